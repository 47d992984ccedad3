"""Reports rendered from the artifact store with jinja2: results.md, byte-identical for the same store.

Every figure is a median over passes with its spread and n, and, for non-baseline arms, the
paired ratio to the grid's baseline arm with its bootstrap CI and verdict.

    inputs.py    what the report reads: the stores' accepted artifacts, parsed once and cached
    sections.py  a grid's section (tables, verdicts, views), fidelity and ceiling sections, across hosts
    pages.py     the index and a page per grid: written, checked, summarized
    hosts.py     the machines that measured a store
    readme.py    the generated blocks of the README and docs
    memo.py      the rendered report of exactly these inputs, kept and read back
    jinja.py     the templates
"""

from __future__ import annotations

import os

from pathlib import Path

from harness import analysis, summary, views, workloads
from harness.analysis import by_host, by_key
from harness.errors import UserError
from harness.grid import read_expanded
from harness.plotcache import PLOT_HASHES, write_plots
from harness.report import inputs
from harness.report.hosts import check_file, format_hosts, hosts, hosts_rows
from harness.report.inputs import Collected, _cached_inputs, _listing, collect, printable
from harness.report.jinja import TEMPLATES, _env
from harness.report.memo import _Output
from harness.report.pages import (INDEX, PAGE_MARK, Pages, check_pages, grid_pages, orphan_pages, page_name,
                                  summary_intro, summary_view, verdict_lines, worse_rows, write_pages)
from harness.report.readme import BLOCKS, block_markers, readme_text, render_block
from harness.report.sections import (_context, _scale, _steps, across_hosts, ceiling_section, fidelity_section,
                                     grid_section, history_block, plot_names, targets_block)
from harness.store import gc_paused

# what the CLI, the HTML site and the tests reach here (the submodules hold them)
__all__ = ["BLOCKS", "INDEX", "PAGE_MARK", "PLOT_HASHES", "TEMPLATES", "Pages", "block_markers", "build", "build_all",
           "check_file", "check_pages", "collect", "format_hosts", "hosts", "hosts_rows", "inputs", "orphan_pages",
           "page_name", "plot_names", "readme_text", "render", "render_block", "targets_block", "verdict_lines", "worse_rows",
           "write_pages", "write_plots"]


def render(store_dirs: list[str] | None = None) -> str:
    """The whole report as one text: the index, then every grid's page."""
    return "".join(build_all(store_dirs)[0].values())


def build(store_dirs: list[str] | None = None) -> tuple[str, list[dict]]:
    pages, sections, _ = build_all(store_dirs)
    return "".join(pages.values()), sections


def build_all(store_dirs: list[str] | None = None) -> tuple[Pages, list[dict], dict]:
    """(the pages: the index and a page per grid, grid sections, the whole context the templates are rendered
    from)."""
    if store_dirs:  # a store named by the user must exist: a typo must not render an empty report
        for d in store_dirs:
            if not Path(d).is_dir():
                raise UserError(str(d), "--store: no such store directory", "pass the folder that holds <grid>/<id>.json")
    store_dirs = [str(d) for d in store_dirs] if store_dirs else ["artifacts", "baselines"]
    with gc_paused():  # thousands of parsed artifacts and the rows made from them: trees, no cycles
        try:
            return _build_all(store_dirs)
        finally:
            analysis.forget()


def _build_all(store_dirs: list[str]) -> tuple[Pages, list[dict], dict]:
    """build_all, memoized: where every file's verdict is in its store's verification cache under the file's
    current stamp, the report of exactly these inputs (_output_key) rendered before is read back (_Output)."""
    dirs = [d for d in store_dirs if Path(d).exists()]
    listing = _listing(dirs)
    memo = _Output(store_dirs, "pages")
    known = _cached_inputs(listing)
    if known is not None:
        hit = memo.load(known)
        if hit is not None:
            return hit
    inputs: list = []
    views.forget()  # the grid files this render reads (their `report:` fields) are inputs too: memo.save keeps them
    out = _render_all(store_dirs, collect(dirs, listing, inputs))
    if all(None not in ids for _, ids, _ in inputs):
        memo.save(inputs, out, views.reads())
    return out


def _render_all(store_dirs: list[str], c: Collected) -> tuple[Pages, list[dict], dict]:
    newest = analysis.newest_by_grid_and_host(c.runs)  # each speed grid's newest series per host, once
    gates = analysis.fidelity_gates([a for arts in c.fidelity.values() for a in arts])
    specs = {}  # grid name -> what its file declares the report shows (views.py), read from its newest series' file
    for name, arts in c.runs.items():
        latest = max(arts, key=lambda a: a.timing.end)
        specs[name] = views.of_series(name, latest.grid.path, read_expanded)
        if not os.path.exists(latest.grid.path):  # a bisect probe's grid, in another user's cache: its history
            probe = views.probe_history(name, sorted({a.grid.arm for a in arts}))
            specs[name] = (probe, "") if probe is not None else specs[name]
    ceiling_grids = tuple(sorted(n for n, (spec, _) in specs.items() if spec.ceiling))
    fsections = [fidelity_section(name, host_arts, newest, ceiling_grids)
                 for name, arts in c.fidelity.items() for host_arts in by_host(arts).values()]
    ceiling = ceiling_section(c.calibrations, newest, ceiling_grids)
    sections = []
    cal_by_host = {key: max(cals, key=lambda c: c.timing.end) for key, cals in by_key(c.calibrations).items()}
    for name, arts in c.runs.items():
        groups = by_host(arts)
        spec, problem = specs[name]
        for key, host_arts in groups.items():
            sec = grid_section(name, host_arts, c.where, gates)
            if problem:
                sec["warnings"] = sorted({*sec["warnings"], printable(problem)})
            sec["n_hosts"] = len(groups)
            sec["blocks"] = list(spec.blocks)
            series = analysis.newest_series(host_arts)  # once: every view below reads this host's newest series
            sec["scale"] = _scale(sec, series, cal_by_host) if spec.shows("scale") else None
            sec["steps"] = _steps(sec, series, cal_by_host) if spec.shows("steps") else None
            sec["targets"] = targets_block(spec.targets, series)
            sec["history"] = history_block(spec.history, series)
            sec["context"] = _context(sec, series, cal_by_host) if spec.shows("context") else None
            for kind in workloads.kinds():  # each workload kind's own views of the series (sweep, tools: serving's)
                sec.update(kind.views(sec, series))
            sec["plots"] = plot_names(sec)
            sections.append(sec)
    ctx = {"sections": sections, "fidelity": fsections, "ceilings": ceiling, "stores": store_dirs,
           "left_out": [printable(line) for line in c.left_out],
           "hosts": hosts_rows(c), "across_hosts": across_hosts(sections)}
    ctx["grids"] = grid_pages(sections, fsections, ctx["across_hosts"])
    legacy = {h["key"] for h in ctx["hosts"] if str(h["identity"]).startswith("legacy")}
    ctx["summary"] = summary_view(summary.summarize(newest, gates, legacy), ctx["hosts"],
                                  {g["name"]: g["page"] for g in ctx["grids"]})
    ctx["summary_intro"] = summary_intro()
    env = _env()
    pages = {INDEX: env.get_template("results.md.j2").render(**ctx)}
    for g in ctx["grids"]:
        pages[g["page"]] = env.get_template("grid.md.j2").render(g=g, stores=store_dirs)
    return pages, sections, ctx


assert set(BLOCKS) == {"published", "answer", *views.BLOCKS}  # the README's summary and answer: of every grid
