"""Reports rendered from the artifact store with jinja2: results.md, byte-identical for the same store.

Every figure is a median over passes with its spread and n, and, for non-baseline arms, the
paired ratio to the grid's baseline arm with its bootstrap CI and verdict.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2

from harness import analysis, stats, summary, targets, views
from harness.analysis import Newest, by_host, by_key
from harness.artifact import RunArtifact
from harness.errors import UserError
from harness.grid import read_yaml
from harness.paths import PROJECT_ROOT
from harness.probe import describe
from harness.plotcache import PLOT_HASHES, write_plots  # noqa: F401 (cli and tests reach them here)
from harness.store import Store, gc_paused, load_path

TEMPLATES = PROJECT_ROOT / "reports" / "templates"
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
    tables = []
    for metric in an.metrics:
        rows = [_row_dict(r) for r in an.rows if r.metric == metric]
        tables.append({"metric": metric, "unit": rows[0]["unit"] if rows else "",
                       "definitions": _definitions(ok, metric),
                       "rows": rows})
    warnings = list(an.warnings)
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
    warnings = sorted(set(warnings))
    # A/A: every arm ran the same engine, model form and requested configuration
    configs = {(a.engine.name, a.model.form, a.execution.observe, json.dumps(a.execution.requested, sort_keys=True))
               for a in ok}
    calibration = aa_calibration(an) if ok and len(configs) == 1 and len(an.arms) > 1 else None
    engines = sorted({(a.engine.name, a.engine.version, a.engine.build_commit, analysis.build_id(a.engine)) for a in arts})
    models = {id(a.model): a.model for a in arts}.values()  # each record once: runs share them (_share)
    model_files = sorted({(m.form, f.path, f.sha256[:12]) for m in models for f in m.weight_files() or []})
    between = [{"cell": b.cell.replace("batch=1,", ""), "arm": b.arm, "metric": b.metric,
                "series": [{"label": f.label, "median": _fmt(f.median),
                            "median_ci": "n<6: no interval" if f.median_ci is None else
                            f"[{_fmt(f.median_ci[0])}, {_fmt(f.median_ci[1])}]",
                            "ratio": "baseline" if f.ratio is None else f"{f.ratio:.3f}" + (
                                f" [{f.ratio_ci[0]:.3f}, {f.ratio_ci[1]:.3f}]" if f.ratio_ci else " (no interval)")}
                           for f in b.series],
                "spread": f"{b.spread:.3f}", "flag": ", ".join(f"{x} do not overlap" for x in b.disjoint)}
               for b in analysis.between_series(all_arts)]
    return {
        "name": name, "grid_path": first.grid.path, "grid_sha": first.grid.sha256[:12], "order": first.grid.order,
        "passes": len({a.grid.pass_index for a in arts}), "baseline": first.grid.baseline_arm,
        "model": "`, `".join(sorted({a.model.name for a in arts})),
        "n_artifacts": len(arts), "n_failed": sum(1 for a in arts if a.status != "ok"), "tables": tables,
        "n_all": len(all_arts), "n_older": len(older), "older_series": older_series,
        "older_status": _status_counts(older) if older else "", "fingerprint": fingerprint,
        "warnings": warnings, "engines": engines, "calibration": calibration, "model_files": model_files,
        "arm_forms": {a.grid.arm: (a.engine.name, a.model.form) for a in ok},
        "family": _family_text(an), "shows": _shows(an, ok), "between": between, "definitions_note": _definitions_note(tables),
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
    return (f"{an.family_size} comparison(s) given verdicts, {scope}; each interval at "
            f"{stats.level_text(an.level)} (Bonferroni: 1 - {analysis.ALPHA}/{an.family_size})"
            + (f"; {n_expl} exploratory estimate(s) with a plain 95% interval and no verdict" if n_expl else ""))


def aa_calibration(an: analysis.SeriesAnalysis) -> list[dict]:
    """A/A (identical arms): every verdict is a false positive (analysis.aa_calibration), worded."""
    def rate(k: int, n: int, ci: tuple[float, float]) -> str:
        return f"{k}/{n} [{ci[0] * 100:.0f}%, {ci[1] * 100:.0f}%]"
    return [{"metric": r.metric, "n": r.n, "flagged": rate(r.flagged, r.n, r.flagged_ci), "raw": rate(r.raw, r.n, r.raw_ci),
             "mde": f"+/-{r.detectable * 100:.1f}%" if r.detectable is not None else "no verdict reachable"}
            for r in analysis.aa_calibration(an)]


@dataclass
class Collected:
    """What a set of stores holds: run artifacts by grid, fidelity artifacts by fidelity grid (references
    are read through them), calibration artifacts, and the store each artifact was read from; `left_out`:
    one `path: field: reason` line per file the report did not read because `harness check` refuses it."""
    runs: dict[str, list[RunArtifact]]
    fidelity: dict[str, list]
    calibrations: list
    where: dict[str, str]
    references: list
    left_out: list[str] = field(default_factory=list)


def printable(text: str) -> str:
    """A line from a store (a file name, an error) safe to print in markdown: control characters as `?`."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


