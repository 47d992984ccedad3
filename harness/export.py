"""`harness export`: the store's runs in the formats other tools read (docs/harness.md, "Exports").

- csv, jsonl, parquet: one row per run and metric (a failed run: one row, no metric), with the provenance
  columns people filter on (COLUMNS). jsonl and parquet keep each run's raw samples as a list; csv as JSON text.
- llama-bench-json, llama-bench-sql: the rows llama-bench prints with `-o json` / `-o sql` (its field names and types,
  a `llama_bench` table), one prompt-processing and one token-generation row per run, for the engines whose package
  maps their runs onto that schema (Yardsticks.llama_bench_rows), so llama.cpp's scripts/compare-llama-bench.py reads
  them. One engine per export: llama-bench's figures and the request loop's are not one definition.
- pyperf: pyperf's JSON suite (one benchmark per arm, cell and metric; a run per artifact, its repetitions as
  values and its warm-ups as warm-ups), so `pyperf stats` and `pyperf compare_to` read it. pyperf knows seconds,
  bytes and integers: a throughput (tok/s) is exported as its reciprocal, seconds per token, and the benchmark's
  name says so.

Only what `harness check` accepts is exported (the report's door, report.collect); every value is the one recorded.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from pathlib import Path
from typing import Any, Iterable

from harness.engines import weight_files
from harness.engines.capabilities import Yardsticks, capability
from harness.errors import UserError
from harness.untrusted import write_file

DEFAULT_STORES = ["artifacts", "baselines"]
FORMATS = ("csv", "jsonl", "parquet", "llama-bench-json", "llama-bench-sql", "pyperf")
COLUMNS = ("id", "grid", "grid_sha256", "grid_path", "series", "host_key", "machine_key", "emulation", "cpu_model",
           "isa_tier", "cell", "arm", "baseline_arm", "pass_index", "position", "order", "status", "error",
           "engine", "engine_version", "build_commit", "build_id", "model", "form", "dtype", "weights_sha256",
           "threads", "prompt_len", "context_len", "gen_len", "batch",
           "load_concurrency", "load_rate", "load_arrival", "load_burstiness", "load_requests", "sent_rate_req_s",
           "slo",
           "metric", "unit", "higher_is_better", "definition", "n_samples", "median", "mean", "stdev", "min", "max",
           "samples", "warmup_samples", "start", "end", "harness_commit", "dirty", "loadavg_before")


def collect(store_dirs: list[str] | None, err=None):
    """The stores (default artifacts and baselines) through the report's door (report.collect: what check accepts);
    each file left out named on `err`. A store that is not a folder is one line."""
    from harness import report
    dirs = store_dirs or DEFAULT_STORES
    for d in dirs:
        if not Path(d).is_dir():
            raise UserError(d, "not a store directory", "pass --store with a folder that holds <grid>/<id>.json")
    c = report.collect(dirs)
    if err is not None:
        for line in c.left_out:
            print(f"left out (harness check refuses it): {line}", file=err)
    return c


def series_id(a) -> str:
    """A run's series: its grid, the machine that measured it and the grid's version (sha256 prefix), as `harness
    compare` names a side (GRID@HOST#SHA)."""
    from harness.analysis import machine_key
    return f"{a.grid.name}@{machine_key(a)}#{a.grid.sha256[:12]}"


def select(store_dirs: list[str] | None, grids: list[str] | None = None, hosts: list[str] | None = None,
           engines: list[str] | None = None, arms: list[str] | None = None, err=None,
           all_series: bool = False) -> list:
    """The run artifacts of the stores that check accepts, filtered: by default the newest series of each grid on
    each machine (the report's), with `all_series` every series; what it leaves out is named on `err`."""
    from harness.analysis import newest_by_grid_and_host
    dirs = store_dirs or DEFAULT_STORES
    c = collect(dirs, err)
    chosen = c.runs if all_series else {
        g: [a for (name, _), series in newest_by_grid_and_host(c.runs).items() if name == g for a in series]
        for g in c.runs}
    runs = [a for g, arts in chosen.items() if not grids or g in grids for a in arts]
    runs = [a for a in runs if (not hosts or a.host.key in hosts) and (not engines or a.engine.name in engines)
            and (not arms or a.grid.arm in arms)]
    runs.sort(key=lambda a: (a.grid.name, a.host.key, a.grid.pass_index, a.grid.position, a.id))
    if not runs:
        what = ", ".join(f"{k} {', '.join(v)}" for k, v in (("grid", grids), ("host", hosts), ("engine", engines),
                                                            ("arm", arms)) if v)
        raise UserError(", ".join(dirs), f"no run artifact{' of ' + what if what else ''}",
                        "harness hosts --store DIR lists what a store holds; loosen the filters")
    return runs


def _weights(a) -> str:
    return ",".join(sorted(f.sha256 for f in weight_files(a.model) or []))


def rows(runs: Iterable) -> list[dict[str, Any]]:
    """One row per run and metric; a run without metrics (failed) is one row with metric None."""
    from harness import analysis
    out = []
    for a in runs:
        w, lb = a.workload, a.host.get("loadavg_before")
        load = w.load if isinstance(w.load, dict) else {}
        sent = [x.get("rate_req_s") for x in a.execution.effective.get("achieved") or [] if isinstance(x, dict)]
        sent = [x for x in sent if isinstance(x, (int, float)) and not isinstance(x, bool)]
        base = {"id": a.id, "grid": a.grid.name, "grid_sha256": a.grid.sha256, "grid_path": a.grid.path,
                "series": series_id(a),
                "load_concurrency": load.get("concurrency"), "load_rate": load.get("rate"),
                "load_arrival": load.get("arrival"), "load_burstiness": load.get("burstiness"),
                "load_requests": load.get("requests"), "sent_rate_req_s": statistics.median(sent) if sent else None,
                "slo": json.dumps(w.slo, sort_keys=True) if w.slo else None,
                "host_key": a.host.key, "machine_key": a.host.get("machine_key") or a.host.key,
                "emulation": a.host.emulation, "cpu_model": a.host.cpu.get("model"),
                "isa_tier": a.host.cpu.get("isa_tier"), "cell": a.grid.cell, "arm": a.grid.arm,
                "baseline_arm": a.grid.baseline_arm, "pass_index": a.grid.pass_index, "position": a.grid.position,
                "order": a.grid.order, "status": a.status, "error": a.error, "engine": a.engine.name,
                "engine_version": a.engine.version, "build_commit": a.engine.build_commit,
                "build_id": analysis.build_id(a.engine), "model": a.model.name, "form": a.model.form,
                "dtype": a.model.dtype, "weights_sha256": _weights(a), "threads": a.execution.threads,
                "prompt_len": w.prompt_len, "context_len": w.context_len, "gen_len": w.gen_len, "batch": w.batch,
                "start": a.timing.start, "end": a.timing.end, "harness_commit": a.harness.commit,
                "dirty": a.harness.dirty,
                "loadavg_before": float(lb[0]) if isinstance(lb, list) and lb else None}
        for name, m in sorted(a.metrics.items()) or [(None, None)]:
            s = list(m.samples) if m else []
            out.append({**base, "metric": name, "unit": m.unit if m else None,
                        "higher_is_better": m.higher_is_better if m else None,
                        "definition": m.definition if m else None, "n_samples": len(s),
                        "median": statistics.median(s) if s else None, "mean": statistics.fmean(s) if s else None,
                        "stdev": statistics.stdev(s) if len(s) > 1 else None, "min": min(s) if s else None,
                        "max": max(s) if s else None, "samples": s,
                        "warmup_samples": list(m.warmup_samples) if m else []})
    return out


# ---- llama-bench ---------------------------------------------------------------------------------------------

# llama-bench's fields and their SQL types (tools/llama-bench/llama-bench.cpp, test::get_fields and
# get_field_type, at the pinned llama.cpp); samples_ns and samples_ts follow in its JSON output only.
LLAMA_BENCH_FIELDS = (
    ("build_commit", "TEXT"), ("build_number", "INTEGER"), ("cpu_info", "TEXT"), ("gpu_info", "TEXT"),
    ("backends", "TEXT"), ("model_filename", "TEXT"), ("model_type", "TEXT"), ("model_size", "INTEGER"),
    ("model_n_params", "INTEGER"), ("n_batch", "INTEGER"), ("n_ubatch", "INTEGER"), ("n_threads", "INTEGER"),
    ("cpu_mask", "TEXT"), ("cpu_strict", "INTEGER"), ("poll", "INTEGER"), ("type_k", "TEXT"), ("type_v", "TEXT"),
    ("n_gpu_layers", "INTEGER"), ("n_cpu_moe", "INTEGER"), ("split_mode", "TEXT"), ("main_gpu", "INTEGER"),
    ("no_kv_offload", "INTEGER"), ("flash_attn", "INTEGER"), ("devices", "TEXT"), ("tensor_split", "TEXT"),
    ("tensor_buft_overrides", "TEXT"), ("load_mode", "TEXT"), ("lazy_mode", "TEXT"), ("embeddings", "INTEGER"),
    ("no_op_offload", "INTEGER"), ("no_host", "INTEGER"), ("repack", "INTEGER"), ("fit_target", "INTEGER"),
    ("fit_min_ctx", "INTEGER"), ("n_prompt", "INTEGER"), ("n_gen", "INTEGER"), ("n_depth", "INTEGER"),
    ("test_time", "TEXT"), ("avg_ns", "INTEGER"), ("stddev_ns", "INTEGER"), ("avg_ts", "REAL"), ("stddev_ts", "REAL"),
)


def llama_bench_rows(runs: list) -> list[dict[str, Any]]:
    from harness.engines import get_engine
    engines = sorted({a.engine.name for a in runs})
    if len(engines) > 1:
        raise UserError("--format llama-bench-json", f"the runs are of engines {', '.join(engines)}, whose figures have "
                        "different definitions", "export one engine at a time (--engine NAME)")
    eng = get_engine(engines[0])
    out = []
    for a in runs:
        if a.status != "ok":
            continue  # llama-bench prints no row for a test that did not run
        got = capability(eng, Yardsticks).llama_bench_rows(a)
        if got is None:
            raise UserError("--format llama-bench-json", f"engine {engines[0]} has no mapping onto llama-bench's rows",
                            "use --format csv, jsonl, parquet or pyperf for its runs")
        for r in got:
            missing = [f for f, _ in LLAMA_BENCH_FIELDS if f not in r]
            assert not missing, missing  # the engine's mapping gives every field
            out.append({**{f: r[f] for f, _ in LLAMA_BENCH_FIELDS}, "samples_ns": r["samples_ns"],
                        "samples_ts": r["samples_ts"]})
    return out


def _sql_value(v: Any) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, (int, float)):
        return repr(v)
    return "'" + str(v).replace("'", "''") + "'"


