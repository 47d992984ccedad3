"""Where each decode step's time goes (grids whose runs carry an `attribution` block, e.g.
grids/step-attribution.yaml): per arm and cell, each part's mean time per decode step (the median over the
series' runs of each run's mean), their sum against the measured inter-token latency, the non-model share,
and the forward alone against the host's measured read bandwidth (is the forward itself bandwidth-bound?).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from harness import stats
from harness.engines import weight_bytes
from harness.metrics import STEP_PART_NAMES, step_parts

PARTS = tuple(STEP_PART_NAMES)
ACCOUNT_TOLERANCE = 0.10  # the parts must account for the inter-token latency within this


def _med(xs: list[float]) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return stats.summarize(xs).median if xs else None


def steps_block(arts: list, section: dict, best: dict[int, dict[str, float]] | None) -> dict | None:
    """The attribution view of one series, or None when none of its runs timed its steps."""
    ok = [a for a in arts if a.status == "ok" and getattr(a, "attribution", None) is not None]
    if not ok:
        return None
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for a in ok:
        groups[(a.grid.arm, a.grid.cell)].append(a)
    rows = []
    for (arm, cell), mine in sorted(groups.items(), key=lambda kv: (kv[1][0].engine.name, kv[0][0], kv[0][1])):
        a0 = mine[0]
        t = a0.execution.threads
        parts = {p: _med([a.attribution.parts[p].mean_ms for a in mine if p in a.attribution.parts]) for p in PARTS}
        itl = _med([a.attribution.itl_mean_ms for a in mine])
        acc = _med([a.attribution.accounted for a in mine])
        share = _med([a.attribution.model_share for a in mine])
        eng_fwd = _med([a.attribution.engine_forward_mean_ms for a in mine])
        wbytes = weight_bytes(a0.model)
        if wbytes is None:  # a format without a weight-file rule: no figure
            continue
        fwd = parts.get("forward")
        gbs = wbytes / (fwd / 1e3) / 1e9 if fwd else None
        bw = (best or {}).get(t, {}).get("read_bandwidth_gb_s")
        kern = _med([a.attribution.inside_forward["linear_kernel"].mean_ms for a in mine
                     if a.attribution.inside_forward and "linear_kernel" in a.attribution.inside_forward])
        kgbs = wbytes / (kern / 1e3) / 1e9 if kern else None
        rows.append({
            "arm": arm, "cell": cell, "cell_short": cell.replace("batch=1,", ""), "engine": a0.engine.name,
            "form": a0.model.form, "threads": t, "n": len(mine), "steps": sum(a.attribution.steps for a in mine),
            "parts": parts, "parts_text": {p: "-" if v is None else f"{v:.2f}" for p, v in parts.items()},
            "itl_ms": itl, "itl_text": "-" if itl is None else f"{itl:.2f}",
            "accounted": acc, "accounted_text": "-" if acc is None else f"{100 * acc:.1f}%",
            "within": acc is not None and abs(acc - 1) <= ACCOUNT_TOLERANCE,
            "model_share": share, "nonmodel_text": "-" if share is None else f"{100 * (1 - share):.0f}%",
            "engine_forward_text": "-" if eng_fwd is None else f"{eng_fwd:.2f}",
            "forward_gbs": "-" if gbs is None else f"{gbs:.1f}",
            "forward_bw_share_value": None if gbs is None or not bw else gbs / bw,
            "forward_bw_share": "no calibration" if not bw else "-" if gbs is None else f"{100 * gbs / bw:.0f}%",
            "decode_bw_share": "no calibration" if not bw else "-" if not itl else
            f"{100 * wbytes / (itl / 1e3) / 1e9 / bw:.0f}%",
            "kernel_ms": kern, "kernel_bw_share_value": None if kgbs is None or not bw else kgbs / bw,
            "instrumented": True})
    parts_present = [p for p in PARTS if any(r["parts"].get(p) for r in rows)]
    return {"rows": rows, "parts": parts_present, "definitions": {p: step_parts()[p] for p in parts_present},
            "text": _meaning(rows), "tolerance": f"{100 * ACCOUNT_TOLERANCE:.0f}%",
            "source": sorted({a.attribution.source for a in ok})}


def _meaning(rows: list[dict]) -> list[str]:
    """Sentences generated from the rows: what is left outside the forward, per engine, and whether the
    parts account for the measured latency."""
    out = []
    for r in rows:
        if r["model_share"] is None or r["itl_ms"] is None:
            continue
        rest = {p: v for p, v in r["parts"].items() if p != "forward" and v}
        top = max(rest.items(), key=lambda kv: kv[1]) if rest else None
        out.append(f"{r['arm']} ({r['cell_short']}): the forward takes {100 * r['model_share']:.0f}% of the "
                   f"{r['itl_ms']:.1f} ms between tokens"
                   + (f", streaming the weights at {r['forward_bw_share']} of the measured read bandwidth"
                      if r["forward_bw_share_value"] is not None else "")
                   + (f"; the largest other part is {top[0]} ({top[1]:.2f} ms)" if top else "")
                   + (f"; inside the forward, the linear layers' kernel takes {r['kernel_ms']:.1f} ms"
                      + (f" (the weights at {100 * r['kernel_bw_share_value']:.0f}% of the read bandwidth)"
                         if r.get("kernel_bw_share_value") is not None else "")
                      + f" and everything else in it (attention, norms, rotary, activations and the calls between "
                        f"them) {r['parts']['forward'] - r['kernel_ms']:.1f} ms"
                      if r.get("kernel_ms") and r["parts"].get("forward") else "")
                   + ("" if r["within"] else f"; the parts account for only {r['accounted_text']} of it"))
    over = [r["arm"] for r in rows if (r["forward_bw_share_value"] or 0) > 1]
    if over:
        out.append(f"{', '.join(sorted(set(over)))}: a share above 100% means this host read memory faster during "
                   "the series than in its ceiling measurement (the newest `harness probe --bandwidth` of the host, "
                   "taken at another time): the ceiling is a reference, not a bound, when the host's speed varies")
    return out


def plot(section: dict, out_dir: Any) -> str:
    """One stacked bar per arm and cell: each part's mean ms per decode step, the measured latency as a tick."""
    from harness.plots import plt, save
    blk = section["steps"]
    rows = blk["rows"]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.2))
    xs = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for p in blk["parts"]:
        vals = [r["parts"].get(p) or 0.0 for r in rows]
        ax.bar(xs, vals, bottom=bottom, label=p, width=0.7)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.scatter(xs, [r["itl_ms"] or 0.0 for r in rows], marker="_", s=400, color="black", label="measured itl",
               zorder=3)
    ax.set_xticks(xs, [f"{r['arm']}\n{r['threads']}t" for r in rows], fontsize=7, rotation=30, ha="right")
    ax.set_ylabel("ms per decode step (mean)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{section['name']} (host {section['host_key']}): where a decode step's time goes", fontsize=9)
    fig.tight_layout()
    return save(fig, out_dir, f"{section['slug']}-steps.png")