def collect(store_dirs: list[str], listing: list | None = None, inputs: list | None = None) -> Collected:
    """Read the stores through the one door check also uses: a file that is not a plain, bounded, valid
    artifact whose id matches its bytes, or that check refuses (check.accepted), is left out and named in
    `left_out`, never rendered. `listing`: the stores' files as _listing gave them; `inputs`: filled with what
    the report is rendered from, per store (as _cached_inputs gives it)."""
    by_grid: dict[str, list[RunArtifact]] = defaultdict(list)
    fidelity: dict[str, list] = defaultdict(list)
    calibrations = []
    where: dict[str, str] = {}
    references = []
    left_out: list[str] = []
    for d, paths, store_left_out in listing if listing is not None else _listing(store_dirs):
        left_out += store_left_out
        accepted_ids: list[tuple[str, str]] = []
        ok, refused = _load_accepted(Path(d), paths, accepted_ids)
        left_out += refused
        if inputs is not None:
            inputs.append((str(d), accepted_ids, store_left_out + refused))
        for a in ok:
            where.setdefault(a.id, str(d))
            if a.kind == "run":
                by_grid[a.grid.name].append(a)
            elif a.kind == "fidelity":
                fidelity[a.grid.name].append(a)
            elif a.kind == "calibration":
                calibrations.append(a)
            else:
                references.append(a)
    return Collected(dict(sorted(by_grid.items())), dict(sorted(fidelity.items())), calibrations, where, references,
                     left_out)


def _listing(store_dirs: list[str]) -> list[tuple[str, list[Path], list[str]]]:
    """Per store folder: its artifact files the report reads, and a line per entry that is no file to read."""
    out = []
    for d in store_dirs:
        st = Store(Path(d))
        # references (large) are read through their fidelity artifacts, never rendered
        paths = [p for p in st.iter_paths() if p.parent.parent.name != "quality"]
        out.append((d, paths, list(st.left_out)))
    return out


def _ok_id(hit: Any) -> str | None:
    """The id of an accepted file's verdict-cache entry (["ok", id]); None for any other entry."""
    return hit[1] if isinstance(hit, list) and len(hit) == 2 and hit[0] == "ok" and isinstance(hit[1], str) else None


