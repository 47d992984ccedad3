"""The workload kind contract: what one kind of workload owns, beside the engines' contract."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from harness.grid import GridSpec


class WorkloadKind:
    """One kind of workload (text generation in-process, serving under load, ...).

    - `axis_value` checks a value of an axis it adds (serving: rate).
    - `parse` reads its fields of the grid's `workload:` mapping (removing them; a field no kind takes is refused)
      and returns them (kept in GridSpec.kinds under its name: `fields(spec)` reads them back) and the cell
      parameters it fixes; it may add axes (a rate sweep's points). `require` holds the cells' fixed parameters
      to its rules once every kind has parsed.
    - `validate` checks the whole spec (its engines can run it), after parsing, at plan.
    - `record`: what its fields add to one run's artifact `workload` block.
    - `metrics`: the metrics its runs report, name -> (unit, higher is better, definition).
    - `views`: the report's keys of a grid section for one series of its runs (None where it does not apply).
    """

    name: ClassVar[str] = ""
    metrics: ClassVar[dict[str, tuple[str, bool, str]]] = {}

    def parse(self, path: str, workload: dict[str, Any], axes: dict[str, list]) -> tuple[dict[str, Any], dict]:
        return {}, {}

    def owns(self, fixed: dict[str, Any], axes: dict[str, list]) -> bool:
        """Whether the cells are this kind's own requests, not token generation (speech: a text per request)."""
        return False

    def axis_value(self, path: str, fld: str, axis: str, v: Any, rule: bool) -> bool:
        """Check a value of an axis this kind adds (`rule`: in an include, exclude or primary rule); False where
        the axis is not this kind's (the grid's own rule for numeric axes applies)."""
        return False

    def require(self, path: str, fixed: dict[str, Any], axes: dict[str, list]) -> None:
        """Refuse cells whose fixed parameters and axes lack what this kind needs."""

    def validate(self, spec: "GridSpec") -> None:
        """Refuse a spec this kind's runs cannot have (its engines, its fields together)."""

    def fields(self, spec: "GridSpec") -> dict[str, Any]:
        """This kind's fields of a grid, as its parse returned them."""
        return spec.kinds.get(self.name) or {}

    def record(self, spec: "GridSpec", params: dict[str, Any], resolved: dict | None) -> dict[str, Any]:
        """What this kind adds to a run's artifact `workload` block (`resolved`: a rate sweep's point as resolved)."""
        return {}

    def views(self, sec: dict[str, Any], series: list) -> dict[str, Any]:
        return {}
