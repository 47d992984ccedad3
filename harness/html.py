"""The report as static HTML (`harness report --html DIR`): the same pages as the markdown (the index and a
page per grid, converted by markdown-it), every table sortable by a click on its header, every plot drawn
interactive by plotly.js from the same section data the PNGs are drawn from. No server and no network at view
time: one copy of plotly.js (from the plotly wheel) beside the pages, the rest inline.

A page records what it ran into: `data-plots` on <body> counts the plots drawn with data, `data-labels-missing`
the category labels (a forest plot's rows) that a plot left undrawn, `data-errors` the script errors (tests open
the pages in headless Chromium and read them).
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.errors import UserError

ASSET = "plotly.min.js"

STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;
color:#1f2328;line-height:1.45}
table{border-collapse:collapse;margin:1em 0;font-size:13px;display:block;overflow-x:auto}
th,td{border:1px solid #d0d7de;padding:3px 7px;vertical-align:top}
th{background:#f6f8fa;cursor:pointer;user-select:none;position:sticky;top:0}
details>summary{cursor:pointer}details>summary>h2{display:inline}nav.contents{font-size:14px}
th[data-dir=asc]::after{content:" \\25B2"}th[data-dir=desc]::after{content:" \\25BC"}
tr:nth-child(even) td{background:#fbfbfc}code{background:#f2f4f6;padding:0 3px;border-radius:3px;font-size:90%}
.plot{width:100%;max-width:1000px;height:440px;margin:1em 0}
"""

# Sort a table by the clicked column: numbers (the first number in a cell) numerically, else as text.
SCRIPT = """
window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message));
document.body.dataset.errors=window.__errors.length;});
function __key(t){var m=t.replace(/,/g,'').match(/-?\\d+(\\.\\d+)?(e[-+]?\\d+)?/i);return m?parseFloat(m[0]):null;}
document.addEventListener('DOMContentLoaded',function(){
document.body.dataset.errors=window.__errors.length;
document.querySelectorAll('table').forEach(function(tb){tb.querySelectorAll('th').forEach(function(th,i){
th.addEventListener('click',function(){var dir=th.dataset.dir==='asc'?'desc':'asc';
tb.querySelectorAll('th').forEach(function(o){delete o.dataset.dir;});th.dataset.dir=dir;
var body=tb.tBodies[0];var rows=Array.from(body.rows);rows.sort(function(a,b){
var x=a.cells[i]?a.cells[i].textContent:'',y=b.cells[i]?b.cells[i].textContent:'';var kx=__key(x),ky=__key(y);
var c=(kx!==null&&ky!==null)?kx-ky:x.localeCompare(y);return dir==='asc'?c:-c;});
rows.forEach(function(r){body.appendChild(r);});});});});
var plots=document.querySelectorAll('div.plot');var drawn=0;var missing=0;
plots.forEach(function(d){var f=JSON.parse(document.getElementById(d.id+'-data').textContent);
Plotly.newPlot(d,f.data,f.layout,{responsive:true,displaylogo:false}).then(function(){
if(f.data.some(function(t){return (t.x||[]).length>0||(t.y||[]).length>0;}))drawn++;
var want={},got={};f.data.forEach(function(t){(t.y||[]).forEach(function(v){if(typeof v==='string')want[v]=1;});});
d.querySelectorAll('.ytick text').forEach(function(e){got[e.textContent]=1;});
missing+=Object.keys(want).filter(function(k){return !got[k];}).length;
document.body.dataset.labelsMissing=missing;document.body.dataset.plots=drawn;});});
document.body.dataset.plots=drawn;document.body.dataset.plotsExpected=plots.length;
document.querySelectorAll('details').forEach(function(d){d.addEventListener('toggle',function(){
if(d.open)d.querySelectorAll('div.plot').forEach(function(p){Plotly.Plots.resize(p);});});});});
"""


