"""Text generation: batch requests of prompt_len token ids, each decoding gen_len tokens, in a context of
context_len (docs/harness.md). Its lengths have no defaults: each of them, left at a default, has produced a wrong
conclusion. Its metrics are the request metrics every request engine reports (harness/metrics.py)."""

from __future__ import annotations

from typing import Any

from harness.grid.spec import WHY_NO_DEFAULTS, WORKLOAD_FIELDS, err
from harness.metrics import REQUEST_METRICS
from harness.workloads.base import WorkloadKind


class Generation(WorkloadKind):
    name = "generation"
    metrics = REQUEST_METRICS

    def require(self, path: str, fixed: dict[str, Any], axes: dict[str, list]) -> None:
        from harness.workloads import kinds
        if any(k.owns(fixed, axes) for k in kinds()):  # another kind's requests (speech: texts, not tokens)
            return
        for w in WORKLOAD_FIELDS:
            if w not in fixed and w not in axes:
                raise err(path, f"workload.{w}", "is required and has no default", f"set it; {WHY_NO_DEFAULTS}")
