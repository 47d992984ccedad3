"""A parquet index of the store for queries with pandas: one row per artifact and metric.

Artifacts are content-addressed and never change, so the index is stale exactly when the set
of artifact files differs from the fingerprint stored in its metadata; it is then rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import statistics
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from harness.store import Store, gc_paused, load_path

INDEX_NAME = ".index.parquet"
FINGERPRINT_KEY = b"edge_harness_fingerprint"

SCHEMA = pa.schema([
    ("id", pa.string()), ("path", pa.string()), ("grid", pa.string()), ("grid_sha256", pa.string()), ("host_key", pa.string()),
    ("cell", pa.string()), ("arm", pa.string()), ("pass_index", pa.int32()), ("position", pa.int32()),
    ("order", pa.string()), ("status", pa.string()), ("engine", pa.string()), ("engine_version", pa.string()),
    ("build_commit", pa.string()), ("model", pa.string()), ("form", pa.string()), ("dtype", pa.string()),
    ("threads", pa.int32()), ("prompt_len", pa.int32()), ("context_len", pa.int32()), ("gen_len", pa.int32()),
    ("batch", pa.int32()), ("metric", pa.string()), ("unit", pa.string()), ("median", pa.float64()),
    ("n_samples", pa.int32()), ("start", pa.string()), ("end", pa.string()), ("harness_commit", pa.string()),
    ("dirty", pa.bool_()), ("load_before", pa.float64()),
])


def fingerprint(paths: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(str(p.relative_to(root)).encode() + b"\n")
    return h.hexdigest()


def index_path(root: Path) -> Path:
    return root / INDEX_NAME


def is_stale(root: Path) -> bool:
    ip = index_path(root)
    if not ip.exists():
        return True
    meta = pq.read_schema(ip).metadata or {}
    paths = list(Store(root).iter_paths())
    return meta.get(FINGERPRINT_KEY, b"").decode() != fingerprint(paths, root)


def build(root: str | Path) -> Path:
    root = Path(root)
    paths = list(Store(root).iter_paths())
    rows: dict[str, list] = {f.name: [] for f in SCHEMA}
    with gc_paused():
        arts = [load_path(p) for p in paths]
    for p, a in zip(paths, arts):
        if a.kind != "run":  # references and fidelity results have no metrics to index
            continue
        w = a.workload
        lb = a.host.get("loadavg_before")
        base = {"id": a.id, "path": str(p.relative_to(root)), "grid": a.grid.name, "grid_sha256": a.grid.sha256, "host_key": a.host.key,
                "cell": a.grid.cell, "arm": a.grid.arm, "pass_index": a.grid.pass_index, "position": a.grid.position,
                "order": a.grid.order, "status": a.status, "engine": a.engine.name, "engine_version": a.engine.version,
                "build_commit": a.engine.build_commit, "model": a.model.name, "form": a.model.form,
                "dtype": a.model.dtype, "threads": a.execution.threads, "prompt_len": w.prompt_len,
                "context_len": w.context_len, "gen_len": w.gen_len, "batch": w.batch, "start": a.timing.start,
                "end": a.timing.end, "harness_commit": a.harness.commit, "dirty": a.harness.dirty,
                "load_before": float(lb[0]) if isinstance(lb, list) and lb else None}
        metrics = list(a.metrics.items()) or [(None, None)]
        for name, m in metrics:
            row = {**base, "metric": name, "unit": m.unit if m else None,
                   "median": statistics.median(m.samples) if m and m.samples else None,
                   "n_samples": len(m.samples) if m else 0}
            for k in rows:
                rows[k].append(row[k])
    table = pa.table(rows, schema=SCHEMA.with_metadata({FINGERPRINT_KEY: fingerprint(paths, root).encode()}))
    ip = index_path(root)
    tmp = ip.with_name(f".index.tmp{os.getpid()}.parquet")
    tmp.unlink(missing_ok=True)  # a link planted under this name is removed, never written through
    pq.write_table(table, tmp)
    os.replace(tmp, ip)
    return ip


def load(root: str | Path):
    """The index as a pandas DataFrame, rebuilt first when stale."""
    root = Path(root)
    if is_stale(root):
        build(root)
    return pq.read_table(index_path(root)).to_pandas()
