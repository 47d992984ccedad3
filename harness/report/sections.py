"""A grid's section of the report: its tables (medians, paired ratios, intervals, verdicts), the views its
grid file declares (scale, steps, context, sweep, targets), and the fidelity, ceiling and across-host
sections. Analysis derives the rows (harness/analysis.py); this formats them."""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from typing import Any


from harness import analysis, stats, targets, views
from harness.analysis import Newest, by_key
from harness.artifact import RunArtifact
from harness.engines import weight_files
from harness.probe import describe


SPREAD_PREFIX = "per-pass ratios spread widely in"  # the page's one warning of them (readme.py counts it)
LOADED_CORES = 0.25  # CPU cores used by other processes during a run above which it is flagged


BOUND_WORDS = {"forward": "its forward", "linear_kernel": "its linear layers' kernel"}


def targets_block(declared: tuple[views.Target, ...], arts: list) -> list[str]:
    """Generated lines: each target's arm / reference ratio (paired Hodges-Lehmann with its interval) and whether
    the target is met (the whole interval at or above it), not met (the whole interval below) or undecided; then
    the bounds (harness/targets.py)."""
    out = []
    for r in targets.check(declared, arts):
        c, t = r.comparison, r.target
        ci = "" if c.ci_low is None or c.ci_high is None else \
            f" [{c.ci_low:.2f}, {c.ci_high:.2f}] ({stats.level_text(c.level)})"
        if r.bound is None:
            out.append(f"{r.arm} / {t.against} {t.metric}: {c.ratio:.2f}x{ci}, {c.n_pairs} passes paired, "
                       f"against the target of at least {t.at_least:g}x ({t.issue}): {r.status}.")
        else:
            out.append(f"{r.arm} with nothing but {BOUND_WORDS[r.bound]} ({r.step_ms:.1f} ms a step) / {t.against} "
                       f"{t.metric}: at most {c.ratio:.2f}x{ci}, {c.n_pairs} passes paired: {r.status}.")
    return out


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _status_counts(arts: list) -> str:
    ok = sum(1 for a in arts if a.status == "ok")
    bad = len(arts) - ok
    return f"{ok} ok" + (f", {bad} failed or timed out" if bad else "")


def _ratio_text(c: stats.Comparison) -> str:
    if not c.has_ratio:  # a zero (a goodput of 0) or a non-finite value in a pair: no ratio at all
        return "no ratio: a value of a pair is zero or not finite"
    if not c.has_interval:
        return f"{c.ratio:.3f} (n={c.n_pairs}: no interval at {stats.level_text(c.level)})"
    return f"{c.ratio:.3f} [{c.ci_low:.3f}, {c.ci_high:.3f}]"


def _row_dict(r: analysis.Row) -> dict:
    """A row as the templates and plots read it: formatted text beside the values they need."""
    s = r.summary
    d: dict[str, Any] = {
        "cell": r.cell, "arm": r.arm, "unit": r.unit, "median": _fmt(s.median), "iqr": _fmt(s.iqr),
        "median_value": s.median, "q1_value": s.q1, "q3_value": s.q3,
        "median_ci": r.median_ci, "threads": r.threads,
        "cell_short": r.cell_short, "range": f"{_fmt(s.lo)}-{_fmt(s.hi)}",
        "n": f"{s.n} runs / {r.n_samples} samples" + (f" (+{r.duplicates} duplicate)" if r.duplicates else ""),
        "failed": r.failed, "hib": r.higher_is_better, "verdict": r.verdict, "role": r.role,
        "ratio": {"baseline": "baseline", "unpaired": "no paired baseline"}.get(r.role, ""), "p": "",
        "fidelity": r.fidelity}
    c = r.comparison
    if c is not None:
        d["ratio"] = _ratio_text(c) + (" (exploratory, 95%)" if r.role == "exploratory" else "")
        d["ratio_value"], d["p_raw"] = c.ratio, c.p_value
        d["p"] = ("" if not c.has_ratio else f"{c.p_adjusted:.3g}" if r.role == "family"
                  else f"{c.p_value:.3g} (unadjusted)")
        if c.has_interval:
            d["ci"] = (c.ci_low, c.ci_high)
        d["detectable"] = c.detectable
    return d


