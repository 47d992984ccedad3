"""Analysis of a store: series selection (per host), pairing by pass, the family of comparisons, the
statistics, fidelity gates and between-series spread. Returns typed rows; harness/report/ only formats.

A series is (grid sha256, host key). Runs are paired by (cell, arm, pass) inside one series only.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness import stats
from harness.grid import in_family


# --- series -----------------------------------------------------------------------------------

def machine_key(a) -> str:
    """The physical machine of an artifact: its host key, or for a run emulating a hardware class the key of
    the machine it ran on (host.machine_key). A grid's arms on one machine, emulated or not, are one series
    and pair by pass; an arm's runs all share its class, so emulated and native runs are never pooled."""
    h = a.host
    extra = getattr(h, "__pydantic_extra__", None)  # host.get("machine_key") without pydantic's __getattr__
    mk = extra.get("machine_key") if isinstance(extra, dict) else h.get("machine_key")
    return mk or h.key


def _by_identity(table: dict, obj: Any, fn: Any) -> Any:
    """fn(obj), computed once per object while `table` holds it (the object is kept beside its value, so its id
    is not reused): artifacts share their engine and model records (harness/report/inputs.py _share)."""
    hit = table.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    v = fn(obj)
    table[id(obj)] = (obj, v)
    return v


_BUILD_IDS: dict[int, tuple] = {}
_MODEL_IDS: dict[int, tuple] = {}
_WEIGHT_SHAS: dict[int, tuple] = {}


def forget() -> None:
    """Drop the per-object values computed since (a report calls it when done)."""
    _BUILD_IDS.clear()
    _MODEL_IDS.clear()
    _WEIGHT_SHAS.clear()


def by_host(arts: list) -> dict[str, list]:
    """Artifacts grouped by the machine that measured them (machine_key), machines in order of their first run."""
    groups: dict[str, list] = defaultdict(list)
    for a in sorted(arts, key=lambda a: (a.timing.start, a.id)):
        groups[machine_key(a)].append(a)
    return dict(groups)


def by_key(arts: list) -> dict[str, list]:
    """Artifacts grouped by their exact host key (an emulated class apart from its machine)."""
    groups: dict[str, list] = defaultdict(list)
    for a in sorted(arts, key=lambda a: (a.timing.start, a.id)):
        groups[a.host.key].append(a)
    return dict(groups)


def newest_series(arts: list) -> list:
    """The newest series of one host's artifacts of a grid: those stamped with the grid sha256 of its latest
    run. Callers pass one host's artifacts only."""
    assert len({machine_key(a) for a in arts}) == 1, "a series is measured by one host"
    latest = max(arts, key=lambda a: a.timing.end)
    sha = latest.grid.sha256
    return [a for a in arts if a.grid.sha256 == sha]


def all_series(arts: list) -> list[list]:
    """Every series of one host's artifacts of a grid, oldest first."""
    groups: dict[str, list] = defaultdict(list)
    for a in arts:
        groups[a.grid.sha256].append(a)
    return sorted(groups.values(), key=lambda s: min(a.timing.start for a in s))


Newest = dict[tuple[str, str], list]  # (grid name, host key) -> the newest series


def newest_by_grid_and_host(runs: dict[str, list]) -> Newest:
    return {(name, key): newest_series(host_arts) for name, arts in runs.items()
            for key, host_arts in by_host(arts).items()}


# --- builds -----------------------------------------------------------------------------------

def build_id(engine: Any) -> str:
    """The engine build a run used: its binary's sha256 prefix (llama.cpp), else a hash of every sha256 the
    engine recorded (wheel RECORDs, shell)."""
    return _by_identity(_BUILD_IDS, engine, _build_id)


def _build_id(engine: Any) -> str:
    b = engine.build
    if isinstance(b.get("binary_sha256"), str):
        return b["binary_sha256"][:12]
    shas = {k: v for k, v in sorted(b.items()) if k.endswith("sha256")}
    return hashlib.sha256(json.dumps(shas or b, sort_keys=True).encode()).hexdigest()[:12]


def weight_shas(a: Any) -> tuple[str, ...]:
    return _by_identity(_WEIGHT_SHAS, a.model, _weight_shas)


def _weight_shas(model: Any) -> tuple[str, ...]:
    return tuple(sorted(f.sha256 for f in model.weight_files() or []))


