"""How decode and prefill change with the context (grids whose cells differ by prompt length, e.g.
grids/context-scale.yaml).

A decode token reads every weight once and, on top, the KV cache of every token before it: K and V of
every layer. Per arm, model and prompt length: decode and prefill rates, the bytes a decode token reads
(the weight files, plus the KV cache's bytes per token x the mean context over the decoded tokens), the
share of them that is KV, that traffic as GB/s against the host's measured read bandwidth, and decode
relative to the same arm's shortest prompt beside what the extra bytes alone predict (decode time in
proportion to bytes read). Where the measured slowdown is larger than the prediction, something other
than reading the KV (attention's arithmetic, its per-token overheads) grows with the context too.

KV bytes per token: vLLM's worker reports them (execution.effective.kv_bytes_per_token, from the
model's geometry and its KV dtype); elsewhere, the bytes per value of the KV types the engine read back (its
Sizing.kv_bytes_per_value: llama.cpp's type_k and type_v) x the model's KV values per token (harness/models.py).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from harness.engines import ENGINES, engine_class, weight_bytes
from harness.engines.capabilities import Sizing, has
from harness.scale import _median_of_runs, _size

TOLERANCE = 0.05  # |measured - predicted| relative decode under which the KV reads are said to account for it
SPAN = 8  # the view is drawn for a series whose prompt lengths span at least this factor


def applies(arts: list) -> bool:
    """A context series: its runs' prompt lengths span at least SPAN x (a 128-512 axis of a speed grid is not)."""
    lens = {a.workload.prompt_len for a in arts if a.status == "ok"}
    return len(lens) >= 2 and max(lens) >= SPAN * min(lens)


def kv_bytes_per_token(a: Any) -> tuple[float | None, str]:
    """(bytes the KV cache holds per token, where the figure comes from) for one run."""
    from harness.models import kv_elements_per_token
    eff = a.execution.effective or {}
    if isinstance(eff.get("kv_bytes_per_token"), (int, float)):
        return float(eff["kv_bytes_per_token"]), "engine"
    cls = engine_class(a.engine.name) if a.engine.name in ENGINES else None
    n = kv_elements_per_token(a.model.name)
    got = cls.kv_bytes_per_token(eff, n) if n and cls is not None and has(cls, Sizing) else None
    if got is not None:
        return got
    return None, "unknown"


def _g(v: float) -> str:
    """Three significant digits, without exponents for large values."""
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def context_block(arts: list, section: dict, best: dict[int, dict[str, float]] | None) -> dict | None:
    """The context view of one series, or None unless its prompt lengths span SPAN x (applies)."""
    ok = [a for a in arts if a.status == "ok" and "decode_tok_s" in a.metrics and a.model.files]
    if not applies(ok):
        return None
    ratios = {(r["arm"], r["cell"]): r for t in section["tables"] if t["metric"] == "decode_tok_s"
              for r in t["rows"] if r.get("ratio_value") is not None}
    groups: dict[tuple[str, str, int], list] = defaultdict(list)
    for a in ok:
        groups[(a.grid.arm, a.model.name, a.workload.prompt_len)].append(a)
    rows = []
    for (arm, model, plen), mine in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[1][0].model.parameters,
                                                                           kv[0][2])):
        a0 = mine[0]
        wbytes = weight_bytes(a0.model)
        if wbytes is None:  # a format without a weight-file rule: no figure
            continue
        kvt, kv_src = kv_bytes_per_token(a0)
        ctx = plen + (a0.workload.gen_len - 1) / 2  # mean tokens before a decoded token
        kv_read = kvt * ctx if kvt is not None else None
        dec = _median_of_runs(mine, "decode_tok_s")
        pre = _median_of_runs(mine, "prefill_tok_s")
        ttft = _median_of_runs(mine, "ttft_s")
        bw = (best or {}).get(a0.execution.threads, {}).get("read_bandwidth_gb_s")
        traffic = wbytes + (kv_read or 0)
        gbs = traffic * dec / 1e9 if dec is not None else None
        r = ratios.get((arm, a0.grid.cell))
        rows.append({
            "arm": arm, "model": model, "size": _size(a0.model.parameters), "parameters": a0.model.parameters,
            "synthetic": bool(a0.model.source.get("synthetic")), "prompt_len": plen, "n": len(mine),
            "weight_bytes": wbytes, "kv_bytes_per_token": kvt, "kv_source": kv_src, "kv_read": kv_read,
            "kv_share_value": kv_read / traffic if kv_read is not None and traffic else None,
            "decode_value": dec, "prefill_value": pre, "ttft_value": ttft,
            "gbs": "-" if gbs is None else f"{gbs:.2f}",
            "bw_share": "no calibration" if not bw else "-" if gbs is None else f"{100 * gbs / bw:.0f}%",
            "ratio": r["ratio"] if r else ("baseline" if arm == section["baseline"] else "-"),
            "ratio_value": r["ratio_value"] if r else None})
    _relative(rows)
    for r in rows:
        r["decode"] = "-" if r["decode_value"] is None else _g(r["decode_value"])
        r["prefill"] = "-" if r["prefill_value"] is None else _g(r["prefill_value"])
        r["ttft"] = "-" if r["ttft_value"] is None else _g(r["ttft_value"])
        r["kv_mib"] = "-" if r["kv_read"] is None else f"{r['kv_read'] / 2**20:.0f}"
        r["kv_share"] = "-" if r["kv_share_value"] is None else f"{100 * r['kv_share_value']:.0f}%"
        r["relative"] = "-" if r["relative_value"] is None else f"{r['relative_value']:.2f}x"
        r["predicted"] = "-" if r["predicted_value"] is None else f"{r['predicted_value']:.2f}x"
    return {"rows": rows, "text": _meaning(rows, section["baseline"]), "tolerance": f"{100 * TOLERANCE:.0f}%"}


