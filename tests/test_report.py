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

ratios = st.lists(st.floats(0.5, 2.0, allow_nan=False), min_size=2, max_size=12)


@settings(max_examples=50, deadline=None)
@given(a=ratios)
def test_ratio_interval_contains_the_estimate(a):
    c = stats.compare(a, [1.0] * len(a))
    if c.has_interval:
        assert c.ci_low <= c.ratio <= c.ci_high


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


def test_targets_are_checked_by_their_interval():
    """A target is met only when the whole paired interval is at or above it, not met when wholly below."""
    from types import SimpleNamespace as NS
    from harness import report

    def art(arm, p, v):
        return NS(status="ok", metrics={"decode_tok_s": NS(samples=[v])}, grid=NS(arm=arm, cell="c", pass_index=p))
    ref = [art("llama.cpp-f32", p, 20.0 + p % 2) for p in range(7)]
    fast = [art("vllm-fp32-both", p, 16.0 + 0.1 * p) for p in range(7)]
    slow = [art("vllm-fp32", p, 8.0 + 0.1 * p) for p in range(7)]
    lines = report.targets_block("runtime-decode", ref + fast + slow)
    assert len(lines) == 2
    assert lines[0].startswith("vllm-fp32 / llama.cpp-f32 decode_tok_s: 0.4") and lines[0].endswith(": not met.")
    assert lines[1].startswith("vllm-fp32-both / llama.cpp-f32") and lines[1].endswith(": met.")
    assert "7 passes paired" in lines[1] and "(#17)" in lines[1]
    assert report.targets_block("other-grid", ref + fast) == []
