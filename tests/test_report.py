"""Golden test: a small committed store and the exact markdown it must render; statistics on known cases."""

import numpy as np
import pytest
from scipy import stats as sps

from harness import report, stats
from harness.paths import PROJECT_ROOT

GOLDEN = PROJECT_ROOT / "tests" / "golden"


def test_golden_markdown(monkeypatch):
    monkeypatch.chdir(GOLDEN)
    assert report.render(["store"]) == (GOLDEN / "results.md").read_text()


def test_render_is_deterministic(monkeypatch):
    monkeypatch.chdir(GOLDEN)
    assert report.render(["store"]) == report.render(["store"])


def test_signed_rank_p_matches_scipy_exact():
    a = [1.10, 1.05, 1.07, 1.12, 1.09, 1.06, 1.08, 1.11]
    b = [1.0] * 8
    c = stats.compare(a, b)
    assert c.p_value == pytest.approx(sps.wilcoxon(np.log(a), method="exact").pvalue)
    assert c.p_value == pytest.approx(2 / 2 ** 8)  # all 8 ratios above 1: the exact two-sided minimum
    assert c.ci_low <= c.ratio <= c.ci_high and c.ci_low > 1
    assert stats.verdict(c, True) == "better" and stats.verdict(c, False) == "worse"


def test_identical_samples_no_difference():
    c = stats.compare([2.0] * 8, [2.0] * 8)
    assert c.ratio == 1.0 and stats.verdict(c, True).startswith("no difference detected")


def test_too_few_passes_give_no_interval_and_no_verdict():
    c = stats.compare([1.5, 1.6], [1.0, 1.0])
    assert not c.has_interval and c.ci_low is None
    assert stats.verdict(c, True).startswith("undetermined")
    # 2/2^n <= 0.05/m: 6 passes for one comparison, 9 for twelve, 10 for fourteen
    assert [stats.passes_needed(m) for m in (1, 2, 12, 14)] == [6, 7, 9, 10]
    assert not stats.reachable(6, 2) and stats.reachable(6, 1) and stats.reachable(8, 3)


def test_summary_known_values():
    s = stats.summarize([1, 2, 3, 4, 5])
    assert (s.median, s.q1, s.q3, s.lo, s.hi, s.n) == (3, 2, 4, 1, 5, 5)


from hypothesis import given, settings
from hypothesis import strategies as st

ENOUGH = stats.passes_needed(1)  # 6: from here on every comparison has an interval
ratio = st.floats(0.5, 2.0, allow_nan=False)


@settings(max_examples=50, deadline=None)
@given(a=st.lists(ratio, min_size=ENOUGH, max_size=12))
def test_ratio_interval_contains_the_estimate(a):
    c = stats.compare(a, [1.0] * len(a))
    assert c.has_interval and c.ci_low <= c.ratio <= c.ci_high


@settings(max_examples=20, deadline=None)
@given(a=st.lists(ratio, min_size=1, max_size=ENOUGH - 1))
def test_fewer_passes_never_give_an_interval(a):
    c = stats.compare(a, [1.0] * len(a))
    assert not c.has_interval and stats.verdict(c, True).startswith("undetermined")


@settings(max_examples=30, deadline=None)
@given(a=st.lists(st.floats(0.1, 100, allow_nan=False), min_size=2, max_size=12))
def test_aa_identical_samples_never_differ(a):
    c = stats.compare(a, list(a))
    assert stats.verdict(c, True).startswith(("no difference", "undetermined"))


def test_other_load_measure():
    from harness import provenance
    before = {"machine_busy_s": 10.0, "own_s": 1.0}
    after = {"machine_busy_s": 14.0, "own_s": 3.0}
    o = provenance.other_load(before, after, 4.0)
    assert o["other_cores"] == 0.5  # 4 busy s, 2 of them ours, over 4 s


def _runtime_decode_targets():
    """The targets grids/runtime-decode.yaml declares (its `report:` field)."""
    from harness import views
    from harness.grid import read_yaml
    spec, problem = views.of_series("runtime-decode", "grids/runtime-decode.yaml", read_yaml)
    assert not problem and spec.targets
    return spec.targets


def test_targets_are_checked_by_their_interval():
    """A target is met only when the whole paired interval is at or above it, not met when wholly below."""
    from types import SimpleNamespace as NS
    from harness import report

    def art(arm, p, v):
        return NS(status="ok", metrics={"decode_tok_s": NS(samples=[v])}, grid=NS(arm=arm, cell="c", pass_index=p))
    ref = [art("llama.cpp-f32", p, 20.0 + p % 2) for p in range(7)]
    fast = [art("vllm-fp32-both", p, 16.0 + 0.1 * p) for p in range(7)]
    slow = [art("vllm-fp32", p, 8.0 + 0.1 * p) for p in range(7)]
    lines = report.targets_block(_runtime_decode_targets(), ref + fast + slow)
    assert len(lines) == 2
    assert lines[0].startswith("vllm-fp32 / llama.cpp-f32 decode_tok_s: 0.4") and lines[0].endswith(": not met.")
    assert lines[1].startswith("vllm-fp32-both / llama.cpp-f32") and lines[1].endswith(": met.")
    assert "7 passes paired" in lines[1] and "(#17)" in lines[1]
    assert report.targets_block((), ref + fast) == []


