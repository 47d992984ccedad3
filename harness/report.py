"""Reports rendered from the artifact store with jinja2: results.md, byte-identical for the same store.

Every figure is a median over passes with its spread and n, and, for non-baseline arms, the
paired ratio to the grid's baseline arm with its bootstrap CI and verdict.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from harness import stats
from harness.artifact import RunArtifact
from harness.errors import UserError
from harness.paths import PROJECT_ROOT
from harness.store import Store, load_path

TEMPLATES = PROJECT_ROOT / "reports" / "templates"
LOADED_CORES = 0.25  # CPU cores used by other processes during a run above which it is flagged


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _series(arts: list[RunArtifact]) -> list[RunArtifact]:
    """The newest series of a grid: artifacts stamped with the grid sha256 of the latest run."""
    latest = max(arts, key=lambda a: a.timing.end)
    return [a for a in arts if a.grid.sha256 == latest.grid.sha256]


def grid_section(name: str, all_arts: list[RunArtifact]) -> dict:
    arts = _series(all_arts)
    # every artifact of the grid, shown or not, is in the fingerprint: adding or removing any one
    # of them makes the rendered file stale
    fingerprint = hashlib.sha256("\n".join(sorted(a.id for a in all_arts)).encode()).hexdigest()[:16]
    first = arts[0]
    ok = [a for a in arts if a.status == "ok"]
    cells = sorted({a.grid.cell for a in arts})
    arms = sorted({a.grid.arm for a in arts}, key=lambda n: (n != first.grid.baseline_arm, n))
    metric_names = sorted({m for a in ok for m in a.metrics})
    # value of a run = median of its repetitions; keyed by (cell, arm, pass)
    runs: dict[tuple, RunArtifact] = {}
    for a in sorted(ok, key=lambda a: a.timing.end):
        runs[(a.grid.cell, a.grid.arm, a.grid.pass_index)] = a
    failed = defaultdict(int)
    for a in arts:
        if a.status != "ok":
            failed[(a.grid.cell, a.grid.arm)] += 1
    # the cell parameters that vary across this grid's cells name a cell in plots
    varying = {k for k in first.grid.cell_params if len({str(a.grid.cell_params.get(k)) for a in arts}) > 1}
    tables = []
    for metric in metric_names:
        rows, comps = [], []
        for cell in cells:
            base_vals = {p: stats.summarize(r.metrics[metric].samples).median
                         for (c, arm, p), r in runs.items() if c == cell and arm == first.grid.baseline_arm
                         and metric in r.metrics}
            for arm in arms:
                per_pass = {p: r for (c, am, p), r in runs.items() if c == cell and am == arm and metric in r.metrics}
                if not per_pass:
                    continue
                m0 = next(iter(per_pass.values())).metrics[metric]
                vals = [stats.summarize(r.metrics[metric].samples).median for _, r in sorted(per_pass.items())]
                s = stats.summarize(vals)
                n_samples = sum(len(r.metrics[metric].samples) for r in per_pass.values())
                row = {"cell": cell, "arm": arm, "unit": m0.unit, "median": _fmt(s.median), "iqr": _fmt(s.iqr),
                       "median_value": s.median, "q1_value": s.q1, "q3_value": s.q3,
                       "median_ci": stats.median_ci(np.asarray(vals, dtype=float)),
                       "threads": next(iter(per_pass.values())).execution.threads,
                       "cell_short": ",".join(f"{k}={v}" for k, v in sorted(
                           next(iter(per_pass.values())).grid.cell_params.items()) if k in varying),
                       "range": f"{_fmt(s.lo)}-{_fmt(s.hi)}", "n": f"{s.n} runs / {n_samples} samples",
                       "failed": failed.get((cell, arm), 0), "ratio": "baseline" if arm == first.grid.baseline_arm else "",
                       "verdict": "", "hib": m0.higher_is_better}
                if arm != first.grid.baseline_arm:
                    common = sorted(set(per_pass) & set(base_vals))
                    if common:
                        c = stats.compare([stats.summarize(per_pass[p].metrics[metric].samples).median for p in common],
                                          [base_vals[p] for p in common])
                        comps.append((row, c))
                    else:
                        row["ratio"] = "no paired baseline"
                rows.append(row)
        adjusted = stats.holm([c.p_value for _, c in comps])
        for (row, c), padj in zip(comps, adjusted):
            c2 = stats.Comparison(**{**c.__dict__, "p_adjusted": padj})
            row["ratio"] = f"{c.ratio_median:.3f} [{c.ci_low:.3f}, {c.ci_high:.3f}]"
            row["ratio_value"], row["ci"] = c.ratio_median, (c.ci_low, c.ci_high)
            row["p_raw"] = c.p_value
            row["verdict"] = stats.verdict(c2, row["hib"], len(comps))
            row["p"] = "-" if padj is None else f"{padj:.3g}"
            row["warnings"] = list(c.warnings)
            if not stats.reachable(c.n_pairs, len(comps)):
                need = next(n for n in range(1, 64) if stats.reachable(n, len(comps)))
                row["warnings"].append(f"{c.n_pairs} passes can never reach p<{stats.ALPHA} with a paired signed-rank "
                                       f"test over {len(comps)} Holm-corrected comparison(s); run at least {need} passes")
        tables.append({"metric": metric, "unit": rows[0]["unit"] if rows else "",
                       "definitions": sorted({(r.engine.name, r.metrics[metric].definition) for r in ok if metric in r.metrics}),
                       "rows": rows})
    warnings = sorted({w for t in tables for r in t["rows"] for w in r.get("warnings", [])})
    # Rule 6: a setting that did not take effect measures nothing; say so wherever it happened
    for a in ok:
        eff = a.execution.effective.get("threads", a.execution.effective.get("torch_threads"))
        if isinstance(eff, int) and eff != a.execution.threads:
            warnings.append(f"arm {a.grid.arm}, cell {a.grid.cell}: requested {a.execution.threads} thread(s), "
                            f"the engine used {eff} (read back); its figures are not a {a.execution.threads}-thread result")
    loaded = [a for a in ok if isinstance(a.host.get("other_load_during_run"), dict)
              and a.host["other_load_during_run"].get("other_cores", 0) > LOADED_CORES]
    if loaded:
        worst = max(a.host["other_load_during_run"]["other_cores"] for a in loaded)
        warnings.append(f"{len(loaded)} run(s) shared the host with other work (up to {worst:.2f} cores used by other "
                        f"processes during a run, threshold {LOADED_CORES}): not publishable as is; rerun on an idle host")
    if len([x for x in arms if x != first.grid.baseline_arm]) > 1:
        warnings.append("several arms are compared with one baseline: their separately measured effects overlap and "
                        "must not be added")
    warnings = sorted(set(warnings))
    # A/A: every arm ran the same engine, model form and requested configuration
    configs = {(a.engine.name, a.model.form, json.dumps(a.execution.requested, sort_keys=True)) for a in ok}
    calibration = None
    if ok and len(configs) == 1 and len(arms) > 1:
        calibration = []
        for t in tables:
            rows = [r for r in t["rows"] if "ci" in r]
            if not rows:
                continue
            flagged = sum(1 for r in rows if r["verdict"] in ("better", "worse"))
            raw = sum(1 for r in rows if r.get("p_raw") is not None and r["p_raw"] < stats.ALPHA)
            half = sorted((r["ci"][1] - r["ci"][0]) / 2 for r in rows)
            calibration.append({"metric": t["metric"], "n": len(rows), "flagged": flagged, "raw": raw,
                                "mde": f"{half[len(half) // 2] * 100:.1f}%"})
    engines = sorted({(a.engine.name, a.engine.version, a.engine.build_commit) for a in arts})
    model_files = sorted({(a.model.form, f.path, f.sha256[:12]) for a in arts for f in a.model.files
                          if f.path.endswith((".gguf", ".safetensors"))})
    return {
        "name": name, "grid_path": first.grid.path, "grid_sha": first.grid.sha256[:12], "order": first.grid.order,
        "passes": len({a.grid.pass_index for a in arts}), "baseline": first.grid.baseline_arm, "model": first.model.name,
        "n_artifacts": len(arts), "n_failed": sum(1 for a in arts if a.status != "ok"), "tables": tables,
        "n_all": len(all_arts), "n_older": len(all_arts) - len(arts), "fingerprint": fingerprint,
        "warnings": warnings, "engines": engines, "calibration": calibration, "model_files": model_files,
        "host": f"{first.host['cpu']['model']}, {first.host['cpu']['logical_cores']} logical cores, "
                f"{first.host['kernel']}",
        "harness_commits": sorted({a.harness.commit[:12] for a in arts}),
        "dirty": any(a.harness.dirty for a in arts),
        "dates": f"{min(a.timing.start for a in arts)[:10]} to {max(a.timing.end for a in arts)[:10]}",
        "store_dir": "",
    }


def collect(store_dirs: list[str]) -> tuple[dict[str, list[RunArtifact]], dict[str, list], list]:
    """Run artifacts by grid, fidelity artifacts by fidelity grid (references are read through them),
    and calibration artifacts."""
    by_grid: dict[str, list[RunArtifact]] = defaultdict(list)
    fidelity: dict[str, list] = defaultdict(list)
    calibrations = []
    for d in store_dirs:
        st = Store(Path(d))
        for p in st.iter_paths():
            a = load_path(p)
            if a.kind == "run":
                by_grid[a.grid.name].append(a)
            elif a.kind == "fidelity":
                fidelity[a.grid.name].append(a)
            elif a.kind == "calibration":
                calibrations.append(a)
    return dict(sorted(by_grid.items())), dict(sorted(fidelity.items())), calibrations


# The speed grids whose builds are set against the machine's ceiling (when they are in the store).
CEILING_GRIDS = ("llamacpp-baseline", "vllm-vs-llamacpp", "decode-threads")


def ceiling_section(calibrations: list, newest: dict[str, list[RunArtifact]]) -> dict | None:
    """Decode as weight bytes per second against the measured read bandwidth, prefill as FLOP/s against
    the measured matmul peak, both at the run's thread count (newest calibration, newest series)."""
    if not calibrations:
        return None
    from harness.ceiling import best_by_threads
    from harness.models import MATMUL_PARAMETERS
    cal = max(calibrations, key=lambda c: c.timing.end)
    best = best_by_threads(cal)
    cal_rows = [{"threads": t, "bw": f"{b['read_bandwidth_gb_s']:.1f}", "fp32": f"{b['matmul_gflop_s_fp32']:.0f}",
                 "bf16": f"{b['matmul_gflop_s_bf16']:.0f}"} for t, b in sorted(best.items())]
    rows = []
    for name in CEILING_GRIDS:
        if name not in newest:
            continue
        groups: dict[tuple, list[RunArtifact]] = defaultdict(list)
        for a in newest[name]:
            if a.status == "ok" and "decode_tok_s" in a.metrics and a.model.files:
                groups[(a.grid.cell, a.grid.arm)].append(a)
        for (cell, arm), arts in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
            a0 = arts[0]
            t = a0.execution.threads
            if t not in best:
                continue
            wbytes = sum(f.size for f in a0.model.files if f.path.endswith((".gguf", ".safetensors")))
            dec = stats.summarize([stats.summarize(a.metrics["decode_tok_s"].samples).median for a in arts]).median
            pre = stats.summarize([stats.summarize(a.metrics["prefill_tok_s"].samples).median for a in arts]).median
            gbs = wbytes * dec / 1e9
            bf16 = "bf16" in a0.model.dtype or "bfloat16" in a0.model.dtype
            quant = a0.model.dtype.lower().startswith("q")
            peak = best[t]["matmul_gflop_s_bf16" if bf16 else "matmul_gflop_s_fp32"]
            gflops = 2 * MATMUL_PARAMETERS.get(a0.model.name, a0.model.parameters) * pre / 1e9
            rows.append({"grid": name, "cell": cell.replace("batch=1,", ""), "arm": arm, "engine": a0.engine.name,
                         "form": a0.model.form, "threads": t, "mib": f"{wbytes / 2**20:.0f}", "decode": _fmt(dec),
                         "gbs": f"{gbs:.2f}", "bw_share": f"{100 * gbs / best[t]['read_bandwidth_gb_s']:.0f}%",
                         "prefill": _fmt(pre), "gflops": f"{gflops:.0f}",
                         "peak": "-" if quant else f"{'bf16' if bf16 else 'fp32'} {peak:.0f}",
                         "flop_share": "n/a (integer kernels)" if quant else f"{100 * gflops / peak:.0f}%",
                         "n": len(arts)})
    return {"calibration": cal_rows, "rows": rows, "id": cal.id[:12], "command": cal.grid.path,
            "definitions": cal.method["definitions"], "date": cal.timing.start[:10],
            "dirty": cal.harness.dirty, "host": f"{cal.host['cpu']['model']}, {cal.host['cpu']['logical_cores']} logical cores"}