def _title(sec: dict, what: str) -> str:
    return f"{sec['name']} (host {sec['host_key']}): {what}"


def ratio_figure(sec: dict) -> dict:
    """The ratio chart: each comparison's paired ratio to the baseline with its interval (plots.ratio_chart)."""
    from harness.plots import ratio_label, verdict_color
    labels, ratios, lo, hi, colors = [], [], [], [], []
    for t in sec["tables"]:
        for r in t["rows"]:
            if "ci" in r:
                labels.append(ratio_label(t["metric"], r, " | "))
                ratios.append(r["ratio_value"])
                lo.append(r["ratio_value"] - r["ci"][0])
                hi.append(r["ci"][1] - r["ratio_value"])
                colors.append(verdict_color(r["verdict"]).replace("tab:", ""))
    return {"data": [{"type": "scatter", "mode": "markers", "x": ratios, "y": labels, "name": "ratio",
                      "marker": {"color": colors},
                      "error_x": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo}}],
            "layout": {"title": {"text": _title(sec, "ratio to the baseline, interval at the family's level")},
                       "height": 180 + 26 * len(labels),  # every label drawn: a row of its own (tests/test_html.py)
                       "xaxis": {"title": {"text": f"ratio to '{sec['baseline']}'"}},
                       "yaxis": {"autorange": "reversed", "automargin": True},
                       "shapes": [{"type": "line", "x0": 1, "x1": 1, "yref": "paper", "y0": 0, "y1": 1,
                                   "line": {"dash": "dash", "color": "grey"}}]}}


def threads_figure(sec: dict) -> dict:
    """The thread sweep: each arm's median per thread count with the band of its 95% interval."""
    data = []
    for t in sec["tables"]:
        if t["unit"] != "tok/s":
            continue
        for arm in sorted({r["arm"] for r in t["rows"]}):
            rows = sorted((r for r in t["rows"] if r["arm"] == arm), key=lambda r: r["threads"])
            data.append({"type": "scatter", "mode": "lines+markers", "name": f"{t['metric']} {arm}",
                         "x": [r["threads"] for r in rows], "y": [r["median_value"] for r in rows],
                         "error_y": {"type": "data", "symmetric": False,
                                     "array": [r["median_ci"][1] - r["median_value"] for r in rows],
                                     "arrayminus": [r["median_value"] - r["median_ci"][0] for r in rows]}})
    return {"data": data, "layout": {"title": {"text": _title(sec, "median over passes, bars: 95% interval")},
                                     "xaxis": {"title": {"text": "threads"}, "dtick": 1},
                                     "yaxis": {"title": {"text": "tok/s"}}}}


def scale_figure(sec: dict) -> dict:
    by: dict[str, list[dict]] = defaultdict(list)
    for r in sec["scale"]["rows"]:
        if r["bw_share_value"] is not None:
            by[r["arm"]].append(r)
    data = [{"type": "scatter", "mode": "lines+markers", "name": arm,
             "x": [r["parameters"] for r in sorted(rows, key=lambda r: r["parameters"])],
             "y": [100 * r["bw_share_value"] for r in sorted(rows, key=lambda r: r["parameters"])]}
            for arm, rows in sorted(by.items())]
    return {"data": data, "layout": {"title": {"text": _title(sec, "decode's share of the read bandwidth")},
                                     "xaxis": {"type": "log", "title": {"text": "parameters"}},
                                     "yaxis": {"title": {"text": "% of measured read bandwidth"}}}}


def steps_figure(sec: dict) -> dict:
    blk = sec["steps"]
    xs = [f"{r['arm']} {r['threads']}t {r['cell_short']}" for r in blk["rows"]]
    data: list[dict[str, Any]] = [{"type": "bar", "name": p, "x": xs, "y": [r["parts"].get(p) or 0.0 for r in blk["rows"]]}
                                  for p in blk["parts"]]
    data.append({"type": "scatter", "mode": "markers", "name": "measured itl", "x": xs,
                 "y": [r["itl_ms"] or 0.0 for r in blk["rows"]], "marker": {"symbol": "line-ew-open", "size": 30}})
    return {"data": data, "layout": {"barmode": "stack", "title": {"text": _title(sec, "where a decode step's time goes")},
                                     "yaxis": {"title": {"text": "ms per decode step (mean)"}}}}