def _load_accepted(d: Path, paths: list[Path], accepted_ids: list | None = None) -> tuple[list, list[str]]:
    """The artifacts of one store folder that load (regular, bounded, hashing to their id) and that check accepts
    (check.accepted: every content rule, the tree state aside: a dirty tree's run is a real run, and the published
    store's tree state is gated by `harness check` in CI), in file order; a line per file left out, those that did
    not load first. Incremental: each file's verdict is kept in the store's verification cache (hashcache.
    StoreCache, under the user's cache folder) while the file is unchanged, and an accepted file unchanged since
    is neither read, hashed, checked nor parsed again: the artifact it gave is kept beside the verdict, pickled
    (hashcache.PickleCache, under the same stamp). An entry of either whose stamp differs is a file read, verified
    and parsed as the first time. `accepted_ids`: filled with (path relative to `d`, id) of each accepted file,
    where the store is cached (None otherwise)."""
    import os
    import time

    import pydantic_core

    from harness.artifact import parse
    from harness.check import CACHE_FROM, _relative, accepted
    from harness.hashcache import StoreCache, stamp
    from harness.store import read_if_unchanged
    cache = StoreCache("report", d) if len(paths) >= CACHE_FROM else None
    pcache = _parsed_cache(d) if cache is not None else None
    parsed_old = pcache.load() if pcache is not None else {}
    parsed: dict[str, tuple] = {}
    shared: dict = {}  # the sub-objects of the artifacts parsed now, each shared with an equal one (_share)
    arts, unloadable, refused = [], [], []
    now = time.time_ns()  # before any file is stat'd or read (StoreCache.put)
    for p in paths:
        where, st, hit = str(p), None, None
        if cache is not None:
            rel = _relative(p, d)
            try:
                st = stamp(os.lstat(p))
            except OSError:
                pass
            hit = cache.get(rel, st) if st else None
        hit_id = _ok_id(hit)
        if hit_id is not None:
            entry = parsed_old.get(rel)
            if _parsed_entry_ok(entry, st, hit_id):
                arts.append(entry[1])  # type: ignore[index]
                parsed[rel] = entry  # type: ignore[assignment]
                _note(accepted_ids, rel, hit_id)
                continue
            raw = read_if_unchanged(p, st)  # type: ignore[arg-type]
            try:
                a = parse(pydantic_core.from_json(raw, allow_inf_nan=False), where)
                if a.id != hit_id:
                    raise ValueError("not the artifact verified")
            except Exception:  # changed since (None), or not what was verified: loaded and checked below
                pass
            else:
                arts.append(_share(a, shared))
                parsed[rel] = (st, a)
                _note(accepted_ids, rel, hit_id)
                continue
        elif isinstance(hit, list) and len(hit) == 2 and hit[0] in ("load", "refused") and all(
                isinstance(x, str) for x in hit[1]):
            (unloadable if hit[0] == "load" else refused).extend(f"{where}: {x}" for x in hit[1])
            continue
        try:
            a = load_path(p, verify_id=True)
        except UserError as e:
            kind, lines = "load", [str(e)]
            unloadable += lines
        else:
            good, lines = accepted([(a, where)], tree_state=False)
            arts += good
            refused += lines
            kind = "refused" if lines else "ok"
            if good and cache is not None:
                _note(accepted_ids, rel, a.id)
        if st and all(line.startswith(f"{where}: ") for line in lines):
            cache.put(rel, st, ["ok", a.id] if kind == "ok" else [kind, [line[len(where) + 2:] for line in lines]],
                      now)
            if kind == "ok" and rel in cache.new:  # its verdict is kept: so is what it parsed to
                parsed[rel] = (st, _share(a, shared))
    if cache is not None:
        cache.save()
        pcache.save(parsed_old, parsed)  # type: ignore[union-attr]
    elif accepted_ids is not None:
        accepted_ids.append(None)  # an uncached store: its inputs are not known without reading it (_inputs)
    return arts, unloadable + refused


def _note(accepted_ids: list | None, rel: str, aid: str) -> None:
    if accepted_ids is not None:
        accepted_ids.append((rel, aid))


def _artifact_classes() -> tuple[type, ...]:
    from pydantic import BaseModel

    from harness import artifact
    return tuple(v for v in vars(artifact).values()
                 if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == artifact.__name__)


def _parsed_cache(d: Path):
    from harness.artifact import ARTIFACT_TYPES
    from harness.hashcache import PickleCache
    allowed = frozenset((c.__module__, c.__name__) for c in _artifact_classes())
    return PickleCache("report-parsed", d, allowed, options=",".join(sorted(ARTIFACT_TYPES)))


def _parsed_entry_ok(entry: Any, st: list[int] | None, aid: str) -> bool:
    """Whether a parsed-cache entry is (the stamp the verdict was read with, an artifact of a known kind with the
    verdict's id)."""
    from harness.artifact import ARTIFACT_TYPES
    return (isinstance(entry, tuple) and len(entry) == 2 and entry[0] == st
            and type(entry[1]) in ARTIFACT_TYPES.values() and getattr(entry[1], "id", None) == aid)


# Sub-objects of an artifact that many runs share (the same tree, machine, model, engine, settings): an artifact
# parsed from its file has them shared with an equal one parsed in the same call (equal in type and in every
# value), so that the pickled cache holds, and reads back, each once. Frozen models, never written to.
SHARED_FIELDS = ("harness", "host", "model", "engine", "execution", "workload", "residency")


