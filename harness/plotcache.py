"""The plot cache: each plot the report draws is redrawn only when the data it shows changed; plots.json
beside the plots records, for each plot's name, the sha256 of that data."""
from __future__ import annotations

import hashlib
import inspect
import json
import math
import numbers
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.paths import safe_component
from harness.store import read_bytes

PLOT_HASHES = "plots.json"  # beside the plots: each plot's name -> the sha256 of the data it was drawn from
# Floats are hashed at the precision a plot draws them: rounded on a log scale to steps of 1e-6 of their value
# (~6 significant digits; the markdown shows ~4). That moves a value by at most 5e-7 of itself: on a ~700 px
# axis (7 in at dpi 100) that spans at least a hundredth of the values it draws (a ratio chart's CIs around 1,
# a sweep from near 0), under 0.04 px, which no eye sees. The last bits that differ between CPUs (SIMD widths
# in sums, exp and log: ~1e-15 of a value) then give the same hash, unless a value lies that close to a step's
# boundary (a chance of ~1e-9 per float). Decimal rounding would not do: its boundaries lie on the grid the data
# is recorded on (the median of two 4-decimal figures, 67.82985, sits exactly on one of 6 digits).
LOG_STEP = 1e-6


def as_drawn(x: Any) -> Any:
    """x with every float in it, at any depth of lists, tuples and dicts, replaced by its step on the log scale."""
    if isinstance(x, numbers.Real) and not isinstance(x, numbers.Integral):
        x = float(x)
        if x == 0 or not math.isfinite(x):
            return abs(x) if x == 0 else x  # -0.0 is drawn where 0.0 is
        return f"{'-' if x < 0 else ''}e{round(math.log(abs(x)) / LOG_STEP)}"
    if isinstance(x, dict):
        return {k: as_drawn(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [as_drawn(v) for v in x]
    return x


def _plot_data_hash(sec: dict, name: str) -> str:
    """What a plot shows: its section's identity and every row figure it draws (not the markdown text)."""
    keys = ("metric", "unit")
    rows = [(t["metric"], r["arm"], r["cell_short"], r["threads"], r["median_value"], list(r["median_ci"]),
             r.get("ratio_value"), list(r.get("ci", ())), r["verdict"]) for t in sec["tables"] for r in t["rows"]]
    blob = json.dumps(as_drawn({"name": name, "title": [sec["name"], sec["host_key"], sec["baseline"]],
                       "tables": [[t[k] for k in keys] for t in sec["tables"]], "rows": rows,
                       "scale": [(r["arm"], r["parameters"], r["bw_share_value"]) for r in (sec.get("scale") or {}).get(
                           "rows", [])],
                       **({"steps": [(r["arm"], r["cell"], r["threads"], r["parts"], r["itl_ms"])
                                     for r in sec["steps"]["rows"]]} if sec.get("steps") else {}),
                       **({"context": [(r["arm"], r["size"], r["prompt_len"], r["decode_value"])
                                       for r in sec["context"]["rows"]]} if sec.get("context") else {}),
                       **({"history": [(t["metric"], t["cell"], [(r["version"], r["median_value"], r["ci_values"],
                                                               r["found"], r["verdict"]) for r in t["rows"]])
                                       for t in sec["history"]["tables"]]} if sec.get("history") else {}),
                       "plots_code": _plots_code_hash()}), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


@lru_cache(maxsize=1)
def _plots_code_hash() -> str:
    """The code that draws: plots.py and the plot functions of the views (scale, steps, context)."""
    from harness import context, scale, steps
    code = (Path(__file__).parent / "plots.py").read_text() + "".join(inspect.getsource(m.plot)
                                                                      for m in (scale, steps, context))
    return hashlib.sha256(code.encode()).hexdigest()[:16]


def write_plots(sections: list[dict], out_dir: Path) -> tuple[list[Path], list[Path]]:
    """Draw the plots the markdown names (plot_names) whose data changed since they were drawn (the hash of
    their data is recorded in plots.json beside them); matplotlib is imported only when one must be drawn.
    Every plot path is built by paths.contained: a name that is not one file name, or that would resolve
    outside out_dir, is refused (drawn) or never touched (a stale name read from plots.json). (drawn, unchanged)."""
    from harness.paths import contained, name_problem
    record_path = out_dir / PLOT_HASHES
    try:
        record = json.loads(read_bytes(record_path, limit=1 << 20))
        if not isinstance(record, dict):
            record = {}
    except (UserError, ValueError):
        record = {}
    drawn, kept, new_record = [], [], {}
    for sec in sections:
        for name in sec["plots"]:
            path = contained(out_dir, safe_component(name, f"plot of grid {sec['name']}"))
            h = _plot_data_hash(sec, name)
            new_record[name] = h
            if record.get(name) == h and path.is_file() and not path.is_symlink():
                kept.append(path)
                continue
            from harness import plots
            from harness import context, scale, steps
            draw = {"-ratios.png": plots.ratio_chart, "-threads.png": plots.thread_sweep, "-scale.png": scale.plot,
                    "-steps.png": steps.plot, "-context.png": context.plot, "-load.png": plots.load_curve,
                    "-history.png": plots.history_chart}
            fn = next(f for suffix, f in draw.items() if name.endswith(suffix))
            if path.is_symlink():  # never draw through a link planted beside the report
                path.unlink()
            fn(sec, out_dir)
            drawn.append(path)
    for name in set(record) - set(new_record):  # a plot the markdown no longer names is removed
        if name_problem(name) is None and name.endswith(".png"):  # only a plot's own name, never a path
            try:
                contained(out_dir, name).unlink(missing_ok=True)
            except UserError:
                pass
    if new_record != record:
        tmp = record_path.with_name(f".{PLOT_HASHES}.tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.write_text(json.dumps(new_record, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, record_path)  # replaces a link in its place, never writes through it
    return drawn, kept
