"""Serving under load: a server engine sent requests by a load generator, closed loop (concurrency), open loop (a
rate, with arrivals) or a rate sweep, with latency bounds (docs/serving.md).

    grid.py      workload.load and workload.slo, read and validated
    analysis.py  load points, a rate sweep's capacity, the client tools' medians beside the harness's
    views.py     the report's sweep and tools tables
"""

from __future__ import annotations

from typing import Any

from harness.metrics import SERVING_METRICS
from harness.workloads.base import WorkloadKind
from harness.workloads.serving import grid as serving_grid


class Serving(WorkloadKind):
    name = serving_grid.KIND
    metrics = SERVING_METRICS

    def parse(self, path: str, workload: dict[str, Any], axes: dict[str, list]) -> tuple[dict[str, Any], dict]:
        return serving_grid.parse(path, workload, axes)

    def axis_value(self, path: str, fld: str, axis: str, v: Any, rule: bool) -> bool:
        return serving_grid.axis_value(path, fld, axis, v, rule)

    def validate(self, spec: Any) -> None:
        serving_grid.validate_load(spec)

    def record(self, spec: Any, params: dict[str, Any], resolved: dict | None) -> dict[str, Any]:
        """A served run's load as sent (its sweep point as resolved) and the grid's latency bounds."""
        if serving_grid.load(spec) is None:
            return {}
        return {"load": serving_grid.load_of(spec, params, resolved).record(), "slo": serving_grid.slo(spec)}

    def views(self, sec: dict[str, Any], series: list) -> dict[str, Any]:
        from harness.workloads.serving import views
        return {"sweep": views.sweep(sec, series), "tools": views.tools(series)}