def grid_section(name: str, all_arts: list[RunArtifact], where: dict[str, str] | None = None,
                 gates: dict | None = None) -> dict:
    """One series of a grid (the newest of one host): `all_arts` are that host's artifacts of the grid."""
    arts = analysis.newest_series(all_arts)
    # every artifact of the grid on this host, shown or not, is in the fingerprint: adding or removing
    # any one of them makes the rendered file stale
    fingerprint = hashlib.sha256("\n".join(sorted(a.id for a in all_arts)).encode()).hexdigest()[:16]
    first = next((a for a in arts if not a.host.emulation), arts[0])  # the machine itself, where it ran natively
    older = [a for a in all_arts if a.grid.sha256 != first.grid.sha256]
    older_series = len({a.grid.sha256 for a in older})
    ok = [a for a in arts if a.status == "ok"]
    an = analysis.analyse(arts, gates)
    between = analysis.between_series(all_arts)
    tables = []
    for metric in an.metrics:
        rows = [_row_dict(r) for r in an.rows if r.metric == metric]
        tables.append({"metric": metric, "unit": rows[0]["unit"] if rows else "",
                       "definitions": _definitions(ok, metric),
                       "rows": rows})
    warnings = _warnings(an, ok)
    # A/A: every arm ran the same engine, model form and requested configuration
    configs = {(a.engine.name, a.model.form, a.execution.observe, json.dumps(a.execution.requested, sort_keys=True))
               for a in ok}
    calibration = aa_calibration(an) if ok and len(configs) == 1 and len(an.arms) > 1 else None
    engines = sorted({(a.engine.name, a.engine.version, a.engine.build_commit, analysis.build_id(a.engine)) for a in arts})
    models = {id(a.model): a.model for a in arts}.values()  # each record once: runs share them (artifact.parse, shared)
    model_files = sorted({(m.form, f.path, f.sha256[:12]) for m in models for f in weight_files(m) or []})
    return {
        "name": name, "grid_path": first.grid.path, "grid_sha": first.grid.sha256[:12], "order": first.grid.order,
        "derived_from": first.grid.derived_from,
        "passes": len({a.grid.pass_index for a in arts}), "baseline": first.grid.baseline_arm,
        "model": "`, `".join(sorted({a.model.name for a in arts})),
        "n_artifacts": len(arts), "n_failed": sum(1 for a in arts if a.status != "ok"), "tables": tables,
        "n_all": len(all_arts), "n_older": len(older), "older_series": older_series,
        "older_status": _status_counts(older) if older else "", "fingerprint": fingerprint,
        "warnings": warnings, "engines": engines, "calibration": calibration, "model_files": model_files,
        "arm_forms": {a.grid.arm: (a.engine.name, a.model.form) for a in ok},
        "family": _family_text(an), "shows": _shows(an, ok), "between": _between(between), "definitions_note": _definitions_note(tables),
        "answer": {**_answer(tables), "changed": _changed(between, first.grid.sha256)},
        "host": describe(first.host.model_dump()), "host_key": analysis.machine_key(first),
        "slug": f"{name}-{analysis.machine_key(first)}", "emulated_arms": _emulated_arms(arts),
        "synthetic": any(a.model.source.get("synthetic") for a in arts),
        "failures": [{"arm": a.grid.arm, "pass_index": a.grid.pass_index, "error": (a.error or a.status)[:200]}
                     for a in sorted(arts, key=lambda a: (a.grid.arm, a.grid.pass_index)) if a.status != "ok"],
        "kernels": sorted({str(a.host.get("kernel")) for a in arts}),
        "harness_commits": sorted({a.harness.commit[:12] for a in arts}),
        "dirty": any(a.harness.dirty for a in arts),
        "dates": f"{min(a.timing.start for a in arts)[:10]} to {max(a.timing.end for a in arts)[:10]}",
        "span": _span(arts),
        "store_dirs": sorted({(where or {}).get(a.id, "") for a in arts}),
    }