def _share_key(v: Any) -> bytes:
    """Equal pickles are equal objects: the type and every value (a dict's key order too: no sharing there)."""
    import pickle
    return pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)


def _share(a: Any, table: dict) -> Any:
    d = a.__dict__
    for f in SHARED_FIELDS:
        v = d.get(f)
        if v is not None and hasattr(v, "model_dump_json"):
            d[f] = table.setdefault(_share_key(v), v)
    return a


# The speed grids whose builds are set against the machine's ceiling (when they are in the store).



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


def render(store_dirs: list[str] | None = None) -> str:
    """The whole report as one text: the index, then every grid's page."""
    return "".join(build_all(store_dirs)[0].values())


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
    if any(len(rows) > 1 for by_arm in analysis.load_points(section).values() for rows in by_arm.values()):
        names.append(f"{section['slug']}-load.png")
    return names


def build(store_dirs: list[str] | None = None) -> tuple[str, list[dict]]:
    pages, sections, _ = build_all(store_dirs)
    return "".join(pages.values()), sections


Pages = dict[str, str]  # file name (beside the index) -> markdown; the index (INDEX) first


INDEX = "results.md"


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
        specs[name] = views.of_series(name, latest.grid.path, read_yaml)
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
            sec["context"] = _context(sec, series, cal_by_host) if spec.shows("context") else None
            sec["sweep"] = _sweep(sec, series)
            sec["tools"] = _tools(series)
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


PAGE_MARK = "<!-- harness report: a grid's page, rendered from the store; do not edit -->"


