"""A rate sweep to saturation (`workload.load: {rate: sweep, points: N}`; docs/serving.md).

Like GuideLLM's sweep, each pass measures two ends first and derives the rates between them:
- `sync`: one request at a time (a closed loop of 1): the rate a server reaches unloaded;
- `max`: every request of the repetition sent at once (concurrency = requests): its throughput at saturation;
- `sweep-KofM` (K = 1..M, M = points - 2): an open loop at lo + (hi - lo) * K / (M + 1) requests/s, where lo is
  the lowest `sync` request throughput of the pass's arms and hi the highest `max` one, so every arm of a pass
  is sent the same rates (their runs pair) and the points reach from the slowest arm unloaded to the fastest
  arm saturated.

The points are cells (the `rate` axis holds their names), so they interleave and pair like every grid's; a
point's rate is resolved when its run starts, from the pass's `sync` and `max` artifacts on the machine that
runs the pass (`resolve`), and recorded in the artifact's `workload.load.sweep`. A probe that failed or has not
run leaves its pass's points failed, with the reason, never run at a guessed rate.

`capacity` is the sweep's answer per arm and pass: the highest rate whose run met the SLO (its goodput share,
median over repetitions, at least `slo.share`).
"""

from __future__ import annotations

import math
import re
import statistics
from typing import Any

SYNC, MAX = "sync", "max"
DEFAULT_POINTS, MIN_POINTS, MAX_POINTS = 5, 3, 20
DEFAULT_SHARE = 0.9  # the share of a run's requests within every SLO bound for the run to meet the SLO
_POINT = re.compile(r"sweep-([0-9]{1,2})of([0-9]{1,2})")


def points(n: int) -> list[str]:
    """The sweep's cells' `rate` values, in run order within a pass: the probes first."""
    m = n - 2
    return [SYNC, MAX] + [f"sweep-{k}of{m}" for k in range(1, m + 1)]


def between(value: Any) -> tuple[int, int] | None:
    """(K, M) of a point between the probes; None for anything else."""
    hit = _POINT.fullmatch(value) if isinstance(value, str) else None
    if hit is None:
        return None
    k, m = int(hit.group(1)), int(hit.group(2))
    return (k, m) if 1 <= k <= m <= MAX_POINTS - 2 else None


def is_point(value: Any) -> bool:
    return value in (SYNC, MAX) or between(value) is not None


def order(value: str) -> float:
    """Where a point lies on the sweep, 0 (sync) to 1 (max)."""
    km = between(value)
    return 0.0 if value == SYNC else 1.0 if value == MAX else km[0] / (km[1] + 1)  # type: ignore[index]


def label(value: str) -> str:
    km = between(value)
    return value if km is None else f"{km[0]}/{km[1] + 1}"


def _req_s(a: Any) -> float | None:
    m = a.metrics.get("request_throughput_req_s")
    vals = [v for v in (m.samples if m else []) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
    return statistics.median(vals) if vals else None


def resolve(run: Any, probes: dict[str, dict[str, str]], done: dict[str, list]) -> dict[str, Any]:
    """The load of a point between the probes: {point, rate_req_s, sync_req_s, max_req_s, from}, or {point,
    error} when a probe of its pass has no ok artifact in `done` (run key -> this machine's artifacts).
    `probes`: probe -> arm -> the run key of that arm's probe in the point's pass (schedule.probe_keys)."""
    value = run.cell.params["rate"]
    k, m = between(value)  # type: ignore[misc]
    got: dict[str, dict[str, dict]] = {}
    for probe in (SYNC, MAX):
        for arm, key in probes[probe].items():
            arts = done.get(key, [])
            ok = [a for a in arts if a.status == "ok"]
            v = _req_s(ok[-1]) if ok else None
            if v is None:
                state = "has no measured request throughput" if ok else "failed" if arts else "has not run"
                return {"point": value, "error": f"pass {run.pass_index}'s {probe} run of arm {arm} {state}: "
                        "a sweep's rates come from its pass's sync and max runs"}
            got.setdefault(arm, {})[probe] = {"request_throughput_req_s": v, "artifact": ok[-1].id}
    lo = min(g[SYNC]["request_throughput_req_s"] for g in got.values())
    hi = max(g[MAX]["request_throughput_req_s"] for g in got.values())
    return {"point": value, "rate_req_s": lo + (hi - lo) * k / (m + 1), "sync_req_s": lo, "max_req_s": hi,
            "rule": f"sync + (max - sync) * {k}/{m + 1}; sync: the pass's lowest, max: its highest, over arms",
            "from": got}


def offered(a: Any) -> float | None:
    """The rate a sweep run was sent at: a point's resolved rate; for a probe, the request throughput it reached
    (a closed loop has no rate of its own)."""
    sw = record_of(a)
    if "rate_req_s" in sw:
        return float(sw["rate_req_s"])
    return _req_s(a) if sw.get("point") in (SYNC, MAX) else None


def record_of(a: Any) -> dict[str, Any]:
    """A run's recorded sweep block (`workload.load.sweep`), {} where it has none or it is not a mapping (a store is
    untrusted input: harness check reports such a block)."""
    sw = (a.workload.load or {}).get("sweep")
    return sw if isinstance(sw, dict) else {}


def meets(a: Any, share: float) -> bool:
    m = a.metrics.get("goodput_share")
    vals = [v for v in (m.samples if m else []) if isinstance(v, (int, float)) and math.isfinite(v)]
    return bool(vals) and statistics.median(vals) >= share


def capacity(arts: list, share: float) -> dict[str, dict[int, float]]:
    """arm -> pass -> the highest rate (requests/s) among the arm's sweep runs of the pass that met the SLO, 0.0
    where none did, over the runs of one sweep (its cells less the rate alike). A pass where a point of the arm
    has no ok run is left out: its highest rate is unknown."""
    runs: dict[tuple[str, int], list] = {}
    for a in arts:
        runs.setdefault((a.grid.arm, a.grid.pass_index), []).append(a)
    n_points = len({a.grid.cell for a in arts})
    out: dict[str, dict[int, float]] = {}
    for (arm, p), mine in sorted(runs.items()):
        ok = [a for a in mine if a.status == "ok"]
        if len({a.grid.cell for a in ok}) < n_points:
            continue
        rates = [offered(a) for a in ok if meets(a, share)]
        out.setdefault(arm, {})[p] = max([r for r in rates if r is not None], default=0.0)
    return out