def context_figure(sec: dict) -> dict:
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in sec["context"]["rows"]:
        if r["decode_value"] is not None:
            by[(r["arm"], r["size"])].append(r)
    data = [{"type": "scatter", "mode": "lines+markers", "name": f"{arm} {size}",
             "x": [r["prompt_len"] for r in sorted(rows, key=lambda r: r["prompt_len"])],
             "y": [r["decode_value"] for r in sorted(rows, key=lambda r: r["prompt_len"])]}
            for (arm, size), rows in sorted(by.items())]
    return {"data": data, "layout": {"title": {"text": _title(sec, "decode against the prompt length")},
                                     "xaxis": {"type": "log", "title": {"text": "prompt tokens before decode"}},
                                     "yaxis": {"type": "log", "title": {"text": "decode tok/s"}}}}


def load_figure(sec: dict) -> dict:
    """The serving curve: each arm's latency against its output throughput, a point per load (plots.load_curve)."""
    from harness.analysis import load_points
    data = [{"type": "scatter", "mode": "lines+markers+text", "name": f"{metric} {arm}",
             "x": [x for _, x, _, _ in rows], "y": [y for _, _, y, _ in rows], "text": [t for _, _, _, t in rows],
             "textposition": "top right"}
            for metric, by_arm in load_points(sec).items() for arm, rows in sorted(by_arm.items())]
    return {"data": data, "layout": {"title": {"text": _title(sec, "latency against throughput, a point per load")},
                                     "xaxis": {"title": {"text": "serve_output_tok_s"}},
                                     "yaxis": {"title": {"text": "s"}}}}


def history_figure(sec: dict) -> dict:
    """A history (plots.history_chart): each metric and cell a line of its versions' medians relative to its first
    version, with their 95% intervals; the steps found named in the hover text."""
    data = []
    for t in sec["history"]["tables"]:
        first = t["rows"][0]["median_value"]
        ys = [r["median_value"] / first for r in t["rows"]]
        lo = [(r["median_value"] - (r["ci_values"] or [r["median_value"]])[0]) / first for r in t["rows"]]
        hi = [((r["ci_values"] or [0, r["median_value"]])[1] - r["median_value"]) / first for r in t["rows"]]
        data.append({"type": "scatter", "mode": "lines+markers", "name": f"{t['metric']} {t['cell']}".strip(),
                     "x": [r["version"] for r in t["rows"]], "y": ys,
                     "text": [f"step x{r['step_value']:.3f}: {r['verdict']}" if r["found"] else r["verdict"]
                              for r in t["rows"]],
                     "error_y": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo}})
    return {"data": data, "layout": {"title": {"text": _title(sec, "history, relative to its first version")},
                                     "yaxis": {"title": {"text": "median / first version's"}}}}


FIGURES = {"-ratios.png": ratio_figure, "-history.png": history_figure, "-threads.png": threads_figure, "-scale.png": scale_figure,
           "-steps.png": steps_figure, "-context.png": context_figure, "-load.png": load_figure}


def figures(sections: list[dict]) -> dict[str, dict]:
    """plot file name (as the markdown names it) -> its plotly figure."""
    out = {}
    for sec in sections:
        for name in sec["plots"]:
            fn = next(f for suffix, f in FIGURES.items() if name.endswith(suffix))
            out[name] = fn(sec)
    return out