def write_pages(out: str, pages: Pages) -> tuple[list[str], list[str]]:
    """The index to `out`, each grid's page beside it, every file replaced whole (never written through a link);
    pages of grids no longer in the store (a file beside it that starts with PAGE_MARK) removed. (written,
    removed)."""
    from harness.paths import replace_file
    folder = Path(out).parent
    written = []
    for name, text in pages.items():
        path = Path(out) if name == INDEX else folder / name
        replace_file(path, text.encode())
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
    return list(out.values())


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
    hostile store's), the index's own name or one taken, grid-<sha256 prefix>.md."""
    import re
    name = f"{grid}.md"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,100}", grid) or name == INDEX or name.lower() in taken:
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


def _cached_inputs(listing: list) -> list | None:
    """What collect would record as the stores' inputs (per store: its path, (file, id) of each accepted file,
    the lines of those left out), read from the verification caches alone: None unless every store is cached
    and every file's verdict is there under the file's current stamp."""
    import os

    from harness.check import CACHE_FROM, _relative
    from harness.hashcache import StoreCache, stamp
    out = []
    for d, paths, left_out in listing:
        if len(paths) < CACHE_FROM:
            return None
        root = Path(d)
        cache = StoreCache("report", root)
        ids, unloadable, refused = [], [], []
        for p in paths:
            try:
                st = stamp(os.lstat(p))
            except OSError:
                return None
            rel = _relative(p, root)
            hit = cache.get(rel, st)
            aid = _ok_id(hit)
            if aid is not None:
                ids.append((rel, aid))
            elif isinstance(hit, list) and len(hit) == 2 and hit[0] in ("load", "refused") and all(
                    isinstance(x, str) for x in hit[1]):
                (unloadable if hit[0] == "load" else refused).extend(f"{p}: {x}" for x in hit[1])
            else:
                return None
        out.append((str(d), ids, left_out + unloadable + refused))
    return out


# What a rendered report may hold besides builtins and the artifact classes (some sections keep an artifact's
# records, e.g. a fidelity grid's prompt set): the numbers some rows keep as numpy scalars.
OUTPUT_CLASSES = frozenset({("numpy", "dtype"), ("numpy._core.multiarray", "scalar"),
                            ("numpy.core.multiarray", "scalar")})


class _Output:
    """The last report rendered from a list of stores with a template, under the user's cache folder (one file
    per list and template), with the key of every input it was rendered from (_output_key). Read back only
    under the same key; a file unreadable, corrupt, of another key or holding anything but builtins, artifact
    records and numpy numbers is ignored (and replaced by the next render)."""

    def __init__(self, store_dirs: list[str], template: str) -> None:
        from harness.hashcache import CACHE_FORMAT, code_version, store_cache_path
        self.store_dirs, self.template = list(store_dirs), template
        real = [str(Path(d).resolve()) for d in store_dirs]
        first = next((r for r in real if Path(r).is_dir()), "")
        self.path = store_cache_path("report-output", Path(first or "."), json.dumps([real, template]))
        self.meta = {"format": CACHE_FORMAT, "code": code_version(), "store": first}

    def key(self, inputs: list) -> str:
        return _output_key(self.store_dirs, self.template, inputs)

    def load(self, inputs: list) -> tuple[Pages, list[dict], dict] | None:
        """The memoized output, where every grid file it read (views.reads) still has the bytes it had."""
        from harness.hashcache import load_pickle
        allowed = OUTPUT_CLASSES | frozenset((c.__module__, c.__name__) for c in _artifact_classes())
        v = load_pickle(self.path, {**self.meta, "key": self.key(inputs)}, allowed)
        ok = isinstance(v, tuple) and len(v) == 4 and isinstance(v[0], dict) and isinstance(v[1], list) \
            and isinstance(v[2], dict) and views.still_valid(v[3])
        return v[:3] if ok else None  # type: ignore[index]

    def save(self, inputs: list, out: tuple[Pages, list[dict], dict], grid_reads: list) -> None:
        from harness.hashcache import save_pickle
        save_pickle(self.path, {**self.meta, "key": self.key(inputs)}, (*out, grid_reads))


def _output_key(store_dirs: list[str], template: str, inputs: list) -> str:
    """Every input of a report: the stores named (in order) and, per store read, each accepted file's path and
    id and each line left out; the template; the harness's source (hashcache.code_version: Python and
    pydantic-core too) and the versions of the libraries it renders with; the bytes of every template and
    hardware class file (the hosts table reads the classes' caps)."""
    import importlib.metadata

    from harness import hardware
    from harness.hashcache import code_version
    h = hashlib.sha256()
    libs = {}
    for lib in ("jinja2", "markupsafe", "numpy", "scipy", "pydantic"):
        try:
            libs[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            libs[lib] = None
    h.update(json.dumps({"code": code_version(), "template": template, "stores": [str(d) for d in store_dirs],
                         "libs": libs}, sort_keys=True).encode())
    for folder, pattern in ((Path(TEMPLATES), "**/*"), (Path(hardware.CLASSES_DIR), "*.yaml")):
        for p in sorted(folder.glob(pattern)):
            if p.is_file():
                h.update(b"\0" + str(p).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    h.update(json.dumps(inputs).encode())
    return h.hexdigest()


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


def _sweep(sec: dict, series: list[RunArtifact]) -> dict | None:
    """A series' rate sweep, worded (analysis.sweep_view computes it)."""
    v = analysis.sweep_view(series, sec["baseline"])
    if v is None:
        return None
    return {"share": f"{v.share:.0%}", "slo": ", ".join(f"{k} <= {x:g} s" for k, x in v.slo.items()),
            "rows": [{"cell": r.cell.replace("batch=1,", ""), "arm": r.arm, "n": len(r.values),
                      "median": _fmt(r.median), "per_pass": ", ".join(_fmt(x) for x in r.values),
                      "ci": f"[{_fmt(r.median_ci[0])}, {_fmt(r.median_ci[1])}]" if r.median_ci else
                      f"(n={len(r.values)}: no 95% interval; 6 passes give one)",
                      "ratio": _ratio_text(r.vs_baseline) if r.vs_baseline else ""} for r in v.rows],
            "rates": [{"cell": r.cell.replace("batch=1,", ""), "point": r.point, "label": r.label,
                       "rate": _fmt(r.median_req_s), "n": r.n} for r in v.rates]}


def _tools(series: list[RunArtifact]) -> list[dict]:
    """The cross-check's two tools' medians side by side (analysis.tool_medians computes them)."""
    rows = []
    for t in analysis.tool_medians(series):
        row = {"cell": t.cell.replace("batch=1,", ""), "arm": t.arm, "client": t.client, "n": t.n}
        for m, _ in analysis.TOOL_MEDIANS:
            row[m] = _fmt(t.ours[m] * 1000) if m in t.ours else ""
            row[m + "_printed"] = _fmt(t.printed[m] * 1000) if m in t.printed else ""
        rows.append(row)
    return rows


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
            out.append({"grid": name, "sha": sha, "hosts": hosts, "rows": rows})
    return out


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), keep_trailing_newline=True,
                              trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                              bytecode_cache=_bytecode_cache())


@lru_cache(maxsize=1)
def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates, outside the checkout (keyed by jinja on each template's source checksum): compiling
    them was 0.3 s of every report. None where the cache folder cannot be made: templates compile each time."""
    from harness.paths import cache_root
    d = cache_root() / "jinja"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(d))


def _class_caps(name: str) -> dict | None:
    """The caps of a hardware class as the hosts tables show them (None where its file is gone)."""
    from harness import hardware
    try:
        hc = hardware.get_class(name)
    except UserError:
        return None
    return {"isa_tier": hc.isa_tier, "cores": str(hc.cores), "memory": f"{hc.memory_gib:g} GiB"}


def hosts_rows(c: Collected) -> list[dict]:
    """One row per host that measured anything in the stores: key, CPU, ISA tier, cores, memory, artifact
    count by kind, first and last date."""
    every = [a for arts in c.runs.values() for a in arts] + [a for arts in c.fidelity.values() for a in arts] + \
        list(c.calibrations) + list(c.references)
    rows = []
    for key, arts in by_key(every).items():
        h = arts[0].host
        total = h.memory.get("total_bytes")
        kinds = defaultdict(int)
        for a in arts:
            kinds[a.kind] += 1
        row = {"isa_tier": h.cpu.get("isa_tier", "unknown"),
               "cores": f"{h.cpu.get('physical_cores')}/{h.cpu.get('logical_cores')}",
               "memory": f"{total / 2**30:.1f} GiB" if isinstance(total, int) else "unknown"}
        if h.emulation:  # an emulated class: its caps, on the machine that emulated it
            row = _class_caps(h.emulation) or row
        rows.append({"key": key, "cpu": h.cpu.get("model", "unknown"), **row,
                     "machine": h.get("machine_key") or key,
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
        if r["emulation"] != "none":
            note = f"class {r['emulation']} emulated on {r['machine']}"
        if r["identity"].startswith("legacy"):
            note = ", ".join(x for x in (note, "legacy record (identity not recorded)") if x)
        lines.append(f"{r['key']:<14} {r['cpu'][:18]:<18} {r['isa_tier']:<12} {r['cores']:<6} {r['memory']:>9} "
                     f"{r['artifacts']:>9}  {r['first']}  {r['last']}  {note}")
    return "\n".join(lines)


# Generated blocks in the README and the docs: each between its own markers, rendered from the store by
# `harness report --readme FILE` and checked with --check. name -> (template, metrics shown); the grids a block
# shows are those whose files name it (`report: {blocks: [...]}`, views.py), in the order of their names.
BLOCKS: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "published": ("readme.md.j2", None),
    "runtime": ("evidence.md.j2", ("startup_s", "decode_tok_s", "prefill_tok_s", "ttft_s", "peak_rss_mib")),
    "definitions": ("definitions.md.j2", ()),
    "hardware": ("hardware.md.j2", ("decode_tok_s", "prefill_tok_s", "ttft_s", "startup_s", "peak_rss_mib")),
    "evidence": ("evidence.md.j2", None),
}
assert set(BLOCKS) == {"published", *views.BLOCKS}  # published: the README's summary, of every grid


def block_markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}:begin: rendered from the store by `harness report --readme`; do not edit -->",
            f"<!-- {name}:end -->")


README_BEGIN, README_END = block_markers("published")


def _short_verdict(v: str) -> str:
    return v.split(":")[0].split(" (")[0] if v else "no verdict"


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
    twins = [(c.definition_of, c.name, c.definition_pairs) for c in map(engine_class, ENGINES) if c.definition_of]
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
    spread = [w for w in warnings if w.startswith("per-pass ratios spread widely")]
    out = [w for w in warnings if w not in spread]
    if spread:
        out.append(f"{len(spread)} comparison(s) with per-pass ratios spread widely (IQR above 0.10): see "
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
