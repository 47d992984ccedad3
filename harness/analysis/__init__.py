"""Analysis of a store: series selection (per host), pairing by pass, the family of comparisons, the
statistics, fidelity gates and between-series spread. Returns typed rows; harness/report/ only formats.

A series is (grid sha256, host key). Runs are paired by (cell, arm, pass) inside one series only.

    series.py   artifacts grouped into series per host; build, model and weight identities; fidelity gates
    (the serving workload kind's: harness/workloads/serving/analysis.py, re-exported here)
    (here)      the paired comparisons of a series, calibration, across hosts, between series, ceilings
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness import sequential, stats
from harness.engines import weight_bytes
from harness.grid import in_family
from harness.analysis.series import (_BUILD_IDS, _MODEL_IDS, _WEIGHT_SHAS, Newest, all_series, build_id, by_host, by_key,
                                     fidelity_gates, fidelity_key, forget, gate, isa_cap, machine_key, mixed_builds,
                                     model_id, newest_by_grid_and_host, newest_series, weight_shas)
# the serving workload kind's analysis (harness/workloads/serving), read here by the plots, the HTML site and tests
from harness.workloads.serving.analysis import (LOAD_LATENCIES, TOOL_MEDIANS, CapacityRow, SweepRate, SweepView,
                                                ToolMedians, load_of, load_points, sweep_view, tool_medians)

# what the report, the summary and the tests read here (series.py and serving.py hold them)
__all__ = ["ALPHA", "ALPHA_ACROSS", "AcrossReach", "across_reach", "LOAD_LATENCIES", "TOOL_MEDIANS", "_BUILD_IDS", "_MODEL_IDS", "_WEIGHT_SHAS", "AARow", "AcrossRow",
           "BetweenRow", "CapacityRow", "CeilingRow", "Newest", "Row", "SeriesAnalysis", "SeriesFigure", "Speed",
           "SweepRate", "SweepView", "ToolMedians", "aa_calibration", "across_hosts", "all_series", "analyse",
           "between_series", "build_id", "by_host", "by_key", "ceiling_rows", "fidelity_gates", "fidelity_key", "forget",
           "gate", "isa_cap", "load_of", "load_points", "machine_key", "mixed_builds", "model_id",
           "newest_by_grid_and_host", "newest_series", "speed_of", "sweep_view", "tool_medians", "unreachable",
           "weight_shas"]


@dataclass
class Row:
    """One (cell, arm, metric) of a series: the arm's figures over passes and, for non-baseline arms, its
    paired comparison with the baseline."""
    cell: str
    cell_params: dict
    cell_short: str
    arm: str
    metric: str
    unit: str
    higher_is_better: bool
    threads: int
    values: list[float]  # per pass: the run's median over its repetitions
    n_samples: int
    failed: int
    duplicates: int
    role: str  # baseline | family | exploratory | unpaired
    comparison: stats.Comparison | None = None
    pairs: tuple[list[float], list[float]] | None = None  # (arm, baseline) per common pass
    fidelity: str = "n/a"  # the gate of this arm's build (and the baseline's, folded in)
    summary: stats.Summary = field(init=False)

    def __post_init__(self) -> None:
        self.summary = stats.summarize(self.values)

    @property
    def median_ci(self) -> tuple[float, float]:
        """The median's exact 95% order-statistic interval over passes (the range where n < 6)."""
        return stats.median_ci(np.asarray(self.values, dtype=float))

    @property
    def verdict(self) -> str:
        c = self.comparison
        if c is None or self.role != "family":
            return "exploratory: no verdict" if self.role == "exploratory" and c is not None else ""
        if self.fidelity == "synthetic weights":
            return f"{stats.verdict(c, self.higher_is_better)} (synthetic weights)"
        if self.fidelity not in ("pass", "n/a"):  # fail or unchecked, the build's or its baseline's
            return f"fidelity {self.fidelity}"
        return stats.verdict(c, self.higher_is_better)


@dataclass
class SeriesAnalysis:
    rows: list[Row]
    metrics: list[str]
    cells: list[str]
    arms: list[str]
    baseline: str
    family_size: int
    primary: dict | None
    duplicates: int
    warnings: list[str]
    looks: tuple[int, ...] = ()  # sequential passes: the looks the grid planned (harness/sequential.py)

    @property
    def level(self) -> float:
        """The level of each interval of the family (Bonferroni over its comparisons, and its looks)."""
        return 1 - ALPHA / (max(1, self.family_size) * sequential.factor(self.looks))


ALPHA = stats.ALPHA


