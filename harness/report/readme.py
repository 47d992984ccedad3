"""The generated blocks of the README and docs (`harness report --readme`): each block's sections as pivot
tables, rendered from the store between its markers."""

from __future__ import annotations

import itertools
from pathlib import Path


from harness.errors import UserError
from harness.report.jinja import _env
from harness.report.sections import SPREAD_PREFIX, _fmt, _short_verdict


# Generated blocks in the README and the docs: each between its own markers, rendered from the store by
# `harness report --readme FILE` and checked with --check. name -> (template, metrics shown); the grids a block
# shows are those whose files name it (`report: {blocks: [...]}`, views.py), in the order of their names.
BLOCKS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "published": ("readme.md.j2", None),
    "answer": ("answer.md.j2", None),
    "runtime": ("evidence.md.j2", ("startup_s", "decode_tok_s", "prefill_tok_s", "ttft_s", "peak_rss_mib")),
    "definitions": ("definitions.md.j2", ()),
    "hardware": ("hardware.md.j2", ("decode_tok_s", "prefill_tok_s", "ttft_s", "startup_s", "peak_rss_mib")),
    "evidence": ("evidence.md.j2", None),
}


def block_markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}:begin: rendered from the store by `harness report --readme`; do not edit -->",
            f"<!-- {name}:end -->")


README_BEGIN, README_END = block_markers("published")


def pivot(section: dict, metrics: tuple[str, ...] | None = None) -> list[dict]:
    """A grid section as one table per metric: a row per cell, a column per arm; each entry the median and,
    for non-baseline arms, the paired ratio with its CI and verdict. A metric only one arm has is left out
    (e.g. vLLM's TTFT in a series where llama.cpp was measured by llama-bench)."""
    out = []
    arms = []
    for t in section["tables"]:
        for r in t["rows"]:
            if r["arm"] not in arms:
                arms.append(r["arm"])
    for t in section["tables"]:
        if (metrics is not None and t["metric"] not in metrics) or len({r["arm"] for r in t["rows"]}) < 2:
            continue
        cells: dict[str, dict] = {}
        for r in t["rows"]:
            entry = r["median"]
            if "ci" in r:
                entry += f" ({r['ratio_value']:.2f}x [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}], {_short_verdict(r['verdict'])})"
            elif "ratio_value" in r:
                entry += f" ({r['ratio_value']:.2f}x, no interval: {_short_verdict(r['verdict'])})"
            cells.setdefault(r["cell_short"] or r["cell"].replace("batch=1,", ""), {})[r["arm"]] = entry
        out.append({"metric": t["metric"], "unit": t["unit"], "arms": arms,
                    "rows": [{"cell": c, "entries": [v.get(a, "-") for a in arms]}
                             for c, v in cells.items()]})
    return out


# The same build measured as requests (llama.cpp engine) and by llama-bench (its definition_of and definition_pairs)
def definition_pairs(section: dict) -> list[dict]:
    """Per cell and model form measured both ways: the request figure, llama-bench's, and their quotient
    (medians over passes; a quotient of medians, not a paired ratio: the two are different quantities)."""
    med = {(t["metric"], r["arm"], r["cell_short"] or r["cell"]): r["median_value"] for t in section["tables"]
           for r in t["rows"]}
    by_form: dict[str, dict[str, str]] = {}
    for arm, (engine, form) in section.get("arm_forms", {}).items():
        by_form.setdefault(form, {})[engine] = arm
    from harness.engines import ENGINES, engine_class
    from harness.engines.capabilities import Yardsticks, has
    twins = [(c.definition_of, c.name, c.definition_pairs) for c in map(engine_class, ENGINES)
             if has(c, Yardsticks) and c.definition_of]
    out = []
    for cell in sorted({k[2] for k in med}):
        for (form, arms), (req_engine, bench_engine, pairs) in itertools.product(sorted(by_form.items()), twins):
            if req_engine not in arms or bench_engine not in arms:
                continue
            row = {"cell": cell, "form": form, "figures": []}
            for req, bench in pairs:
                a, b = med.get((req, arms[req_engine], cell)), med.get((bench, arms[bench_engine], cell))
                row["figures"].append({"request": _fmt(a) if a else "-", "bench": _fmt(b) if b else "-",
                                       "quotient": f"{a / b:.2f}" if a and b else "-"})
            out.append(row)
    return out


def render_block(name: str, ctx: dict) -> str:
    template, metrics = BLOCKS[name]
    begin, end = block_markers(name)
    secs = sorted((sec for sec in ctx["sections"] if name in sec.get("blocks", ())), key=lambda s: s["name"])
    grids = tuple(dict.fromkeys(sec["name"] for sec in secs))
    class_hosts = {e["host_key"]: e["cls"] for sec in secs for e in sec.get("emulated_arms", [])}
    class_hosts.update({sec["host_key"]: "native" for sec in secs if sec.get("emulated_arms")})
    return _env().get_template(template).render(
        sections=[{**sec, "pivots": pivot(sec, metrics), "pairs": definition_pairs(sec),
                   "warnings_brief": _brief(sec["warnings"])} for sec in secs],
        fidelity=ctx["fidelity"], class_hosts=class_hosts, block_grids=grids, summary=ctx["summary"], grids=ctx["grids"],
        summary_intro=ctx["summary_intro"],
        ceilings=ctx["ceilings"], hosts=ctx["hosts"], begin=begin, end=end).rstrip("\n")


def _brief(warnings: list[str]) -> list[str]:
    """A section's warnings for a generated block: the per-comparison spread warnings counted in one line."""
    spread = [w for w in warnings if w.startswith(SPREAD_PREFIX)]
    out = [w for w in warnings if w not in spread]
    n = sum(int(w[len(SPREAD_PREFIX):].split()[0]) for w in spread)
    if spread:
        out.append(f"{n} comparison(s) with per-pass ratios spread widely (IQR above 0.10): see "
                   "reports/results.md")
    return out


def readme_text(path: str, ctx: dict) -> str:
    """The file with each generated block it holds (README's published results, the docs' evidence) replaced
    by what the store renders now."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UserError(path, f"--readme: unreadable ({e.strerror})", "pass a README or doc that holds block markers") \
            from None
    found = 0
    for name in BLOCKS:
        begin, end = block_markers(name)
        if begin not in text and end not in text:
            continue
        if text.count(begin) != 1 or text.count(end) != 1:
            raise UserError(path, f"--readme: the {name} block's markers are incomplete or repeated",
                            f"put one line `{begin}` and one `{end}` where the block goes")
        head, rest = text.split(begin)
        _, tail_ = rest.split(end)
        text = head + render_block(name, ctx) + tail_
        found += 1
    if not found:
        raise UserError(path, "--readme: no generated-block markers in this file",
                        f"put `{README_BEGIN}` and `{README_END}` where the published block goes")
    return text