def model_id(a: Any) -> str:
    """The weights a run used: a hash of its model files' sha256s."""
    return _by_identity(_MODEL_IDS, a.model, _model_id)


def _model_id(model: Any) -> str:
    return hashlib.sha256("".join(sorted(f.sha256 for f in model.files)).encode()).hexdigest()[:12]


def mixed_builds(arts: list) -> list[str]:
    """Within one series, each arm whose runs used more than one engine build or model file set (pyperf
    refuses to merge such runs; the report says so and names them)."""
    out = []
    arms: dict[str, list] = defaultdict(list)
    for a in arts:
        arms[a.grid.arm].append(a)
    for arm, runs in sorted(arms.items()):
        builds = sorted({build_id(a.engine) for a in runs})
        # figures pool per cell: a model or form axis gives each cell its own files, which is no mixing
        cells: dict[str, set[str]] = defaultdict(set)
        for a in runs:
            if a.model.files:
                cells[a.grid.cell].add(model_id(a))
        weights = sorted(set().union(*(w for w in cells.values() if len(w) > 1)))
        if len(builds) > 1:
            out.append(f"arm {arm}: its runs used {len(builds)} different engine builds (sha256 "
                       f"{', '.join(builds)}): figures of different binaries are pooled in this series")
        if len(weights) > 1:
            out.append(f"arm {arm}: its runs used {len(weights)} different model file sets ({', '.join(weights)}): "
                       "figures of different weights are pooled in this series")
    return out


# --- fidelity gates ---------------------------------------------------------------------------

def fidelity_key(a: Any) -> tuple:
    """What a fidelity result vouches for: the machine, the engine, its build commit and ISA variant (a capped
    llama.cpp build computes with other kernels; None: the native build), the ISA a run was capped to (torch's kernels change with it), the
    model form and its weight files. A run emulating a class without an ISA cap (cores, memory) computes what
    the machine computes: its machine's fidelity vouches for it."""
    return (machine_key(a), a.engine.name, a.engine.build_commit, a.engine.build.get("isa_variant"), isa_cap(a),
            a.model.name, a.model.form, weight_shas(a))


def isa_cap(a: Any) -> str | None:
    """The ISA tier a run was capped to, or None (native, or emulated without an ISA cap)."""
    emu = getattr(a.execution, "emulation", None) if hasattr(a, "execution") else None
    if not emu:
        return None
    isa = emu.get("caps", {}).get("isa", {})
    return None if str(isa.get("applied", "")).startswith("none") else isa.get("requested")


def fidelity_gates(fidelity_arts: list) -> dict[tuple, Any]:
    """The newest same-engine (gated) fidelity artifact for each fidelity_key."""
    out: dict[tuple, Any] = {}
    for a in sorted(fidelity_arts, key=lambda a: a.timing.end):
        if not a.cross_engine:
            out[fidelity_key(a)] = a
    return out


def gate(a: Any, gates: dict[tuple, Any]) -> str:
    """`pass`, `fail` (failed or errored), `unchecked` (no fidelity artifact for this build on this host),
    `n/a` (no model: the command engine), or `synthetic weights` (outputs mean nothing: speed only; the
    verdict stands, marked)."""
    if not a.model.files:
        return "n/a"
    if a.model.source.get("synthetic"):
        return "synthetic weights"
    f = gates.get(fidelity_key(a))
    if f is None:
        return "unchecked"
    return "pass" if f.status == "ok" and f.verdict == "pass" else "fail"


# --- one series -------------------------------------------------------------------------------

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

    @property
    def level(self) -> float:
        """The level of each interval of the family (Bonferroni)."""
        return 1 - ALPHA / max(1, self.family_size)


ALPHA = stats.ALPHA