def _speed_of(newest: dict[str, list[RunArtifact]], engine: str, form: str, threads: int) -> dict[str, str]:
    """A build's measured speed, from the newest series of the speed grids: the first of CEILING_GRIDS that
    ran this engine, model form and thread count (then any other grid), its cell with the shortest prompt."""
    groups: dict[tuple, list[RunArtifact]] = defaultdict(list)
    for name, arts in newest.items():
        for a in arts:
            if (a.status == "ok" and a.engine.name == engine and a.model.form == form and a.execution.threads == threads
                    and "decode_tok_s" in a.metrics):
                groups[(name, a.grid.cell)].append(a)
    if not groups:
        return {"decode": "not measured", "prefill": "not measured", "where": ""}

    def rank(kv: tuple) -> tuple:
        (name, cell), arts = kv
        grid_rank = CEILING_GRIDS.index(name) if name in CEILING_GRIDS else len(CEILING_GRIDS)
        return grid_rank, arts[0].workload.prompt_len, -len(arts), name, cell
    (grid_name, cell), arts = min(groups.items(), key=rank)
    out = {"where": f"{grid_name}, {cell.replace('batch=1,', '')}"}
    for key, metric in (("decode", "decode_tok_s"), ("prefill", "prefill_tok_s")):
        vals = [stats.summarize(a.metrics[metric].samples).median for a in arts if metric in a.metrics]
        out[key] = _fmt(stats.summarize(vals).median) if vals else "not measured"
    return out


