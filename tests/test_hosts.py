"""One machine, one series: host identity, resume per host, series per host in the report, per-host
lookups (ceiling, vLLM auto policy), mixed engine builds flagged, installs without git.

Two hosts on one machine: the second is this machine's real probe with another machine identity and
CPU flags (a small fake of the probe, the only way to have two machines in one test); every engine
run is real (the command engine).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import execute, provenance, report
from harness.artifact import SCHEMA_VERSION
from harness.paths import PROJECT_ROOT
from harness.probe import host_key, key_inputs, probe
from harness.store import Store, load_path


def _arts(store: Path, name: str):
    return [load_path(p) for p in Store(store).iter_paths(name)]


def other_machine() -> dict:
    """This machine's profile as another machine would report it: another identity, another flag set."""
    h = json.loads(json.dumps(probe()))
    h["identity"] = {"status": "recorded", "source": "/etc/machine-id", "sha256": "ab" * 32}
    h["cpu"]["flags"] = sorted(set(h["cpu"]["flags"]) | {"avx512f", "avx512_bf16"})
    h["cpu"]["flags_sha256"] = "cd" * 32
    h["key"] = host_key(h)
    return h


@pytest.fixture
def on_other_machine(monkeypatch):
    """While active, the harness measures as the other machine."""
    other = other_machine()
    monkeypatch.setattr(provenance, "host_static", lambda: other)
    return other["key"]


def test_host_key_names_the_machine_not_the_moment():
    h = probe()
    assert h["key"] == host_key(h) and len(h["key"]) == 12
    assert h["identity"]["status"] in ("recorded", "unreadable") and "machine-id" not in json.dumps(h["identity"]["sha256"])
    moved = json.loads(json.dumps(h))
    moved["loadavg"], moved["memory"]["available_bytes"], moved["kernel"] = [9, 9, 9], 1, "other-kernel"
    assert host_key(moved) == h["key"]  # load, free memory, kernel: recorded, not keyed
    for change in (lambda x: x["cpu"].__setitem__("flags_sha256", "0" * 64),
                   lambda x: x["cpu"].__setitem__("logical_cores", 64),
                   lambda x: x["identity"].__setitem__("sha256", "1" * 64),
                   lambda x: x.__setitem__("emulation", "x86-avx2-2c-4g")):
        y = json.loads(json.dumps(h))
        change(y)
        assert host_key(y) != h["key"]
    assert other_machine()["key"] != h["key"]


def test_resume_never_counts_another_hosts_runs(write_grid, tmp_path, monkeypatch):
    from conftest import COMMAND_GRID
    g = write_grid(COMMAND_GRID)
    with monkeypatch.context() as m:
        other = other_machine()
        m.setattr(provenance, "host_static", lambda: other)
        s0 = execute.run_grid(str(g), store_root=tmp_path / "st")
    s1 = execute.run_grid(str(g), store_root=tmp_path / "st")  # this machine: nothing of it is stored yet
    s2 = execute.run_grid(str(g), store_root=tmp_path / "st")
    assert (s0.done, s1.done, s1.skipped, s2.done, s2.skipped) == (8, 8, 0, 0, 8)
    arts = _arts(tmp_path / "st", "cmd")
    keys = {a.host.key for a in arts}
    assert keys == {other["key"], provenance.current_host_key()} and len(arts) == 16


def test_report_renders_one_series_per_host_and_never_pairs_across(write_grid, tmp_path, monkeypatch):
    from conftest import COMMAND_GRID
    g = write_grid(COMMAND_GRID.replace("passes: 4", "passes: 6"))  # 6 passes: one comparison gets an interval
    with monkeypatch.context() as m:
        other = other_machine()
        m.setattr(provenance, "host_static", lambda: other)
        execute.run_grid(str(g), store_root=tmp_path / "st")
    execute.run_grid(str(g), store_root=tmp_path / "st")
    me = provenance.current_host_key()
    # this host's baseline runs are gone from its series: its arm b has nothing to pair with on this host,
    # and must not borrow the other host's baseline
    for a, p in zip(_arts(tmp_path / "st", "cmd"), Store(tmp_path / "st").iter_paths("cmd")):
        if a.host.key == me and a.grid.arm == "a":
            p.unlink()
    text, sections = report.build([str(tmp_path / "st")])
    by_key = {s["host_key"]: s for s in sections if s["name"] == "cmd"}
    assert set(by_key) == {me, other["key"]}
    row_other = next(r for r in by_key[other["key"]]["tables"][0]["rows"] if r["arm"] == "b")
    row_me = next(r for r in by_key[me]["tables"][0]["rows"] if r["arm"] == "b")
    assert "ci" in row_other and row_other["n"].startswith("6 runs")
    assert row_me["ratio"] == "no paired baseline" and "ci" not in row_me
    assert f"## cmd on host `{me}`" in text and f"## cmd on host `{other['key']}`" in text
    assert f"{me}-ratios.png" not in text and f"cmd-{other['key']}-ratios.png" in text