def _finite(x: Any) -> Any:
    """x with every float that is not finite (a NaN from a broken run) as None: plotly leaves a gap."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def script_json(x: Any) -> str:
    """JSON for a <script type="application/json"> block: every '<', '>' and '&' as a JSON escape, so that no
    string in it (an arm named `</script>` or `<!--<script>`) can close the block or turn its end into text."""
    return (json.dumps(x, sort_keys=True, allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))


_IMG = re.compile(r'<img src="([^"]+\.png)" alt="[^"]*"\s*/?>')
_LINK = re.compile(r'href="([A-Za-z0-9][A-Za-z0-9_-]*)\.md"')


_H2 = re.compile(r"<h2>(.*?)</h2>", re.S)
OPEN = ("The answer",)  # the sections shown open: the answer first; the rest folded, listed in the contents


def _fold(body: str) -> str:
    """Each h2 section a <details> (folded, but the answer) and a table of contents of them at the top."""
    starts = [m.start() for m in _H2.finditer(body)]
    if len(starts) < 2:
        return body
    parts, toc = [body[:starts[0]]], []
    for i, (a, b) in enumerate(zip(starts, starts[1:] + [len(body)])):
        m = _H2.match(body, a)
        title, rest, anchor = m.group(1), body[m.end():b], f"section-{i + 1}"
        toc.append(f'<li><a href="#{anchor}">{title}</a></li>')
        opened = " open" if html.unescape(re.sub(r"<[^>]+>", "", title)) in OPEN else ""
        parts.append(f'<details id="{anchor}"{opened}><summary><h2>{title}</h2></summary>{rest}</details>\n')
    return parts[0] + f'<nav class="contents"><ul>{"".join(toc)}</ul></nav>\n' + "".join(parts[1:])


def page_html(title: str, markdown: str, figs: dict[str, dict]) -> str:
    """One page: its markdown as HTML, links to pages beside it made .html, each plot an interactive chart."""
    from markdown_it import MarkdownIt
    from harness.report import PAGE_MARK
    markdown = markdown.replace(PAGE_MARK + "\n", "", 1)
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    body = _LINK.sub(lambda m: f'href="{m.group(1)}.html"', body)
    n = 0

    def plot(m: re.Match) -> str:
        nonlocal n
        fig = figs.get(html.unescape(m.group(1)))
        if fig is None:
            return m.group(0)
        n += 1
        data = script_json(_finite(fig))
        return (f'<div class="plot" id="plot-{n}"></div>'
                f'<script type="application/json" id="plot-{n}-data">{data}</script>')
    body = _fold(_IMG.sub(plot, body))
    head = f'<script src="{ASSET}"></script>' if n else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<style>{STYLE}</style>{head}<script>{SCRIPT}</script>'
            f'</head><body data-plots="0" data-errors="0">\n{body}</body></html>\n')


def write(out_dir: str, pages: dict[str, str], sections: list[dict]) -> list[str]:
    """Every page as DIR/<page>.html (the index as index.html) and plotly.js beside them; files replaced whole."""
    import plotly

    from harness.untrusted import make_folder, write_file
    d = Path(out_dir)
    if d.exists() and not d.is_dir():
        raise UserError(out_dir, "--html: not a directory", "give a folder for the HTML pages")
    if not d.parent.is_dir():
        raise UserError(out_dir, "--html: its parent folder does not exist", f"create {d.parent} first")
    make_folder(d, f"harness report --html {out_dir}")
    figs = figures(sections)
    written = []
    for name, text in pages.items():
        stem = "index" if name == "results.md" else name[:-3]
        title = text.split("\n# ", 1)[-1].split("\n", 1)[0] if "\n# " in text else text.split("\n", 1)[0].lstrip("# ")
        out = d / f"{stem}.html"
        write_file(out, page_html(title, text.replace("](results.md)", "](index.md)"), figs).encode(),
                   f"harness report --html {out_dir}")
        written.append(str(out))
    asset = Path(plotly.__file__).parent / "package_data" / ASSET
    write_file(d / ASSET, asset.read_bytes(), f"harness report --html {out_dir}")
    return written