def unreachable(an: SeriesAnalysis) -> tuple[int, float, int] | None:
    """(the fewest passes of a family comparison, the family's level, the passes a verdict needs) where those
    passes can never give a verdict at that level; None where they can (or there is no family)."""
    n_min = min((r.comparison.n_pairs for r in an.rows if r.comparison and r.role == "family"), default=0)
    if an.family_size and not stats.reachable(n_min, an.family_size):
        return n_min, an.level, stats.passes_needed(an.family_size)
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
    runs: dict[tuple, Any] = {}
    dup: dict[tuple, int] = defaultdict(int)
    for a in sorted(ok, key=lambda a: a.timing.end):
        k = (a.grid.cell, a.grid.arm, a.grid.pass_index)
        if k in runs:
            dup[(a.grid.cell, a.grid.arm)] += 1
        runs[k] = a
    failed: dict[tuple, int] = defaultdict(int)
    for a in arts:
        if a.status != "ok":
            failed[(a.grid.cell, a.grid.arm)] += 1
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
    for row, a_vals, b_vals in pending:
        # exploratory estimates get a plain 95% interval, family members the family's level
        row.pairs = (a_vals, b_vals)
        row.comparison = stats.compare(a_vals, b_vals, m if row.role == "family" else 1, power)
    warnings = sorted({w for r in rows if r.comparison for w in r.comparison.warnings})
    warnings += mixed_builds(ok)
    n_dup = sum(dup.values())
    if n_dup:
        warnings.append(f"{n_dup} (cell, arm, pass) measured more than once (ok): each row says how many; the "
                        "latest run of each is used, the others are kept")
    return SeriesAnalysis(rows=rows, metrics=metric_names, cells=cells, arms=arms, baseline=base, family_size=m,
                          primary=primary, duplicates=n_dup, warnings=warnings)


# --- between series (one host) ----------------------------------------------------------------

@dataclass
class SeriesFigure:
    label: str  # e.g. "2026-11-29 (a1b2c3d4e5f6), 10 passes"
    median: float
    median_ci: tuple[float, float] | None  # exact order-statistic 95% interval; None: n too small
    ratio: float | None
    ratio_ci: tuple[float, float] | None  # 95% signed-rank interval of the paired ratio


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
        per.append((label, {(r.cell, r.arm, r.metric): r for r in an.rows}))
    keys = sorted({k for _, rows in per for k in rows if k[2] in metrics})
    out = []
    for key in keys:
        figs = []
        for label, rows in per:
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
                                     ratio_ci=ratio_ci))
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


# --- the machine's ceiling and a build's speed (the report words them) ------------------------------------

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
            wbytes = a0.model.weight_bytes()
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


# ---- a serving grid's curve: latency against throughput as the load grows ---------------------------------

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


# ---- a rate sweep: the highest rate each arm served within the SLO (harness/sweep.py) ------------------------

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


# ---- the serving cross-check: vLLM's own printed medians beside the harness's (docs/serving.md) ----------------

TOOL_MEDIANS = (("ttft_p50_s", "median_ttft_ms"), ("itl_all_p50_s", "median_itl_ms"), ("tpot_p50_s", "median_tpot_ms"))


@dataclass(frozen=True)
class ToolMedians:
    cell: str
    arm: str
    client: str  # "vllm-bench" or "harness"
    n: int  # ok runs
    ours: dict[str, float]  # metric -> median over runs of the harness's figure from the arm's own records
    printed: dict[str, float]  # metric -> median over runs of vLLM's printed figure (seconds); vllm-bench arms only


def tool_medians(series: list) -> list[ToolMedians]:
    """Per serving cell and arm of a series with a vllm-bench arm: the harness's TTFT, pooled-ITL and TPOT
    medians (median over runs) and, for the vllm-bench arms, the medians vLLM printed for the same runs."""
    ok = [a for a in series if a.status == "ok" and a.workload.load is not None]
    if not any(a.execution.effective.get("tool_report") for a in ok):
        return []
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for a in ok:
        groups[(a.grid.cell, a.grid.arm)].append(a)
    out = []
    for (cell, arm), arts in sorted(groups.items()):
        bench = any(a.execution.effective.get("tool_report") for a in arts)
        ours = {m: float(np.median([np.median(a.metrics[m].samples) for a in arts if m in a.metrics]))
                for m, _ in TOOL_MEDIANS if any(m in a.metrics for a in arts)}
        printed: dict[str, float] = {}
        for m, key in TOOL_MEDIANS:
            vals = []
            for a in arts:  # a run's repetitions each printed one report: their median, in seconds
                reps = [r[key] / 1000.0 for r in a.execution.effective.get("tool_report") or []
                        if isinstance(r, dict) and isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
                if reps:
                    vals.append(float(np.median(reps)))
            if vals:
                printed[m] = float(np.median(vals))
        out.append(ToolMedians(cell=cell, arm=arm, client="vllm-bench" if bench else "harness", n=len(arts), ours=ours,
                               printed=printed))
    return out
