"""Reports rendered from the artifact store with jinja2: results.md, byte-identical for the same store.

Every figure is a median over passes with its spread and n, and, for non-baseline arms, the
paired ratio to the grid's baseline arm with its bootstrap CI and verdict.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from harness import stats
from harness.artifact import RunArtifact
from harness.errors import UserError
from harness.paths import PROJECT_ROOT
from harness.probe import describe
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


def by_host(arts: list) -> dict[str, list]:
    """Artifacts grouped by the host that measured them (host.key), hosts in order of their first run."""
    groups: dict[str, list] = defaultdict(list)
    for a in sorted(arts, key=lambda a: (a.timing.start, a.id)):
        groups[a.host.key].append(a)
    return dict(groups)


def _series(arts: list[RunArtifact]) -> list[RunArtifact]:
    """The newest series of one host's artifacts of a grid: those stamped with the grid sha256 of its latest
    run. A series is (grid sha256, host key): callers pass one host's artifacts only."""
    assert len({a.host.key for a in arts}) == 1, "a series is measured by one host"
    latest = max(arts, key=lambda a: a.timing.end)
    return [a for a in arts if a.grid.sha256 == latest.grid.sha256]


def build_id(engine: Any) -> str:
    """The engine build a run used: its binary's sha256 prefix (llama.cpp), else a hash of every sha256 the
    engine recorded (wheel RECORDs, shell)."""
    b = engine.build
    if isinstance(b.get("binary_sha256"), str):
        return b["binary_sha256"][:12]
    shas = {k: v for k, v in sorted(b.items()) if k.endswith("sha256")}
    return hashlib.sha256(json.dumps(shas or b, sort_keys=True).encode()).hexdigest()[:12]


def model_id(a: Any) -> str:
    """The weights a run used: a hash of its model files' sha256s."""
    return hashlib.sha256("".join(sorted(f.sha256 for f in a.model.files)).encode()).hexdigest()[:12]


def mixed_builds(arts: list) -> list[str]:
    """Within one series, each arm whose runs used more than one engine build or model file set (pyperf
    refuses to merge such runs; the report says so and names them)."""
    out = []
    by_arm: dict[str, list] = defaultdict(list)
    for a in arts:
        by_arm[a.grid.arm].append(a)
    for arm, runs in sorted(by_arm.items()):
        builds = sorted({build_id(a.engine) for a in runs})
        weights = sorted({model_id(a) for a in runs if a.model.files})
        if len(builds) > 1:
            out.append(f"arm {arm}: its runs used {len(builds)} different engine builds (sha256 "
                       f"{', '.join(builds)}): figures of different binaries are pooled in this series")
        if len(weights) > 1:
            out.append(f"arm {arm}: its runs used {len(weights)} different model file sets ({', '.join(weights)}): "
                       "figures of different weights are pooled in this series")
    return out


def _status_counts(arts: list) -> str:
    ok = sum(1 for a in arts if a.status == "ok")
    bad = len(arts) - ok
    return f"{ok} ok" + (f", {bad} failed or timed out" if bad else "")