def _warnings(an: analysis.SeriesAnalysis, ok: list) -> list[str]:
    """What a series' page warns of, sorted: the analysis' own warnings, a pass count that can never give a verdict,
    verdicts withheld by fidelity gates, settings that did not take effect, runs under other load, overlapping
    effects of several arms."""
    spread = "per-pass ratios spread widely"
    warnings = [w for w in an.warnings if not w.startswith(spread)]
    wide = [(r, w) for r in an.rows if r.comparison for w in r.comparison.warnings if w.startswith(spread)]
    if wide:  # said once, with the comparisons it applies to
        iqrs = sorted(float(w.split("IQR ")[1].split(")")[0]) for _, w in wide)
        rows = "; ".join(f"{r.metric} {r.arm}{' at ' + r.cell_short if r.cell_short else ''}" for r, _ in wide)
        warnings.append(f"{SPREAD_PREFIX} {len(wide)} comparison(s) (IQR {iqrs[0]:.2f} to {iqrs[-1]:.2f}): {rows}; "
                        "check host load, add passes")
    short = analysis.unreachable(an)
    if short is not None:
        n_min, level, needed = short
        warnings.append(f"{n_min} passes can never give a verdict in a family of {an.family_size} comparisons "
                        f"(each interval at {stats.level_text(level)}); run at least "
                        f"{needed} passes, or declare the grid's primary comparisons")
    gated = sorted({(r.arm, r.fidelity) for r in an.rows if r.role == "family"
                    and r.fidelity not in ("pass", "n/a", "synthetic weights")})
    for arm, g in gated:
        warnings.append(f"arm {arm}: fidelity {g} on this host: its speed is shown, its verdicts are withheld "
                        "(docs/methodology.md, fidelity gates speed)")
    # Rule 6: a setting that did not take effect measures nothing; say so wherever it happened
    for a in ok:
        for setting, row in (a.execution.settings or {}).items():
            if row.get("rule") == "enforced" and row.get("effective") != row.get("requested"):
                warnings.append(f"arm {a.grid.arm}, cell {a.grid.cell}: {setting} requested {row.get('requested')!r}, the "
                                f"engine used {row.get('effective')!r} (read back); its figures are not a result at the "
                                "requested setting")
        eff = a.execution.effective.get("threads", a.execution.effective.get("torch_threads"))
        if a.execution.settings is None and isinstance(eff, int) and eff != a.execution.threads:
            warnings.append(f"arm {a.grid.arm}, cell {a.grid.cell}: requested {a.execution.threads} thread(s), "
                            f"the engine used {eff} (read back); its figures are not a {a.execution.threads}-thread result")
    # what an engine flagged in a run it kept ok (a client behind its schedule, a server whose usage disagreed)
    flagged: dict[str, list] = {}
    for a in ok:
        flag = a.execution.effective.get("flag")
        for f in (flag.split("; ") if isinstance(flag, str) else ()):
            flagged.setdefault(f.split(":", 1)[0], []).append(a)
    for what, runs in flagged.items():
        warnings.append(f"{len(runs)} run(s) flagged {what!r} (execution.effective.flag): their figures are shown, "
                        "read them with it")
    loaded = [a for a in ok if isinstance(a.host.get("other_load_during_run"), dict)
              and a.host["other_load_during_run"].get("other_cores", 0) > LOADED_CORES]
    if loaded:
        worst = max(a.host["other_load_during_run"]["other_cores"] for a in loaded)
        steal = [a.host["other_load_during_run"].get("steal_cores") for a in loaded]
        why = ""
        if all(isinstance(x, (int, float)) for x in steal):
            why = (f"; of it, hypervisor steal (this virtual machine's CPUs given to other guests) up to "
                   f"{max(steal):.2f} cores")
        warnings.append(f"{len(loaded)} run(s) shared the host with other work (up to {worst:.2f} cores used by other "
                        f"processes during a run, threshold {LOADED_CORES}{why}): not publishable as is; rerun on an "
                        "idle host")
    if len([x for x in an.arms if x != an.baseline]) > 1:
        warnings.append("several arms are compared with one baseline: their separately measured effects overlap and "
                        "must not be added")
    return sorted(set(warnings))


