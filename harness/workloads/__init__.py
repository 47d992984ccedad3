"""Workload kinds, registered by name ("module:Class") as engines are: one package and one line here per kind.

A kind owns what is particular to it (harness/workloads/base.py WorkloadKind): its fields of the grid's
`workload:` and their validation, the cell parameters it fixes, its metric definitions, and the views the report
gives its runs. Grid parsing and the report dispatch over `kinds()` and never branch on a kind's name (docs/harness.md,
"Adding a workload kind").
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any

KINDS: dict[str, str] = {
    "generation": "harness.workloads.generation:Generation",
    "serving": "harness.workloads.serving:Serving",
    "speech": "harness.workloads.speech:Speech",
}


@lru_cache(maxsize=None)
def kind_class(name: str) -> Any:
    mod, cls = KINDS[name].split(":")
    return getattr(importlib.import_module(mod), cls)


@lru_cache(maxsize=1)
def kinds() -> tuple[Any, ...]:
    """One instance of every registered kind, in registry order."""
    return tuple(kind_class(name)() for name in KINDS)


def workload_record(spec: Any, params: dict[str, Any], resolved: dict | None = None) -> dict[str, Any]:
    """What every kind adds to one run's artifact `workload` block (serving: its load and bounds)."""
    out: dict[str, Any] = {}
    for kind in kinds():
        out |= kind.record(spec, params, resolved)
    return out


def metric_definitions() -> dict[str, tuple[str, bool, str]]:
    """Every kind's metrics: name -> (unit, higher is better, definition); a name means one thing everywhere."""
    out: dict[str, tuple[str, bool, str]] = {}
    for kind in kinds():
        for name, d in kind.metrics.items():
            if out.setdefault(name, d) != d:
                raise RuntimeError(f"metric {name} is defined twice, differently (workload kind {kind.name})")
    return out