def test_an_arm_whose_engine_build_changed_is_flagged(write_grid, tmp_path, monkeypatch):
    from conftest import COMMAND_GRID
    from harness.engines.command import Command
    real = Command.engine_info
    calls = []

    def changing(self):  # the shell binary is replaced half-way through the series
        calls.append(1)
        info = real(self)
        if len(calls) > 4:
            info["build"] = {**info["build"], "shell_sha256": "e" * 64}
        return info
    monkeypatch.setattr(Command, "engine_info", changing)
    g = write_grid(COMMAND_GRID)
    execute.run_grid(str(g), store_root=tmp_path / "st")
    text, sections = report.build([str(tmp_path / "st")])
    assert any("different engine builds" in w for s in sections for w in s["warnings"])
    assert "different engine builds" in text and text.count("build sha256 `") >= 2


def test_ceiling_and_auto_policy_are_per_host(write_grid, tmp_path, on_other_machine):
    from conftest import COMMAND_GRID
    from harness.engines.vllm import measured_costs
    # the other machine measures a speed grid that the ceiling reads; only the published host has a calibration
    g = write_grid(COMMAND_GRID.replace("name: cmd", "name: cmd-ceiling") + "report: {ceiling: true}\n")
    execute.run_grid(str(g), store_root=tmp_path / "st")
    shutil.copytree(PROJECT_ROOT / "baselines" / "calibration", tmp_path / "st" / "calibration")
    published = load_path(next((PROJECT_ROOT / "baselines" / "calibration").glob("*.json"))).host.key
    _, _, ctx = report.build_all([str(tmp_path / "st")])
    by_key = {c["host_key"]: c for c in ctx["ceilings"]}
    assert by_key[published]["missing"] == "" and by_key[published]["calibration"]
    assert by_key[on_other_machine]["missing"].startswith(f"no calibration for host `{on_other_machine}`")
    # the auto policy reads the store it is given, and only this host's series
    startup = PROJECT_ROOT / "artifacts" / "runtime-startup"
    shutil.copytree(startup, tmp_path / "st2" / "runtime-startup")
    legacy = load_path(next(startup.glob("*.json"))).host.key
    assert measured_costs(tmp_path / "st2", legacy)["host"] == legacy
    assert measured_costs(tmp_path / "st2") is None  # this (other) machine measured nothing
    assert measured_costs(tmp_path / "empty", legacy) is None  # not the published store behind its back


def test_without_git_artifacts_are_valid_and_check_needs_a_flag(write_grid, tmp_path, monkeypatch, cli):
    from conftest import COMMAND_GRID
    outside = tmp_path / "unpacked"
    outside.mkdir()
    info = provenance.harness_info(outside)
    assert info["commit"] == provenance.NOT_A_CHECKOUT and info["dirty"] is None and "git_error" not in info
    real = provenance.harness_info
    monkeypatch.setattr(provenance, "harness_info", lambda root=None: real(outside))
    g = write_grid(COMMAND_GRID)
    s = execute.run_grid(str(g), store_root=tmp_path / "st")
    assert s.done == 8
    rc, out, _ = cli("check", tmp_path / "st")
    assert rc == 1 and "harness.commit" in out and "--allow-unknown-commit" in out
    rc, out, _ = cli("check", tmp_path / "st", "--allow-unknown-commit")
    assert rc == 0, out


def test_legacy_artifacts_migrate_with_a_derived_key_and_hosts_lists_them(cli, monkeypatch):
    monkeypatch.chdir(PROJECT_ROOT)
    paths = sorted((PROJECT_ROOT / "artifacts" / "quickstart").glob("*.json"))
    raw = [json.loads(p.read_text()) for p in paths]
    legacy = [load_path(p) for p, d in zip(paths, raw) if d["schema_version"] == 1]
    assert legacy, "the published store holds version-1 artifacts"
    a = legacy[0]
    assert a.schema_version == SCHEMA_VERSION and a.host.identity.status.startswith("legacy")
    assert a.host.key == host_key(a.host.model_dump()) and key_inputs(a.host.model_dump())["legacy"] is True
    rc, out, _ = cli("hosts")
    assert rc == 0 and a.host.key in out and "legacy record" in out
    rc, out, _ = cli("hosts", "--json")
    rows = json.loads(out)
    assert {r["key"] for r in rows} >= {a.host.key} and all("isa_tier" in r for r in rows)


def test_a_tampered_host_key_is_reported(write_grid, tmp_path, cli):
    from conftest import COMMAND_GRID
    from harness.artifact import compute_id
    g = write_grid(COMMAND_GRID)
    execute.run_grid(str(g), store_root=tmp_path / "st")
    p = next(Store(tmp_path / "st").iter_paths("cmd"))
    doc = json.loads(p.read_text())
    doc["host"]["key"] = "0" * 12
    doc["id"] = compute_id(doc)
    bad = tmp_path / "bad" / f"{doc['id']}.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps(doc))
    rc, out, _ = cli("check", bad, "--no-model-hashes")
    assert rc == 1 and "host.key" in out
