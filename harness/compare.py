"""`harness compare A B`: two series that need not be arms of one grid (two hosts, two versions of a grid, two
stores), matched by cell, arm and metric (docs/harness.md, "Comparing two series").

A series is `GRID[@HOST][#SHA][/ARM]`: the runs of grid GRID measured by HOST (a host key or a unique prefix of
one; optional where one host measured the grid), of the grid version whose sha256 starts with SHA (default: that
host's newest), of arm ARM (default: every arm). Each side may come from its own stores (--store-a, --store-b).

- A and B of one series, two arms named: paired per pass (stats.compare), as the report compares arms.
- Otherwise unpaired: each run is one value (the median of its repetitions), and B/A is the Hodges-Lehmann
  shift of the log values with its exact Mann-Whitney interval (stats.compare_unpaired).

Every comparison of the output is one family: each interval at 1 - 0.05/m, the verdict words the report's. Runs
whose metric definitions or units differ are refused, named: their figures are not one measurement.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from harness import analysis, stats
from harness.errors import UserError

SPEC = re.compile(r"^(?P<grid>[A-Za-z0-9][A-Za-z0-9._-]*)(@(?P<host>[0-9a-f]{1,12}))?(#(?P<sha>[0-9a-f]{1,64}))?"
                  r"(/(?P<arm>[^/@#]+))?$")


@dataclass(frozen=True)
class Side:
    spec: str
    grid: str
    host: str
    sha256: str
    arm: str | None
    runs: list


def parse(spec: str) -> dict[str, str | None]:
    m = SPEC.match(spec)
    if not m:
        raise UserError(spec, "not a series", "write GRID[@HOST][#SHA256-PREFIX][/ARM], e.g. quickstart@3891360811dc")
    return m.groupdict()


def resolve(spec: str, by_grid: dict[str, list]) -> Side:
    """The runs a series names (ok runs only: a failed run is one with no value), or one line saying why none."""
    p = parse(spec)
    arts = by_grid.get(p["grid"] or "")
    if not arts:
        raise UserError(spec, f"no runs of grid {p['grid']!r}", f"grids in the store(s): {', '.join(sorted(by_grid)) or 'none'}")
    hosts = analysis.by_key(arts)
    keys = [k for k in hosts if not p["host"] or k.startswith(p["host"])]
    if len(keys) != 1:
        raise UserError(spec, "no host" if not keys else f"{len(keys)} hosts measured it",
                        f"name one with @HOST: {', '.join(sorted(hosts))}")
    series = analysis.all_series(hosts[keys[0]])
    if p["sha"]:
        series = [s for s in series if s[0].grid.sha256.startswith(p["sha"])]
        if len(series) != 1:
            shas = sorted({a.grid.sha256[:12] for a in hosts[keys[0]]})
            raise UserError(spec, f"{'no' if not series else len(series)} version(s) of the grid match #{p['sha']}",
                            f"its versions on {keys[0]}: {', '.join(shas)}")
    chosen = max(series, key=lambda s: max(a.timing.end for a in s))
    runs = [a for a in chosen if a.status == "ok" and (not p["arm"] or a.grid.arm == p["arm"])]
    if p["arm"] and not runs:
        raise UserError(spec, f"no ok run of arm {p['arm']!r}", f"its arms: {', '.join(sorted({a.grid.arm for a in chosen}))}")
    return Side(spec, p["grid"], keys[0], chosen[0].grid.sha256, p["arm"], runs)


def _definitions(side: Side, with_arm: bool) -> dict[tuple, set[tuple[str, str]]]:
    """(cell, arm or None, metric) -> the (definition, unit) its runs recorded."""
    out: dict[tuple, set[tuple[str, str]]] = defaultdict(set)
    for a in side.runs:
        for name, m in a.metrics.items():
            out[(a.grid.cell, a.grid.arm if with_arm else None, name)].add((m.definition, m.unit))
    return out


def _values(side: Side, with_arm: bool) -> dict[tuple, dict[int, float]]:
    """(cell, arm or None, metric) -> {pass index: run value}."""
    out: dict[tuple, dict[int, float]] = defaultdict(dict)
    for a in side.runs:
        for name, m in a.metrics.items():
            if m.samples:
                out[(a.grid.cell, a.grid.arm if with_arm else None, name)][a.grid.pass_index] = stats.run_value(m.samples)
    return out


def compare(a: Side, b: Side, metrics: list[str] | None = None) -> list[dict[str, Any]]:
    """One row per matched (cell, arm, metric): A and B medians, B/A with its interval, the verdict."""
    if (a.arm is None) != (b.arm is None):
        raise UserError(f"{a.spec} vs {b.spec}", "one side names an arm, the other does not",
                        "name an arm on both sides (/ARM) or on neither")
    same_series = (a.grid, a.host, a.sha256) == (b.grid, b.host, b.sha256)
    paired = same_series and a.arm is not None
    with_arm = a.arm is None
    va, vb = _values(a, with_arm), _values(b, with_arm)
    both = {k[2] for k in set(va) & set(vb)}
    for name in metrics or []:
        if name not in both:
            raise UserError(f"--metric {name}", "not measured by both series in a common cell",
                            f"metrics of both: {', '.join(sorted(both)) or 'none'}")
    keys = sorted(k for k in set(va) & set(vb) if not metrics or k[2] in metrics)
    if not keys:
        raise UserError(f"{a.spec} vs {b.spec}", "no cell, arm and metric in common",
                        "name arms (/ARM) to compare two arms, or series of grids with the same cells")
    da, db = _definitions(a, with_arm), _definitions(b, with_arm)
    for key in keys:
        if len(da[key]) != 1 or da[key] != db[key]:
            cell, arm, name = key
            defs = "; ".join(f"{s.spec}: {' | '.join(sorted(f'{d} [{u}]' for d, u in dd[key]))}"
                             for s, dd in ((a, da), (b, db)))
            raise UserError(f"metric {name} ({cell}{', arm ' + arm if arm else ''})",
                            f"the runs' definitions differ ({defs[:500]})",
                            "compare runs of one definition: choose the metrics with --metric, or re-measure")
    higher = {name: m.higher_is_better for s in (a, b) for r in s.runs for name, m in r.metrics.items()}
    m_family = len(keys)
    rows = []
    for key in keys:
        cell, arm, metric = key
        xa, xb = va[key], vb[key]
        row: dict[str, Any] = {"cell": cell, "arm": arm, "metric": metric, "higher_is_better": higher[metric],
                               "a_runs": len(xa), "b_runs": len(xb),
                               "a_median": stats.summarize(list(xa.values())).median,
                               "b_median": stats.summarize(list(xb.values())).median}
        if paired:
            common = sorted(set(xa) & set(xb))
            c = stats.compare([xb[i] for i in common], [xa[i] for i in common], m_family=m_family, power=False)
            row |= {"method": f"paired by pass ({len(common)} passes)", "ratio": c.ratio, "ci_low": c.ci_low,
                    "ci_high": c.ci_high, "level": c.level, "verdict": stats.verdict(c, higher[metric]),
                    "warnings": list(c.warnings)}
        else:
            u = stats.compare_unpaired(list(xb.values()), list(xa.values()), m_family=m_family)
            row |= {"method": f"unpaired ({u.n_a} vs {u.n_b} runs)", "ratio": u.ratio, "ci_low": u.ci_low,
                    "ci_high": u.ci_high, "level": u.level, "verdict": stats.unpaired_verdict(u, higher[metric]),
                    "warnings": list(u.warnings)}
        rows.append(row)
    return rows


def gate(rows: list[dict[str, Any]], min_effect: float = 0.0) -> list[dict[str, Any]]:
    """The rows a CI gate fails on (`--fail-on worse`): a verdict of worse whose whole interval lies beyond
    `min_effect` on the worse side (higher is better: its upper bound below 1 - min_effect; lower is better: its
    lower bound above 1 + min_effect). With min_effect 0 this is exactly a verdict of worse."""
    return [r for r in rows if worse_by(r["verdict"], r.get("ci_low"), r.get("ci_high"), r.get("higher_is_better"),
                                        min_effect)]


def worse_by(verdict: str, ci_low: float | None, ci_high: float | None, higher_is_better: bool | None,
             min_effect: float) -> bool:
    """A verdict of worse by at least min_effect with the interval's confidence (the gate's one rule)."""
    if not verdict.startswith("worse") or ci_low is None or ci_high is None or higher_is_better is None:
        return False
    return ci_high < 1 - min_effect if higher_is_better else ci_low > 1 + min_effect


def _f(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:.4g}"


def markdown(a: Side, b: Side, rows: list[dict[str, Any]]) -> str:
    lines = [f"# {b.spec} against {a.spec}", "",
             f"- A: grid {a.grid}, host {a.host}, grid sha256 {a.sha256[:12]}, {len(a.runs)} ok run(s)"
             f"{', arm ' + a.arm if a.arm else ''}",
             f"- B: grid {b.grid}, host {b.host}, grid sha256 {b.sha256[:12]}, {len(b.runs)} ok run(s)"
             f"{', arm ' + b.arm if b.arm else ''}",
             f"- {len(rows)} comparison(s), one family: each interval at {stats.level_text(rows[0]['level'])}; "
             f"{rows[0]['method'].split(' (')[0]}", "",
             "| cell | arm | metric | A median | B median | B/A [interval] | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        iv = f" [{_f(r['ci_low'])}, {_f(r['ci_high'])}]" if r["ci_low"] is not None else ""
        lines.append(f"| {r['cell']} | {r['arm'] or '-'} | {r['metric']} | {_f(r['a_median'])} | {_f(r['b_median'])} | "
                     f"{_f(r['ratio'])}{iv} | {r['verdict']} |")
    notes = sorted({w for r in rows for w in r["warnings"]})
    return "\n".join(lines + ([""] + [f"- note: {n}" for n in notes] if notes else [])) + "\n"


def to_json(a: Side, b: Side, rows: list[dict[str, Any]]) -> str:
    side = (lambda s: {"spec": s.spec, "grid": s.grid, "host": s.host, "grid_sha256": s.sha256, "arm": s.arm,
                       "runs": len(s.runs)})
    return json.dumps({"a": side(a), "b": side(b), "comparisons": rows}, indent=1) + "\n"
