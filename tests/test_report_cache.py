"""The report's caches of what the stores' files parsed to (report.inputs._load_accepted, hashcache.PickleCache): the
same report with and without them, cold and warm, after an artifact is added, removed or replaced, and with the
cache damaged, truncated or planted (never trusted: ignored, rebuilt, nothing in it run)."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest

from harness import analysis, artifact, check, hashcache, report, store
from harness.paths import PROJECT_ROOT

@pytest.fixture
def env(cached_store):
    """A store of published artifacts of every kind (fidelity with their references), a cache folder of its own,
    caching from the first file (tests/conftest.py)."""
    return cached_store


def _uncached(root: Path, monkeypatch) -> str:
    with monkeypatch.context() as m:
        m.setattr(check, "CACHE_FROM", 10**9)
        return report.render([str(root)])


def _reads(monkeypatch) -> list[str]:
    """Every store file read or parsed from here on (verified, or parsed after its verdict was found)."""
    calls: list[str] = []
    real_load, real_read, real_parse = report.inputs.load_path, store.read_if_unchanged, artifact.parse
    monkeypatch.setattr(report.inputs, "load_path", lambda p, **kw: calls.append(str(p)) or real_load(p, **kw))
    monkeypatch.setattr(store, "read_if_unchanged", lambda p, st: calls.append(str(p)) or real_read(p, st))
    monkeypatch.setattr(artifact, "parse", lambda doc, where, *shared: calls.append(where) or real_parse(doc, where, *shared))
    return calls


@pytest.fixture
def no_output_memo(monkeypatch):
    """The rendered report never read back (report._Output): every render reads the stores' caches."""
    monkeypatch.setattr(report._Output, "load", lambda self, inputs: None)


def _shards(root: Path) -> list[Path]:
    base = hashcache.store_cache_path("report-parsed", root, "x")
    return sorted(base.parent.glob("report-parsed-*.cache"))


def test_warm_report_reads_no_file_and_equals_cold(env, monkeypatch, no_output_memo):
    want = _uncached(env, monkeypatch)
    cold = report.render([str(env)])
    assert _shards(env)
    calls = _reads(monkeypatch)
    warm = report.render([str(env)])
    assert cold == want and warm == want
    # the fidelity references are read through their fidelity artifacts (harness/report/inputs.py collect), never here
    assert calls == []


def test_warm_artifacts_share_their_records(env):
    report.render([str(env)])
    ok, _ = report.inputs._load_accepted(env, [p for p in store.Store(env).iter_paths() if p.parent.name == "decode-compiled"])
    assert len(ok) > 10 and len({id(a.harness) for a in ok}) < len(ok)  # shared within each shard
    assert all(type(a) is artifact.RunArtifact for a in ok)


@pytest.mark.parametrize("memo", [True, False])
def test_added_removed_and_replaced_artifacts(env, monkeypatch, memo):
    if not memo:
        monkeypatch.setattr(report._Output, "load", lambda self, inputs: None)
    report.render([str(env)])
    extra = sorted((PROJECT_ROOT / "artifacts" / "decode-target").glob("*.json"))[:3]
    (env / "decode-target").mkdir()
    for p in extra:
        shutil.copy(p, env / "decode-target" / p.name)
    calls = _reads(monkeypatch)
    added = report.render([str(env)])
    assert sorted(set(calls)) == sorted(str(env / "decode-target" / p.name) for p in extra)  # only the new ones
    assert added == _uncached(env, monkeypatch) and "decode-target" in added
    gone = sorted((env / "quickstart").glob("*.json"))[0]
    gone.unlink()
    removed = report.render([str(env)])
    assert removed == _uncached(env, monkeypatch) and removed != added
    # replaced: another artifact's bytes under a name that was accepted (same size or not: a new stamp)
    victim = sorted((env / "quickstart").glob("*.json"))[0]
    victim.write_bytes(extra[0].read_bytes())
    replaced = report.render([str(env)])
    assert replaced == _uncached(env, monkeypatch) and replaced != removed
    assert report.render([str(env)]) == replaced


class _Boom:
    def __reduce__(self):
        return (shutil.rmtree, ("/nonexistent-edge-harness-test",))


