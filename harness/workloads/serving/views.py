"""The report's views of a serving grid's series: its rate sweep (capacity under the SLO, per pass, with intervals)
and the cross-check's two client tools' medians side by side. analysis.py computes them; this words them."""

from __future__ import annotations

from harness.report.sections import _fmt, _ratio_text
from harness.workloads.serving.analysis import TOOL_MEDIANS, sweep_view, tool_medians


def sweep(sec: dict, series: list) -> dict | None:
    """A series' rate sweep, worded (analysis.sweep_view computes it)."""
    v = sweep_view(series, sec["baseline"])
    if v is None:
        return None
    return {"share": f"{v.share:.0%}", "slo": ", ".join(f"{k} <= {x:g} s" for k, x in v.slo.items()),
            "rows": [{"cell": r.cell.replace("batch=1,", ""), "arm": r.arm, "n": len(r.values),
                      "median": _fmt(r.median), "per_pass": ", ".join(_fmt(x) for x in r.values),
                      "ci": f"[{_fmt(r.median_ci[0])}, {_fmt(r.median_ci[1])}]" if r.median_ci else
                      f"(n={len(r.values)}: no 95% interval; 6 passes give one)",
                      "ratio": _ratio_text(r.vs_baseline) if r.vs_baseline else ""} for r in v.rows],
            "rates": [{"cell": r.cell.replace("batch=1,", ""), "point": r.point, "label": r.label,
                       "rate": _fmt(r.median_req_s), "n": r.n} for r in v.rates]}


def tools(series: list) -> list[dict]:
    """The cross-check's two tools' medians side by side (analysis.tool_medians computes them)."""
    rows = []
    for t in tool_medians(series):
        row = {"cell": t.cell.replace("batch=1,", ""), "arm": t.arm, "client": t.client, "n": t.n}
        for m in TOOL_MEDIANS:
            row[m] = _fmt(t.ours[m] * 1000) if m in t.ours else ""
            row[m + "_printed"] = _fmt(t.printed[m] * 1000) if m in t.printed else ""
        rows.append(row)
    return rows
