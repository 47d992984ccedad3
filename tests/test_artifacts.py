"""Artifacts: round-trips, content-hash ids, and `harness check` catching every kind of damage."""

import copy
import hashlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness import artifact, check, execute
from harness.errors import UserError
from harness.store import Store, load_path

from conftest import COMMAND_GRID


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    d = tmp_path_factory.mktemp("art")
    g = d / "cmd.yaml"
    g.write_text(COMMAND_GRID)
    execute.run_grid(str(g), store_root=d / "store")
    return d / "store"


@pytest.fixture(scope="module")
def one(store):
    p = sorted(Store(store).iter_paths("cmd"))[0]
    return p, json.loads(p.read_text())


def _problems(doc, where="x.json"):
    # the tree running the tests may be dirty; that finding is tested separately
    return [p for p in check.check_doc(doc, where) if ": harness.dirty:" not in p]


def test_round_trip(one):
    p, doc = one
    a = load_path(p)
    assert artifact.dumps(a) == p.read_text()
    assert artifact.parse(json.loads(artifact.dumps(a)), "x") == a
    assert a.id == p.stem == artifact.compute_id(doc)


def test_clean_artifact_passes(one):
    p, doc = one
    assert _problems(doc, str(p)) == []


def _shuffle(obj, rnd):
    if isinstance(obj, dict):
        items = list(obj.items())
        rnd.shuffle(items)
        return {k: _shuffle(v, rnd) for k, v in items}
    if isinstance(obj, list):
        return [_shuffle(v, rnd) for v in obj]
    return obj


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10**6), indent=st.sampled_from([None, 0, 1, 4]))
def test_id_stable_under_key_order_and_whitespace(one, seed, indent):
    import random
    _, doc = one
    shuffled = json.loads(json.dumps(_shuffle(doc, random.Random(seed)), indent=indent))
    assert artifact.compute_id(shuffled) == doc["id"]


@pytest.mark.parametrize("field", check.REQUIRED["run"][0] + check.REQUIRED["run"][1])
def test_removing_a_required_field_fails(one, field):
    _, doc = one
    if field.startswith(("model.files", "residency.before", "residency.after_run")):
        pytest.skip("command artifacts carry no model files")
    d = copy.deepcopy(doc)
    parts = field.split(".")
    cur = d
    for k in parts[:-1]:
        cur = cur[k]
    del cur[parts[-1]]
    probs = _problems(d)
    assert probs and any(field in p or parts[0] in p for p in probs), probs


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_changing_any_value_fails(one, data):
    _, doc = one
    d = copy.deepcopy(doc)
    # pick a leaf anywhere in the document (metrics and provenance alike) and change it
    leaves = []

    def walk(o, path):
        if isinstance(o, dict):
            for k, v in o.items():
                walk(v, path + [k])
        elif isinstance(o, list) and o:
            for i, v in enumerate(o):
                walk(v, path + [i])
        elif path and path[0] != "id":
            leaves.append(path)
    walk(d, [])
    path = data.draw(st.sampled_from(leaves))
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    v = cur[path[-1]]
    cur[path[-1]] = (v + 1) if isinstance(v, (int, float)) and not isinstance(v, bool) else (
        (not v) if isinstance(v, bool) else f"{v}x")
    assert any("id: does not match" in p or ": " in p for p in _problems(d)), path
    assert any("id: does not match" in p for p in check.check_doc(d, "x.json")), path
    assert any("id: does not match" in p for p in check.check_doc(d, "x.json", finite=True)), path  # the fast way


def test_nan_where_null_was_is_caught(one, tmp_path):
    """orjson writes NaN as null: a file whose null became NaN must not pass the fast id check."""
    p, doc = one
    assert '"error": null' in p.read_text()
    bad = tmp_path / p.name
    bad.write_text(p.read_text().replace('"error": null', '"error": NaN'))
    n, problems = check.check([str(bad)], verify_models=False, allow_unknown_commit=True)
    assert n == 1 and any("id: content is not canonical JSON" in x for x in problems), problems


def test_future_schema_refused(one):
    _, doc = one
    d = dict(doc, schema_version=99)
    with pytest.raises(UserError, match="newer than this harness supports.*upgrade"):
        artifact.parse(d, "x.json")


def _copy_store(store, tmp_path):
    import shutil
    dst = tmp_path / "s"
    shutil.copytree(store, dst)
    return dst