def _changed(between: list, newest_sha: str) -> str:
    """What changed against the previous series of the grid on this host, in one line: the figures whose 95%
    intervals of the median, in the newest series and the one before, do not overlap (analysis.between_series);
    empty where this host measured one series."""
    moved, label, n = [], "", 0
    for b in between:
        prev, new = b.series[-2], b.series[-1]
        if new.sha != newest_sha:
            continue  # the newest series did not measure it
        n += 1
        label = prev.label
        if prev.median_ci and new.median_ci and (prev.median_ci[1] < new.median_ci[0] or new.median_ci[1] < prev.median_ci[0]):
            where = b.cell.replace("batch=1,", "")
            moved.append(f"{b.metric} {b.arm} at {where}: {_fmt(prev.median)} to {_fmt(new.median)}")
    if not n:
        return ""
    if not moved:
        return (f"against the previous series ({label}): no decode or prefill median moved beyond both its 95% "
                f"intervals ({n} compared)")
    return (f"against the previous series ({label}): {len(moved)} of {n} decode and prefill medians moved "
            f"beyond both 95% intervals: {'; '.join(moved)}")


def _between(rows: list) -> list[dict]:
    """The between-series spread of a grid's figures on one host (analysis.between_series), worded."""
    return [{"cell": b.cell.replace("batch=1,", ""), "arm": b.arm, "metric": b.metric,
             "series": [{"label": f.label, "median": _fmt(f.median),
                         "median_ci": "n<6: no interval" if f.median_ci is None else
                         f"[{_fmt(f.median_ci[0])}, {_fmt(f.median_ci[1])}]",
                         "ratio": "baseline" if f.ratio is None else f"{f.ratio:.3f}" + (
                             f" [{f.ratio_ci[0]:.3f}, {f.ratio_ci[1]:.3f}]" if f.ratio_ci else " (no interval)")}
                        for f in b.series],
             "spread": f"{b.spread:.3f}", "flag": ", ".join(f"{x} do not overlap" for x in b.disjoint)}
            for b in rows]


def _answer(tables: list[dict]) -> dict:
    """The section's declared comparisons (the family: those given verdicts), one row each, for the top of its
    page: metric with the direction of "better", cell, arm, ratio [interval], verdict; and their verdicts counted."""
    rows = [{"metric": t["metric"], "better": "higher" if r["hib"] else "lower", "cell": r["cell_short"] or "(its one cell)",
             "arm": r["arm"], "ratio": r["ratio"], "verdict": _short_verdict(r["verdict"]),
             "fidelity": r["fidelity"] if r["fidelity"] not in ("pass", "n/a") else ""}
            for t in tables for r in t["rows"] if r["role"] == "family"]
    counts: dict[str, int] = defaultdict(int)
    for r in rows:
        counts[r["verdict"]] += 1
    order = ("better", "worse", "no difference detected", "undetermined")
    words = [f"{counts[v]} {v}" for v in order if counts[v]] + [f"{n} {v}" for v, n in sorted(counts.items())
                                                                 if v not in order]
    return {"rows": rows, "counts": ", ".join(words)}


def _shows(an: analysis.SeriesAnalysis, ok: list) -> str:
    """What a cross-engine series on the very same files shows, in one paragraph generated from the store: the
    files each cell's engines shared, and every verdict comparison (ratio, interval, verdict). Empty unless the
    arms run more than one engine and, in every cell, all loaded the same weight files."""
    cells: dict[str, set] = defaultdict(set)
    forms: dict[str, set] = defaultdict(set)
    for a in ok:
        cells[a.grid.cell].add(analysis.weight_shas(a))
        forms[a.model.form] |= {s[:12] for s in analysis.weight_shas(a)}
    if len({a.engine.name for a in ok}) < 2 or not cells or any(len(v) != 1 or not next(iter(v)) for v in cells.values()):
        return ""
    engines = " and ".join(sorted({a.engine.name for a in ok}))
    files = ", ".join(f"{form} `{', '.join(sorted(s))}`" for form, s in sorted(forms.items()))
    parts = []
    for r in an.rows:
        c = r.comparison
        if r.role != "family" or c is None:
            continue
        interval = f" [{c.ci_low:.3f}, {c.ci_high:.3f}]" if c.has_interval else " (no interval)"
        parts.append(f"{r.metric} {c.ratio:.3f}{interval} at {r.cell_short or r.cell}: {_short_verdict(r.verdict)}")
    if not parts:
        return ""
    arms = sorted({r.arm for r in an.rows if r.role == "family"})
    return (f"In every cell {engines} loaded the very same weight files (sha256 by form: {files}), so only the engine "
            f"differs. {', '.join(arms)} relative to {an.baseline} (paired ratio [interval at the family's level]: "
            f"verdict): {'; '.join(parts)}.")


