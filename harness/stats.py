"""Paired A/B statistics over interleaved passes: per-pass ratios, bootstrap CI, paired test, verdict.

scipy does the tests; everything is seeded, so the same store always gives the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
BOOT_SEED = 20261129
BOOT_N = 2000


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    q1: float
    q3: float
    lo: float
    hi: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1


def summarize(values: list[float]) -> Summary:
    a = np.asarray(values, dtype=float)
    q1, med, q3 = np.percentile(a, [25, 50, 75])
    return Summary(n=len(a), median=float(med), q1=float(q1), q3=float(q3), lo=float(a.min()), hi=float(a.max()))


@dataclass(frozen=True)
class Comparison:
    n_pairs: int
    ratio_median: float
    ci_low: float
    ci_high: float
    p_value: float | None
    p_adjusted: float | None
    min_detectable: float | None
    warnings: tuple[str, ...]


def min_possible_p(n: int) -> float:
    """Smallest two-sided p-value an exact Wilcoxon signed-rank test can give with n pairs."""
    return 2.0 / (2 ** n) if n > 0 else 1.0


def median_ci(values: np.ndarray) -> tuple[float, float]:
    """Percentile bootstrap 95% CI of the median (seeded)."""
    if len(values) < 2 or np.all(values == values[0]):
        return float(np.median(values)), float(np.median(values))
    res = sps.bootstrap((values,), np.median, n_resamples=BOOT_N, confidence_level=1 - ALPHA,
                        method="percentile", random_state=np.random.default_rng(BOOT_SEED))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    med = float(np.median(values))
    return min(lo, med), max(hi, med)  # a percentile interval of the median always holds the median


def compare(arm: list[float], base: list[float]) -> Comparison:
    """Arm vs baseline, paired by pass: ratio arm/base per pass."""
    a, b = np.asarray(arm, float), np.asarray(base, float)
    ratios = a / b
    n = len(ratios)
    med = float(np.median(ratios))
    lo, hi = median_ci(ratios)
    warnings = []
    p = None
    if n >= 1 and not np.all(ratios == 1.0):
        logs = np.log(ratios)
        if np.all(logs == 0):
            p = 1.0
        else:
            p = float(sps.wilcoxon(logs, alternative="two-sided", method="exact" if n <= 25 else "auto").pvalue)
    spread = float(np.percentile(ratios, 75) - np.percentile(ratios, 25)) if n > 1 else 0.0
    if spread > 0.10:
        warnings.append(f"per-pass ratios spread widely (IQR {spread:.2f}); check host load, add passes")
    # the smallest effect these passes could detect: half-width of the CI around the median ratio
    mde = (hi - lo) / 2 if n >= 2 else None
    return Comparison(n_pairs=n, ratio_median=med, ci_low=lo, ci_high=hi, p_value=p, p_adjusted=p,
                      min_detectable=mde, warnings=tuple(warnings))


def reachable(n_pairs: int, m_comparisons: int = 1) -> bool:
    """Whether n paired passes can reach significance after Holm over m comparisons at all."""
    return min_possible_p(n_pairs) * max(1, m_comparisons) <= ALPHA


def verdict(c: Comparison, higher_is_better: bool, m_comparisons: int = 1) -> str:
    if not reachable(c.n_pairs, m_comparisons):
        return f"undetermined: {c.n_pairs} passes cannot reach p<{ALPHA} over {m_comparisons} comparison(s)"
    p = c.p_adjusted
    if p is None or p >= ALPHA or (c.ci_low <= 1.0 <= c.ci_high):
        mde = f" (smallest detectable ~{c.min_detectable * 100:.0f}%)" if c.min_detectable else ""
        return f"no difference detected{mde}"
    better = (c.ratio_median > 1) == higher_is_better
    return "better" if better else "worse"


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm-Bonferroni adjusted p-values, None left as None."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    ps = sorted(((pvalues[i], i) for i in idx), key=lambda t: t[0])  # type: ignore[arg-type, return-value]
    m = len(ps)
    out: list[float | None] = list(pvalues)
    running = 0.0
    for k, (p, i) in enumerate(ps):
        adj = min(1.0, (m - k) * p)
        running = max(running, adj)
        out[i] = running
    return out