def test_forward_bound_says_whether_overhead_outside_the_forward_can_reach_a_target():
    """Arms that timed their steps get a second line: the decode rate with nothing but the forward left
    (1000 / forward ms), paired against the reference: below the target even then means the forward itself
    must get faster."""
    from types import SimpleNamespace as NS
    from harness import report

    def art(arm, p, v, fwd_ms=None, kernel_ms=None):
        inside = None if kernel_ms is None else {"linear_kernel": NS(mean_ms=kernel_ms)}
        att = None if fwd_ms is None else NS(parts={"forward": NS(mean_ms=fwd_ms)}, inside_forward=inside)
        return NS(status="ok", metrics={"decode_tok_s": NS(samples=[v])}, attribution=att,
                  grid=NS(arm=arm, cell="c", pass_index=p))
    ref = [art("llama.cpp-f32", p, 20.0 + p % 2) for p in range(7)]
    slow = [art("vllm-fp32", p, 8.0 + 0.1 * p, fwd_ms=110.0 - p) for p in range(7)]  # at most ~9.5 tok/s
    near = [art("vllm-fp32-both", p, 11.0 + 0.1 * p, fwd_ms=40.0 + p) for p in range(7)]  # 22-25 tok/s
    lines = report.targets_block(_runtime_decode_targets(), ref + slow + near)
    assert len(lines) == 4
    bound = [ln for ln in lines if "with nothing but its forward" in ln]
    assert bound[0].startswith("vllm-fp32 with nothing but its forward (107.0 ms a step)")
    assert bound[0].endswith("what is left is inside the forward.")
    assert bound[1].startswith("vllm-fp32-both with nothing but its forward")
    assert bound[1].endswith("within reach of removing the time outside the forward.")
    # an arm whose kernel timed itself inside the forward gets a third line: nothing but the kernel left
    gemv = [art("vllm-fp32-both", p, 11.0 + 0.1 * p, fwd_ms=60.0 + p, kernel_ms=30.0 + 0.2 * p) for p in range(7)]
    lines = report.targets_block(_runtime_decode_targets(), ref + gemv)
    (kern,) = [ln for ln in lines if "nothing but its linear layers' kernel" in ln]
    assert kern.startswith("vllm-fp32-both with nothing but its linear layers' kernel (30.6 ms a step)")
    assert kern.endswith("within reach of the kernel alone.")
    assert "(95%)" in kern  # the family is the target's arms the series measured: one here
    # untimed arms give no bound
    assert not any("nothing but" in ln for ln in report.targets_block(_runtime_decode_targets(), ref + [
        art("vllm-fp32", p, 8.0) for p in range(7)]))


def _analysis_rows() -> list[dict]:
    """The golden store's series through the analysis layer (harness/analysis.py), as plain rows: the figures a
    page words, at 9 significant digits (the last bits of a log or exp may differ between CPUs)."""
    from harness import analysis
    c = report.collect(["store"])
    out = []
    for name, arts in sorted(c.runs.items()):
        an = analysis.analyse(analysis.newest_series(arts), power=False)
        for r in an.rows:
            cmp_ = r.comparison
            out.append({"grid": name, "cell": r.cell, "arm": r.arm, "metric": r.metric, "role": r.role,
                        "median": float(f"{r.summary.median:.9g}"), "n": r.summary.n,
                        "median_ci": [float(f"{x:.9g}") for x in r.median_ci],
                        "ratio": None if cmp_ is None else float(f"{cmp_.ratio:.9g}"),
                        "interval": None if cmp_ is None or not cmp_.has_interval else
                        [float(f"{cmp_.ci_low:.9g}"), float(f"{cmp_.ci_high:.9g}")],
                        "p": None if cmp_ is None else float(f"{cmp_.p_value:.9g}"), "verdict": r.verdict})
    return out


def test_golden_analysis_rows(monkeypatch):
    """The analysis layer's own golden file (tests/golden/analysis.json): the page's figures before wording."""
    import json
    monkeypatch.chdir(GOLDEN)
    assert _analysis_rows() == json.loads((GOLDEN / "analysis.json").read_text())


def test_the_answer_says_what_moved_against_the_previous_series():
    from harness.analysis import BetweenRow, SeriesFigure
    from harness.report.sections import _changed

    def fig(label, med, lo, hi, sha):
        return SeriesFigure(label=label, median=med, median_ci=(lo, hi), ratio=None, ratio_ci=None, sha=sha)
    moved = BetweenRow(cell="batch=1,threads=2", arm="a", metric="decode_tok_s", spread=1.2, disjoint=["medians"],
                       series=[fig("old", 10.0, 9.5, 10.5, "o"), fig("new", 12.0, 11.5, 12.5, "n")])
    held = BetweenRow(cell="batch=1,threads=2", arm="b", metric="decode_tok_s", spread=1.0, disjoint=[],
                      series=[fig("old", 10.0, 9.0, 11.0, "o"), fig("new", 10.5, 9.5, 11.5, "n")])
    gone = BetweenRow(cell="batch=1,threads=4", arm="b", metric="decode_tok_s", spread=1.0, disjoint=[],
                      series=[fig("older", 10.0, 9.0, 11.0, "x"), fig("old", 20.0, 19.0, 21.0, "o")])
    line = _changed([moved, held, gone], "n")
    assert line == ("against the previous series (old): 1 of 2 decode and prefill medians moved beyond both 95% "
                    "intervals: decode_tok_s a at threads=2: 10.00 to 12.00")
    assert "no decode or prefill median moved" in _changed([held], "n") and _changed([gone], "n") == ""