def _family_text(an: analysis.SeriesAnalysis) -> str:
    if not an.family_size:
        return "no comparisons"
    scope = ("the declared primaries (" + "; ".join(f"{k}: {v}" for k, v in sorted(an.primary.items())) + ")"
             if an.primary else "every comparison of this series")
    n_expl = sum(1 for r in an.rows if r.role == "exploratory")
    k = len(an.looks)
    seq = (f"; sequential passes (looks at {', '.join(map(str, an.looks))}), read at the last look reached, each "
           f"interval at {stats.level_text(an.level)} (Bonferroni: 1 - {analysis.ALPHA}/({an.family_size} x {k} looks))"
           if k else f"; each interval at {stats.level_text(an.level)} (Bonferroni: 1 - {analysis.ALPHA}/{an.family_size})")
    return (f"{an.family_size} comparison(s) given verdicts, {scope}{seq}"
            + (f"; {n_expl} exploratory estimate(s) with a plain 95% interval and no verdict" if n_expl else ""))


def aa_calibration(an: analysis.SeriesAnalysis) -> list[dict]:
    """A/A (identical arms): every verdict is a false positive (analysis.aa_calibration), worded."""
    def rate(k: int, n: int, ci: tuple[float, float]) -> str:
        return f"{k}/{n} [{ci[0] * 100:.0f}%, {ci[1] * 100:.0f}%]"
    return [{"metric": r.metric, "n": r.n, "flagged": rate(r.flagged, r.n, r.flagged_ci), "raw": rate(r.raw, r.n, r.raw_ci),
             "mde": f"+/-{r.detectable * 100:.1f}%" if r.detectable is not None else "no verdict reachable"}
            for r in analysis.aa_calibration(an)]


def ceiling_section(calibrations: list, newest: Newest, ceiling_grids: tuple[str, ...]) -> list[dict]:
    """Per host: decode as weight bytes per second against the read bandwidth measured on that host, prefill
    as FLOP/s against its matmul peak, both at the run's thread count (the host's newest calibration, newest
    series of the grids whose files declare `report: {ceiling: true}`). A host with speed series and no
    calibration is named, with the command that measures one."""
    cal_by_host = {key: max(cals, key=lambda c: c.timing.end) for key, cals in by_key(calibrations).items()}
    # an emulated class is its own host here: its runs are set against the calibration taken under its caps
    speed: dict[str, dict[str, list]] = defaultdict(dict)
    for (name, _machine), arts in newest.items():
        if name in ceiling_grids:
            for key, mine in by_key(arts).items():
                speed[key][name] = mine
    out = []
    for key in sorted(set(cal_by_host) | set(speed)):
        cal = cal_by_host.get(key)
        if cal is None:
            emu = next((a.host.emulation for g in speed[key].values() for a in g if a.host.emulation), None)
            how = f"`harness probe --bandwidth --class {emu}`" if emu else "`harness probe --bandwidth`"
            out.append({"host_key": key, "missing": f"no calibration for host `{key}`: run {how} "
                        "on it; another machine's ceiling is never borrowed"})
            continue
        out.append(_ceiling_of_host(cal, speed.get(key, {}), ceiling_grids))
    return out