def _plant(path: Path, value) -> None:
    """A shard whose head is right for its body (as a cache writer would give it): only the unpickler stands."""
    head, _, _ = path.read_bytes().partition(b"\n")
    body = pickle.dumps(value)
    meta = {**json.loads(head), "sha256": hashlib.sha256(body).hexdigest()}
    path.write_bytes(json.dumps(meta).encode() + b"\n" + body)


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "foreign-class", "wrong-shape", "other-code"])
def test_a_damaged_cache_is_ignored(env, monkeypatch, no_output_memo, damage):
    want = report.render([str(env)])
    shards = _shards(env)
    assert shards
    for p in shards:
        raw = p.read_bytes()
        if damage == "truncate":
            p.write_bytes(raw[: len(raw) // 2])
        elif damage == "flip":
            p.write_bytes(raw[:-10] + bytes(b ^ 0xFF for b in raw[-10:]))
        elif damage == "garbage":
            p.write_bytes(b"\x00" * 100)
        elif damage == "foreign-class":
            _plant(p, {"quickstart/x.json": ([0], _Boom())})
        elif damage == "wrong-shape":
            _plant(p, {k: ("not a stamp", 3) for k in ("quickstart/x.json",)} if p == shards[0] else ["a", "list"])
        else:
            head, _, body = raw.partition(b"\n")
            p.write_bytes(json.dumps({**json.loads(head), "code": "0" * 64}).encode() + b"\n" + body)
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: pytest.fail("the cache ran code"))
    assert report.render([str(env)]) == want
    calls = _reads(monkeypatch)
    assert report.render([str(env)]) == want and calls == []  # rebuilt by the call before


def _outputs(root: Path) -> list[Path]:
    return sorted(hashcache.store_cache_path("x", root).parent.glob("report-output-*.cache"))


def test_the_rendered_report_is_read_back_for_the_same_inputs_only(env, monkeypatch, tmp_path):
    want = report.build_all([str(env)])
    assert len(_outputs(env)) == 1
    real_collect = report.collect
    monkeypatch.setattr(report, "collect", lambda *a, **k: pytest.fail("rendered again"))
    assert report.build_all([str(env)]) == want
    monkeypatch.setattr(report, "collect", real_collect)
    # another template folder: an edited template renders again
    templates = tmp_path / "templates"
    shutil.copytree(report.TEMPLATES, templates)
    monkeypatch.setattr(report.jinja, "TEMPLATES", templates)
    index = want[0]["results.md"]
    assert report.build_all([str(env)])[0]["results.md"] == index
    (templates / "results.md.j2").write_text((templates / "results.md.j2").read_text() + "edited\n")
    edited = report.build_all([str(env)])[0]
    assert edited["results.md"] == index + "edited\n" and {**edited, "results.md": index} == want[0]
    # the stores named are an input (the report lists them), their order too
    other = tmp_path / "other"
    other.mkdir()
    both = report.render([str(env), str(other)])
    assert both != report.render([str(env)]) and report.render([str(other), str(env)]) != both


@pytest.mark.parametrize("damage", ["truncate", "garbage", "foreign-class", "wrong-shape", "other-key"])
def test_a_damaged_rendered_report_is_ignored(env, monkeypatch, damage):
    want = report.render([str(env)])
    (out,) = _outputs(env)
    raw = out.read_bytes()
    if damage == "truncate":
        out.write_bytes(raw[: len(raw) // 2])
    elif damage == "garbage":
        out.write_bytes(b"{}\n" + raw)
    elif damage == "foreign-class":
        _plant(out, ("text", [], {"x": _Boom()}))
    elif damage == "wrong-shape":
        _plant(out, ["planted", [], {}])
    else:
        head, _, body = raw.partition(b"\n")
        meta = {**json.loads(head), "key": "0" * 64}
        out.write_bytes(json.dumps(meta).encode() + b"\n" + body)
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: pytest.fail("the cache ran code"))
    assert report.render([str(env)]) == want


def test_an_unwritable_cache_folder_is_no_error(env, monkeypatch):
    want = _uncached(env, monkeypatch)
    (env.parent / "cache").write_text("a file where the cache folder goes")
    assert report.render([str(env)]) == want


def test_analysis_forgets_its_per_object_values(env):
    report.render([str(env)])
    assert not analysis._BUILD_IDS and not analysis._MODEL_IDS and not analysis._WEIGHT_SHAS


def test_a_report_after_check_reuses_its_verdicts_and_rechecks_what_it_refused(env, monkeypatch, no_output_memo):
    """A store `harness check` just verified: the report parses each file it found clean (its tree state aside)
    without checking it again; a file check refused is checked again, and left out as before."""
    victim = sorted(p for p in env.rglob("*.json") if p.parent.name == "quickstart")[0]
    doc = json.loads(victim.read_text())
    doc["metrics"]["decode_tok_s"]["samples"][0] *= 100  # a lie check catches (its id recomputed)
    doc["id"] = artifact.compute_id(doc)
    lie = victim.with_name(f"{doc['id']}.json")
    lie.write_text(json.dumps(doc))
    want = _uncached(env, monkeypatch)  # every file read and checked: the lie left out, named
    import time
    time.sleep(hashcache.RACY_NS / 1e9)
    n, problems = check.check([str(env)], verify_models=False)
    assert any(p.startswith(str(lie)) for p in problems)
    calls: list[str] = []
    real = check.accepted
    monkeypatch.setattr(check, "accepted", lambda arts, **kw: calls.extend(w for _, w in arts) or real(arts, **kw))
    after = report.render([str(env)])
    assert calls == [str(lie)]  # only what check refused is checked again
    assert after == want


def test_equal_blocks_are_validated_once_and_shared(env):
    """artifact.parse with a table: a block equal as JSON to one validated before (same kind) is that object, not
    validated again; the artifact equals the one parsed alone; a block that differs in a value, or only in a
    number's type, is its own object."""
    import pydantic_core
    first = pydantic_core.from_json(next((env / "quickstart").rglob("*.json")).read_bytes())
    second = json.loads(json.dumps(first))
    second["grid"]["pass_index"] += 1  # another run of the same arm, machine and tree
    table: dict = {}
    a, b = (artifact.parse(d, "x", table) for d in (first, second))
    assert a == artifact.parse(first, "x") and b == artifact.parse(second, "x") and a != b
    assert a.host is b.host and a.harness is b.harness and a.engine is b.engine
    other = json.loads(json.dumps(second))
    other["host"]["loadavg_before"] = [float(x) + 1 for x in other["host"]["loadavg_before"]]
    c = artifact.parse(other, "x", table)
    assert c.host is not a.host and c.host.loadavg_before != a.host.loadavg_before and c.harness is a.harness
    cores = other["host"]["cpu"]["logical_cores"]
    other["host"]["cpu"]["logical_cores"] = float(cores)  # the same value as JSON numbers go, another type
    assert artifact.parse(other, "x", table).host is not c.host
