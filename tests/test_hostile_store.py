"""Stores, reports and model files read as untrusted input (issue 30): links never followed out of a store,
names that become paths validated, bounded reads, one line and exit 2 for what cannot be read or written,
and the hash of what a run loads checked against its manifest."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from harness import execute, models, report, runner
from harness.artifact import compute_id
from harness.errors import UserError
from harness.paths import contained, name_problem
from harness.store import Store, load_path, read_bytes

PUBLISHED = Path(__file__).resolve().parent.parent / "artifacts"


def _published_run() -> dict:
    """A small ok llama.cpp run artifact of the published store, as a dict."""
    for p in sorted((PUBLISHED / "quickstart").glob("*.json")):
        d = json.loads(p.read_text())
        if d["kind"] == "run" and d["status"] == "ok":
            return d
    raise AssertionError("no published quickstart run")


def _store_with(tmp_path: Path, doc: dict, grid_dir: str = "g") -> Path:
    doc = {**doc, "id": compute_id(doc)}
    d = tmp_path / "st" / grid_dir
    d.mkdir(parents=True)
    (d / f"{doc['id']}.json").write_text(json.dumps(doc))
    return tmp_path / "st"


def test_lock_that_is_a_symlink_is_refused_and_its_target_untouched(write_grid, tmp_path, cli):
    from conftest import COMMAND_GRID
    g = write_grid(COMMAND_GRID)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "st" / "cmd").mkdir(parents=True)
    os.symlink(victim, tmp_path / "st" / "cmd" / ".lock")
    rc, out, err = cli("run", g, "--store", tmp_path / "st")
    assert rc == 2 and ".lock" in err and "symlink" in err and len(err.strip().splitlines()) == 1
    assert victim.read_text() == "precious"


def test_lock_of_a_real_run_is_not_truncated(write_grid, tmp_path):
    from conftest import COMMAND_GRID
    g = write_grid(COMMAND_GRID.replace("passes: 4", "passes: 1"))
    execute.run_grid(str(g), store_root=tmp_path / "st")
    lock = tmp_path / "st" / "cmd" / ".lock"
    assert lock.is_file() and not lock.is_symlink()


def test_grid_folder_that_is_a_symlink_is_not_written_through(write_grid, tmp_path, cli):
    from conftest import COMMAND_GRID
    g = write_grid(COMMAND_GRID.replace("passes: 4", "passes: 1"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "st").mkdir()
    os.symlink(elsewhere, tmp_path / "st" / "cmd")
    rc, out, err = cli("run", g, "--store", tmp_path / "st")
    assert rc == 2 and ("not a folder" in err or "resolves outside" in err) and len(err.strip().splitlines()) == 1
    assert list(elsewhere.iterdir()) == []


def test_grid_name_with_dotdot_is_refused_by_check_and_left_out_of_the_report(tmp_path, cli):
    doc = _published_run()
    doc["grid"] = {**doc["grid"], "name": "../../escape"}
    st = _store_with(tmp_path, doc)
    rc, out, err = cli("check", st)
    assert rc == 1 and "grid.name" in out and "cannot be a file name" in out
    outdir = tmp_path / "rep" / "reports"
    outdir.mkdir(parents=True)
    rc, out, err = cli("report", "--store", st, "--out", outdir / "results.md")
    assert rc == 0 and "left out" in err and "grid.name" in err
    text = (outdir / "results.md").read_text()
    assert "**Left out**: 1 file(s)" in text
    assert not any(p.suffix == ".png" for p in tmp_path.rglob("*") if not p.is_relative_to(outdir))


def test_path_builder_refuses_what_resolves_outside(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match="resolves outside"):
        contained(tmp_path / "out", "..", "x.png")
    os.symlink(tmp_path, tmp_path / "out" / "link")
    with pytest.raises(UserError, match="resolves outside"):
        contained(tmp_path / "out", "link", "x.png")
    assert contained(tmp_path / "out", "a-b_c.png") == tmp_path / "out" / "a-b_c.png"
    for bad in ("", ".", "..", "a/b", "-rf", "a\nb", "x" * 101, "a\x00b"):
        assert name_problem(bad), bad


def test_stale_plot_names_from_plots_json_never_remove_outside(tmp_path):
    out = tmp_path / "reports"
    out.mkdir()
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"keep")
    own = out / "old-grid-ratios.png"
    own.write_bytes(b"stale")
    (out / "plots.json").write_text(json.dumps({"../victim.png": "x", str(victim): "y", "old-grid-ratios.png": "z"}))
    report.write_plots([], out)
    assert victim.read_bytes() == b"keep"
    assert not own.exists()  # a plot of its own the markdown no longer names is removed


def test_fifo_and_device_in_a_store_neither_hang_nor_exhaust_memory(tmp_path, cli):
    st = tmp_path / "st" / "g"
    st.mkdir(parents=True)
    os.mkfifo(st / "fifo.json")
    os.symlink("/dev/zero", st / "zero.json")
    result: dict = {}

    def go():
        result["check"] = cli("check", tmp_path / "st")

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "check hung on a FIFO or /dev/zero in the store"
    rc, out, err = result["check"]
    assert rc == 1 and "fifo.json" in out and "zero.json" in out
    with pytest.raises(UserError, match="not a regular file"):
        read_bytes(st / "fifo.json")
    with pytest.raises(UserError, match="symlink"):
        read_bytes(st / "zero.json")
    s = Store(tmp_path / "st")
    assert list(s.iter_paths()) == [] and len(s.left_out) == 2


def test_oversized_and_deeply_nested_artifacts_are_one_line(tmp_path):
    d = tmp_path / "st" / "g"
    d.mkdir(parents=True)
    deep = d / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(UserError, match="nested more than"):
        load_path(deep)
    big = d / "big.json"
    with open(big, "wb") as f:
        f.truncate(17 << 20)
    with pytest.raises(UserError, match="more than the"):
        load_path(big)
    nan = d / "nan.json"
    nan.write_text('{"schema_version": 2, "kind": "run", "x": NaN}')
    with pytest.raises(UserError, match="NaN"):
        load_path(nan)


def test_report_of_a_store_with_broken_files_leaves_them_out(tmp_path, cli):
    doc = _published_run()
    st = _store_with(tmp_path, doc, grid_dir=doc["grid"]["name"])
    (st / "quickstart" / "truncated.json").write_text(json.dumps(doc)[:200])
    rc, out, err = cli("report", "--store", st, "--out", tmp_path / "results.md")
    assert rc == 0 and "truncated.json" in err
    assert "**Left out**: 1 file(s)" in (tmp_path / "results.md").read_text()


@pytest.mark.parametrize("err", [(28, "No space left on device"), (30, "Read-only file system"),
                                 (36, "File name too long")])
def test_store_write_errors_end_the_run_in_one_line(write_grid, tmp_path, cli, monkeypatch, err):
    """A full disk, a read-only store, a name too long: one line, exit 2 (root ignores permissions, so the
    OS error is raised where the store creates its temporary file)."""
    from conftest import COMMAND_GRID
    g = write_grid(COMMAND_GRID.replace("passes: 4", "passes: 1"))

    def fail(*a, **k):
        raise OSError(err[0], err[1])

    monkeypatch.setattr("harness.store.tempfile.mkstemp", fail)
    rc, out, err_text = cli("run", g, "--store", tmp_path / "st")
    errors = [line for line in err_text.splitlines() if line.startswith("error:")]
    assert rc == 2 and len(errors) == 1 and err[1] in errors[0] and "Traceback" not in err_text


def test_write_errors_are_one_line(tmp_path, monkeypatch):
    from harness.artifact import parse
    doc = _published_run()
    a = parse({**doc, "id": compute_id(doc)}, "x")
    s = Store(tmp_path / "st")

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("harness.store.tempfile.mkstemp", full)
    with pytest.raises(UserError, match="No space left on device.*free disk space"):
        s.write(a)


# ---- provenance of what was loaded ------------------------------------------------------------------------

@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A prepared model of one GGUF form in a temporary zoo (the harness's own logic, no engine)."""
    root = tmp_path / "zoo" / "m"
    root.mkdir(parents=True)
    data = bytes(range(256)) * 64
    (root / "m.gguf").write_bytes(data)
    manifest = {"name": "m", "source": {"test": "fixture"}, "parameters": 1,
                "forms": {"gguf-f32": {"path": "m.gguf", "format": "gguf", "dtype": "f32"}},
                "files": {"m.gguf": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(models, "model_dir", lambda name: root)
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("harness.hashcache.HashCache._default", None)
    return root, manifest


def test_a_flipped_byte_with_its_size_kept_is_refused_naming_both_hashes(fake_model):
    root, manifest = fake_model
    good = manifest["files"]["m.gguf"]["sha256"]
    assert models.loaded_block("m", "gguf-f32")["files"][0]["sha256"] == good
    p = root / "m.gguf"
    raw = bytearray(p.read_bytes())
    raw[1000] ^= 0xFF
    p.write_bytes(bytes(raw))  # same size; a new mtime, so the hash cache re-reads it
    with pytest.raises(UserError) as e:
        models.loaded_block("m", "gguf-f32")
    msg = str(e.value)
    assert good in msg and hashlib.sha256(bytes(raw)).hexdigest() in msg and "--rebuild m" in msg


def test_a_truncated_weight_file_is_refused(fake_model):
    root, _ = fake_model
    with open(root / "m.gguf", "r+b") as f:
        f.truncate(100)
    with pytest.raises(UserError, match="size 100 is not the manifest's"):
        models.loaded_block("m", "gguf-f32")


def test_the_runner_hashes_what_it_loads(fake_model, monkeypatch):
    calls = []
    real = models.loaded_block
    monkeypatch.setattr(models, "loaded_block", lambda n, f: calls.append((n, f)) or real(n, f))
    block, weights = runner.model_block("m", "gguf-f32")
    assert calls == [("m", "gguf-f32")] and block["files"][0]["sha256"] == fake_model[1]["files"]["m.gguf"]["sha256"]


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf"), -1.0])
def test_no_verdict_is_read_from_a_non_finite_ratio(bad):
    from harness import stats
    arm = [2.0] * 11
    arm[3] = bad
    c = stats.compare(arm, [1.0] * 11)
    assert not c.has_interval and stats.verdict(c, True).startswith("undetermined: a per-pass ratio is not")
    assert stats.verdict(stats.compare([2.0] * 11, [1.0] * 11), True) == "better"  # the same data, finite


# ---- your files and your writes, round 2 (issue 63): one reader with bounds, every write one line -------------

def _gguf(*kvs: bytes) -> bytes:
    import struct
    return b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)


def _kv(key: str, vtype: int, value: bytes) -> bytes:
    import struct
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + value


def _in_thread(fn, timeout_s: float = 20.0):
    """fn's result or exception, from a thread: a reader that hangs (a FIFO) fails the test instead of hanging it."""
    out: dict = {}

    def go():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            out["error"] = e
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "the reader hangs"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.parametrize("body, says", [
    (_gguf(_kv("general.alignment", 4, (0).to_bytes(4, "little"))), "general.alignment 0"),
    (_gguf(_kv("general.alignment", 8, (1).to_bytes(8, "little") + b"x")), "general.alignment 'x'"),
    (_gguf(_kv("deep", 9, (9).to_bytes(4, "little") + (1).to_bytes(8, "little")) * 1
           + ((9).to_bytes(4, "little") + (1).to_bytes(8, "little")) * 5000), "arrays nested deeper than"),
])
def test_a_hostile_gguf_header_is_one_user_error(tmp_path, body, says):
    from harness.usermodels import gguf_info
    p = tmp_path / "m.gguf"
    p.write_bytes(body)
    with pytest.raises(UserError, match="unreadable GGUF header") as e:
        gguf_info(p, "models add")
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_fifo_or_a_link_loop_given_as_a_gguf_is_refused_without_hanging(tmp_path):
    from harness.usermodels import gguf_info
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="is a FIFO, not a regular file"):
        _in_thread(lambda: gguf_info(fifo, "models add"))
    (tmp_path / "a.gguf").symlink_to(tmp_path / "b.gguf")
    (tmp_path / "b.gguf").symlink_to(tmp_path / "a.gguf")
    with pytest.raises(UserError, match="Too many levels of symbolic links"):
        gguf_info(tmp_path / "a.gguf", "models add")


