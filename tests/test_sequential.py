"""Sequential passes (harness/sequential.py): `passes: {until: verdict, max: N}` runs passes until every declared
comparison has its verdict, looking only at planned looks, each interval at 1 - alpha/(m K); the report reads a
series at its last look. The level under stopping at the first verdict is the coverage simulation's
(harness/coverage.py), checked here against naive peeking, which does not keep it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import coverage, sequential, stats
from harness.grid import load

GRID = """
name: seq
arms:
  - {{name: fast, engine: command, cpus: [0], options: {{cmd: "true"}}}}
  - {{name: slow, engine: command, cpus: [0], options: {{cmd: "sleep 0.2"}}}}
baseline: fast
workload: {{prompt_len: 1, context_len: 1, gen_len: 1}}
threads: 1
passes: {passes}
repetitions: 1
warmups: 0
timeout_s: 30
"""


def _grid(tmp_path: Path, passes: str) -> Path:
    g = tmp_path / "seq.yaml"
    g.write_text(GRID.format(passes=passes))
    return g


def test_looks_are_planned_so_that_the_first_can_give_a_verdict():
    assert sequential.schedule(8, 48) == [8, 12, 18, 27, 41, 48]
    for m in (1, 4, 48):
        looks = sequential.default_looks(m, 64)
        assert looks[-1] == 64 and looks == sorted(set(looks))
        assert stats.reachable(looks[0], m * len(looks))  # the first look can answer at the level it is read at
    assert sequential.trim(20, (8, 12, 18, 24)) == 18 and sequential.trim(5, (8, 12)) == 5
    assert sequential.trim(20, None) == 20 and sequential.factor((8, 12, 18)) == 3 and sequential.factor(None) == 1


def test_a_sequential_grid_plans_its_looks_and_says_the_level(tmp_path, cli):
    spec = load(_grid(tmp_path, "{until: verdict, max: 24}"))
    assert spec.passes == 24 and spec.looks == (8, 12, 18, 24)
    assert load(_grid(tmp_path, "{until: verdict, max: 30, looks: [10, 20]}")).looks == (10, 20, 30)
    rc, out, _ = cli("plan", _grid(tmp_path, "{until: verdict, max: 24}"))
    assert rc == 0 and "looks at 8, 12, 18, 24 passes" in out and "Bonferroni over 1 x 4 looks" in out


@pytest.mark.parametrize("passes, says", [
    ("{until: never, max: 24}", "passes.until"),
    ("{until: verdict}", "passes.max"),
    ("{until: verdict, max: 1}", "passes.max"),
    ("{until: verdict, max: 24, looks: [12, 8]}", "must increase"),
    ("{until: verdict, max: 24, looks: [30]}", "passes.looks[0]"),
    ("{until: verdict, max: 24, every: 2}", "passes.every"),
    ("{until: verdict, max: 5}", "raise max to"),
])
def test_a_bad_sequential_design_is_one_line_exit_2(tmp_path, cli, passes, says):
    rc, _, err = cli("plan", _grid(tmp_path, passes))
    assert rc == 2 and says in err and len(err.strip().splitlines()) == 1 and "seq.yaml" in err, err


def test_a_clear_difference_stops_at_the_first_look_and_a_rerun_runs_nothing(tmp_path, cli):
    g = _grid(tmp_path, "{until: verdict, max: 12}")
    store = tmp_path / "store"
    rc, _, err = cli("run", g, "--store", store)
    assert rc == 0 and "look 1 of 3 at 7 passes: 1 of 1 declared comparisons have a verdict; every one has: " \
        "stopping" in err, err
    arts = [json.loads(p.read_text()) for p in (store / "seq").glob("*.json")]
    assert len(arts) == 14 and {a["grid"]["pass_index"] for a in arts} == set(range(7))
    assert all(a["grid"]["looks"] == [7, 11, 12] for a in arts)
    rc, _, err = cli("run", g, "--store", store)
    assert rc == 0 and "0 ok, 0 failed, 14 skipped" in err
    from harness.analysis import analyse
    from harness.store import Store
    an = analyse(Store(store).load_grid("seq"))
    (row,) = [r for r in an.rows if r.role == "family"]
    assert row.comparison.m_family == 3 and an.level == 1 - 0.05 / 3 and row.comparison.n_pairs == 7
    assert stats.verdict(row.comparison, row.higher_is_better) == "worse"


def test_stopping_at_the_first_verdict_keeps_the_level_and_peeking_does_not():
    """The simulation behind docs/methodology.md's table, smaller: under no effect, the design's false verdicts
    stay within 5% (plus the simulation's error) while naive peeking at 95% intervals makes several times more;
    under a 3% effect the design stops, on average, well before the fixed passes of the same power."""
    rows = coverage.sequential_table(sims=800)
    for r in rows:
        if r["effect"] == 0:
            assert 1 - r["design"]["coverage"] <= 0.05 + 0.025, r
            assert 1 - r["peeking"]["coverage"] >= 2 * (1 - r["design"]["coverage"]), r
        else:
            assert r["design"]["coverage"] >= 0.95 - 0.025 and r["design"]["mean_passes"] < r["fixed_passes"], r