def _digest(root: Path) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage", ["truncated", "non_utf8", "empty", "wrong_type", "symlink", "duplicate",
                                    "edited_metric", "not_object"])
def test_bad_input_one_line_each_and_nothing_changed(store, tmp_path, cli, damage):
    s = _copy_store(store, tmp_path)
    files = sorted((s / "cmd").glob("*.json"))
    victim = files[0]
    raw = victim.read_bytes()
    if damage == "truncated":
        victim.write_bytes(raw[: len(raw) // 2])
    elif damage == "non_utf8":
        victim.write_bytes(raw[:10] + b"\xff\xfe" + raw[10:])
    elif damage == "empty":
        victim.write_bytes(b"")
    elif damage == "wrong_type":
        d = json.loads(raw)
        d["workload"]["prompt_len"] = "many"
        victim.write_text(json.dumps(d))
    elif damage == "symlink":
        os.symlink(files[1], s / "cmd" / "link.json")
    elif damage == "duplicate":
        (s / "cmd" / "copy").mkdir()
        (s / "cmd" / "copy" / victim.name).write_bytes(raw)
    elif damage == "edited_metric":
        d = json.loads(raw)
        d["metrics"]["wall_s"]["samples"][0] *= 0.5
        victim.write_text(json.dumps(d, indent=1))
    elif damage == "not_object":
        victim.write_text("[1, 2]")
    before = _digest(s)
    rc, out, err = cli("check", s, "--no-model-hashes")
    assert rc == 1
    lines = [x for x in out.splitlines() if ": harness.dirty:" not in x]
    assert lines, out
    assert all(x.count(": ") >= 2 for x in lines)  # path: field: reason
    assert _digest(s) == before


def test_missing_path_is_usage_error(cli, tmp_path):
    rc, _, err = cli("check", tmp_path / "nope")
    assert rc == 2 and "no such file" in err and len(err.strip().splitlines()) == 1


def test_store_never_overwrites(store, tmp_path):
    s = Store(_copy_store(store, tmp_path))
    p = sorted(s.iter_paths("cmd"))[0]
    a = load_path(p)
    before = p.read_bytes()
    assert s.write(a) == p and p.read_bytes() == before


def test_json_schema_exports_every_kind():
    sch = artifact.json_schema()
    assert "run" in sch and "metrics" in sch["run"]["properties"]


def test_index_built_and_rebuilt_when_stale(store, tmp_path, cli):
    from harness import index
    s = _copy_store(store, tmp_path)
    assert index.is_stale(s)
    df = index.load(s)
    assert df["id"].nunique() == 8 and set(df["metric"]) == {"wall_s"}
    assert not index.is_stale(s)
    next((s / "cmd").glob("*.json")).unlink()
    assert index.is_stale(s)
    rc, out, _ = cli("index", "--store", s)
    assert rc == 0 and "7 artifacts" in out and "rebuilt" in out


def test_check_fails_an_enforced_setting_the_engine_did_not_use(one):
    """The read-back rule alone: the id is recomputed after the edit, so only it can catch the difference."""
    _, doc = one
    row = doc["execution"]["settings"]["warmups"]
    assert row["rule"] == "enforced" and row["effective"] == row["requested"]
    edited = copy.deepcopy(doc)
    edited["execution"]["settings"]["warmups"]["effective"] = 0
    edited["id"] = artifact.compute_id(edited)
    where = f"{edited['id']}.json"
    assert _problems(edited, where) == [f"{where}: execution.settings.warmups: requested 1, engine used 0"]
    edited["execution"]["settings"]["warmups"]["effective"] = None
    edited["id"] = artifact.compute_id(edited)
    assert "not read back" in _problems(edited, f"{edited['id']}.json")[0]


def test_the_environment_records_whether_python_keeps_bytecode():
    """PYTHONDONTWRITEBYTECODE changes what a Python engine's start costs (every module compiled from source in
    every process): recorded where it is set, absent where it is not."""
    from harness.provenance import relevant_env
    assert relevant_env({"PYTHONDONTWRITEBYTECODE": "1", "OMP_WAIT_POLICY": "PASSIVE", "HOME": "/root"}) == \
        {"OMP_WAIT_POLICY": "PASSIVE", "PYTHONDONTWRITEBYTECODE": "1"}
    assert "PYTHONDONTWRITEBYTECODE" not in relevant_env({"PYTHONPATH": "/x"})
