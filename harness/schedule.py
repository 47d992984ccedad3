"""Run order: interleaved arms, balanced across passes, seeded; or sequential, or random.

Interleaved: pass-major; within each pass every cell runs every arm once, in an order that
is balanced across passes (ABBA for two arms, a seeded Williams design for more).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any
from functools import lru_cache

from harness.grid import Cell, GridSpec, arms_for, cell_id, expand
from harness.rules import run_key


@dataclass(frozen=True)
class RunSpec:
    cell: Cell
    arm: str
    pass_index: int
    position: int  # position within its pass, 0-based
    index: int  # position in the whole schedule
    # a rate sweep's point: its load, resolved by the execution loop when the run starts (harness/sweep.py)
    sweep: dict[str, Any] | None = field(default=None, compare=False, hash=False)

    @property
    def run_key(self) -> str:
        return run_key(self.cell.id, self.arm, self.pass_index)


def probe_keys(spec: GridSpec, run: RunSpec) -> dict[str, dict[str, str]]:
    """A rate sweep point's probes in its pass (harness/sweep.py): probe -> arm -> run key."""
    from harness import sweep
    out: dict[str, dict[str, str]] = {}
    for probe in (sweep.SYNC, sweep.MAX):
        cid = cell_id({**run.cell.params, "rate": probe})
        out[probe] = {a.name: run_key(cid, a.name, run.pass_index) for a in arms_for(spec, run.cell)}
    return out


def williams(n: int) -> list[list[int]]:
    """A Williams design: each item comes first equally often and precedes each other item
    equally often (carry-over balanced); n rows for even n, 2n for odd n."""
    first = [0]
    lo, hi = 1, n - 1
    for i in range(1, n):
        if i % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    if n % 2:
        rows += [list(reversed(r)) for r in rows]
    return rows


@lru_cache(maxsize=64)
def _design(n: int) -> tuple[list[int], ...]:
    """williams(n), built once per n (each cell's arm_orders shuffles its rows; the rows are shared, read only)."""
    return tuple(williams(n))


def arm_orders(n_arms: int, passes: int, seed: int) -> list[list[int]]:
    """The arm order of each pass."""
    if n_arms == 1:
        return [[0]] * passes
    if n_arms == 2:
        abba = [[0, 1], [1, 0], [1, 0], [0, 1]]
        return [abba[p % 4] for p in range(passes)]
    rows = _design(n_arms)
    rng = random.Random(seed)
    out: list[list[int]] = []
    while len(out) < passes:
        block = list(rows)
        rng.shuffle(block)  # a seeded order of rows in each block of the design
        out.extend(block)
    return out[:passes]


def schedule(spec: GridSpec) -> list[RunSpec]:
    cells = expand(spec)
    entries: list[tuple[Cell, str, int, int]] = []  # cell, arm, pass, position
    cell_arms = [arms_for(spec, cell) for cell in cells]  # once per cell, not once per pass
    if spec.order == "interleaved":
        # each cell gets its own rotation of the design so arm order is not aligned across cells
        orders = [arm_orders(len(arms), spec.passes, spec.seed + ci) for ci, arms in enumerate(cell_arms)]
        for p in range(spec.passes):
            pos = 0
            for ci, cell in enumerate(cells):
                arms = cell_arms[ci]
                for k in orders[ci][p]:
                    entries.append((cell, arms[k].name, p, pos))
                    pos += 1
    elif spec.order == "sequential":
        for cell, arms in zip(cells, cell_arms):
            for arm in arms:
                for p in range(spec.passes):
                    entries.append((cell, arm.name, p, 0))
    else:  # random
        for p in range(spec.passes):
            for cell, arms in zip(cells, cell_arms):
                for arm in arms:
                    entries.append((cell, arm.name, p, 0))
        random.Random(spec.seed).shuffle(entries)
    if spec.order != "interleaved":
        counters: dict[int, int] = {}
        fixed = []
        for cell, arm, p, _ in entries:
            fixed.append((cell, arm, p, counters.get(p, 0)))
            counters[p] = counters.get(p, 0) + 1
        entries = fixed
    return [RunSpec(cell=c, arm=a, pass_index=p, position=pos, index=i) for i, (c, a, p, pos) in enumerate(entries)]