def grid_section(name: str, all_arts: list[RunArtifact], where: dict[str, str] | None = None) -> dict:
    """One series of a grid (the newest of one host): `all_arts` are that host's artifacts of the grid."""
    arts = _series(all_arts)
    # every artifact of the grid on this host, shown or not, is in the fingerprint: adding or removing
    # any one of them makes the rendered file stale
    fingerprint = hashlib.sha256("\n".join(sorted(a.id for a in all_arts)).encode()).hexdigest()[:16]
    first = arts[0]
    older = [a for a in all_arts if a.grid.sha256 != first.grid.sha256]
    older_series = len({a.grid.sha256 for a in older})
    ok = [a for a in arts if a.status == "ok"]
    cells = sorted({a.grid.cell for a in arts})
    arms = sorted({a.grid.arm for a in arts}, key=lambda n: (n != first.grid.baseline_arm, n))
    metric_names = sorted({m for a in ok for m in a.metrics})
    # value of a run = median of its repetitions; keyed by (cell, arm, pass)
    runs: dict[tuple, RunArtifact] = {}
    duplicates = 0
    for a in sorted(ok, key=lambda a: a.timing.end):
        k = (a.grid.cell, a.grid.arm, a.grid.pass_index)
        duplicates += k in runs
        runs[k] = a
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
    warnings += mixed_builds(ok)
    if duplicates:
        warnings.append(f"{duplicates} (cell, arm, pass) measured more than once (ok): the latest run of each is used, "
                        "the others are kept")
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
    engines = sorted({(a.engine.name, a.engine.version, a.engine.build_commit, build_id(a.engine)) for a in arts})
    model_files = sorted({(a.model.form, f.path, f.sha256[:12]) for a in arts for f in a.model.files
                          if f.path.endswith((".gguf", ".safetensors"))})
    return {
        "name": name, "grid_path": first.grid.path, "grid_sha": first.grid.sha256[:12], "order": first.grid.order,
        "passes": len({a.grid.pass_index for a in arts}), "baseline": first.grid.baseline_arm, "model": first.model.name,
        "n_artifacts": len(arts), "n_failed": sum(1 for a in arts if a.status != "ok"), "tables": tables,
        "n_all": len(all_arts), "n_older": len(older), "older_series": older_series,
        "older_status": _status_counts(older) if older else "", "fingerprint": fingerprint,
        "warnings": warnings, "engines": engines, "calibration": calibration, "model_files": model_files,
        "host": describe(first.host.model_dump()), "host_key": first.host.key, "slug": f"{name}-{first.host.key}",
        "kernels": sorted({str(a.host.get("kernel")) for a in arts}),
        "harness_commits": sorted({a.harness.commit[:12] for a in arts}),
        "dirty": any(a.harness.dirty for a in arts),
        "dates": f"{min(a.timing.start for a in arts)[:10]} to {max(a.timing.end for a in arts)[:10]}",
        "store_dirs": sorted({(where or {}).get(a.id, "") for a in arts}),
    }


@dataclass
class Collected:
    """What a set of stores holds: run artifacts by grid, fidelity artifacts by fidelity grid (references
    are read through them), calibration artifacts, and the store each artifact was read from."""
    runs: dict[str, list[RunArtifact]]
    fidelity: dict[str, list]
    calibrations: list
    where: dict[str, str]
    references: list


def collect(store_dirs: list[str]) -> Collected:
    by_grid: dict[str, list[RunArtifact]] = defaultdict(list)
    fidelity: dict[str, list] = defaultdict(list)
    calibrations = []
    where: dict[str, str] = {}
    references = []
    for d in store_dirs:
        st = Store(Path(d))
        for p in st.iter_paths():
            a = load_path(p)
            where.setdefault(a.id, str(d))
            if a.kind == "run":
                by_grid[a.grid.name].append(a)
            elif a.kind == "fidelity":
                fidelity[a.grid.name].append(a)
            elif a.kind == "calibration":
                calibrations.append(a)
            else:
                references.append(a)
    return Collected(dict(sorted(by_grid.items())), dict(sorted(fidelity.items())), calibrations, where, references)


# The speed grids whose builds are set against the machine's ceiling (when they are in the store).
CEILING_GRIDS = ("llamacpp-baseline", "vllm-vs-llamacpp", "decode-threads")

# newest[(grid name, host key)]: the newest series of each grid on each host
Newest = dict[tuple[str, str], list[RunArtifact]]


def newest_series(runs: dict[str, list[RunArtifact]]) -> Newest:
    return {(name, key): _series(host_arts) for name, arts in runs.items() for key, host_arts in by_host(arts).items()}


def ceiling_section(calibrations: list, newest: Newest) -> list[dict]:
    """Per host: decode as weight bytes per second against the read bandwidth measured on that host, prefill
    as FLOP/s against its matmul peak, both at the run's thread count (the host's newest calibration, newest
    series). A host with speed series and no calibration is named, with the command that measures one."""
    cal_by_host = {key: max(cals, key=lambda c: c.timing.end) for key, cals in by_host(calibrations).items()}
    speed_hosts = {key for (name, key) in newest if name in CEILING_GRIDS}
    out = []
    for key in sorted(set(cal_by_host) | speed_hosts):
        cal = cal_by_host.get(key)
        if cal is None:
            out.append({"host_key": key, "missing": f"no calibration for host `{key}`: run `harness probe --bandwidth` "
                        "on it; another machine's ceiling is never borrowed"})
            continue
        out.append(_ceiling_of_host(cal, {name: arts for (name, k), arts in newest.items() if k == key}))
    return out


def _ceiling_of_host(cal: Any, newest: dict[str, list[RunArtifact]]) -> dict:
    from harness.ceiling import best_by_threads
    from harness.models import MATMUL_PARAMETERS
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
            "definitions": cal.method["definitions"], "date": cal.timing.start[:10], "host_key": cal.host.key,
            "dirty": cal.harness.dirty, "host": describe(cal.host.model_dump()), "missing": ""}