def _ceiling_of_host(cal: Any, newest: dict[str, list[RunArtifact]], ceiling_grids: tuple[str, ...]) -> dict:
    from harness.ceiling import best_by_threads
    best = best_by_threads(cal)
    cal_rows = [{"threads": t, "bw": f"{b['read_bandwidth_gb_s']:.1f}", "fp32": f"{b['matmul_gflop_s_fp32']:.0f}",
                 "bf16": f"{b['matmul_gflop_s_bf16']:.0f}"} for t, b in sorted(best.items())]
    rows = [{"grid": r.grid, "cell": r.cell.replace("batch=1,", ""), "arm": r.arm, "engine": r.engine, "form": r.form,
             "threads": r.threads, "mib": f"{r.weight_bytes / 2**20:.0f}", "decode": _fmt(r.decode),
             "gbs": f"{r.gbs:.2f}", "bw_share": f"{100 * r.bw_share:.0f}%", "prefill": _fmt(r.prefill),
             "gflops": f"{r.gflops:.0f}", "peak": "-" if r.peak is None else f"{r.peak_kind} {r.peak:.0f}",
             "flop_share": "n/a (integer kernels)" if r.flop_share is None else f"{100 * r.flop_share:.0f}%",
             "forward_bw": "-" if r.forward_gbs is None else f"{r.forward_gbs:.2f} ({100 * r.forward_share:.0f}%)",
             "n": r.n} for r in analysis.ceiling_rows(best, newest, ceiling_grids)]
    return {"calibration": cal_rows, "rows": rows, "id": cal.id[:12], "measured_by": cal.grid.path,
            "definitions": cal.method["definitions"], "date": cal.timing.start[:10], "host_key": cal.host.key,
            "dirty": cal.harness.dirty, "host": describe(cal.host.model_dump()), "missing": ""}


def _definitions(arts: list, metric: str) -> list[tuple[str, str]]:
    """Each definition text of a metric with the engines that measured by it: one line where they share it."""
    by: dict[str, set[str]] = {}
    for r in arts:
        if metric in r.metrics:
            by.setdefault(r.metrics[metric].definition, set()).add(r.engine.name)
    return sorted((", ".join(sorted(engs)) + (" (one definition)" if len(engs) > 1 else ""), d)
                  for d, engs in by.items())


def _definitions_note(tables: list[dict]) -> str:
    """Whether the engines of a series were measured by one definition per metric name."""
    engines = {e for t in tables for names, _ in t["definitions"] for e in names.split(" (")[0].split(", ")}
    if len(engines) < 2:
        return ""
    split = [t["metric"] for t in tables if len(t["definitions"]) > 1]
    if split:
        return (f"the engines' definitions of {', '.join(split)} differ (series before the common request "
                "definitions): their ratios are not like for like")
    return "one definition per metric for every engine (harness/metrics.py)"


def _speed_of(newest: Newest, host: str, engine: str, form: str, threads: int,
              ceiling_grids: tuple[str, ...]) -> dict[str, str]:
    """A build's measured speed on one host (analysis.speed_of), worded."""
    sp = analysis.speed_of(newest, host, engine, form, threads, ceiling_grids)
    if sp is None:
        return {"decode": "not measured", "prefill": "not measured", "where": ""}
    return {"where": f"{sp.grid}, {sp.cell.replace('batch=1,', '')}",
            **{k: "not measured" if v is None else _fmt(v) for k, v in (("decode", sp.decode), ("prefill", sp.prefill))}}


def fidelity_section(name: str, all_arts: list, newest: Newest, ceiling_grids: tuple[str, ...] = ()) -> dict:
    """The newest result of each build (and cross-engine pair) of a fidelity grid on one host (`all_arts`
    are that host's), beside its speed on the same host."""
    if all_arts and all_arts[0].kind == "audio-fidelity":  # a voice's grid: its own view
        from harness.workloads.speech.views import audio_fidelity_section
        return audio_fidelity_section(name, all_arts, describe, _span)
    arts = analysis.newest_series(all_arts)
    latest = max(arts, key=lambda a: a.timing.end)
    by_build: dict[tuple, Any] = {}
    for a in sorted(arts, key=lambda a: a.timing.end):
        by_build[(a.grid.build, a.cross_engine)] = a
    rows = []
    for (build, cross), a in sorted(by_build.items(), key=lambda kv: (kv[0][1], kv[1].engine.name, kv[0][0])):
        s = a.summary
        speed = _speed_of(newest, a.host.key, a.engine.name, a.model.form, a.execution.threads, ceiling_grids)

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
            "references": sorted({f"{a.reference['engine']} {a.reference['form']}" for a in by_build.values()}),
            "n_older": len(all_arts) - len(arts), "fingerprint": fingerprint, "threads": latest.execution.threads,
            "host": describe(latest.host.model_dump()), "host_key": latest.host.key,
            "dirty": any(a.harness.dirty for a in arts), "harness_commits": sorted({a.harness.commit[:12] for a in arts}),
            "span": _span(list(by_build.values()))}