def plan_rows(runs: list[RunSpec]) -> list[dict]:
    return [{"index": r.index, "cell": r.cell.id, "arm": r.arm, "pass": r.pass_index, "position": r.position,
             "run_key": r.run_key} for r in runs]


def passes_warning(spec: GridSpec, m: int | None = None) -> str | None:
    """Whether the grid's passes can reach a verdict at all over its family of comparisons (before anything
    runs): every verdict the grid gives (its declared primaries, or all), Bonferroni over them. `m`: the
    family's size, when the caller has it."""
    from harness import stats
    from harness.grid import family
    if m is None:
        m = len(family(spec))
    # reachable is monotone in the passes: compare with the fewest that reach (small n), never build the
    # signed-rank distribution of `passes` itself (cubic in it: a grid of 1000 passes would hang the plan)
    if m == 0 or spec.passes >= stats.passes_needed(m):
        return None
    scope = "declared primary" if spec.primary else "every"
    return (f"warning: {spec.passes} passes can never give a verdict: the family is {scope} comparison of the grid "
            f"({m}), each interval at 1 - {stats.ALPHA}/{m}, which a signed-rank interval over {spec.passes} passes "
            f"cannot reach; the report will say 'undetermined'. Use passes: {stats.passes_needed(m)} or more"
            + ("" if spec.primary else ", or declare the grid's primary comparisons (primary: {metrics: [...]})"))


def format_plan(spec: GridSpec, runs: list[RunSpec]) -> str:
    cells = expand(spec)
    lines = [f"grid {spec.name} ({spec.path}, sha256 {spec.sha256[:12]}): {len(cells)} cells x "
             f"{len(spec.arms)} arms x {spec.passes} passes = {len(runs)} runs, order {spec.order}, seed {spec.seed}"]
    from harness import stats
    from harness.grid import family
    m = len(family(spec))
    if spec.looks and spec.until == "step":
        k, ms = len(spec.looks), spec.looked_m
        if m:
            lines.append(f"family: {m} comparison(s) given verdicts ({'declared primaries' if spec.primary else 'all'}),"
                         f" each interval at {stats.level_text(1 - stats.ALPHA / (m * k))} (Bonferroni over {m} x {k} "
                         f"looks), read at the last look reached")
        lines.append(f"history steps: sequential: looks at {', '.join(map(str, spec.looks))} passes, stopping at the "
                     f"first where the history ({', '.join(spec.history)}) shows a step on a primary metric; its steps "
                     f"are a family at {spec.step_alpha:g} (as {ms} at {stats.ALPHA}), each interval at "
                     f"{stats.level_text(1 - stats.ALPHA / (ms * k))} (Bonferroni over {ms} x {k} looks)")
    elif m and spec.looks:
        k = len(spec.looks)
        lines.append(f"family: {m} comparison(s) given verdicts ({'declared primaries' if spec.primary else 'all'}), "
                     f"sequential: looks at {', '.join(map(str, spec.looks))} passes, stopping at the first where "
                     + "every one has its verdict; each interval at {stats.level_text(1 - stats.ALPHA / (m * k))} "
                     f"(Bonferroni over {m} x {k} looks)")
    elif m:
        lines.append(f"family: {m} comparison(s) given verdicts ({'declared primaries' if spec.primary else 'all'}), "
                     f"each interval at {stats.level_text(1 - stats.ALPHA / m)} (Bonferroni); "
                     f"{stats.passes_needed(m)} passes needed for a verdict")
    warn = passes_warning(spec, m)
    if warn:
        lines.append(warn)
    lines.append(f"{'#':>4}  {'pass':>4}  {'pos':>3}  {'arm':<20} cell")
    for r in runs:
        lines.append(f"{r.index:>4}  {r.pass_index:>4}  {r.position:>3}  {r.arm:<20} {r.cell.id}")
    return "\n".join(lines)