def llama_bench_sql(rs: list[dict[str, Any]]) -> str:
    """llama-bench's `-o sql`: CREATE TABLE IF NOT EXISTS llama_bench, then one INSERT per row."""
    cols = [f for f, _ in LLAMA_BENCH_FIELDS]
    lines = ["CREATE TABLE IF NOT EXISTS llama_bench ("]
    lines += [f"  {f} {t}{',' if i < len(cols) - 1 else ''}" for i, (f, t) in enumerate(LLAMA_BENCH_FIELDS)]
    lines += [");", ""]
    for r in rs:
        lines.append(f"INSERT INTO llama_bench ({', '.join(cols)}) VALUES "
                     f"({', '.join(_sql_value(r[c]) for c in cols)});")
    return "\n".join(lines) + "\n"


# ---- pyperf -----------------------------------------------------------------------------------------------------

def _pyperf_values(unit: str, xs: list[float]) -> tuple[str, list[float], str]:
    """(pyperf unit, values, what the values are): seconds as they are; tok/s as seconds per token."""
    if unit == "s":
        return "second", list(xs), ""
    if unit == "tok/s":
        return "second", [1.0 / x for x in xs], " (seconds per token: 1 / tok/s)"
    raise KeyError(unit)


def _line(text: str) -> str:
    """A store's string as pyperf metadata takes it: one line (control characters as `?`), no outer spaces."""
    from harness.report import printable
    return printable(text).strip()


