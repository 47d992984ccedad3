"""How each engine's cost grows with model size (grids with a `model` axis, e.g. grids/model-scale.yaml).

Per series (one grid on one host): for each arm and model, decode as weight bytes per second against
the host's measured read bandwidth, prefill as FLOP/s against its matmul peak, peak RSS; the paired
ratio of each arm to the baseline at each size (from the series' own analysis); the largest model each
arm would fit in this machine's memory, extrapolated from the measured footprints (stated as such); and
a short paragraph of what the numbers say, generated from them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from harness import stats
from harness.engines import weight_bytes

GIB = 2**30


def _median_of_runs(arts: list, metric: str) -> float | None:
    vals = [stats.summarize(a.metrics[metric].samples).median for a in arts if metric in a.metrics]
    return stats.summarize(vals).median if vals else None


def _size(params: int) -> str:
    return f"{params / 1e9:.2f}B" if params >= 1e9 else f"{params / 1e6:.0f}M"


def fit_footprint(points: list[tuple[int, int]]) -> tuple[float, float] | None:
    """Least squares rss = a + b * parameters over (parameters, rss) points of distinct sizes; None below 2."""
    if len({p for p, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(p for p, _ in points) / n
    my = sum(r for _, r in points) / n
    sxx = sum((p - mx) ** 2 for p, _ in points)
    b = sum((p - mx) * (r - my) for p, r in points) / sxx
    return my - b * mx, b


def _matmul_of(shape: object) -> int | None:
    """The prefill matmul parameters of a shape a user's model recorded (model.source.shape), if it is whole."""
    from harness.usermodels import matmul_parameters
    try:
        return matmul_parameters(shape) if isinstance(shape, dict) else None  # type: ignore[arg-type]
    except (KeyError, TypeError, ZeroDivisionError):
        return None


