"""The short answer: per host, per model measured, each engine's best form on decode, prefill and TTFT, as
a paired ratio to the reference engine's reference form (llama.cpp on f32 weights: the engine class that
names a `summary_reference` form) with its interval, and the fidelity status of that build on that host.

Read from the newest series of every grid on every host (analysis.newest_by_grid_and_host), with these left
out: a host whose identity was not recorded (legacy records), a series measured by a dirty tree, runs under an
emulated hardware class (their own host key: not this machine), and a metric whose definitions differ between
the engines of a series (not like for like). A candidate is an arm of a series that also ran the reference form
of the same model in the same single-request cell; its ratio is paired by pass against that reference. A
form's evidence is its candidate of the most passes; an engine's best form is the best point ratio among its
forms whose fidelity did not fail (summarize). Each (host, model, metric) is one family (Bonferroni): the
question a reader asks of one model on one machine.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from harness import analysis, stats

METRICS = ("decode_tok_s", "prefill_tok_s", "ttft_s")


@dataclass(frozen=True)
class Best:
    """An engine's best form on one metric: where it was measured and how it compares with the reference."""
    metric: str
    form: str
    arm: str
    grid: str
    cell: str
    median: float
    unit: str
    higher_is_better: bool
    reference: bool  # this is the reference form itself (ratio 1 by definition)
    comparison: stats.Comparison | None
    verdict: str
    fidelity: str  # of this form's build on this host: pass, fail, unchecked, n/a, synthetic weights


@dataclass(frozen=True)
class Row:
    host: str
    model: str
    engine: str
    synthetic: bool
    best: dict[str, Best]  # metric -> the engine's best form on it


@dataclass(frozen=True)
class Candidate:
    host: str
    model: str
    engine: str
    form: str
    arm: str
    grid: str
    cell: str
    metric: str
    unit: str
    higher_is_better: bool
    values: tuple[float, ...]  # per common pass
    ref_values: tuple[float, ...]
    reference: bool
    synthetic: bool
    fidelity: str

    @cached_property
    def point(self) -> float:
        """The point ratio to the reference (its Hodges-Lehmann estimate), oriented so larger is better."""
        r = 1.0 if self.reference else stats.compare(list(self.values), list(self.ref_values), power=False).ratio
        return r if self.higher_is_better else 1.0 / r  # nan (a value not finite and positive) stays nan


def reference_forms() -> dict[str, str]:
    """engine name -> its summary reference form (one engine names one)."""
    from harness.engines import ENGINES, engine_class
    from harness.engines.capabilities import Yardsticks, has
    return {c.name: c.summary_reference for c in map(engine_class, ENGINES) if has(c, Yardsticks) and c.summary_reference}


def _one_definition(runs: list, metric: str) -> bool:
    return len({r.metrics[metric].definition for r in runs if metric in r.metrics}) <= 1


def candidates(newest: analysis.Newest, gates: dict, legacy_hosts: set[str]) -> list[Candidate]:
    refs = reference_forms()
    out = []
    for (grid, host), series in sorted(newest.items()):
        if host in legacy_hosts or any(a.harness.dirty for a in series):
            continue
        ok = [a for a in series if a.status == "ok" and not a.host.emulation and a.model.files]
        by: dict[tuple[str, str], dict[int, Any]] = defaultdict(dict)  # (cell, arm) -> pass -> run (the latest)
        for a in sorted(ok, key=lambda a: a.timing.end):
            if a.grid.cell_params.get("batch", 1) == 1:
                by[(a.grid.cell, a.grid.arm)][a.grid.pass_index] = a
        for cell in sorted({c for c, _ in by}):
            arms = {arm: runs for (c, arm), runs in by.items() if c == cell}
            ref_arms = [arm for arm, runs in arms.items()
                        if refs.get(next(iter(runs.values())).engine.name) == next(iter(runs.values())).model.form]
            if not ref_arms:
                continue
            ref_runs = arms[sorted(ref_arms)[0]]
            r0 = next(iter(ref_runs.values()))
            for arm, runs in sorted(arms.items()):
                a0 = next(iter(runs.values()))
                if a0.model.name != r0.model.name:
                    continue
                for metric in METRICS:
                    passes = sorted(p for p in set(runs) & set(ref_runs)
                                    if metric in runs[p].metrics and metric in ref_runs[p].metrics)
                    if not passes or not _one_definition([*runs.values(), *ref_runs.values()], metric):
                        continue
                    m = a0.metrics[metric]
                    out.append(Candidate(
                        host=host, model=a0.model.name, engine=a0.engine.name, form=a0.model.form, arm=arm, grid=grid,
                        cell=cell, metric=metric, unit=m.unit, higher_is_better=m.higher_is_better,
                        values=tuple(stats.run_value(runs[p].metrics[metric].samples) for p in passes),
                        ref_values=tuple(stats.run_value(ref_runs[p].metrics[metric].samples) for p in passes),
                        reference=arm == sorted(ref_arms)[0], synthetic=bool(a0.model.source.get("synthetic")),
                        fidelity=analysis.gate(a0, gates)))
    return out