def fidelity_section(name: str, all_arts: list, newest: dict[str, list[RunArtifact]]) -> dict:
    """The newest result of each build (and cross-engine pair) of a fidelity grid, beside its speed."""
    latest = max(all_arts, key=lambda a: a.timing.end)
    arts = [a for a in all_arts if a.grid.sha256 == latest.grid.sha256]
    by_build: dict[tuple, Any] = {}
    for a in sorted(arts, key=lambda a: a.timing.end):
        by_build[(a.grid.build, a.cross_engine)] = a
    rows = []
    for (build, cross), a in sorted(by_build.items(), key=lambda kv: (kv[0][1], kv[1].engine.name, kv[0][0])):
        s = a.summary
        speed = _speed_of(newest, a.engine.name, a.model.form, a.execution.threads)

        def f(key: str, digits: str = ".3f") -> str:
            v = s.get(key)
            return "-" if v is None else format(v, digits)
        diverged = sorted((p.first_divergence, p.id) for p in a.prompts if p.first_divergence is not None)
        rows.append({"build": build + (" (cross-engine)" if cross else ""), "engine": a.engine.name, "form": a.model.form,
                     "reference": f"{a.reference['engine']} {a.reference['form']} `{a.reference['id'][:12]}`",
                     "verdict": a.verdict if a.status == "ok" else f"error: {a.error}",
                     "exact": f("exact_match_rate", ".2f"), "first_div": f("median_first_divergence", "g"),
                     "agree": f("token_agreement"), "top1": f("top1_agreement"), "kl": f("mean_kl", ".4f"),
                     "thresholds": ", ".join(f"{k} {v:g}" for k, v in sorted(a.thresholds.items())) or "not gated",
                     "earliest": ", ".join(f"{pid}@{pos}" for pos, pid in diverged[:3]) or "none",
                     "decode": speed["decode"], "prefill": speed["prefill"], "speed_where": speed["where"],
                     "id": a.id[:12]})
    fingerprint = hashlib.sha256("\n".join(sorted(a.id for a in all_arts)).encode()).hexdigest()[:16]
    return {"name": name, "grid_path": latest.grid.path, "grid_sha": latest.grid.sha256[:12], "model": latest.model.name,
            "prompt_set": latest.prompt_set, "decoding": latest.decoding, "rows": rows, "n_artifacts": len(arts),
            "n_older": len(all_arts) - len(arts), "fingerprint": fingerprint, "threads": latest.execution.threads,
            "dirty": any(a.harness.dirty for a in arts), "harness_commits": sorted({a.harness.commit[:12] for a in arts})}