def scale_block(arts: list, section: dict, best: dict[int, dict[str, float]] | None, memory_total: int | None) -> dict | None:
    """The model-scale view of one series, or None when its cells do not differ by model."""
    from harness.models import MATMUL_PARAMETERS
    ok = [a for a in arts if a.status == "ok" and "decode_tok_s" in a.metrics and a.model.files]
    if len({a.model.name for a in ok}) < 2:
        return None
    groups: dict[tuple[str, str], list] = defaultdict(list)
    for a in ok:
        groups[(a.grid.arm, a.model.name)].append(a)
    model_of_cell = {a.grid.cell: a.model.name for a in ok}
    ratios: dict[tuple[str, str], dict] = {}
    for t in section["tables"]:
        if t["metric"] != "decode_tok_s":
            continue
        for r in t["rows"]:
            if r.get("ratio_value") is not None and r["cell"] in model_of_cell:
                ratios[(r["arm"], model_of_cell[r["cell"]])] = r
    rows = []
    for (arm, model), mine in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[1][0].model.parameters)):
        a0 = mine[0]
        t = a0.execution.threads
        wbytes = weight_bytes(a0.model)
        if wbytes is None:  # a format without a weight-file rule: no figure
            continue
        dec = _median_of_runs(mine, "decode_tok_s")
        pre = _median_of_runs(mine, "prefill_tok_s")
        rss = [a.residency.peak_memory.get("rss_bytes") for a in mine]
        rss = [x for x in rss if isinstance(x, int)]
        bw = (best or {}).get(t, {}).get("read_bandwidth_gb_s")
        quant = a0.model.dtype.lower().startswith("q")
        bf16 = "bf16" in a0.model.dtype or "bfloat16" in a0.model.dtype
        peak_key = "matmul_gflop_s_bf16" if bf16 and best and t in best and \
            best[t]["matmul_gflop_s_bf16"] > best[t]["matmul_gflop_s_fp32"] else "matmul_gflop_s_fp32"
        peak = (best or {}).get(t, {}).get(peak_key)
        gbs = wbytes * dec / 1e9 if dec is not None else None
        mm = MATMUL_PARAMETERS.get(model) or _matmul_of(a0.model.source.get("shape"))
        gflops = 2 * mm * pre / 1e9 if pre is not None and mm else None  # no shape recorded: no figure
        r = ratios.get((arm, model))
        rows.append({
            "arm": arm, "engine": a0.engine.name, "form": a0.model.form, "model": model,
            "parameters": a0.model.parameters, "size": _size(a0.model.parameters), "threads": t,
            "synthetic": bool(a0.model.source.get("synthetic")), "weights_mib": f"{wbytes / 2**20:.0f}",
            "weight_bytes": wbytes, "decode": dec, "decode_text": "-" if dec is None else f"{dec:.3g}",
            "gbs": "-" if gbs is None else f"{gbs:.2f}",
            "bw_share_value": None if gbs is None or not bw else gbs / bw,
            "bw_share": "no calibration" if not bw else "-" if gbs is None else f"{100 * gbs / bw:.0f}%",
            "prefill": "-" if pre is None else f"{pre:.3g}", "gflops": "-" if gflops is None else f"{gflops:.0f}",
            "flop_share": "n/a (integer kernels)" if quant else "-" if gflops is None else "no calibration" if not peak
            else f"{100 * gflops / peak:.0f}%",
            "rss_value": sorted(rss)[len(rss) // 2] if rss else None,
            "rss": f"{sorted(rss)[len(rss) // 2] / GIB:.2f}" if rss else "-",
            "ratio": r["ratio"] if r else ("baseline" if arm == section["baseline"] else "-"),
            "ratio_value": r["ratio_value"] if r else None, "n": len(mine)})
    return {"rows": rows, "fits": _fits(rows, memory_total), "text": _meaning(rows, section["baseline"]),
            "memory_gib": f"{memory_total / GIB:.1f}" if memory_total else "unknown"}


def _fits(rows: list[dict], memory_total: int | None) -> list[dict]:
    out = []
    by_arm: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_arm[r["arm"]].append(r)
    for arm, mine in sorted(by_arm.items()):
        pts = [(r["parameters"], r["rss_value"]) for r in mine if r["rss_value"]]
        fit = fit_footprint(pts)
        if fit is None or not memory_total or fit[1] <= 0:
            continue
        a, b = fit
        largest = (memory_total - a) / b
        out.append({"arm": arm, "form": mine[0]["form"], "sizes": len(pts),
                    "bytes_per_param": f"{b:.2f}", "fixed_gib": f"{a / GIB:.2f}",
                    "largest": _size(int(largest)) if largest > 0 else "none",
                    "largest_value": largest})
    return out


def _meaning(rows: list[dict], baseline: str) -> list[str]:
    """Sentences generated from the rows: each arm's ratio to the baseline by size, and where (if anywhere) an
    arm's share of the read bandwidth reaches the baseline's."""
    by_arm: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_arm[r["arm"]].append(r)
    base = {r["model"]: r for r in by_arm.get(baseline, [])}
    out = []
    for arm, mine in sorted(by_arm.items()):
        if arm == baseline:
            continue
        rs = [r for r in mine if r["ratio_value"] is not None]
        if rs:
            out.append(f"{arm} decodes at " + ", ".join(f"{r['ratio_value']:.2f}x {baseline} at {r['size']}"
                                                         for r in rs) + " (paired ratios, intervals in the table).")
        shares = [(r, base.get(r["model"])) for r in mine if r["bw_share_value"] is not None]
        shares = [(r, b) for r, b in shares if b is not None and b["bw_share_value"] is not None]
        if not shares:
            continue
        reached = next((r for r, b in shares if r["bw_share_value"] >= b["bw_share_value"]), None)
        text = ", ".join(f"{100 * r['bw_share_value']:.0f}% vs {100 * b['bw_share_value']:.0f}% at {r['size']}"
                         for r, b in shares)
        if reached is not None:
            out.append(f"{arm}'s decode moves weights at a share of the measured read bandwidth that reaches "
                       f"{baseline}'s at {reached['size']} ({text}).")
        else:
            out.append(f"{arm}'s share of the measured read bandwidth stays below {baseline}'s at every size "
                       f"measured ({text}).")
    return out


def plot(section: dict, out_dir: Any) -> str:
    """Decode's share of the read bandwidth against parameter count, one line per arm."""
    from harness.plots import plt, save
    sc = section["scale"]
    fig, ax = plt.subplots(figsize=(7, 4))
    by_arm: dict[str, list[dict]] = defaultdict(list)
    for r in sc["rows"]:
        if r["bw_share_value"] is not None:
            by_arm[r["arm"]].append(r)
    for arm, mine in sorted(by_arm.items()):
        mine.sort(key=lambda r: r["parameters"])
        ax.plot([r["parameters"] for r in mine], [100 * r["bw_share_value"] for r in mine], marker="o", label=arm)
    ax.set_xscale("log")
    ax.set_xlabel("parameters")
    ax.set_ylabel("decode: weight bytes/s as % of measured read bandwidth")
    ax.set_ylim(0, 110)
    ax.legend(fontsize=7)
    ax.set_title(f"{section['name']} (host {section['host_key']})", fontsize=9)
    return save(fig, out_dir, f"{section['slug']}-scale.png")
