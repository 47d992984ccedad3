"""Analysis of a store: series selection (per host), pairing by pass, the family of comparisons, the
statistics, fidelity gates and between-series spread. Returns typed rows; harness/report.py only formats.

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
    is not reused): artifacts share their engine and model records (report._share)."""
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
