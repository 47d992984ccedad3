"""Sequential passes (`passes: {until: verdict, max: N}`, docs/methodology.md, "Stopping when the answer is known").

Passes run in order; at each of a few planned looks (a number of complete passes) the runner reads the series'
declared comparisons and stops once every one has a verdict (better or worse), or at `max`. Peeking at fixed-n
intervals after every pass and stopping at the first that excludes 1 is not valid: each look is another chance of a
false verdict. Here the family's error is spent over the looks (Bonferroni over comparisons and looks): with m
comparisons and K looks, every interval at every look is at 1 - alpha/(m K), so the chance that any interval at any
look misses is at most alpha, whatever rule decides when to stop; the intervals at the look where the runner stopped
keep their level. The report reads a series at its last look (the passes after it, if any, are left out of the
verdicts). Looks default to a geometric schedule, each about 1.5 times the one before, from the first number of
passes that can give a verdict at that level to `max`; a grid may give its own (`looks: [8, 12, 16, 24]`).
`python -m harness.coverage` checks the level under stopping at the first verdict, and the passes it saves.
"""

from __future__ import annotations

import math
from typing import Any

from harness.errors import UserError

# verdict: every declared comparison has one; step: the grid's history (report.history) shows a step on one of its
# primary metrics (a bisect's probe: which half holds the change)
UNTIL = ("verdict", "step")
FIELDS = {"until", "max", "looks", "alpha"}
GROWTH = 1.5  # each look about this many times the passes of the one before
MAX_LOOKS = 32


def schedule(first: int, last: int, growth: float = GROWTH) -> list[int]:
    """Looks from `first` to `last` passes, each about `growth` times the one before, `last` always one."""
    out, n = [], max(1, first)
    while n < last:
        out.append(n)
        n = max(n + 1, math.ceil(n * growth))
    return out + [last]


def default_looks(m: int, last: int) -> list[int] | None:
    """The geometric looks for a family of m comparisons: the first at the fewest passes that can give a verdict
    at 1 - alpha/(m K), K the number of looks (the smallest K whose schedule has at most K looks: the first look can
    then answer at the level it is read at); None where `last` passes cannot give one even with a single look."""
    from harness import stats  # numpy: not imported with the grid reader (make's early steps run without it)
    if stats.passes_needed(m) > last:
        return None
    for k in range(1, MAX_LOOKS + 1):
        need = stats.passes_needed(m * k)
        if need > last:
            return [last]
        looks = schedule(need, last)
        if len(looks) <= k:
            return looks
    return [last]


def parse(path: str, raw: Any) -> tuple[int, tuple[int, ...] | None]:
    """`passes: N` -> (N, None); `passes: {until: verdict, max: N, looks: [...]}` -> (N, the looks given or ())."""
    from harness.grid.spec import err, integer, short
    if not isinstance(raw, dict):
        return integer(path, "passes", raw, hi=1 << 62), None  # bounded by the runs they make (MAX_RUNS)
    extra = sorted(map(str, set(raw) - FIELDS))
    if extra:
        raise err(path, f"passes.{extra[0][:40]}", "unknown field", f"allowed: {', '.join(sorted(FIELDS))}")
    if raw.get("until") not in UNTIL:
        raise err(path, "passes.until", f"must be one of {', '.join(UNTIL)}, got {short(raw.get('until'))}",
                  "passes: {until: verdict, max: 48}: passes go on until every declared comparison has its verdict "
                  "(until: step: until the grid's history shows a step)")
    last = integer(path, "passes.max", raw.get("max"), lo=2, hi=1 << 20)
    looks = raw.get("looks")
    if looks is None:
        return last, ()
    if not isinstance(looks, list) or not 1 <= len(looks) <= MAX_LOOKS:
        raise err(path, "passes.looks", f"must list 1 to {MAX_LOOKS} numbers of passes, got {short(looks)}",
                  "looks: [8, 12, 16, 24], increasing, the last at most max")
    vals = [integer(path, f"passes.looks[{i}]", v, lo=2, hi=last) for i, v in enumerate(looks)]
    if any(b <= a for a, b in zip(vals, vals[1:])):
        raise err(path, "passes.looks", f"must increase, got {short(vals)}", "looks: [8, 12, 16, 24]")
    return last, tuple(vals if vals[-1] == last else vals + [last])


