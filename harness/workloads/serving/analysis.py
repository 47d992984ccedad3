"""What the runs of a served load derive (docs/serving.md): each cell's load point and the latency-against-load
curves, a rate sweep's capacity under its SLO, and the client tools' own medians beside the harness's."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness import stats
from harness.engines import ENGINES, get_engine
from harness.engines.capabilities import Serves, capability


LOAD_LATENCIES = ("ttft_p90_s", "tpot_p90_s", "e2e_p90_s")


def load_of(cell: str) -> tuple[str, float, str] | None:
    """A serving cell's load ('concurrency', 'rate' or 'rate sweep'; where it lies, as a number that grows with
    the load; its label), from the cell id; None for other cells."""
    from harness import sweep
    params = dict(kv.split("=", 1) for kv in cell.split(",") if "=" in kv)
    if sweep.is_point(params.get("rate")):
        return "rate sweep", sweep.order(params["rate"]), sweep.label(params["rate"])
    for k in ("rate", "concurrency"):
        if k in params:
            try:
                v = float(params[k])
            except ValueError:
                return None
            return k, v, f"{v:g}"
    return None


def load_points(section: dict) -> dict[str, dict[str, list[tuple[float, float, float, str]]]]:
    """latency metric -> arm -> [(load, output tok/s median, latency median, the load's label)], by load: the
    curve of each arm's latency against its throughput as the load grows (a serving grid's cells)."""
    med = {(t["metric"], r["arm"], r["cell"]): r["median_value"] for t in section["tables"] for r in t["rows"]}
    out: dict[str, dict[str, list[tuple[float, float, float]]]] = {}
    for (metric, arm, cell), tput in sorted(med.items()):
        if metric != "serve_output_tok_s" or load_of(cell) is None:
            continue
        for lat in LOAD_LATENCIES:
            y = med.get((lat, arm, cell))
            if y is not None and tput is not None:
                _, at, label = load_of(cell)  # type: ignore[misc]
                out.setdefault(lat, {}).setdefault(arm, []).append((at, tput, y, label))
    for by_arm in out.values():
        for pts in by_arm.values():
            pts.sort()
    return out


@dataclass(frozen=True)
class CapacityRow:
    cell: str  # the sweep's other parameters (its cells less the rate)
    arm: str
    values: tuple[float, ...]  # per pass with every point of the arm stored ok: its highest rate meeting the SLO
    median_ci: tuple[float, float] | None  # exact 95% order-statistic interval of the median over passes
    vs_baseline: stats.Comparison | None  # paired by pass, its own 95% interval (outside the grid's family)

    @property
    def median(self) -> float:
        return float(np.median(self.values))


@dataclass(frozen=True)
class SweepRate:
    cell: str
    point: str
    label: str
    median_req_s: float  # the resolved rate, median over passes
    n: int


@dataclass(frozen=True)
class SweepView:
    share: float
    slo: dict[str, float]
    rows: list[CapacityRow]
    rates: list[SweepRate]


def _rest(a: Any) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(a.grid.cell_params.items()) if k != "rate")


def sweep_view(series: list, baseline: str) -> SweepView | None:
    """A series' rate sweep: each arm's highest rate meeting the SLO per pass, its median with an interval, the
    paired ratio to the baseline arm; and the rate each point was sent at. None: no sweep (or no SLO)."""
    from harness import sweep
    arts = [a for a in series if sweep.is_point(a.grid.cell_params.get("rate"))]
    slo = next((a.workload.slo for a in arts if a.workload.slo), None)
    if not arts or not slo:
        return None
    share = float(slo.get("share", sweep.DEFAULT_SHARE))
    rows, rates = [], []
    groups: dict[str, list] = defaultdict(list)
    for a in arts:
        groups[_rest(a)].append(a)
    for rest, mine in sorted(groups.items()):
        cap = sweep.capacity(mine, share)
        base = cap.get(baseline, {})
        for arm, by_pass in sorted(cap.items()):
            vals = tuple(v for _, v in sorted(by_pass.items()))
            common = sorted(set(by_pass) & set(base))
            vs = stats.compare([by_pass[p] for p in common], [base[p] for p in common], power=False) \
                if arm != baseline and common else None
            rows.append(CapacityRow(cell=rest, arm=arm, values=vals, median_ci=stats.order_statistic_ci(
                np.asarray(vals, float)), vs_baseline=vs))
        by_point: dict[str, list[float]] = defaultdict(list)
        seen: set[tuple[str, int]] = set()
        for a in mine:
            r = sweep.record_of(a).get("rate_req_s")
            point = a.grid.cell_params["rate"]
            if a.status == "ok" and r is not None and (point, a.grid.pass_index) not in seen:  # one per pass
                seen.add((point, a.grid.pass_index))
                by_point[point].append(float(r))
        rates += [SweepRate(cell=rest, point=p, label=sweep.label(p), median_req_s=float(np.median(v)), n=len(v))
                  for p, v in sorted(by_point.items(), key=lambda kv: sweep.order(kv[0]))]
    return SweepView(share=share, slo={k: v for k, v in slo.items() if k != "share"}, rows=rows, rates=rates)


# the serving metrics a client tool's own printed medians are set beside (the engine reads them from its report)
TOOL_MEDIANS = ("ttft_p50_s", "itl_all_p50_s", "tpot_p50_s")


@dataclass(frozen=True)
class ToolMedians:
    cell: str
    arm: str
    client: str  # the client that sent the load: "harness", or the tool that printed its own medians
    n: int  # ok runs
    ours: dict[str, float]  # metric -> median over runs of the harness's figure from the arm's own records
    printed: dict[str, float]  # metric -> median over runs of the tool's printed figure (seconds); tool arms only


def tool_medians(series: list) -> list[ToolMedians]:
    """Per serving cell and arm of a series where a client tool printed its own medians (the engine's Serves
    capability reads them back): the harness's TTFT, pooled-ITL and TPOT medians (median over runs) and, for the
    tool's arms, the medians it printed for the same runs."""
    ok = [a for a in series if a.status == "ok" and a.workload.load is not None]
    printed_by = {id(a): capability(get_engine(a.engine.name), Serves).printed_medians(a.execution.effective,
                                                                                        TOOL_MEDIANS)
                  for a in ok if a.engine.name in ENGINES}
    if all(c == "harness" for c, _ in printed_by.values()):
        return []
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for a in ok:
        groups[(a.grid.cell, a.grid.arm)].append(a)
    out = []
    for (cell, arm), arts in sorted(groups.items()):
        runs = [printed_by.get(id(a), ("harness", {})) for a in arts]
        client = next((c for c, _ in runs if c != "harness"), "harness")
        ours = {m: float(np.median([np.median(a.metrics[m].samples) for a in arts if m in a.metrics]))
                for m in TOOL_MEDIANS if any(m in a.metrics for a in arts)}
        printed = {m: float(np.median(vals)) for m in TOOL_MEDIANS if (vals := [p[m] for _, p in runs if m in p])}
        out.append(ToolMedians(cell=cell, arm=arm, client=client, n=len(arts), ours=ours, printed=printed))
    return out
