"""The report's statistics keep their promise: exact signed-rank distribution, interval and test agree,
stated coverage holds at the pass counts used, A/A families stay under 5%, the docs table is regenerated."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from harness import coverage, stats
from harness.paths import PROJECT_ROOT


@pytest.mark.parametrize("n", [1, 2, 5, 8, 12])
def test_exact_distribution_matches_scipy(n):
    rng = np.random.default_rng(n)
    x = rng.normal(0.02, 0.05, n)
    assert stats.signed_rank_p(x) == pytest.approx(sps.wilcoxon(x, method="exact").pvalue)  # n=1: both 1.0
    cdf = stats.signed_rank_cdf(n)
    assert cdf[-1] == pytest.approx(1.0) and cdf[0] == pytest.approx(2.0 ** -n)


@settings(max_examples=200, deadline=None)
@given(logs=st.lists(st.floats(-0.3, 0.3, allow_nan=False), min_size=5, max_size=14, unique=True),
       m=st.integers(1, 14))
def test_verdict_and_adjusted_p_read_the_same_interval(logs, m):
    x = np.exp(np.asarray(logs))
    c = stats.compare(list(x), [1.0] * len(x), m)
    if not c.has_interval:
        assert stats.min_possible_p(len(x)) * m > stats.ALPHA
        return
    assume(not np.any(stats.walsh(np.asarray(logs)) == 0))  # a Walsh average exactly at the null: a tie
    excludes = c.ci_low > 1.0 or c.ci_high < 1.0
    assert excludes == (c.p_adjusted <= stats.ALPHA)


@pytest.mark.parametrize("model", coverage.MODELS)
def test_stated_95_intervals_cover_at_least_94_percent(model):
    ns = range(6, 11, 2)
    rows = [r for r in coverage.coverage_table(ns=ns, sims=3000, boot_sims=20) if r["model"] == model]
    assert sorted(r["n"] for r in rows) == list(ns)
    for r in rows:
        assert r["coverage"] >= 0.94, r


def test_aa_families_stay_under_5_percent():
    rows = coverage.aa_table(m=12, ns=(9, 12), sims=3000)
    assert len(rows) == 2 * len(coverage.MODELS)  # every model at both pass counts (9 reach a verdict in 12)
    for r in rows:
        assert r["fwer"] <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 3000), r


def test_power_figure_grows_with_noise_and_shrinks_with_passes():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 0.02, 10)
    d = stats.detectable_effect(x, 0.05)
    assert 0 < d < stats.detectable_effect(4 * x, 0.05)  # the same residuals, four times the spread
    assert stats.detectable_effect(np.tile(x, 2), 0.05) < d  # the same spread over twice the passes
    assert stats.detectable_effect(x[:4], 0.05) is None  # no verdict reachable at n=4


def test_methodology_coverage_table_is_what_the_simulation_gives():
    text = (PROJECT_ROOT / "docs" / "methodology.md").read_text()
    block = text[text.index(coverage.BEGIN):text.index(coverage.END) + len(coverage.END)]
    assert block == coverage.markdown(coverage.coverage_table(), coverage.aa_table(), coverage.sequential_table()), \
        "run: python -m harness.coverage --write docs/methodology.md"


def test_coverage_write_refuses_a_file_without_markers(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text("kept\n")
    assert coverage.main(["--write", str(doc)]) == 2
    err = capsys.readouterr().err
    assert str(doc) in err and "markers" in err and len(err.strip().splitlines()) == 1
    assert doc.read_text() == "kept\n"


@given(st.lists(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False), min_size=1, max_size=40),
       st.sampled_from([0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95]))
def test_quantile_is_numpys_to_the_last_bit(values, q):
    import numpy as np
    from harness.stats import quantile
    assert quantile(sorted(values), q) == float(np.quantile(values, q))


@given(st.integers(min_value=1, max_value=300), st.data())
def test_clopper_pearson_matches_scipys_beta_quantiles(n, data):
    from scipy.special import betaincinv
    k = data.draw(st.integers(min_value=0, max_value=n))
    lo, hi = stats.clopper_pearson(k, n)
    want_lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, 0.025))
    want_hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 0.975))
    assert abs(lo - want_lo) < 1e-9 and abs(hi - want_hi) < 1e-9
