"""The summary (harness/summary.py) on the published store: what it reads, what it leaves out, and each entry's
ratio recomputed from the store's own runs."""

from __future__ import annotations

import pytest

from harness import analysis, report, stats, summary
from harness.paths import PROJECT_ROOT


@pytest.fixture(scope="module")
def published():
    c = report.collect([str(PROJECT_ROOT / "artifacts"), str(PROJECT_ROOT / "baselines")])
    newest = analysis.newest_by_grid_and_host(c.runs)
    gates = analysis.fidelity_gates([a for arts in c.fidelity.values() for a in arts])
    legacy = {h["key"] for h in report.hosts_rows(c) if h["identity"].startswith("legacy")}
    return newest, gates, legacy


def test_each_entry_is_the_paired_ratio_of_its_series_against_llamacpp_f32(published):
    newest, gates, legacy = published
    rows = summary.summarize(newest, gates, legacy)
    assert rows and not {r.host for r in rows} & legacy  # a host whose identity was not recorded: left out
    refs = summary.reference_forms()
    assert list(refs.values()) == ["gguf-f32"]
    checked = 0
    for r in rows:
        for metric, b in r.best.items():
            series = newest[(b.grid, r.host)]
            runs = {(a.grid.arm, a.grid.pass_index): a for a in sorted(series, key=lambda a: a.timing.end)
                    if a.status == "ok" and a.grid.cell == b.cell and metric in a.metrics}
            ref_arm = next(arm for (arm, _), a in runs.items() if refs.get(a.engine.name) == a.model.form)
            passes = sorted(p for arm, p in runs if arm == b.arm and (ref_arm, p) in runs)
            vals = [stats.run_value(runs[(b.arm, p)].metrics[metric].samples) for p in passes]
            assert b.median == stats.summarize(vals).median
            if b.reference:
                assert b.comparison is None and b.verdict == "reference"
                continue
            ref = [stats.run_value(runs[(ref_arm, p)].metrics[metric].samples) for p in passes]
            again = stats.compare(vals, ref, b.comparison.m_family, power=False)
            assert (again.ratio, again.ci_low, again.ci_high) == (b.comparison.ratio, b.comparison.ci_low,
                                                                   b.comparison.ci_high)
            if b.fidelity in ("pass", "n/a", "synthetic weights"):
                assert b.verdict == stats.verdict(again, b.higher_is_better)
            else:
                assert b.verdict == f"fidelity {b.fidelity}"
            checked += 1
    assert checked >= 6


def test_a_failed_build_is_not_the_best_form_while_a_sound_one_exists(published):
    newest, gates, legacy = published
    cands = summary.candidates(newest, gates, legacy)
    failed = {(c.host, c.model, c.engine, c.metric) for c in cands if c.fidelity == "fail"}
    sound = {(c.host, c.model, c.engine, c.metric) for c in cands if c.fidelity != "fail"}
    assert failed & sound, "the published store has a build that failed fidelity beside sound ones"
    for r in summary.summarize(newest, gates, legacy):
        for metric, b in r.best.items():
            if (r.host, r.model, r.engine, metric) in sound:
                assert b.fidelity != "fail"


def test_dirty_series_and_emulated_runs_are_left_out(published):
    newest, gates, legacy = published
    cands = summary.candidates(newest, gates, legacy)
    assert cands
    dirty = {k for k, s in newest.items() if any(a.harness.dirty for a in s)}
    assert not {(c.grid, c.host) for c in cands} & dirty
    emulated = {a.host.key for s in newest.values() for a in s if a.host.emulation}
    assert emulated and not {c.host for c in cands} & emulated
    # with every host legacy, nothing is left to summarize
    assert summary.summarize(newest, gates, {h for _, h in newest}) == []
