"""`harness check`: every artifact valid, its provenance complete, its id matching its content, and its figures
consistent with each other (settings with the engine's read-back, samples with the workload and the run's
timing, the cell with its parameters, the CPUs with the host).

One line per problem, `path: field: reason`. Reads only; never changes a file. The command (this module: the
files under the paths given, their caches, a process pool for large stores) stands on its rules:

    accepted.py     what check accepts of one artifact, and a store filtered to it: the layer other modules
                    read artifacts through (imports nothing of this module)
    content.py      required provenance, host key, tree state, emulation evidence, settings read back
    consistency.py  figures of one artifact that contradict each other
    modelfiles.py   recorded model files against this machine's zoo
    gridfiles.py    the grid's sha256 against its file in the commit that ran it
    references.py   rules across artifacts: fidelity references, rate sweeps
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Iterable

from harness.artifact import loads
from harness.check.accepted import accepted, check_doc, doc_problems, load_accepted, problems_of
from harness.check.consistency import instant
from harness.check.content import REQUIRED, read_back_problems
from harness.check.gridfiles import derived_record, grid_problems, grid_record
from harness.check.modelfiles import comparable, model_file_problems, users_model
from harness.check.references import (ref_summary, reference_mismatch, reference_problems, sweep_problems,
                                      sweep_record)
from harness.errors import UserError
from harness.rules import MEMORY_TOLERANCE, cell_id, run_key
from harness.store import gc_paused

# what other modules and tests read from `harness.check` (the rules' own modules hold them)
__all__ = ["CACHE_FROM", "MEMORY_TOLERANCE", "PARALLEL_FROM", "REQUIRED", "accepted", "cache_options", "cell_id",
           "check", "check_doc", "comparable", "instant", "iter_artifact_paths", "load_accepted", "problems_of",
           "read_back_problems", "reference_mismatch", "run_key"]


def iter_artifact_paths(paths: Iterable[str]) -> tuple[list[Path], list[str]]:
    """The artifact files to check under the given files and store folders (harness.store.walk: links are never
    followed, FIFOs and devices never opened), and one problem line per entry that is not a plain file."""
    sources, problems = _artifact_paths(paths)
    return [Path(f) for f, _ in sources], problems


def _artifact_paths(paths: Iterable[str]) -> tuple[list[tuple[str, Path | None]], list[str]]:
    """iter_artifact_paths, each file (as str of its Path) with the store folder it was found under (None: named
    itself)."""
    from harness.store import walk_names
    files: list[tuple[str, Path | None]] = []
    problems = []
    for p in map(Path, paths):
        if p.is_symlink():
            problems.append(f"{p}: (file): is a symlink; artifacts are plain files")
        elif p.is_dir():
            found, odd = walk_names(p)
            files += [(f, p) for f in found]
            problems += [f"{q}: (file): {why}" for q, why in odd]
        elif p.is_file():
            files.append((str(p), None))
        elif p.exists():
            problems.append(f"{p}: (file): not a regular file (a FIFO, device or socket)")
        else:
            raise UserError(str(p), "no such file or directory", "pass artifact files or store directories")
    return files, problems


def _check_file(f: Path, allow_unknown_commit: bool, shared: dict | None = None) -> tuple[list[str], dict | None]:
    """One file's problems but its model files', and what the checks across files need of it (its record: id,
    kind, model files, the summary of a reference or fidelity artifact), JSON, as the verification cache keeps it.
    Read through harness.store.read_bytes: a regular file, not a link, bounded in size and nesting. `shared`: the
    blocks validated before in this process (artifact.parse)."""
    from harness.store import MAX_DEPTH, read_bytes, too_deep
    where = str(f)
    try:
        raw = read_bytes(f)
    except UserError as e:
        return [f"{where}: (file): {e.problem}"], None
    if not raw.strip():
        return [f"{where}: (file): empty file"], None
    if too_deep(raw):
        return [f"{where}: (file): JSON nested more than {MAX_DEPTH} deep"], None
    try:
        doc, finite = loads(raw)
    except UnicodeDecodeError as e:
        return [f"{where}: (file): not UTF-8 at byte {e.start}"], None
    except json.JSONDecodeError as e:
        return [f"{where}: (file): invalid JSON ({e.msg} at line {e.lineno}); truncated?"], None
    except (ValueError, RecursionError) as e:
        return [f"{where}: (file): invalid JSON ({e})"], None
    problems, a = doc_problems(doc, where, allow_unknown_commit, finite, shared)
    if not isinstance(doc, dict):
        return problems, None
    rec: dict[str, Any] = {"id": doc.get("id")}
    if a is not None and getattr(a, "grid", None) is not None and getattr(a, "harness", None) is not None:
        rec["grid"] = grid_record(a)
        if getattr(a.grid, "derived_from", None) is not None:
            rec["grid_from"] = derived_record(a)
    if getattr(a, "model", None) is not None and a.model.files:
        rec["model"] = [a.model.name, [[m.path, m.sha256] for m in a.model.files], users_model(a)]
    kind = doc.get("kind")
    if kind == "reference" and isinstance(doc.get("id"), str):
        rec["reference"] = ref_summary(a) if a is not None else None
    if kind == "run" and a is not None and a.workload.load and "sweep" in a.workload.load:
        if isinstance(a.workload.load["sweep"], dict):
            rec["sweep"] = sweep_record(a)
        else:
            problems.append(f"{where}: workload.load.sweep: must be a mapping (a rate sweep point's record), got "
                            f"{type(a.workload.load['sweep']).__name__}")
    if kind == "fidelity" and isinstance(doc.get("reference"), dict):
        rec["fidelity"] = {"rid": doc["reference"].get("id"), "parsed": None if a is None else {
            "reference": a.reference, "prompt_set": a.prompt_set.model_dump(mode="json"),
            "engine": None if a.cross_engine else {"build_commit": a.engine.build_commit, "build": a.engine.build}}}
    return problems, rec


def _check_chunk(args: tuple[list[str], bool]) -> list[tuple[list[str], dict | None]]:
    files, allow = args
    with gc_paused():
        shared: dict = {}  # many files share their tree, host, model, engine and settings: validated once
        return [_check_file(Path(f), allow, shared) for f in files]


PARALLEL_FROM = 400  # artifacts; below this a process pool costs more than it saves
CACHE_FROM = 400  # artifacts in a store folder; a smaller one is checked whole each time, uncached


def check(paths: Iterable[str], verify_models: bool = True, allow_unknown_commit: bool = False) -> tuple[int, list[str]]:
    """(number of artifacts checked, problems). Incremental: what checking a file of a store folder found is kept
    in the store's verification cache (harness.hashcache.StoreCache: under the user's cache folder, never in the
    store) and reused while the file is unchanged (its size, mtime, ctime, inode and device); the rest is checked
    on every CPU this process may use. The checks across files (duplicate ids, fidelity references) run over
    every file's record, and the model files are compared afresh, each time: the result is the same as without
    the cache."""
    with gc_paused():  # the cache's entries and the records: many small containers, no cycles
        return _check(paths, verify_models, allow_unknown_commit)


def _check(paths: Iterable[str], verify_models: bool, allow_unknown_commit: bool) -> tuple[int, list[str]]:
    from collections import Counter

    from harness.hashcache import StoreCache, stamp
    sources, problems = _artifact_paths(paths)
    model_file_problems.cache_clear()  # model files are compared afresh by every check
    caches = {root: StoreCache("check", root, cache_options(allow_unknown_commit))
              for root, n in Counter(r for _, r in sources).items() if root is not None and n >= CACHE_FROM}
    prefixes = {root: os.path.join(str(root), "") for root in caches}
    now = time.time_ns()  # before any file is stat'd or read (StoreCache.put)
    results: list[Any] = []
    todo: list[tuple[int, Any, str, list[int]]] = []  # (index, cache, relative path, stamp)
    for where, root in sources:
        cache, hit = caches.get(root), None  # type: ignore[arg-type]
        if cache is not None:
            prefix = prefixes[root]
            rel = where[len(prefix):] if where.startswith(prefix) else os.path.relpath(where, root)
            try:
                st = os.lstat(where)
            except OSError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):  # gone, or replaced since the walk: checked, not kept
                cache = None
            else:
                hit = cache.get(rel, stamp(st))
        if isinstance(hit, list) and len(hit) == 2:
            results.append(([f"{where}: {line}" for line in hit[0]] if hit[0] else [], hit[1]))
        else:
            todo.append((len(results), cache, rel if cache else "", stamp(st) if cache else []))
            results.append(None)
    checked = _check_files([sources[i][0] for i, *_ in todo], allow_unknown_commit)
    for (i, cache, rel, st), r in zip(todo, checked):
        results[i] = r
        where = f"{sources[i][0]}: "
        if cache is not None and all(line.startswith(where) for line in r[0]):
            cache.put(rel, st, [[line[len(where):] for line in r[0]], r[1]], now)
    for cache in caches.values():
        cache.save()
    seen: dict[str, str] = {}
    fidelity_recs: list[tuple[str, dict]] = []
    references: dict[str, dict | None] = {}
    grids: list[tuple[str, list[str]]] = []
    for (where, _), (probs, rec) in zip(sources, results):
        problems += probs
        if rec is None:
            continue
        for key in ("grid", "grid_from"):
            if rec.get(key):
                grids.append((where, rec[key]))
        if verify_models and "model" in rec:
            name, mfiles, user = rec["model"]
            files = comparable(tuple(map(tuple, mfiles)))
            problems += [f"{where}: {p}" for p in model_file_problems(name, files, user)]
        if "fidelity" in rec:
            fidelity_recs.append((where, rec["fidelity"]))
        if "reference" in rec:
            references[rec["id"]] = rec["reference"]
        aid = rec["id"]
        if isinstance(aid, str):
            if aid in seen and Path(seen[aid]).resolve() != Path(where).resolve():
                problems.append(f"{where}: id: duplicate of {seen[aid]}")
            seen.setdefault(aid, where)
    problems += reference_problems(fidelity_recs, references)
    problems += grid_problems(grids)
    problems += sweep_problems([(where, rec["sweep"]) for (where, _), (_, rec) in zip(sources, results)
                               if rec is not None and isinstance(rec.get("sweep"), dict)])
    return len(sources), problems


def cache_options(allow_unknown_commit: bool) -> str:
    """What besides the store keys check's verification cache: the options that change a file's problems."""
    return f"allow_unknown_commit={allow_unknown_commit}"


def _relative(f: Path, root: Path) -> str:
    s, prefix = str(f), os.path.join(str(root), "")
    return s[len(prefix):] if s.startswith(prefix) else os.path.relpath(s, root)


def _check_files(files: list[str], allow_unknown_commit: bool) -> list[tuple[list[str], dict | None]]:
    """_check_file of each, on every CPU this process may use when there are many."""
    workers = min(len(os.sched_getaffinity(0)), 8)
    if len(files) < PARALLEL_FROM or workers < 2:
        return _check_chunk((files, allow_unknown_commit))
    from concurrent.futures import ProcessPoolExecutor
    n = max(1, len(files) // (workers * 4))
    chunks = [(files[i:i + n], allow_unknown_commit) for i in range(0, len(files), n)]
    with ProcessPoolExecutor(workers) as pool:
        return [r for chunk in pool.map(_check_chunk, chunks) for r in chunk]