def _span(arts: list) -> str:
    """The wall time from a series' first start to its last end, as the artifacts recorded them ("": unreadable)."""
    from harness.check.consistency import instant as _instant
    try:
        first = min(_instant(a.timing.start) for a in arts)
        last = max(_instant(a.timing.end) for a in arts)
    except (TypeError, ValueError, AttributeError):
        return ""
    secs = (last - first).total_seconds()
    return f"{secs:.0f} s" if secs < 600 else f"{secs / 60:.0f} min"


def _emulated_arms(arts: list[RunArtifact]) -> list[dict]:
    """Per arm run under a hardware class: the class, its host key, and each cap's status over its runs."""
    out: dict[str, dict] = {}
    for a in arts:
        emu = a.execution.emulation
        if not emu:
            continue
        row = out.setdefault(a.grid.arm, {"arm": a.grid.arm, "cls": emu["class"], "host_key": a.host.key, "caps": {}})
        for cap, c in emu["caps"].items():
            row["caps"].setdefault(cap, set()).add(c["status"])
    return [{**r, "caps": "; ".join(f"{cap} {' / '.join(sorted(st))}" for cap, st in sorted(r["caps"].items()))}
            for _, r in sorted(out.items())]


def plot_names(section: dict) -> list[str]:
    """The plots a section gets: decided from its data alone, so the markdown can name them."""
    names = []
    if any("ci" in r for t in section["tables"] for r in t["rows"]):
        names.append(f"{section['slug']}-ratios.png")
    if any(t["unit"] == "tok/s" and len({r["threads"] for r in t["rows"]}) > 1 for t in section["tables"]):
        names.append(f"{section['slug']}-threads.png")
    if section.get("scale") and any(r["bw_share_value"] is not None for r in section["scale"]["rows"]):
        names.append(f"{section['slug']}-scale.png")
    if section.get("steps"):
        names.append(f"{section['slug']}-steps.png")
    if section.get("context") and any(r["decode_value"] is not None for r in section["context"]["rows"]):
        names.append(f"{section['slug']}-context.png")
    if section.get("history"):
        names.append(f"{section['slug']}-history.png")
    if any(len(rows) > 1 for by_arm in analysis.load_points(section).values() for rows in by_arm.values()):
        names.append(f"{section['slug']}-load.png")
    return names


def history_block(order: tuple[str, ...], series: list[RunArtifact]) -> dict | None:
    """A history's view (analysis/history.py): per metric and cell, each version's median with its 95% interval
    and the step from the version before with its interval at the family's level and verdict; the steps found,
    and the steps too noisy to tell. None: the grid declares no history, or its series measured fewer than two."""
    if not order:
        return None
    from harness.analysis.history import histories
    rule = next((a.grid.stop for a in series if a.grid.stop is not None), None)
    # until: step: the history its looks stopped on (its primary metrics, at its level), so the page reads as the
    # runner did; otherwise every metric, one family at 0.05
    hs = histories(series, order, tuple(rule.metrics), rule.alpha) if rule else histories(series, order)
    if not hs:
        return None
    tables, found, noisy, n_steps, level = [], [], 0, 0, ""
    commits: dict[str, list[str]] = {}  # each version's build commit(s): what changed between two of them
    for a in series:
        if a.grid.arm in order and re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", a.engine.build_commit or ""):
            commits.setdefault(a.grid.arm, [])
            if a.engine.build_commit not in commits[a.grid.arm]:
                commits[a.grid.arm].append(a.engine.build_commit)

    def named(v: str) -> str:
        return f"{v} ({', '.join(commits[v])})" if commits.get(v) else v
    for h in hs:
        step_of = {s.after: s for s in h.steps}
        rows = []
        for p in h.points:
            s = step_of.get(p.version)
            row = {"version": p.version, "median": _fmt(p.median), "median_value": p.median, "n": p.n,
                   "median_ci": "n<6: no interval" if p.median_ci is None else
                   f"[{_fmt(p.median_ci[0])}, {_fmt(p.median_ci[1])}]", "ci_values": p.median_ci,
                   "step": "", "verdict": "", "step_value": None, "found": False}
            if s is not None:
                c = s.comparison
                n_steps += 1
                level = stats.level_text(c.level)
                row |= {"step": _ratio_text(c), "verdict": _short_verdict(s.verdict), "step_value": c.ratio,
                        "found": s.found}
                if s.found:
                    found.append(f"{h.metric} at {h.cell.replace('batch=1,', '')}: {named(s.before)} to {named(s.after)}, "
                                 f"{_ratio_text(c)}, {s.verdict}")
                elif not c.has_interval:
                    noisy += 1
            rows.append(row)
        tables.append({"metric": h.metric, "unit": h.unit, "cell": h.cell.replace("batch=1,", ""),
                       "better": "higher" if h.higher_is_better else "lower", "rows": rows})
    return {"order": list(order), "tables": tables, "found": found, "noisy": noisy, "n_steps": n_steps,
            "level": level, "builds": [named(v) for v in order if commits.get(v)],
            "rule": f"passes until a step: {', '.join(rule.metrics)}, its steps a family at {rule.alpha:g} over every "
                    f"look" if rule else ""}