def pyperf_suite(runs: list, one_arm: bool) -> dict[str, Any]:
    """pyperf's JSON (format version 1.0): a benchmark per (series, arm, cell, metric, definition): pyperf holds a
    benchmark's runs to one host and CPU, and a benchmark never mixes two definitions of its metric (a second one
    is named by its hash). The arm leaves the name when every run is of one arm (--arm), so that `pyperf
    compare_to a.json b.json` matches two arms' files by name."""
    import hashlib
    benches: dict[str, dict[str, Any]] = {}
    defs: dict[str, set] = {}
    for a in runs:
        for name, m in a.metrics.items():
            defs.setdefault(" ".join([series_id(a), a.grid.arm, a.grid.cell, name]), set()).add(m.definition)
    for a in runs:
        if a.status != "ok":
            continue
        for name, m in sorted(a.metrics.items()):
            try:
                unit, values, what = _pyperf_values(m.unit, m.samples)
                _, warm, _ = _pyperf_values(m.unit, m.warmup_samples)
            except KeyError:
                continue  # a unit pyperf cannot hold (MiB peaks, shares): left to csv/jsonl
            if not values or any(not (v > 0) for v in values + warm):
                continue  # pyperf holds only values > 0
            several = len(defs[" ".join([series_id(a), a.grid.arm, a.grid.cell, name])]) > 1
            tag = [f"def-{hashlib.sha256(m.definition.encode()).hexdigest()[:8]}"] if several else []
            bname = _line(" ".join([series_id(a), *([] if one_arm else [a.grid.arm]), a.grid.cell, name, *tag]) + what)
            b = benches.setdefault(bname, {"metadata": {"name": bname, "unit": unit,
                                                        "description": _line(m.definition)[:500] or "-"},
                                           "runs": []})
            meta = {"date": a.timing.start, "duration": a.timing.duration_s, "hostname": a.host.key,
                    "cpu_model_name": a.host.cpu.get("model") or "unknown", "edge_harness_id": a.id,
                    "engine": a.engine.name, "engine_version": a.engine.version, "model": a.model.name,
                    "form": a.model.form, "threads": a.execution.threads, "pass_index": a.grid.pass_index,
                    "loops": 1}
            meta = {k: _line(v) if isinstance(v, str) else v for k, v in meta.items()}
            run = {"metadata": {k: v for k, v in meta.items() if v not in (None, "")}, "values": values}
            if warm:
                run["warmups"] = [[1, v] for v in warm]
            b["runs"].append(run)
    if not benches:
        raise UserError("--format pyperf", "no run has a metric in seconds or tok/s", "use --format csv or jsonl")
    return {"version": "1.0", "benchmarks": [benches[k] for k in sorted(benches)]}