def unreachable(an: SeriesAnalysis) -> tuple[int, float, int] | None:
    """(the fewest passes of a family comparison, the family's level, the passes a verdict needs) where those
    passes can never give a verdict at that level; None where they can (or there is no family)."""
    n_min = min((r.comparison.n_pairs for r in an.rows if r.comparison and r.role == "family"), default=0)
    m = an.family_size * sequential.factor(an.looks)  # sequential passes: Bonferroni over the looks too
    if an.family_size and not stats.reachable(n_min, m):
        return n_min, an.level, stats.passes_needed(m)
    return None


@dataclass(frozen=True)
class AARow:
    """A/A calibration of one metric: comparisons, flagged after the family correction and raw p < 0.05, each
    with its exact (Clopper-Pearson) 95% interval, and the median effect detectable with 80% power."""
    metric: str
    n: int
    flagged: int
    flagged_ci: tuple[float, float]
    raw: int
    raw_ci: tuple[float, float]
    detectable: float | None


def aa_calibration(an: SeriesAnalysis) -> list[AARow]:
    """A/A (identical arms): every verdict is a false positive."""
    out = []
    for metric in an.metrics:
        rows = [r for r in an.rows if r.metric == metric and r.comparison is not None and r.role == "family"]
        if not rows:
            continue
        n = len(rows)
        flagged = sum(1 for r in rows if r.verdict in ("better", "worse"))
        raw = sum(1 for r in rows if r.comparison.p_value < stats.ALPHA)  # type: ignore[union-attr]
        det = sorted(r.comparison.detectable for r in rows if r.comparison.detectable is not None)  # type: ignore[union-attr]
        out.append(AARow(metric=metric, n=n, flagged=flagged, flagged_ci=stats.clopper_pearson(flagged, n), raw=raw,
                         raw_ci=stats.clopper_pearson(raw, n), detectable=det[len(det) // 2] if det else None))
    return out


@dataclass(frozen=True)
class AcrossRow:
    """One comparison several hosts measured: each host's paired ratio, their median, the exact two-sided sign
    test across hosts (is the direction consistent from machine to machine?) and the spread (max / min)."""
    cell: str
    arm: str
    metric: str
    ratios: dict[str, float]
    median: float
    above: int
    below: int
    sign_p: float
    spread: float


def across_hosts(per: dict[tuple[str, str, str], dict[str, float]]) -> list[AcrossRow]:
    """per: (cell, arm, metric) -> host -> that host's paired ratio; rows for those of two hosts or more."""
    out = []
    for (cell, arm, metric), ratios in sorted(per.items()):
        if len(ratios) < 2:
            continue
        vals = list(ratios.values())
        above, below = sum(v > 1 for v in vals), sum(v < 1 for v in vals)
        out.append(AcrossRow(cell=cell, arm=arm, metric=metric, ratios=dict(ratios),
                             median=stats.quantile(sorted(vals), 0.5), above=above, below=below,
                             sign_p=stats.sign_test_p(above, below), spread=max(vals) / min(vals)))
    return out


ALPHA_ACROSS = 0.05  # the level a sign test across hosts is read at


@dataclass(frozen=True)
class AcrossReach:
    reachable: bool  # whether the sign test across these hosts can reach ALPHA_ACROSS at all
    smallest_p: float  # its p with every host on one side: the strongest it gets
    hosts_needed: int  # the fewest hosts with which it can


def across_reach(n_hosts: int) -> AcrossReach:
    """Whether a sign test across n hosts can ever give a verdict (a table that cannot is one line instead)."""
    needed = 1
    while stats.sign_test_p(needed, 0) > ALPHA_ACROSS:
        needed += 1
    smallest = stats.sign_test_p(n_hosts, 0)
    return AcrossReach(reachable=smallest <= ALPHA_ACROSS, smallest_p=smallest, hosts_needed=needed)


def _runs_by_pass(arts: list) -> tuple[dict[tuple, Any], dict[tuple, int], dict[tuple, int]]:
    """A series' ok runs by (cell, arm, pass), the latest of each; how many more were measured of each (cell,
    arm); and how many of each failed."""
    runs: dict[tuple, Any] = {}
    dup: dict[tuple, int] = defaultdict(int)
    for a in sorted((a for a in arts if a.status == "ok"), key=lambda a: a.timing.end):
        k = (a.grid.cell, a.grid.arm, a.grid.pass_index)
        if k in runs:
            dup[(a.grid.cell, a.grid.arm)] += 1
        runs[k] = a
    failed: dict[tuple, int] = defaultdict(int)
    for a in arts:
        if a.status != "ok":
            failed[(a.grid.cell, a.grid.arm)] += 1
    return runs, dup, failed


def analyse(arts: list, gates: dict[tuple, Any] | None = None, power: bool = True) -> SeriesAnalysis:
    """Pair one series' runs by pass, compare each arm with the baseline, and read each verdict from its one
    interval at the family's level. The family: every comparison, or the grid's declared primaries."""
    gates = gates or {}
    first = arts[0]
    base = first.grid.baseline_arm
    primary = first.grid.primary
    ok = [a for a in arts if a.status == "ok"]
    cells = sorted({a.grid.cell for a in arts})
    arms = sorted({a.grid.arm for a in arts}, key=lambda n: (n != base, n))
    metric_names = sorted({m for a in ok for m in a.metrics})
    runs, dup, failed = _runs_by_pass(arts)
    varying = {k for k in first.grid.cell_params if len({str(a.grid.cell_params.get(k)) for a in arts}) > 1}
    by_cell_arm: dict[tuple, list] = defaultdict(list)  # (cell, arm) -> (pass, run), in the order of `runs`
    for (c, am, p), r in runs.items():
        by_cell_arm[(c, am)].append((p, r))
    values: dict[tuple[int, str], float] = {}  # (id of a run in `runs`, metric) -> its value, computed once

    def value(r: Any, metric: str) -> float:
        k = (id(r), metric)
        v = values.get(k)
        if v is None:
            v = values[k] = stats.run_value(r.metrics[metric].samples)
        return v

    def passes(cell: str, arm: str, metric: str) -> dict:
        return {p: r for p, r in by_cell_arm.get((cell, arm), ()) if metric in r.metrics}

    rows: list[Row] = []
    pending: list[tuple[Row, list[float], list[float]]] = []
    for metric in metric_names:
        for cell in cells:
            base_runs = passes(cell, base, metric)
            for arm in arms:
                per_pass = passes(cell, arm, metric)
                if not per_pass:
                    continue
                r0 = next(iter(per_pass.values()))
                m0 = r0.metrics[metric]
                params = r0.grid.cell_params
                row = Row(cell=cell, cell_params=params,
                          cell_short=",".join(f"{k}={v}" for k, v in sorted(params.items()) if k in varying),
                          arm=arm, metric=metric, unit=m0.unit, higher_is_better=m0.higher_is_better,
                          threads=r0.execution.threads, values=[value(r, metric) for _, r in sorted(per_pass.items())],
                          n_samples=sum(len(r.metrics[metric].samples) for r in per_pass.values()),
                          failed=failed.get((cell, arm), 0), duplicates=dup.get((cell, arm), 0), role="baseline")
                if arm != base:
                    common = sorted(set(per_pass) & set(base_runs))
                    if not common:
                        row.role = "unpaired"
                    else:
                        row.role = "family" if in_family(primary, metric, arm, params) else "exploratory"
                        pending.append((row, [value(per_pass[p], metric) for p in common],
                                        [value(base_runs[p], metric) for p in common]))
                        b0 = next(iter(base_runs.values()))
                        g, gb = gate(r0, gates), gate(b0, gates)
                        if g == "n/a" or fidelity_key(r0) == fidelity_key(b0):
                            row.fidelity = "n/a"  # no model, or the same build on both sides: outputs cannot differ
                        else:
                            row.fidelity = g if g != "pass" else ("pass" if gb in ("pass", "n/a") else f"{gb} (baseline)")
                rows.append(row)
    m = sum(1 for r, _, _ in pending if r.role == "family")
    looks = getattr(first.grid, "looks", None)  # sequential passes: the family's error spent over its looks
    for row, a_vals, b_vals in pending:
        # exploratory estimates get a plain 95% interval, family members the family's level; a sequential series is
        # read at the last look it reached, every paired row alike (harness/sequential.py)
        if looks:
            n = sequential.trim(len(a_vals), looks)
            a_vals, b_vals = a_vals[:n], b_vals[:n]
        row.pairs = (a_vals, b_vals)
        row.comparison = stats.compare(a_vals, b_vals, m * sequential.factor(looks) if row.role == "family" else 1,
                                       power)
    warnings = sorted({w for r in rows if r.comparison for w in r.comparison.warnings})
    warnings += mixed_builds(ok)
    n_dup = sum(dup.values())
    if n_dup:
        warnings.append(f"{n_dup} (cell, arm, pass) measured more than once (ok): each row says how many; the "
                        "latest run of each is used, the others are kept")
    return SeriesAnalysis(rows=rows, metrics=metric_names, cells=cells, arms=arms, baseline=base, family_size=m,
                          primary=primary, duplicates=n_dup, warnings=warnings, looks=tuple(looks or ()))


@dataclass
class SeriesFigure:
    label: str  # e.g. "2026-11-29 (a1b2c3d4e5f6), 10 passes"
    median: float
    median_ci: tuple[float, float] | None  # exact order-statistic 95% interval; None: n too small
    ratio: float | None
    ratio_ci: tuple[float, float] | None  # 95% signed-rank interval of the paired ratio
    sha: str = ""  # the series' grid sha256


@dataclass
class BetweenRow:
    cell: str
    arm: str
    metric: str
    series: list[SeriesFigure]
    spread: float  # max / min of the series medians
    disjoint: list[str]  # what does not overlap across series


def between_series(host_arts: list, metrics: tuple[str, ...] = ("decode_tok_s", "prefill_tok_s")) -> list[BetweenRow]:
    """Where one host measured the same (cell, arm) in several series of a grid: each series' median and
    paired ratio with their 95% intervals, the spread of the medians, and the intervals that do not overlap
    (a session effect larger than any one series' interval admits)."""
    series = all_series(host_arts)
    if len(series) < 2:
        return []
    per: list[tuple[str, dict]] = []
    for s in series:
        an = analyse(s, power=False)
        n_pass = len({a.grid.pass_index for a in s})
        label = f"{min(a.timing.start for a in s)[:10]} (`{s[0].grid.sha256[:12]}`), {n_pass} passes"
        per.append((label, s[0].grid.sha256, {(r.cell, r.arm, r.metric): r for r in an.rows}))
    keys = sorted({k for _, _, rows in per for k in rows if k[2] in metrics})
    out = []
    for key in keys:
        figs = []
        for label, sha, rows in per:
            r = rows.get(key)
            if r is None:
                continue
            ratio = ratio_ci = None
            if r.pairs is not None:
                # the plain 95% interval of this series alone (not the family's level): comparable across series
                c = stats.compare(*r.pairs, 1, power=False)
                ratio, ratio_ci = c.ratio, ((c.ci_low, c.ci_high) if c.has_interval else None)
            figs.append(SeriesFigure(label=label, median=r.summary.median,
                                     median_ci=stats.order_statistic_ci(np.asarray(r.values)), ratio=ratio,
                                     ratio_ci=ratio_ci, sha=sha))
        if len(figs) < 2:
            continue
        meds = [f.median for f in figs]
        disjoint = []
        if _disjoint([f.median_ci for f in figs]):
            disjoint.append("medians")
        if _disjoint([f.ratio_ci for f in figs]):
            disjoint.append("ratios")
        out.append(BetweenRow(cell=key[0], arm=key[1], metric=key[2], series=figs, spread=max(meds) / min(meds),
                              disjoint=disjoint))
    return out


def _disjoint(intervals: list) -> bool:
    """Whether some two of the intervals do not overlap (missing intervals are skipped)."""
    iv = [i for i in intervals if i is not None]
    return len(iv) >= 2 and max(lo for lo, _ in iv) > min(hi for _, hi in iv)


@dataclass(frozen=True)
class CeilingRow:
    """One (grid, cell, arm) of a host's newest series against the host's ceiling at the run's threads: decode as
    weight bytes per second and its share of the read bandwidth, prefill as FLOP/s and its share of the matmul
    peak of its compute type (None for quantized builds: integer kernels, no peak measured), the forward alone
    where the runs timed their steps."""
    grid: str
    cell: str
    arm: str
    engine: str
    form: str
    threads: int
    weight_bytes: int
    decode: float
    gbs: float
    bw_share: float
    prefill: float
    gflops: float
    peak_kind: str
    peak: float | None
    flop_share: float | None
    forward_gbs: float | None
    forward_share: float | None
    n: int


def _median_of_runs(arts: list, metric: str) -> float:
    return stats.summarize([stats.summarize(a.metrics[metric].samples).median for a in arts]).median


def ceiling_rows(best: dict[int, dict[str, float]], newest: dict[str, list], ceiling_grids: tuple[str, ...]) -> list[CeilingRow]:
    """best: the host's calibration, best per thread count (ceiling.best_by_threads); newest: grid -> the host's
    newest series of it."""
    from harness.models import MATMUL_PARAMETERS
    rows = []
    for name in ceiling_grids:
        if name not in newest:
            continue
        groups: dict[tuple, list] = defaultdict(list)
        for a in newest[name]:
            if a.status == "ok" and "decode_tok_s" in a.metrics and a.model.files:
                groups[(a.grid.cell, a.grid.arm)].append(a)
        for (cell, arm), arts in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            a0 = arts[0]
            t = a0.execution.threads
            if t not in best:
                continue
            wbytes = weight_bytes(a0.model)
            if wbytes is None:  # a format without a weight-file rule: no figure
                continue
            dec, pre = _median_of_runs(arts, "decode_tok_s"), _median_of_runs(arts, "prefill_tok_s")
            gbs = wbytes * dec / 1e9
            # bf16 weights are computed in bf16 only where the host's bf16 matmul outruns its fp32 one; else the
            # engines widen them to fp32 (llama.cpp on AVX2), and fp32 is the peak they can reach
            bf16 = ("bf16" in a0.model.dtype or "bfloat16" in a0.model.dtype) and \
                best[t]["matmul_gflop_s_bf16"] > best[t]["matmul_gflop_s_fp32"]
            quant = a0.model.dtype.lower().startswith("q")
            peak = best[t]["matmul_gflop_s_bf16" if bf16 else "matmul_gflop_s_fp32"]
            gflops = 2 * MATMUL_PARAMETERS.get(a0.model.name, a0.model.parameters) * pre / 1e9
            # the forward alone, where the runs timed their steps (grids/step-attribution.yaml): is it bandwidth-bound?
            fwd = [a.attribution.parts["forward"].mean_ms for a in arts
                   if a.attribution is not None and "forward" in a.attribution.parts]
            fwd_gbs = wbytes / (stats.summarize(fwd).median / 1e3) / 1e9 if fwd else None
            bw = best[t]["read_bandwidth_gb_s"]
            rows.append(CeilingRow(grid=name, cell=cell, arm=arm, engine=a0.engine.name, form=a0.model.form, threads=t,
                                   weight_bytes=wbytes, decode=dec, gbs=gbs, bw_share=gbs / bw, prefill=pre,
                                   gflops=gflops, peak_kind="bf16" if bf16 else "fp32", peak=None if quant else peak,
                                   flop_share=None if quant else gflops / peak, forward_gbs=fwd_gbs,
                                   forward_share=None if fwd_gbs is None else fwd_gbs / bw, n=len(arts)))
    return rows


@dataclass(frozen=True)
class Speed:
    grid: str
    cell: str
    decode: float | None
    prefill: float | None


def speed_of(newest: Newest, host: str, engine: str, form: str, threads: int,
             ceiling_grids: tuple[str, ...]) -> Speed | None:
    """A build's measured speed on one host, from that host's newest series of the speed grids: the first of
    the ceiling grids that ran this engine, model form and thread count (then any other grid), its cell with the
    shortest prompt; medians of the runs' medians. Another host's speed is never shown beside this host's
    fidelity."""
    groups: dict[tuple, list] = defaultdict(list)
    for (name, key), arts in newest.items():
        if key != host:
            continue
        for a in arts:
            if (a.status == "ok" and a.engine.name == engine and a.model.form == form and a.execution.threads == threads
                    and "decode_tok_s" in a.metrics):
                groups[(name, a.grid.cell)].append(a)
    if not groups:
        return None

    def rank(kv: tuple) -> tuple:
        (name, cell), arts = kv
        grid_rank = ceiling_grids.index(name) if name in ceiling_grids else len(ceiling_grids)
        return grid_rank, arts[0].workload.prompt_len, -len(arts), name, cell
    (grid_name, cell), arts = min(groups.items(), key=rank)

    def med(metric: str) -> float | None:
        mine = [a for a in arts if metric in a.metrics]
        return _median_of_runs(mine, metric) if mine else None
    return Speed(grid=grid_name, cell=cell, decode=med("decode_tok_s"), prefill=med("prefill_tok_s"))


def answered(arts: list) -> tuple[bool, int, int]:
    """Sequential passes (harness/sequential.py): whether every declared comparison of one series (its artifacts)
    has a verdict, better or worse: (answered, how many have, how many there are)."""
    ok = [a for a in arts if a.status == "ok"]
    if not ok:
        return False, 0, 0
    an = analyse(arts, power=False)
    fam = [r for r in an.rows if r.role == "family" and r.comparison is not None]
    done = sum(1 for r in fam if stats.verdict(r.comparison, r.higher_is_better) in ("better", "worse"))
    return bool(fam) and done == len(fam), done, len(fam)