def _scale(sec: dict, series: list[RunArtifact], cal_by_host: dict) -> dict | None:
    """The model-scale view of a series whose cells differ by model (harness/scale.py), native runs only."""
    from harness import scale
    from harness.ceiling import best_by_threads
    arts = [a for a in series if not a.host.emulation]
    from harness.context import applies
    if len({a.model.name for a in arts}) < 2 or applies(arts):
        return None  # (a series over a span of prompt lengths too is a context series: _context)
    cal = cal_by_host.get(sec["host_key"])
    total = arts[0].host.memory.get("total_bytes")
    return scale.scale_block(arts, sec, best_by_threads(cal) if cal else None, total if isinstance(total, int) else None)


def _context(sec: dict, series: list[RunArtifact], cal_by_host: dict) -> dict | None:
    """The context view of a series whose cells differ by prompt length (harness/context.py), native runs only."""
    from harness import context
    from harness.ceiling import best_by_threads
    arts = [a for a in series if not a.host.emulation]
    cal = cal_by_host.get(sec["host_key"])
    return context.context_block(arts, sec, best_by_threads(cal) if cal else None)


def _steps(sec: dict, series: list[RunArtifact], cal_by_host: dict) -> dict | None:
    """The step-attribution view of a series whose runs timed their decode steps (harness/steps.py)."""
    from harness import steps
    from harness.ceiling import best_by_threads
    cal = cal_by_host.get(sec["host_key"])
    return steps.steps_block(series, sec, best_by_threads(cal) if cal else None)


def across_hosts(sections: list[dict]) -> list[dict]:
    """Comparisons that several machines measured with the same grid file (each machine's newest series, as
    in its own section), worded from analysis.across_hosts: the per-host ratios side by side, their median, the
    exact sign test across hosts and the spread. Hosts are blocks here: no runs are pooled across machines."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for s in sections:
        groups[(s["name"], s["grid_sha"])].append(s)
    out = []
    for (name, sha), secs in sorted(groups.items()):
        per: dict[tuple[str, str, str], dict[str, float]] = defaultdict(dict)
        for s in secs:
            for t in s["tables"]:
                for r in t["rows"]:
                    if r.get("ratio_value") is not None:
                        per[(r["cell"], r["arm"], t["metric"])][s["host_key"]] = r["ratio_value"]
        hosts = sorted({s["host_key"] for s in secs})
        rows = [{"cell": r.cell.replace("batch=1,", ""), "arm": r.arm, "metric": r.metric,
                 "ratios": [f"{r.ratios[h]:.3f}" if h in r.ratios else "" for h in hosts],
                 "median": f"{r.median:.3f}", "sign": f"{r.above} above 1, {r.below} below; p = {r.sign_p:.3g}",
                 "spread": f"{r.spread:.3f}"} for r in analysis.across_hosts(per)] if len(hosts) > 1 else []
        if rows:
            reach = analysis.across_reach(len(hosts))
            out.append({"grid": name, "sha": sha, "hosts": hosts, "rows": rows, "reachable": reach.reachable,
                        "smallest_p": f"{reach.smallest_p:.3g}", "hosts_needed": reach.hosts_needed})
    return out


def _short_verdict(v: str) -> str:
    return v.split(":")[0].split(" (")[0] if v else "no verdict"