# ---- writing ----------------------------------------------------------------------------------------------------

def render(fmt: str, runs: list, one_arm: bool = False) -> bytes:
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in rows(runs):
            w.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in r.items()})
        return buf.getvalue().encode()
    if fmt == "jsonl":
        return "".join(json.dumps(r, sort_keys=False) + "\n" for r in rows(runs)).encode()
    if fmt == "parquet":
        import pandas as pd
        buf = io.BytesIO()
        df = pd.DataFrame(rows(runs), columns=list(COLUMNS))
        for col in ("start", "end"):  # typed: timestamps, not strings
            df[col] = pd.to_datetime(df[col], utc=True, format="ISO8601")
        df.to_parquet(buf, index=False)
        return buf.getvalue()
    if fmt == "llama-bench-json":
        return (json.dumps(llama_bench_rows(runs), indent=2) + "\n").encode()
    if fmt == "llama-bench-sql":
        return llama_bench_sql(llama_bench_rows(runs)).encode()
    if fmt == "pyperf":
        return (json.dumps(pyperf_suite(runs, one_arm)) + "\n").encode()
    raise UserError("--format", f"unknown format {fmt!r}", f"one of {', '.join(FORMATS)}")


def write(out: str | None, data: bytes, stdout=None) -> None:
    """To `out` (replaced whole: a temp file beside it renamed over it, so a link there is replaced, never written
    through) or to stdout."""
    if out in (None, "-"):
        (stdout.buffer if hasattr(stdout, "buffer") else stdout).write(data)
        return
    p = Path(out)
    if p.is_dir():
        raise UserError(out, "is a directory", "give --out a file name")
    if not p.parent.is_dir():
        raise UserError(out, "its folder does not exist", f"create {p.parent} first")
    write_file(p, data, f"harness export --out {out}")