def _speed_of(newest: Newest, host: str, engine: str, form: str, threads: int) -> dict[str, str]:
    """A build's measured speed on one host, from that host's newest series of the speed grids: the first of
    CEILING_GRIDS that ran this engine, model form and thread count (then any other grid), its cell with the
    shortest prompt. Another host's speed is never shown beside this host's fidelity."""
    groups: dict[tuple, list[RunArtifact]] = defaultdict(list)
    for (name, key), arts in newest.items():
        if key != host:
            continue
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


def fidelity_section(name: str, all_arts: list, newest: Newest) -> dict:
    """The newest result of each build (and cross-engine pair) of a fidelity grid on one host (`all_arts`
    are that host's), beside its speed on the same host."""
    arts = _series(all_arts)
    latest = max(arts, key=lambda a: a.timing.end)
    by_build: dict[tuple, Any] = {}
    for a in sorted(arts, key=lambda a: a.timing.end):
        by_build[(a.grid.build, a.cross_engine)] = a
    rows = []
    for (build, cross), a in sorted(by_build.items(), key=lambda kv: (kv[0][1], kv[1].engine.name, kv[0][0])):
        s = a.summary
        speed = _speed_of(newest, a.host.key, a.engine.name, a.model.form, a.execution.threads)

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
            "host": describe(latest.host.model_dump()), "host_key": latest.host.key,
            "dirty": any(a.harness.dirty for a in arts), "harness_commits": sorted({a.harness.commit[:12] for a in arts})}


def render(store_dirs: list[str] | None = None, template: str = "results.md.j2") -> str:
    return build(store_dirs, template)[0]


def plot_names(section: dict) -> list[str]:
    """The plots a section gets: decided from its data alone, so the markdown can name them."""
    names = []
    if any("ci" in r for t in section["tables"] for r in t["rows"]):
        names.append(f"{section['slug']}-ratios.png")
    if any(t["unit"] == "tok/s" and len({r["threads"] for r in t["rows"]}) > 1 for t in section["tables"]):
        names.append(f"{section['slug']}-threads.png")
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
    text, sections, _ = build_all(store_dirs, template)
    return text, sections


def build_all(store_dirs: list[str] | None = None, template: str = "results.md.j2") -> tuple[str, list[dict], dict]:
    """(markdown, grid sections, the whole context the templates are rendered from)."""
    if store_dirs:  # a store named by the user must exist: a typo must not render an empty report
        for d in store_dirs:
            if not Path(d).is_dir():
                raise UserError(str(d), "--store: no such store directory", "pass the folder that holds <grid>/<id>.json")
    store_dirs = [str(d) for d in store_dirs] if store_dirs else ["artifacts", "baselines"]
    c = collect([d for d in store_dirs if Path(d).exists()])
    newest = newest_series(c.runs)  # each speed grid's newest series per host, once
    fsections = [fidelity_section(name, host_arts, newest)
                 for name, arts in c.fidelity.items() for host_arts in by_host(arts).values()]
    ceiling = ceiling_section(c.calibrations, newest)
    sections = []
    for name, arts in c.runs.items():
        groups = by_host(arts)
        for key, host_arts in groups.items():
            sec = grid_section(name, host_arts, c.where)
            sec["n_hosts"] = len(groups)
            sec["plots"] = plot_names(sec)
            sections.append(sec)
    ctx = {"sections": sections, "fidelity": fsections, "ceilings": ceiling, "stores": store_dirs,
           "hosts": hosts_rows(c)}
    return _env().get_template(template).render(**ctx), sections, ctx


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), keep_trailing_newline=True,
                              trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)


def hosts_rows(c: Collected) -> list[dict]:
    """One row per host that measured anything in the stores: key, CPU, ISA tier, cores, memory, artifact
    count by kind, first and last date."""
    every = [a for arts in c.runs.values() for a in arts] + [a for arts in c.fidelity.values() for a in arts] + \
        list(c.calibrations) + list(c.references)
    rows = []
    for key, arts in by_host(every).items():
        h = arts[0].host
        total = h.memory.get("total_bytes")
        kinds = defaultdict(int)
        for a in arts:
            kinds[a.kind] += 1
        rows.append({"key": key, "cpu": h.cpu.get("model", "unknown"),
                     "isa_tier": h.cpu.get("isa_tier", "unknown"),
                     "cores": f"{h.cpu.get('physical_cores')}/{h.cpu.get('logical_cores')}",
                     "memory": f"{total / 2**30:.1f} GiB" if isinstance(total, int) else "unknown",
                     "identity": h.identity.status, "emulation": h.emulation or "none",
                     "artifacts": len(arts), "kinds": ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())),
                     "grids": sorted({a.grid.name for a in arts}),
                     "first": min(a.timing.start for a in arts)[:10], "last": max(a.timing.end for a in arts)[:10],
                     "describe": describe(h.model_dump())})
    return rows


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


