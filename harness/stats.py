"""Paired A/B statistics over interleaved passes: one interval per comparison, and the verdict read from it.

Each comparison is the per-pass log ratio arm/baseline. The effect is its Hodges-Lehmann estimate
(the median of the Walsh averages), reported as a ratio; its interval is the exact Wilcoxon
signed-rank interval (order statistics of the Walsh averages) at the family's level. The verdict
reads from that one interval (it excludes 1: better or worse), so test and interval agree by
construction. The family is every verdict a grid gives (or its declared primaries): Bonferroni,
each interval at 1 - alpha/m. Where n passes cannot give an interval at that level, none is
printed. Everything is exact or seeded: the same store always gives the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from functools import lru_cache

import numpy as np

ALPHA = 0.05
POWER = 0.80
POWER_SEED = 20261130
POWER_SIMS = 1000


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


def run_value(samples: list[float]) -> float:
    """The value of one run: the median of its repetitions (the same number np.percentile(.., 50) gives)."""
    import statistics
    return float(statistics.median(samples))


def quantile(x: list[float], q: float) -> float:
    """np.percentile(x, 100 q) ("linear" method, numpy's interpolation to the last bit) of a sorted list, without
    numpy's per-call overhead (the report takes thousands of them over lists of 5-20 values)."""
    pos = (len(x) - 1) * q  # numpy's virtual index for its "linear" method, same rounding
    i = int(pos)
    t = pos - i
    if t == 0.0:
        return float(x[i])
    a, b = float(x[i]), float(x[i + 1])
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def summarize(values: list[float]) -> Summary:
    x = sorted(float(v) for v in values)
    if not x:
        raise ValueError("summarize: no values")
    return Summary(n=len(x), median=quantile(x, 0.5), q1=quantile(x, 0.25), q3=quantile(x, 0.75), lo=x[0], hi=x[-1])


# --- the exact signed-rank distribution -------------------------------------------------------

@lru_cache(maxsize=None)
def signed_rank_cdf(n: int) -> np.ndarray:
    """P(T+ <= t) for t = 0..n(n+1)/2 under the null (no ties): the exact distribution of the
    Wilcoxon signed-rank statistic, by counting subsets of {1..n} with each rank sum."""
    m = n * (n + 1) // 2
    counts = np.zeros(m + 1, dtype=object)  # exact integers: 2^n overflows float precision past n ~ 50
    counts[0] = 1
    for k in range(1, n + 1):
        counts[k:] = counts[k:] + counts[:-k]  # the right side is built from the old counts first
    total = 2 ** n
    return np.array([float(c) for c in np.cumsum(counts)]) / total


def critical_k(n: int, alpha: float) -> int | None:
    """The largest k with P(T+ <= k) <= alpha/2, or None when even k = 0 exceeds it (n too small to
    give a (1 - alpha) interval: 2 / 2^n > alpha)."""
    if n < 1:
        return None
    return _largest_within(signed_rank_cdf(n), alpha)


def _largest_within(cdf: np.ndarray, alpha: float) -> int | None:
    """The largest k with cdf[k] <= alpha/2 (a two-sided interval's critical value), or None."""
    ks = np.nonzero(cdf <= alpha / 2 + 1e-15)[0]
    return int(ks[-1]) if len(ks) else None


def min_possible_p(n: int) -> float:
    """Smallest two-sided p-value an exact Wilcoxon signed-rank test can give with n pairs."""
    return 2.0 / (2 ** n) if n > 0 else 1.0


def reachable(n_pairs: int, m_comparisons: int = 1) -> bool:
    """Whether n paired passes can give a verdict at all in a family of m (an interval at 1 - alpha/m)."""
    return critical_k(n_pairs, ALPHA / max(1, m_comparisons)) is not None


def passes_needed(m_comparisons: int) -> int:
    return next(n for n in range(1, 64) if reachable(n, m_comparisons))


def walsh(x: np.ndarray) -> np.ndarray:
    """The sorted Walsh averages (x_i + x_j) / 2, i <= j."""
    i, j = np.triu_indices(len(x))
    return np.sort((x[i] + x[j]) / 2)


def signed_rank_p(x: np.ndarray) -> float:
    """Exact two-sided signed-rank p-value of x against 0, from the same distribution as the interval
    (T+ = the number of positive Walsh averages, zeros counted half)."""
    n = len(x)
    w = walsh(x)
    t_lo = int(np.sum(w > 0))  # T+ rounded down: a zero average counts against rejecting
    t_hi = int(np.sum(w >= 0))
    cdf = signed_rank_cdf(n)
    m = n * (n + 1) // 2
    p_low = cdf[t_hi]  # P(T+ <= t)
    p_high = 1.0 - (cdf[t_lo - 1] if t_lo > 0 else 0.0)  # P(T+ >= t)
    return float(min(1.0, 2 * min(p_low, p_high))) if m else 1.0


@dataclass(frozen=True)
class Comparison:
    n_pairs: int
    ratio: float  # exp(Hodges-Lehmann estimate of the log ratio)
    ci_low: float | None  # None: n too small for an interval at this level
    ci_high: float | None
    level: float  # the stated level of the interval (1 - alpha/m)
    achieved: float | None  # its exact level (>= the stated one)
    p_value: float  # exact signed-rank, unadjusted
    p_adjusted: float  # Bonferroni over the family: min(1, m p)
    m_family: int
    detectable: float | None  # effect detectable with 80% power at this n and spread (ratio - 1, +/-)
    warnings: tuple[str, ...]

    @property
    def has_interval(self) -> bool:
        return self.ci_low is not None

    @property
    def has_ratio(self) -> bool:
        """False when a value of a pair is zero or not finite (a goodput of 0 in both arms): no ratio exists."""
        return NOT_FINITE not in self.warnings and NOT_FINITE_UNPAIRED not in self.warnings

    # Backwards-compatible names
    @property
    def ratio_median(self) -> float:
        return self.ratio


def interval(logs: np.ndarray, alpha: float) -> tuple[float, float | None, float | None, float | None]:
    """(Hodges-Lehmann estimate, low, high, achieved level) of the centre of the log ratios; low/high
    None when n is too small for a (1 - alpha) interval."""
    w = walsh(logs)
    est = float(np.median(w))
    n, m = len(logs), len(w)
    k = critical_k(n, alpha)
    if k is None:
        return est, None, None, None
    achieved = 1 - 2 * float(signed_rank_cdf(n)[k])
    return est, float(w[k]), float(w[m - 1 - k]), achieved


def detectable_effect(logs: np.ndarray, alpha: float, power: float = POWER) -> float | None:
    """The smallest shift of the log ratio that a (1 - alpha) signed-rank test detects with `power`, at
    this n and the observed spread: residuals about the estimate, resampled with random signs, shifted,
    tested (seeded simulation). None when no verdict is reachable at all at this n."""
    n = len(logs)
    k = critical_k(n, alpha)
    if k is None:
        return None
    m = n * (n + 1) // 2
    resid = logs - float(np.median(walsh(logs)))
    scale = float(np.max(np.abs(resid)))
    if scale == 0:
        return 0.0
    rng = np.random.default_rng(POWER_SEED)
    draws = rng.choice(resid, size=(POWER_SIMS, n)) * rng.choice([-1.0, 1.0], size=(POWER_SIMS, n))
    i, j = np.triu_indices(n)
    # T+ at a shift counts the pair sums s + 2 shift > 0: it reaches m - k exactly when the (k+1)-th smallest
    # sum is above -2 shift, and falls to k when the (m-k)-th is not. Two columns of the sorted sums decide
    # every shift, so each step of the search is O(simulations), not O(simulations x pairs).
    sums = np.sort(draws[:, i] + draws[:, j], axis=1)
    upper, lower = sums[:, k], sums[:, m - 1 - k]

    def power_at(shift: float) -> float:
        return float(np.mean((upper > -2 * shift) | (lower <= -2 * shift)))
    lo, hi = 0.0, scale
    while power_at(hi) < power:  # grow until detected (the shift dominates the noise eventually)
        hi *= 2
        if hi > 50:
            return None
    for _ in range(12):  # to 1/4000 of the search range: finer than any figure printed
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if power_at(mid) < power else (lo, mid)
    return float(np.expm1(hi))


def compare(arm: list[float], base: list[float], m_family: int = 1, power: bool = True) -> Comparison:
    """Arm vs baseline, paired by pass (ratio arm/base per pass), in a family of m verdicts. `power`: compute
    the detectable effect where the verdict would be "no difference" (a seeded simulation)."""
    a, b = np.asarray(arm, float), np.asarray(base, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.log(a / b)
    n = len(logs)
    m_family = max(1, m_family)
    alpha = ALPHA / m_family
    if not np.all(np.isfinite(logs)):  # a zero, negative, NaN or infinite value: no ratio, no interval, no verdict
        return Comparison(n_pairs=n, ratio=float("nan"), ci_low=None, ci_high=None, level=1 - alpha, achieved=None,
                          p_value=1.0, p_adjusted=1.0, m_family=m_family, detectable=None,
                          warnings=(NOT_FINITE,))
    est, lo, hi, achieved = interval(logs, alpha)
    p = signed_rank_p(logs) if n else 1.0
    warnings = []
    ratios = np.exp(logs)
    sr = sorted(ratios.tolist())
    spread = quantile(sr, 0.75) - quantile(sr, 0.25) if n > 1 else 0.0
    if spread > 0.10:
        warnings.append(f"per-pass ratios spread widely (IQR {spread:.2f}); check host load, add passes")
    # the power figure is what a "no difference" verdict says; only such comparisons (interval holding 0) need it
    null_inside = lo is not None and hi is not None and lo <= 0.0 <= hi
    return Comparison(n_pairs=n, ratio=float(np.exp(est)), ci_low=None if lo is None else float(np.exp(lo)),
                      ci_high=None if hi is None else float(np.exp(hi)), level=1 - alpha, achieved=achieved,
                      p_value=p, p_adjusted=min(1.0, p * m_family), m_family=m_family,
                      detectable=detectable_effect(logs, alpha) if power and null_inside else None, warnings=tuple(warnings))


NOT_FINITE = "a per-pass ratio is not a finite positive number (a zero, negative, NaN or infinite value)"


def verdict(c: Comparison, higher_is_better: bool) -> str:
    """Read from the comparison's one interval: it excludes 1 (better or worse), or it does not."""
    return _read(c, higher_is_better, NOT_FINITE if NOT_FINITE in c.warnings else None,
                 f"{c.n_pairs} passes cannot give a {level_text(c.level)} interval (family of {c.m_family}); "
                 f"run at least {passes_needed(c.m_family)} passes",
                 "" if c.detectable is None else f" (80% power to detect +/-{c.detectable * 100:.0f}%)")


def _read(c: Any, higher_is_better: bool, bad: str | None, no_interval: str, power: str = "") -> str:
    """The verdict words of an interval of a ratio (c: ratio, ci_low, ci_high, has_interval)."""
    if bad:
        return f"undetermined: {bad}"
    if not c.has_interval:
        return f"undetermined: {no_interval}"
    if c.ci_low <= 1.0 <= c.ci_high:
        return f"no difference detected{power}"
    return "better" if (c.ratio > 1) == higher_is_better else "worse"


def level_text(level: float) -> str:
    pct = level * 100
    return f"{pct:.1f}%" if round(pct, 1) != round(pct) else f"{pct:.0f}%"


def order_statistic_ci(values: np.ndarray, alpha: float = ALPHA) -> tuple[float, float] | None:
    """Exact distribution-free (1 - alpha) interval of a median: order statistics whose binomial
    coverage is at least 1 - alpha. None when n is too small (n < 6 at 95%)."""
    from math import comb
    x = np.sort(np.asarray(values, float))
    n = len(x)
    best = None
    tail = 0
    for j in range(n // 2):  # interval [x_(j+1), x_(n-j)], 1-based; P(Binomial(n, 1/2) <= j) on each side
        tail += comb(n, j)
        if 1 - 2 * tail / 2 ** n >= 1 - alpha:
            best = (float(x[j]), float(x[n - 1 - j]))
        else:
            break
    return best


def _binom_tail_ge(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (no overflow at large n)."""
    from math import exp, lgamma, log, log1p
    if p <= 0.0:
        return 1.0 if k <= 0 else 0.0
    if p >= 1.0:
        return 1.0
    lp, lq, c = log(p), log1p(-p), lgamma(n + 1)
    return min(1.0, sum(exp(c - lgamma(i + 1) - lgamma(n - i + 1) + i * lp + (n - i) * lq) for i in range(k, n + 1)))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of a rate k/n: the p where P(X >= k) and P(X <= k) reach (1 - level)/2, each
    found by bisection on the binomial tail (monotone in p) to 1e-12. The same interval as the beta quantiles
    scipy.special.betaincinv gives (tests/test_stats.py compares them), without importing scipy into the report."""
    a = (1 - level) / 2

    def solve(f, target: float) -> float:  # f increases in p
        lo, hi = 0.0, 1.0
        while hi - lo > 1e-12:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
        return (lo + hi) / 2
    low = 0.0 if k == 0 else solve(lambda p: _binom_tail_ge(k, n, p), a)
    high = 1.0 if k == n else solve(lambda p: _binom_tail_ge(k + 1, n, p), 1.0 - a)  # P(X <= k) = a
    return low, high


def median_ci(values: np.ndarray) -> tuple[float, float]:
    """Band for plots: the exact 95% order-statistic interval of the median, or the range when n is too
    small for one (drawn, never printed as an interval)."""
    ci = order_statistic_ci(values)
    return ci if ci is not None else (float(np.min(values)), float(np.max(values)))


def sign_test_p(above: int, below: int) -> float:
    """Two-sided exact sign test: how often `above` and `below` would split at least this unevenly if each
    were equally likely (ties dropped before). 1.0 with no observations."""
    n = above + below
    if n == 0:
        return 1.0
    k = min(above, below)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


# --- unpaired: two series that are not arms of one grid (harness compare) ----------------------------------------

@lru_cache(maxsize=None)
def mann_whitney_cdf(m: int, n: int) -> np.ndarray:
    """P(U <= u) for u = 0..m n under the null (no ties): the exact distribution of the Mann-Whitney statistic,
    by counting the arrangements of m and n values with each U (exact integers, as signed_rank_cdf)."""
    rows = [np.array([1], dtype=object)] * (n + 1)  # i = 0: one arrangement with U = 0, for every j
    for i in range(1, m + 1):
        new = [np.zeros(1, dtype=object)]  # j = 0: U = 0 only
        new[0][0] = 1
        for j in range(1, n + 1):
            size = i * j + 1
            c = np.zeros(size, dtype=object)
            left = new[j - 1]  # the largest value is from the second sample: U unchanged
            c[:len(left)] += left
            up = rows[j]  # it is from the first sample: each of the j second values is below it, U + j
            c[j:j + len(up)] += up
            new.append(c)
        rows = new
    counts = rows[n]
    total = sum(counts)
    return np.array([float(x) for x in np.cumsum(counts)]) / float(total)


def unpaired_critical_k(m: int, n: int, alpha: float) -> int | None:
    """The largest k with P(U <= k) <= alpha/2, or None when even U = 0 exceeds it (too few runs)."""
    if m < 1 or n < 1:
        return None
    return _largest_within(mann_whitney_cdf(m, n), alpha)


def unpaired_needed(m_comparisons: int) -> int:
    """The fewest runs per side (equal sizes) whose exact interval reaches 1 - alpha/m."""
    return next(n for n in range(1, 64) if unpaired_critical_k(n, n, ALPHA / max(1, m_comparisons)) is not None)


@dataclass(frozen=True)
class UnpairedComparison:
    n_a: int
    n_b: int
    ratio: float  # exp(Hodges-Lehmann shift of log b - log a): b / a
    ci_low: float | None
    ci_high: float | None
    level: float
    achieved: float | None
    m_family: int
    warnings: tuple[str, ...]

    @property
    def has_interval(self) -> bool:
        return self.ci_low is not None


def compare_unpaired(b: list[float], a: list[float], m_family: int = 1) -> UnpairedComparison:
    """b against a, unpaired (runs of two series: other hosts, other versions of a grid): the Hodges-Lehmann shift
    of the log values (the median of every log b_j - log a_i) with its exact distribution-free interval, the
    differences of ranks k+1 and mn-k where k is the Mann-Whitney critical value at alpha/2 (Lehmann 1963;
    Bauer 1972). The shift model: b is a scaled by a constant factor; the interval covers that factor at its
    level whatever the two samples' common shape (docs/methodology.md, "Comparing two series")."""
    x, y = np.asarray(a, float), np.asarray(b, float)
    m_family = max(1, m_family)
    alpha = ALPHA / m_family
    if len(x) == 0 or len(y) == 0 or not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))
                                          and np.all(x > 0) and np.all(y > 0)):
        return UnpairedComparison(len(x), len(y), float("nan"), None, None, 1 - alpha, None, m_family,
                                  (NOT_FINITE_UNPAIRED,))
    d = np.sort((np.log(y)[None, :] - np.log(x)[:, None]).ravel())
    est = float(np.median(d))
    k = unpaired_critical_k(len(x), len(y), alpha)
    warnings = []
    if len(np.unique(np.concatenate([x, y]))) < len(x) + len(y):
        warnings.append("tied values: the exact interval assumes none (its level is approximate)")
    if k is None:
        return UnpairedComparison(len(x), len(y), float(np.exp(est)), None, None, 1 - alpha, None, m_family,
                                  tuple(warnings))
    achieved = 1 - 2 * float(mann_whitney_cdf(len(x), len(y))[k])
    return UnpairedComparison(len(x), len(y), float(np.exp(est)), float(np.exp(d[k])), float(np.exp(d[len(d) - 1 - k])),
                              1 - alpha, achieved, m_family, tuple(warnings))


NOT_FINITE_UNPAIRED = "a run value is not a finite positive number (a zero, negative, NaN or infinite value)"


def unpaired_verdict(c: UnpairedComparison, higher_is_better: bool) -> str:
    """The paired verdict's words (verdict), read from the unpaired interval."""
    return _read(c, higher_is_better, NOT_FINITE_UNPAIRED if NOT_FINITE_UNPAIRED in c.warnings else None,
                 f"{c.n_a} and {c.n_b} runs cannot give a {level_text(c.level)} interval (family of {c.m_family}); "
                 f"run at least {unpaired_needed(c.m_family)} passes on each side")
