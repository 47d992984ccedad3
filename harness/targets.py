"""Targets a grid's file declares (`report: {targets: [...]}`, harness/views.py), checked from the store by an
interval, never by hand: each target arm against the reference arm, paired by pass in each cell (a family of the
target's arms the series measured), and, for decode, the upper bounds of what removing the time outside the
forward (or everything but the linear kernel) could give. Typed rows; the report words them (harness/report/)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterator

from harness import stats
from harness.views import Target


@dataclass(frozen=True)
class TargetRow:
    target: Target
    arm: str
    cell: str
    comparison: stats.Comparison
    status: str  # met | not met | undecided (the interval holds the target) | undecided (too few passes ...)
    bound: str | None = None  # None: the arm's own metric; "forward" or "linear_kernel": nothing but that left
    step_ms: float | None = None  # the bound's median ms per decode step


# Each bound: the part left, and its status words (met, not met, undecided).
BOUNDS = (("forward", ("the target is within reach of removing the time outside the forward",
                       "below the target even with no time outside the forward: what is left is inside the forward",
                       "undecided (the interval holds the target)")),
          ("linear_kernel", ("the target is within reach of the kernel alone",
                             "below the target even with nothing but the kernel: the kernel itself is too slow",
                             "undecided (the interval holds the target)")))
PLAIN = ("met", "not met", "undecided (the interval holds the target)")
TOO_FEW = "undecided (too few passes for an interval)"


def _paired(t: Target, vals: dict[str, dict[tuple[str, int], float]], ref: dict[tuple[str, int], float],
            labels: tuple[str, str, str]) -> Iterator[tuple[str, str, list, stats.Comparison, str]]:
    """Per target arm and cell: (arm, cell, the paired keys, the comparison, the status against the target). The
    family is the target's arms that this series measured (a series may run fewer of them)."""
    family = max(1, sum(1 for arm in t.arms if vals.get(arm)))
    for arm in t.arms:
        for cell in sorted({c for c, _ in vals.get(arm, {})}):
            keys = sorted(k for k in set(vals[arm]) & set(ref) if k[0] == cell)
            if not keys:
                continue
            c = stats.compare([vals[arm][k] for k in keys], [ref[k] for k in keys], family, power=False)
            if c.ci_low is None or c.ci_high is None:
                status = TOO_FEW
            else:
                status = labels[0] if c.ci_low >= t.at_least else labels[1] if c.ci_high < t.at_least else labels[2]
            yield arm, cell, keys, c, status


def _step_ms(a: Any, source: str) -> float | None:
    """A run's mean ms per decode step of `source`: "forward" (the part) or "linear_kernel" (inside the forward)."""
    att = getattr(a, "attribution", None)
    if att is None:
        return None
    part = att.parts.get("forward") if source == "forward" else (getattr(att, "inside_forward", None) or {}).get(source)
    return part.mean_ms if part is not None and part.mean_ms else None


def check(targets: tuple[Target, ...], arts: list) -> list[TargetRow]:
    """Every target of a series: its arms' rows, then (decode targets) each arm's bounds where its runs timed
    their steps: the decode rate with nothing but the forward left (1000 / its mean forward ms per step), and
    where they timed the linear kernel inside the forward, with nothing but that kernel left, each paired by pass
    against the reference's decode rate. Upper bounds: when even an interval lies below the target, what is left
    is in what remains."""
    out = []
    for t in targets:
        vals: dict[str, dict[tuple[str, int], float]] = defaultdict(dict)
        for a in arts:
            if a.status == "ok" and t.metric in a.metrics:
                vals[a.grid.arm][(a.grid.cell, a.grid.pass_index)] = stats.run_value(a.metrics[t.metric].samples)
        ref = vals.get(t.against, {})
        for arm, cell, _, c, status in _paired(t, vals, ref, PLAIN):
            out.append(TargetRow(target=t, arm=arm, cell=cell, comparison=c, status=status))
        if t.metric != "decode_tok_s":
            continue
        for source, labels in BOUNDS:
            rate: dict[str, dict[tuple[str, int], float]] = defaultdict(dict)
            for a in arts:
                ms = _step_ms(a, source) if a.status == "ok" and a.grid.arm in t.arms else None
                if ms:
                    rate[a.grid.arm][(a.grid.cell, a.grid.pass_index)] = 1000.0 / ms
            for arm, cell, keys, c, status in _paired(t, rate, ref, labels):
                ms = stats.summarize([1000.0 / rate[arm][k] for k in keys]).median
                out.append(TargetRow(target=t, arm=arm, cell=cell, comparison=c, status=status, bound=source,
                                     step_ms=ms))
    return out
