"""The execution loop (harness/execute.py) on the fake executor: resume by run and host key, Ctrl-C, failed and
lost runs, dispatch among machines, ETA, the store's lock. Deterministic: no process starts, no clock is read."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from conftest import COMMAND_GRID
from fake_executor import Fake
from harness import execute, grid
from harness.check import check
from harness.errors import UserError
from harness.schedule import schedule
from harness.store import Store, load_path

SPREAD = COMMAND_GRID.replace("name: cmd", "name: spread")
ALL = SPREAD + "hosts: all\n"


def _arts(store: Path, name: str = "cmd"):
    return [load_path(p) for p in Store(store).iter_paths(name)]


def _keys(spec_path: Path) -> list[str]:
    return [r.run_key for r in schedule(grid.load(spec_path))]


def _run(g: Path, fake: Fake, store: Path, **kw) -> tuple[execute.RunSummary, str]:
    out = io.StringIO()
    s = execute.execute(str(g), fake, store, out=out, **kw)
    return s, out.getvalue()


def test_every_run_once_in_planned_order_then_nothing_left(write_grid, tmp_path):
    g = write_grid(COMMAND_GRID)
    fake = Fake()
    s, out = _run(g, fake, tmp_path / "st")
    assert (s.done, s.failed, s.skipped) == (8, 0, 0) and fake.closed
    assert [k for _, k in fake.calls] == _keys(g)
    arts = _arts(tmp_path / "st")
    assert sorted(a.grid.run_key for a in arts) == sorted(_keys(g))
    assert {a.execution.executor["name"] for a in arts} == {"fake"}
    n, problems = check([tmp_path / "st"], verify_models=False)
    assert n == 8 and [p for p in problems if ": harness.dirty:" not in p] == []
    # the ETA is the mean duration so far times the runs left: 2 s each on the fake clock
    assert "[2/8] pass 0 pos 1" in out and "ETA 0m14s" in out and "ETA 0m02s" in out
    again = Fake()
    s2, out2 = _run(g, again, tmp_path / "st")
    assert (s2.done, s2.skipped, again.calls) == (0, 8, []) and "8 already stored" in out2


def test_ctrl_c_keeps_what_was_stored_and_a_rerun_runs_only_the_rest(write_grid, tmp_path):
    g = write_grid(COMMAND_GRID)
    fake = Fake(script={("m1", 3): "interrupt"})
    with pytest.raises(KeyboardInterrupt):
        _run(g, fake, tmp_path / "st")
    assert fake.closed
    first = {a.grid.run_key for a in _arts(tmp_path / "st")}
    assert first == set(_keys(g)[:3])
    assert not list((tmp_path / "st" / "cmd").glob(".tmp-*"))  # nothing half written
    rest = Fake()
    s, _ = _run(g, rest, tmp_path / "st")  # the lock was released with the interrupted loop
    assert (s.done, s.skipped) == (5, 3) and [k for _, k in rest.calls] == _keys(g)[3:]


def test_a_failed_run_is_stored_and_run_again_on_the_next_call(write_grid, tmp_path):
    g = write_grid(COMMAND_GRID)
    s, out = _run(g, Fake(script={("m1", 1): "failed"}), tmp_path / "st")
    assert (s.done, s.failed) == (7, 1) and "failed: fake failure" in out
    retry = Fake()
    s2, _ = _run(g, retry, tmp_path / "st")
    assert (s2.done, s2.failed) == (1, 0) and [k for _, k in retry.calls] == [_keys(g)[1]]
    assert len(_arts(tmp_path / "st")) == 9  # the failed artifact is kept


def test_another_hosts_runs_never_count_as_done_here(write_grid, tmp_path):
    g = write_grid(COMMAND_GRID)
    _run(g, Fake([("m1", "A")]), tmp_path / "st")
    other = Fake([("m2", "A")])
    s, out = _run(g, other, tmp_path / "st")
    assert s.done == 8 and len(other.calls) == 8 and "8 artifact(s) of other hosts kept apart" in out
    assert len({a.host.key for a in _arts(tmp_path / "st")}) == 2


def test_a_changed_grid_file_is_refused_unless_a_new_series(write_grid, tmp_path):
    g = write_grid(COMMAND_GRID)
    _run(g, Fake(), tmp_path / "st")
    g.write_text(COMMAND_GRID.replace("passes: 4", "passes: 2"))
    with pytest.raises(UserError, match="grid file changed"):
        _run(g, Fake(), tmp_path / "st")
    s, _ = _run(g, Fake(), tmp_path / "st", new_series=True)
    assert s.done == 4 and len({a.grid.sha256 for a in _arts(tmp_path / "st")}) == 2


def test_a_second_driver_of_the_same_grid_and_store_is_refused(write_grid, tmp_path):
    g = write_grid(COMMAND_GRID)
    store = Store(tmp_path / "st")
    with execute.grid_lock(store, grid.load(g)):
        with pytest.raises(UserError, match="another `harness run`"):
            _run(g, Fake(), tmp_path / "st")
    assert _run(g, Fake(), tmp_path / "st")[0].done == 8


def test_a_machine_lost_mid_pass_its_run_stored_failed_its_passes_to_the_others(write_grid, tmp_path):
    g = write_grid(SPREAD)
    fake = Fake([("m1", "A"), ("m2", "A")], script={("m1", 1): "lost"})
    s, out = _run(g, fake, tmp_path / "st")
    arts = _arts(tmp_path / "st", "spread")
    lost = [a for a in arts if a.status != "ok"]
    assert len(lost) == 1 and lost[0].error.startswith("node lost: m1 went away")
    assert lost[0].host.key == fake.hosts["m1"]["key"] and fake.recovered == ["m1"]
    by_machine: dict[str, list] = {}
    for label, key in fake.calls:
        by_machine.setdefault(label, []).append(key)
    lost_pass = lost[0].grid.pass_index
    # m1 ran one run of its first pass, then lost the second; m2 ran every other pass
    assert by_machine["m1"] == [r.run_key for r in schedule(grid.load(g)) if r.pass_index == lost_pass]
    assert {a.grid.pass_index for a in arts if a.host.key == fake.hosts["m2"]["key"]} == set(range(4)) - {lost_pass}
    assert "passes waiting for their machine" in out and (s.done, s.failed) == (7, 1)
    # the pass m1 started is m1's: a rerun fills only its lost run, on m1
    again = Fake([("m1", "A"), ("m2", "A")])
    s2, _ = _run(g, again, tmp_path / "st")
    assert (s2.done, again.calls) == (1, [("m1", lost[0].grid.run_key)])


def test_a_lost_machine_that_recovers_goes_on(write_grid, tmp_path):
    g = write_grid(COMMAND_GRID)
    fake = Fake(script={("m1", 2): "lost"}, recover=True)
    s, out = _run(g, fake, tmp_path / "st")
    assert (s.done, s.failed) == (7, 1) and "goes on from another node" in out and len(fake.calls) == 8


def test_each_pass_on_one_machine_in_order_and_hosts_all_runs_every_pass_everywhere(write_grid, tmp_path):
    g = write_grid(SPREAD)
    fake = Fake([("m1", "A"), ("m2", "A"), ("x1", "B")])
    s, _ = _run(g, fake, tmp_path / "st")
    arts = _arts(tmp_path / "st", "spread")
    keys = {name: h["key"] for name, h in fake.hosts.items()}
    for p in range(4):  # class A: each pass on one of its machines, in its planned order
        mine = [a for a in arts if a.grid.pass_index == p and a.host.key in (keys["m1"], keys["m2"])]
        assert len({a.host.key for a in mine}) == 1 and len(mine) == 2
        assert [a.grid.position for a in sorted(mine, key=lambda a: a.timing.start)] == [0, 1]
    assert sum(a.host.key == keys["x1"] for a in arts) == 8 and s.done == 16  # class B runs every pass
    g2 = write_grid(ALL, "all.yaml")
    every = Fake([("m1", "A"), ("m2", "A")])
    s2, _ = _run(g2, every, tmp_path / "st2")
    assert s2.done == 16 and sorted(k for who, k in every.calls if who == "m1") == sorted(_keys(g2))


def test_a_machine_that_cannot_prepare_takes_no_runs(write_grid, tmp_path):
    g = write_grid(SPREAD)
    fake = Fake([("m1", "A"), ("m2", "A")], refuse={"m1"})
    s, out = _run(g, fake, tmp_path / "st")
    assert s.done == 8 and {who for who, _ in fake.calls} == {"m2"} and "m1: takes no runs: m1 cannot" in out
    with pytest.raises(UserError, match="no machine could prepare the grid"):
        _run(g, Fake([("m1", "A")], refuse={"m1"}), tmp_path / "st3")


def test_a_machine_that_refuses_mid_grid_stops_and_gives_its_passes_back(write_grid, tmp_path):
    g = write_grid(SPREAD)
    fake = Fake([("m1", "A"), ("m2", "A")], script={("m1", 0): "refused"})
    s, out = _run(g, fake, tmp_path / "st")
    assert s.done == 8 and "stops: m1 refuses" in out
    assert {a.host.key for a in _arts(tmp_path / "st", "spread")} == {fake.hosts["m2"]["key"]}


def test_ctrl_c_on_the_cli_exits_130(write_grid, cli, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(execute, "run_grid", interrupted)
    rc, _, err = cli("run", write_grid(COMMAND_GRID))
    assert rc == 130
