"""The report's pages: the index (results.md) and one page per grid, written beside it, checked against the
store (`harness report --check`), and the summary and verdict lines they open with."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path


from harness import summary
from harness.report.hosts import check_file
from harness.report.sections import _fmt, _short_verdict


Pages = dict[str, str]  # file name (beside the index) -> markdown; the index (INDEX) first


INDEX = "results.md"
# the pages' names the site keeps for itself: the index, and the index's name in the HTML site (index.html)
RESERVED = frozenset({INDEX, "index.md"})


PAGE_MARK = "<!-- harness report: a grid's page, rendered from the store; do not edit -->"


def write_pages(out: str, pages: Pages) -> tuple[list[str], list[str]]:
    """The index to `out`, each grid's page beside it, every file replaced whole (never written through a link);
    pages of grids no longer in the store (a file beside it that starts with PAGE_MARK) removed. (written,
    removed)."""
    from harness.untrusted import write_file
    folder = Path(out).parent
    written = []
    for name, text in pages.items():
        path = Path(out) if name == INDEX else folder / name
        write_file(path, text.encode(), f"harness report --out {out}")
        written.append(str(path))
    removed = []
    for p in orphan_pages(out, pages):
        p.unlink()
        removed.append(str(p))
    return written, removed


def orphan_pages(out: str, pages: Pages) -> list[Path]:
    """Files beside the index that a report wrote as a grid's page (they start with PAGE_MARK) and that the store
    renders no more."""
    out_p = Path(out)
    found = []
    for p in sorted(out_p.parent.glob("*.md")):
        if p.name in pages or p.name == out_p.name or p.is_symlink() or not p.is_file():
            continue
        try:
            with open(p, "rb") as f:
                head = f.read(len(PAGE_MARK))
        except OSError:
            continue
        if head == PAGE_MARK.encode():
            found.append(p)
    return found


def check_pages(out: str, pages: Pages) -> list[tuple[str, list[str]]]:
    """(path, diff lines) for each page that differs from what the store renders (a missing one included) and each
    orphan page (orphan_pages)."""
    folder = Path(out).parent
    stale = []
    for name, text in pages.items():
        path = out if name == INDEX else str(folder / name)
        diff = check_file(path, text)
        if diff:
            stale.append((path, diff))
    for p in orphan_pages(out, pages):
        stale.append((str(p), [f"{p}: the page of a grid the store no longer holds: `harness report` removes it"]))
    return stale


def _summary_entry(b: summary.Best | None, page: dict[str, str]) -> dict:
    if b is None:
        return {"text": "-", "grid": "", "page": ""}
    c = b.comparison
    if c is None:
        ratio = "reference"
    elif c.has_interval:
        ratio = f"{c.ratio:.2f}x [{c.ci_low:.2f}, {c.ci_high:.2f}], {_short_verdict(b.verdict)}"
    else:
        ratio = f"{c.ratio:.2f}x, {_short_verdict(b.verdict)} (no interval)"
    return {"text": f"`{b.form}` {_fmt(b.median)} ({ratio})", "grid": b.grid, "page": page.get(b.grid, "")}


def summary_intro() -> str:
    ref = " or ".join(f"{e} on its `{f}` form" for e, f in sorted(summary.reference_forms().items()))
    return (f"The short answer, per host: for each model measured, each engine's best form on decode rate, prefill "
            f"rate and time to first token, as its median and its ratio to {ref} (the same model's weights), paired "
            "by pass within one series and cell (a single request), with the exact interval at the level of its "
            "family (the engines set against the reference for that model, metric and host: Bonferroni) and the "
            "verdict. A form's figure comes from "
            "the series that measured it in the most passes (the link names its grid); the best form is the best "
            "point ratio among the forms whose fidelity did not fail on that host. Left out: hosts whose identity was not recorded, series of a "
            "dirty tree, emulated hardware classes, metrics whose engines' definitions differ, and engines no series "
            "set against the reference (their grids' pages show them). Fidelity: of each best form's build on that "
            "host (docs/methodology.md, fidelity gates speed).")


def summary_view(rows: list[summary.Row], hosts: list[dict], page: dict[str, str]) -> list[dict]:
    """The summary's rows (summary.summarize) as the index and the README print them: one table per host."""
    described = {h["key"]: h for h in hosts}
    out: dict[str, dict] = {}
    for r in rows:
        h = described.get(r.host, {})
        g = out.setdefault(r.host, {"host_key": r.host, "cpu": h.get("cpu", "unknown"),
                                    "isa_tier": h.get("isa_tier", "unknown"), "cores": h.get("cores", "?"),
                                    "memory": h.get("memory", "unknown"), "rows": []})
        entries = {m: _summary_entry(r.best.get(m), page) for m in summary.METRICS}
        g["rows"].append({"model": r.model, "engine": r.engine, "synthetic": r.synthetic,
                          "fidelity": ", ".join(sorted({f"{b.form} {b.fidelity}" for b in r.best.values()})),
                          "entries": [entries[m] for m in summary.METRICS]})
    for key, g in out.items():
        g["answer"] = _answer_line(g, [r for r in rows if r.host == key], page)
    return list(out.values())