def _hf(tmp_path: Path, config: str) -> Path:
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(config)
    (d / "model.safetensors").write_bytes(b"\0" * 8)
    return d


@pytest.mark.parametrize("config, says", [
    ("[1, 2]", "a JSON list, not an object"),
    ('{"a": ' + "[" * 10_000 + "]" * 10_000 + "}", "nests deeper than"),
    ('{"torch_dtype": "../../../../tmp/out"}', "torch_dtype '../../../../tmp/out' is not one of"),
    ('{"torch_dtype": ["float32"]}', "is not one of float32, bfloat16, float16"),
])
def test_a_hostile_hf_config_is_refused_before_anything_is_registered_or_copied(tmp_path, config, says):
    from harness.usermodels import UserModel, check_source
    d = _hf(tmp_path, config)
    with pytest.raises(UserError, match="config.json") as e:
        check_source(UserModel("m", "hf", d), "models add")
    assert says in str(e.value)


def test_an_hf_folder_linking_out_or_holding_a_fifo_is_refused(tmp_path):
    from harness.usermodels import UserModel, check_source
    d = _hf(tmp_path, '{"torch_dtype": "float32"}')
    (tmp_path / "secret").write_text("x")
    (d / "tokenizer.json").symlink_to(tmp_path / "secret")
    with pytest.raises(UserError, match="links out of the folder"):
        check_source(UserModel("m", "hf", d), "models add")
    (d / "tokenizer.json").unlink()
    os.mkfifo(d / "pipe")
    with pytest.raises(UserError, match="is a FIFO"):
        _in_thread(lambda: check_source(UserModel("m", "hf", d), "models add"))