def _relative(rows: list[dict]) -> None:
    """Each row's decode relative to its arm and model's shortest prompt, and what the bytes predict."""
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["arm"], r["model"])].append(r)
    for mine in by.values():
        mine.sort(key=lambda r: r["prompt_len"])
        first = mine[0]
        for r in mine:
            ok = r["decode_value"] is not None and first["decode_value"]
            r["relative_value"] = r["decode_value"] / first["decode_value"] if ok else None
            bytes_ok = r["kv_read"] is not None and first["kv_read"] is not None
            r["predicted_value"] = ((first["weight_bytes"] + first["kv_read"]) / (r["weight_bytes"] + r["kv_read"])
                                    if bytes_ok else None)
            r["shortest"] = first["prompt_len"]


def _meaning(rows: list[dict], baseline: str) -> list[str]:
    """Sentences generated from the rows: per arm and model, decode at the longest prompt against the shortest
    and what the KV reads alone predict; prefill likewise; each arm's ratio to the baseline by prompt length."""
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["arm"], r["model"])].append(r)
    out = []
    for (arm, model), mine in sorted(by.items(), key=lambda kv: (kv[1][0]["parameters"], kv[0][0])):
        lo, hi = mine[0], mine[-1]
        if hi["relative_value"] is None or hi is lo:
            continue
        text = (f"{arm} at {hi['size']}: decode at prompt {hi['prompt_len']} runs at {hi['relative_value']:.2f}x its "
                f"rate at prompt {lo['prompt_len']} ({lo['decode']} -> {hi['decode']} tok/s)")
        if hi["predicted_value"] is not None:
            gap = hi["relative_value"] - hi["predicted_value"]
            verdict = ("the KV reads account for it" if abs(gap) <= TOLERANCE else
                       "more than the KV reads explain: attention's work beyond its reads grows with the context"
                       if gap < 0 else "less than the KV reads predict: the bytes are not all that bounds it")
            text += (f"; the KV cache is {hi['kv_share']} of the bytes a token reads there, which alone predicts "
                     f"{hi['predicted_value']:.2f}x: {verdict}")
        if hi["prefill_value"] and lo["prefill_value"]:
            text += (f". Prefill: {lo['prefill']} -> {hi['prefill']} tok/s "
                     f"({hi['prefill_value'] / lo['prefill_value']:.2f}x)")
        out.append(text + ".")
    for (arm, model), mine in sorted(by.items(), key=lambda kv: (kv[1][0]["parameters"], kv[0][0])):
        rs = [r for r in mine if r["ratio_value"] is not None]
        if arm != baseline and rs:
            out.append(f"{arm} / {baseline} decode at {rs[0]['size']}: " + ", ".join(
                f"{r['ratio_value']:.2f}x at prompt {r['prompt_len']}" for r in rs) + " (paired ratios, intervals "
                "in the table).")
    return out


def plot(section: dict, out_dir: Any) -> str:
    """Decode tok/s against prompt length, one line per arm and model."""
    from harness.plots import plt, save
    by: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in section["context"]["rows"]:
        if r["decode_value"] is not None:
            by[(r["arm"], r["size"])].append(r)
    fig, ax = plt.subplots(figsize=(7, 4))
    for (arm, size), mine in sorted(by.items()):
        mine.sort(key=lambda r: r["prompt_len"])
        ax.plot([r["prompt_len"] for r in mine], [r["decode_value"] for r in mine], marker="o", label=f"{arm} {size}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens before decode")
    ax.set_ylabel("decode tok/s (median of runs)")
    ax.legend(fontsize=7)
    ax.set_title(f"{section['name']} (host {section['host_key']})", fontsize=9)
    return save(fig, out_dir, f"{section['slug']}-context.png")