def _answer_line(host: dict, rows: list[summary.Row], page: dict[str, str]) -> str:
    """One host's answer in a line: on its real-weights model measured by the most engines, the engine and form
    that decode fastest (the best point ratio to the reference, a failed fidelity aside), with its interval and
    verdict; empty where no engine was set against the reference."""
    real = [r for r in rows if not r.synthetic and "decode_tok_s" in r.best]
    if not real:
        return ""
    counts: dict[str, int] = {}
    for r in real:
        counts[r.model] = counts.get(r.model, 0) + 1
    model = max(sorted(counts), key=lambda m: counts[m])
    best = [(r.engine, r.best["decode_tok_s"]) for r in real if r.model == model]
    sound = [(e, b) for e, b in best if not b.verdict.startswith("fidelity")] or best
    engine, b = max(sound, key=lambda eb: (eb[1].comparison.ratio if eb[1].comparison else 1.0, eb[0]))
    ref = " or ".join(f"{e} on `{f}`" for e, f in sorted(summary.reference_forms().items()))
    c = b.comparison
    if c is None:
        vs = f"the reference ({ref}): no engine decodes faster"
    elif c.has_interval:
        vs = f"{c.ratio:.2f}x [{c.ci_low:.2f}, {c.ci_high:.2f}] {ref}: {_short_verdict(b.verdict)}"
    else:
        vs = f"{c.ratio:.2f}x {ref}: {_short_verdict(b.verdict)} (no interval)"
    return (f"**ISA tier {host['isa_tier']}** (host `{host['host_key']}`, {host['cpu']}, {host['cores']} cores): "
            f"`{model}` decodes fastest on {engine} `{b.form}`, {_fmt(b.median)} tok/s, {vs} ({len(best)} engines "
            f"measured{f'; [{b.grid}](reports/{page[b.grid]})' if page.get(b.grid) else ''})")


def worse_rows(sections: list[dict], grid: str, min_effect: float = 0.0) -> list[dict]:
    """The comparisons given verdicts in each host's newest series of `grid` that are worse by at least min_effect
    (compare.worse_by: the gate of `harness report --verdict GRID --fail-on worse`)."""
    from harness.compare import worse_by
    return [{"host": s["host_key"], "arm": r["arm"], "metric": t["metric"], "cell": r["cell_short"] or r["cell"],
             "ratio": r["ratio"]}
            for s in sections if s["name"] == grid for t in s["tables"] for r in t["rows"]
            if r["role"] == "family" and "ci" in r and worse_by(r["verdict"], r["ci"][0], r["ci"][1], r["hib"], min_effect)]


def verdict_lines(sections: list[dict], grid: str) -> list[str]:
    """One line per comparison given a verdict in each host's newest series of `grid` (the page's own words)."""
    out = []
    for s in sections:
        if s["name"] != grid:
            continue
        out.append(f"{grid} on host {s['host_key']} ({s['passes']} passes; family: {s['family']}):")
        for t in s["tables"]:
            for r in t["rows"]:
                if r["role"] == "family":
                    fid = "" if r["fidelity"] == "n/a" else f"; fidelity {r['fidelity']}"
                    out.append(f"  {r['arm']} / {s['baseline']} {t['metric']} at {r['cell_short'] or r['cell']}: "
                               f"{r['ratio']}: {r['verdict']}{fid}")
    return out


def page_name(grid: str, taken: set[str]) -> str:
    """The file of a grid's page beside the index: <grid>.md, or, for a name that is no plain file name (a
    hostile store's), a name the site keeps for itself (RESERVED) or one taken, grid-<sha256 prefix>.md."""
    import re
    name = f"{grid}.md"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,100}", grid) or name.lower() in RESERVED or name.lower() in taken:
        name = f"grid-{hashlib.sha256(grid.encode()).hexdigest()[:12]}.md"
    taken.add(name.lower())
    return name


def grid_pages(sections: list[dict], fsections: list[dict], across: list[dict]) -> list[dict]:
    """One page per grid, speed and fidelity grids alike, in the order of their names: its sections (every host's
    newest series), its across-host comparison and the index's line (hosts, passes, verdicts counted)."""
    names = sorted({s["name"] for s in sections} | {f["name"] for f in fsections})
    taken: set[str] = set()
    out = []
    for name in names:
        secs = [s for s in sections if s["name"] == name]
        fids = [f for f in fsections if f["name"] == name]
        words: dict[str, int] = defaultdict(int)
        for s in secs:
            for t in s["tables"]:
                for r in t["rows"]:
                    if r["role"] == "family":
                        words[_short_verdict(r["verdict"]) if "ci" in r else "no interval"] += 1
        for f in fids:
            for r in f["rows"]:
                if "(cross-engine)" not in r["build"]:
                    words[_short_verdict(r["verdict"])] += 1
        out.append({"name": name, "page": page_name(name, taken), "kind": "speed" if secs else "fidelity",
                    "hosts": sorted({x["host_key"] for x in secs + fids}),
                    "passes": ", ".join(str(p) for p in sorted({s["passes"] for s in secs})) or "-",
                    "verdicts": ", ".join(f"{w} {n}" for w, n in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])))
                    or "none", "sections": secs, "fidelity": fids,
                    "across": [a for a in across if a["grid"] == name]})
    return out