def hosts(store_dirs: list[str] | None = None) -> list[dict]:
    """`harness hosts`: the machines that measured the stores, with this machine marked."""
    from harness.provenance import current_host_key
    if store_dirs:
        for d in store_dirs:
            if not Path(d).is_dir():
                raise UserError(str(d), "--store: no such store directory", "pass the folder that holds <grid>/<id>.json")
    dirs = [str(d) for d in store_dirs] if store_dirs else [d for d in ("artifacts", "baselines") if Path(d).is_dir()]
    me = current_host_key()
    return [{**r, "this_machine": r["key"] == me} for r in hosts_rows(collect(dirs))]


def format_hosts(rows: list[dict]) -> str:
    if not rows:
        return "no artifacts in the store(s)"
    head = f"{'host key':<14} {'CPU':<18} {'ISA tier':<12} {'cores':<6} {'memory':>9} {'artifacts':>9}  first       last        note"
    lines = [head]
    for r in rows:
        note = "this machine" if r["this_machine"] else ""
        if r["identity"].startswith("legacy"):
            note = ", ".join(x for x in (note, "legacy record (identity not recorded)") if x)
        lines.append(f"{r['key']:<14} {r['cpu'][:18]:<18} {r['isa_tier']:<12} {r['cores']:<6} {r['memory']:>9} "
                     f"{r['artifacts']:>9}  {r['first']}  {r['last']}  {note}")
    return "\n".join(lines)


# The README's published block: the grids it shows, as a pivot of medians with paired ratios.
README_GRIDS = ("vllm-vs-llamacpp", "llamacpp-baseline", "quickstart")
README_METRICS = ("decode_tok_s", "prefill_tok_s")
README_BEGIN = "<!-- published:begin: rendered by `harness report --readme README.md` from the store; do not edit -->"
README_END = "<!-- published:end -->"


def _short_verdict(v: str) -> str:
    return v.split(":")[0].split(" (")[0] if v else ""


def pivot(section: dict, metrics: tuple[str, ...] | None = None) -> list[dict]:
    """A grid section as one table per metric: a row per cell, a column per arm; each entry the median and,
    for non-baseline arms, the paired ratio with its CI and verdict."""
    out = []
    arms = []
    for t in section["tables"]:
        for r in t["rows"]:
            if r["arm"] not in arms:
                arms.append(r["arm"])
    for t in section["tables"]:
        if metrics is not None and t["metric"] not in metrics:
            continue
        cells: dict[str, dict] = {}
        for r in t["rows"]:
            entry = r["median"]
            if "ci" in r:
                entry += f" ({r['ratio_value']:.2f}x [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}], {_short_verdict(r['verdict'])})"
            cells.setdefault(r["cell_short"] or r["cell"].replace("batch=1,", ""), {})[r["arm"]] = entry
        out.append({"metric": t["metric"], "unit": t["unit"], "arms": arms,
                    "rows": [{"cell": c, "entries": [v.get(a, "-") for a in arms]}
                             for c, v in cells.items()]})
    return out


def readme_block(ctx: dict) -> str:
    secs = [s for name in README_GRIDS for s in ctx["sections"] if s["name"] == name]
    return _env().get_template("readme.md.j2").render(
        sections=[{**s, "pivots": pivot(s, README_METRICS)} for s in secs], fidelity=ctx["fidelity"], ceilings=ctx["ceilings"],
        hosts=ctx["hosts"], begin=README_BEGIN, end=README_END).rstrip("\n")


def readme_text(path: str, ctx: dict) -> str:
    """The README with its published block replaced by what the store renders now."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UserError(path, f"--readme: unreadable ({e.strerror})", "pass the README that holds the markers") from None
    if text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
        raise UserError(path, "--readme: the published-block markers are missing or repeated",
                        f"put one line `{README_BEGIN}` and one `{README_END}` where the block goes")
    head, rest = text.split(README_BEGIN)
    _, tail_ = rest.split(README_END)
    return head + readme_block(ctx) + tail_