def test_a_deeply_nested_user_registry_is_one_line(cli):
    from harness.usermodels import registry_path  # the test's own (conftest)
    registry_path().write_text('{"m": ' + "[" * 100_000 + "]" * 100_000 + "}")
    rc, _, err = cli("models", "list")
    assert rc == 2 and "user-models.json" in err and len(err.strip().splitlines()) == 1, err


@pytest.fixture
def read_only(monkeypatch):
    """Every replace-whole write refused as a read-only file system refuses it (as root, chmod does not)."""
    def refuse(*a, **k):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr("tempfile.mkstemp", refuse)


@pytest.mark.usefixtures("read_only")
def test_writes_into_a_read_only_folder_are_one_line_and_leave_nothing(tmp_path):
    from harness import export, html
    from harness.report import pages
    from harness.usermodels import UserModel, save_registry
    for write in (lambda: export.write(str(tmp_path / "all.csv"), b"x"),
                  lambda: pages.write_pages(str(tmp_path / "results.md"), {pages.INDEX: "# r\n"}),
                  lambda: html.write(str(tmp_path / "site"), {pages.INDEX: "# r\n"}, []),
                  lambda: save_registry({"m": UserModel("m", "gguf", tmp_path / "m.gguf")})):
        with pytest.raises(UserError, match="Read-only file system") as e:
            write()
        assert "\n" not in str(e.value)
    assert not (tmp_path / "all.csv").exists() and not (tmp_path / "results.md").exists()