def render(store_dirs: list[str] | None = None, template: str = "results.md.j2") -> str:
    return build(store_dirs, template)[0]


def plot_names(section: dict) -> list[str]:
    """The plots a section gets: decided from its data alone, so the markdown can name them."""
    names = []
    if any("ci" in r for t in section["tables"] for r in t["rows"]):
        names.append(f"{section['name']}-ratios.png")
    if any(t["unit"] == "tok/s" and len({r["threads"] for r in t["rows"]}) > 1 for t in section["tables"]):
        names.append(f"{section['name']}-threads.png")
    return names


def write_plots(sections: list[dict], out_dir: Path) -> list[Path]:
    """Draw exactly the plots the markdown names (plot_names)."""
    from harness import plots
    draw = {"-ratios.png": plots.ratio_chart, "-threads.png": plots.thread_sweep}
    written = []
    for sec in sections:
        for name in sec["plots"]:
            fn = next(f for suffix, f in draw.items() if name.endswith(suffix))
            fn(sec, out_dir)
            written.append(out_dir / name)
    return written


def build(store_dirs: list[str] | None = None, template: str = "results.md.j2") -> tuple[str, list[dict]]:
    if store_dirs:  # a store named by the user must exist: a typo must not render an empty report
        for d in store_dirs:
            if not Path(d).is_dir():
                raise UserError(str(d), "--store: no such store directory", "pass the folder that holds <grid>/<id>.json")
    store_dirs = store_dirs or ["artifacts", "baselines"]
    grids, fidelity, calibrations = collect([d for d in store_dirs if Path(d).exists()])
    newest = {name: _series(arts) for name, arts in grids.items()}  # each speed grid's newest series, once
    fsections = [fidelity_section(name, arts, newest) for name, arts in fidelity.items()]
    ceiling = ceiling_section(calibrations, newest)
    sections = []
    for name, arts in grids.items():
        sec = grid_section(name, arts)
        sec["store_dir"] = next((d for d in store_dirs if (Path(d) / name).exists()), "")
        sec["plots"] = plot_names(sec)
        sections.append(sec)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    return env.get_template(template).render(sections=sections, fidelity=fsections, ceiling=ceiling,
                                                   stores=store_dirs), sections


def check_file(path: str, text: str) -> list[str]:
    try:
        current = Path(path).read_text()
    except OSError:
        current = ""
    if current == text:
        return []
    diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), f"{path} (on disk)", f"{path} (from store)",
                                     lineterm="", n=0))
    return diff[:40]