def until(raw: Any) -> str:
    """What sequential passes wait for (UNTIL; parse has checked it): verdict for fixed passes too."""
    return raw["until"] if isinstance(raw, dict) and raw.get("until") in UNTIL else "verdict"


def step_alpha(path: str, raw: Any) -> float:
    """`until: step`'s family level (`alpha`, default 0.05): the history's steps, over every look, show a step by
    chance with probability at most this (a bisect's probe takes its --alpha)."""
    from harness.grid.spec import err, short
    a = raw.get("alpha", 0.05) if isinstance(raw, dict) else 0.05
    if isinstance(raw, dict) and "alpha" in raw and raw.get("until") != "step":
        raise err(path, "passes.alpha", "applies to until: step only (until: verdict's level is the report's)",
                  "drop it")
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not MIN_ALPHA <= a < 0.5:
        raise err(path, "passes.alpha", f"must be a level in [{MIN_ALPHA:g}, 0.5), got {short(a)}", "alpha: 0.01")
    return float(a)


MIN_ALPHA = 1e-6  # a family level below this asks for more passes than any grid runs (and 0.05/alpha overflows)


def scaled(m: int, alpha: float, base: float = 0.05) -> int:
    """m comparisons read at family level `alpha` as a family at `base` (stats.ALPHA): intervals at
    1 - base/M with M = ceil(m x base / alpha), never fewer comparisons than that (rounding down would widen the
    level: 3 steps at 0.03 are 5 at 0.05, not 4)."""
    return max(1, math.ceil(m * base / alpha - 1e-9))


def step_family(path: str, history: tuple[str, ...], primary: dict | None, n_cells: int) -> int:
    """The comparisons `until: step` waits on: each step of the grid's history on each primary metric, per cell;
    refused where the grid declares no history or no primary metrics."""
    if len(history) < 2:
        raise UserError(path, "passes.until: step stops when the grid's history shows a step, and it declares none",
                        "report: {history: [v1, v2, ...]} (the arms that are versions, oldest first)")
    metrics = (primary or {}).get("metrics")
    if not metrics:
        raise UserError(path, "passes.until: step waits on a step of the history's primary metrics, and the grid "
                        "declares none", "primary: {metrics: [decode_tok_s]}")
    return (len(history) - 1) * len(metrics) * n_cells


def resolve(path: str, last: int, given: tuple[int, ...], m: int, what: str = "verdict") -> tuple[int, ...]:
    """The looks of a sequential grid whose family has m comparisons: refused where none can give a verdict
    (`what`: until's value; a step's family counts its steps, scaled to the 0.05 level, not declared comparisons)."""
    from harness import stats
    if m == 0:
        raise UserError(path, "passes.until: a sequential grid stops on its comparisons' verdicts and has none",
                        "give the grid a baseline and another arm, or passes: N")
    looks = list(given) if given else default_looks(m, last)
    k = len(looks) if looks else 1
    if looks is None or not stats.reachable(looks[-1], m * k):
        need = next(n for n in range(2, 1 << 10) if stats.reachable(n, m * k))
        fewer = "declare fewer primary comparisons" if what == "verdict" else \
            "follow fewer primary metrics, or raise passes.alpha"
        raise UserError(path, f"passes.max: {last} passes cannot give a verdict at 1 - {stats.ALPHA}/({m} comparisons x "
                        f"{k} looks)", f"raise max to {need} or more, or {fewer}")
    return tuple(looks)


def trim(n: int, looks: tuple[int, ...] | list[int] | None) -> int:
    """How many of n paired passes a sequential series' comparison reads: its last look reached (all n where the
    series is not sequential, or has not reached its first look)."""
    if not looks:
        return n
    reached = [x for x in looks if x <= n]
    return reached[-1] if reached else n


def factor(looks: tuple[int, ...] | list[int] | None) -> int:
    """The Bonferroni factor of a series' looks (1: a fixed number of passes)."""
    return len(looks) if looks else 1