def test_names_that_would_become_structure_are_escaped_or_renamed():
    from harness import html
    from harness.report import pages
    from harness.report.jinja import TEMPLATES, md_cell
    # a grid named after the site's index gets a page of its own, never the index
    assert pages.page_name("index", set()) != "index.md" and pages.page_name("results", set()) != "results.md"
    # a '|' or a line break in a name stays inside its table cell, in every table row of every template
    assert md_cell("q8|0\n| x") == "q8\\|0 \\| x" and md_cell(3) == "3"
    import re
    for t in TEMPLATES.glob("*.j2"):
        for line in t.read_text().splitlines():
            if line.lstrip().startswith("|"):
                assert all(e.rstrip().endswith("| cell") for e in re.findall(r"\{\{(.*?)\}\}", line)), (t.name, line)
    # no string in a plot's data can end its script block or comment it out
    data = html.script_json({"name": "<!--<script></script>&"})
    assert "<" not in data and ">" not in data and "&" not in data
    assert json.loads(data) == {"name": "<!--<script></script>&"}


def test_an_integer_no_run_can_have_is_refused_at_plan():
    from harness import grid
    doc = {"name": "g", "model": "tiny-llama", "arms": [{"name": "a", "engine": "llama.cpp"}], "threads": 1,
           "workload": {"prompt_len": 10 ** 19, "context_len": 16, "gen_len": 4}}
    with pytest.raises(UserError, match=r"workload.prompt_len: 10000000000000000000 is more than 16,777,216"):
        grid.from_dict(doc, "g.yaml", "0" * 64)
