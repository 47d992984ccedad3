"""A history: a grid's metrics across versions of an engine (its arms, in the order its `report: {history: [...]}`
gives), and the steps between consecutive versions (docs/methodology.md, "Histories").

Each version's runs are interleaved with the others' and paired by pass, as any arms. A step is version i+1
against version i, paired by pass: the ratio (Hodges-Lehmann), its exact signed-rank interval and the verdict read
from it. The family is every step of the history shown (every metric, cell and consecutive pair: Bonferroni), so
the chance that a flat history shows any step is at most 0.05, whatever its length. A step is found where its
interval excludes 1 (better or worse); a step without an interval (too few passes for the family's level) or
one whose interval holds 1 with a wide detectable effect says the history is too noisy there to tell.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness import sequential, stats


@dataclass(frozen=True)
class Point:
    version: str  # the arm
    median: float  # of its runs' values (a run's value: the median of its repetitions)
    median_ci: tuple[float, float] | None  # exact 95% order-statistic interval; None: too few runs
    n: int


@dataclass(frozen=True)
class Step:
    before: str
    after: str
    comparison: stats.Comparison  # after / before, paired by pass, at the family's level
    verdict: str  # better, worse, no difference detected, undetermined: ...

    @property
    def found(self) -> bool:
        return self.verdict in ("better", "worse")


@dataclass(frozen=True)
class History:
    metric: str
    cell: str
    unit: str
    higher_is_better: bool
    points: list[Point]
    steps: list[Step]


def histories(arts: list, order: tuple[str, ...], metrics: tuple[str, ...] | None = None,
              alpha: float = stats.ALPHA) -> list[History]:
    """Every (metric, cell) of one series that at least two of the ordered versions measured, with its points and
    the steps between consecutive versions that both measured it; one family over every step, at level
    1 - alpha (Bonferroni: each step's interval at 1 - alpha/m)."""
    runs: dict[tuple[str, str, int], Any] = {}
    for a in sorted((a for a in arts if a.status == "ok" and a.grid.arm in order), key=lambda a: a.timing.end):
        runs[(a.grid.cell, a.grid.arm, a.grid.pass_index)] = a  # the latest of a (cell, arm, pass)
    per: dict[tuple[str, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    units: dict[str, tuple[str, bool]] = {}
    for (cell, arm, p), a in runs.items():
        for name, m in a.metrics.items():
            if metrics is not None and name not in metrics:
                continue
            per[(name, cell)][arm][p] = stats.run_value(m.samples)
            units.setdefault(name, (m.unit, m.higher_is_better))
    pairs: list[tuple[tuple[str, str], str, str]] = []
    for key, by_arm in per.items():
        present = [v for v in order if by_arm.get(v)]
        pairs += [(key, x, y) for x, y in zip(present, present[1:])]
    looks = next((a.grid.looks for a in runs.values() if getattr(a.grid, "looks", None)), None)
    # stats.compare's intervals are at 1 - ALPHA/m; sequential passes spend the family's error over their looks
    family = sequential.scaled(len(pairs), alpha, stats.ALPHA) * sequential.factor(looks)
    steps: dict[tuple[str, str], list[Step]] = defaultdict(list)
    for key, x, y in pairs:
        common = sorted(set(per[key][x]) & set(per[key][y]))
        common = common[:sequential.trim(len(common), looks)]
        c = stats.compare([per[key][y][p] for p in common], [per[key][x][p] for p in common], m_family=family)
        steps[key].append(Step(before=x, after=y, comparison=c, verdict=stats.verdict(c, units[key[0]][1])))
    out = []
    for (name, cell), by_arm in sorted(per.items()):
        points = [Point(version=v, median=float(np.median(list(by_arm[v].values()))),
                        median_ci=stats.order_statistic_ci(np.asarray(list(by_arm[v].values()))), n=len(by_arm[v]))
                  for v in order if by_arm.get(v)]
        if len(points) >= 2:
            out.append(History(metric=name, cell=cell, unit=units[name][0], higher_is_better=units[name][1],
                               points=points, steps=steps[(name, cell)]))
    return out