def summarize(newest: analysis.Newest, gates: dict, legacy_hosts: set[str]) -> list[Row]:
    """The summary's rows, hosts in order of their keys, then models, then engines (the reference's first).

    Per (host, model, engine, metric): each form's evidence is its candidate of the most passes (then the grid's
    name); the best form is the best point ratio among the forms whose build fidelity did not fail (a faster
    build that changes the outputs is another model), or among all where every one failed. Each (host, model,
    metric) is one family: its intervals are at 1 - 0.05/m, m the engines set against the reference there."""
    per_form: dict[tuple[str, str, str, str, str], Candidate] = {}
    for c in candidates(newest, gates, legacy_hosts):
        if not math.isfinite(c.point):
            continue  # a pass without a finite positive ratio: no estimate to rank (its series' page says so)
        k = (c.host, c.model, c.engine, c.metric, c.form)
        have = per_form.get(k)
        if have is None or (len(c.values), have.grid) > (len(have.values), c.grid):
            per_form[k] = c
    forms: dict[tuple[str, str, str, str], list[Candidate]] = defaultdict(list)
    for (host, model, engine, metric, _), c in sorted(per_form.items()):
        forms[(host, model, engine, metric)].append(c)
    best: dict[tuple[str, str, str, str], Candidate] = {}
    for k, cs in forms.items():
        sound = [c for c in cs if c.fidelity != "fail"] or cs
        best[k] = max(sound, key=lambda c: (c.point, len(c.values), c.form))
    family: dict[tuple[str, str, str], int] = defaultdict(int)  # (host, model, metric) -> comparisons
    for c in best.values():
        if not c.reference:
            family[(c.host, c.model, c.metric)] += 1
    refs = set(reference_forms())
    rows: dict[tuple[str, str, str], dict[str, Best]] = defaultdict(dict)
    for (host, model, engine, metric), c in sorted(best.items()):
        comp = None if c.reference else stats.compare(list(c.values), list(c.ref_values), family[(host, model, metric)],
                                                      power=False)
        if comp is None:
            verdict = "reference"
        elif c.fidelity not in ("pass", "n/a", "synthetic weights"):
            verdict = f"fidelity {c.fidelity}"
        else:
            verdict = stats.verdict(comp, c.higher_is_better)
        rows[(host, model, engine)][metric] = Best(
            metric=metric, form=c.form, arm=c.arm, grid=c.grid, cell=c.cell,
            median=stats.summarize(list(c.values)).median, unit=c.unit, higher_is_better=c.higher_is_better,
            reference=c.reference, comparison=comp, verdict=verdict, fidelity=c.fidelity)
    order = sorted(rows, key=lambda k: (k[0], k[1], k[2] not in refs, k[2]))
    return [Row(host=h, model=m, engine=e, synthetic=any(b.fidelity == "synthetic weights" for b in rows[(h, m, e)].values()),
                best=rows[(h, m, e)]) for h, m, e in order]
