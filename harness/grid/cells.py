"""A grid expanded, purely: its cells (the axes' product, filtered by include and exclude), the arms that run in
each, the models and forms they load, and the family of comparisons given verdicts."""

from __future__ import annotations

import itertools

from harness.grid.spec import Arm, Cell, GridSpec, model_of


def in_family(primary: dict | None, metric: str, arm: str, params: dict) -> bool:
    """Whether a comparison is one of the grid's primaries (every comparison, when none are declared)."""
    if not primary:
        return True
    if "metrics" in primary and metric not in primary["metrics"]:
        return False
    if "arms" in primary and arm not in primary["arms"]:
        return False
    return "cells" not in primary or any(_matches(r, params) for r in primary["cells"])


def family(spec: GridSpec) -> list[tuple[str, str, str]]:
    """The comparisons a grid gives verdicts to, before anything runs: (cell, arm, metric) for each cell,
    each non-baseline arm that runs there beside the baseline, each metric both engines emit, filtered by
    the declared primaries."""
    from harness.engines import engine_metrics
    out = []
    base = spec.arm(spec.baseline)
    for cell in expand(spec):
        arms = arms_for(spec, cell)
        if base not in arms:
            continue
        for a in arms:
            if a.name == spec.baseline:
                continue
            for m in engine_metrics(a.engine):
                if m in engine_metrics(base.engine) and in_family(spec.primary, m, a.name, cell.params):
                    out.append((cell.id, a.name, m))
    return out


def _matches(rule: dict, params: dict, arm: str | None = None) -> bool:
    for k, v in rule.items():
        if k == "arm":
            if arm is not None and arm != v:
                return False
        elif params.get(k) != v:
            return False
    return True


def expand(spec: GridSpec) -> list[Cell]:
    """Cartesian product of the axes, plus the fixed workload, filtered by include/exclude. Pure."""
    keys = sorted(spec.axes)
    id_keys = sorted({*spec.fixed, *keys})  # every cell has the same keys: cell_id's order, sorted once
    drop = [r for r in spec.exclude if "arm" not in r]  # a rule naming an arm drops that arm only (arms_for)
    cells = []
    for combo in itertools.product(*(spec.axes[k] for k in keys)):
        params = {**spec.fixed, **dict(zip(keys, combo))}
        if spec.include and not any(_matches(r, params) for r in spec.include):
            continue
        if drop and any(_matches(r, params) for r in drop):
            continue
        cells.append(Cell(id=",".join([f"{k}={params[k]}" for k in id_keys]), params=params))
    return cells


def model_forms(spec: GridSpec) -> dict[str, list[str] | None]:
    """Each model a grid runs, with the forms its arms load there (None: one is chosen per run, `auto`)."""
    from harness.engines import get_engine
    out: dict[str, set[str] | None] = {}
    for c in expand(spec):
        name = model_of(spec, c.params)
        if name == "none":
            continue
        for a in arms_for(spec, c):
            form = c.params.get("form") or a.form or get_engine(a.engine).default_form
            if form in (None, "auto") or out.get(name, set()) is None:
                out[name] = None
            elif form != "none":
                out.setdefault(name, set()).add(form)  # type: ignore[union-attr]
    return {n: None if f is None else sorted(f) for n, f in sorted(out.items())}


def arms_for(spec: GridSpec, cell: Cell) -> list[Arm]:
    """Arms that run in a cell: exclude rules that name an arm remove it from matching cells."""
    rules = [r for r in spec.exclude if "arm" in r]
    if not rules:
        return list(spec.arms)
    return [a for a in spec.arms if not any(_matches(r, cell.params, a.name) for r in rules)]
