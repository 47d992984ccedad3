"""What the report reads: the stores' artifacts that `harness check` accepts, parsed once and kept in each
store's verification cache (a file whose stamp is unchanged is not parsed again), with their shared records
shared in memory."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from harness.artifact import RunArtifact
from harness.errors import UserError
from harness.store import Store, load_path


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
            elif a.kind in ("fidelity", "audio-fidelity"):
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

    from harness.check import CACHE_FROM, _relative, accepted
    from harness.hashcache import StoreCache, stamp
    cache = StoreCache("report", d) if len(paths) >= CACHE_FROM else None
    check_verdict = _check_verdicts(d)  # a file check found clean is parsed without checking it again
    pcache = _parsed_cache(d) if cache is not None else None
    parsed_old = pcache.load() if pcache is not None else {}
    parsed: dict[str, tuple] = {}
    shared: dict = {}  # the sub-objects of the artifacts parsed now, each shared with an equal one (artifact.parse)
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
            kept = _unchanged(p, rel, st, hit_id, parsed_old, parsed, shared)
            if kept is not None:
                arts.append(kept)
                _note(accepted_ids, rel, hit_id)
                continue
        elif isinstance(hit, list) and len(hit) == 2 and hit[0] in ("load", "refused") and all(
                isinstance(x, str) for x in hit[1]):
            (unloadable if hit[0] == "load" else refused).extend(f"{where}: {x}" for x in hit[1])
            continue
        elif cache is not None and st and (aid := _checked_id(check_verdict(rel, st))) is not None:
            kept = _unchanged(p, rel, st, aid, parsed_old, parsed, shared)
            if kept is not None:
                arts.append(kept)
                _note(accepted_ids, rel, aid)
                cache.put(rel, st, ["ok", aid], now)  # type: ignore[union-attr]
                continue
        try:
            a = load_path(p, verify_id=True, shared=shared)
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
                parsed[rel] = (st, a)
    if cache is not None:
        cache.save()
        pcache.save(parsed_old, parsed)  # type: ignore[union-attr]
    elif accepted_ids is not None:
        accepted_ids.append(None)  # an uncached store: its inputs are not known without reading it (_inputs)
    return arts, unloadable + refused


def _check_verdicts(d: Path) -> Any:
    """`harness check`'s cached verdicts of store d (read only), read at the first file the report's own cache
    misses: a file check found clean but for its tree state is what check.accepted accepts, its id verified."""
    cache: list = []

    def get(rel: str, st: Any) -> Any:
        if not cache:
            from harness.check import cache_options
            from harness.hashcache import StoreCache
            cache.append(StoreCache("check", d, cache_options(False)))
        return cache[0].get(rel, st)
    return get


TREE_STATE = ("harness.commit: ", "harness.dirty: ")  # check's lines on the tree state, which the report does not gate


def _checked_id(verdict: Any) -> str | None:
    """The id of a file `harness check` verified (its cached verdict: [problems, record]) and found clean but for
    its tree state; None otherwise."""
    if not (isinstance(verdict, list) and len(verdict) == 2 and isinstance(verdict[0], list)
            and isinstance(verdict[1], dict)):
        return None
    aid = verdict[1].get("id")
    clean = all(isinstance(x, str) and x.startswith(TREE_STATE) for x in verdict[0])
    return aid if clean and isinstance(aid, str) else None


def _unchanged(p: Path, rel: str, st: Any, hit_id: str, parsed_old: dict, parsed: dict, shared: dict) -> Any:
    """The artifact of a file accepted before and unchanged since (its verdict's stamp): what it parsed to, kept
    (parsed_old), or the file parsed again, unchecked, when it still is the artifact verified; None when it is
    not (changed since, or another artifact): the caller loads and checks it as the first time. What it parsed
    to goes into `parsed` under `rel`."""
    import pydantic_core

    from harness.artifact import parse
    from harness.store import read_if_unchanged
    entry = parsed_old.get(rel)
    if _parsed_entry_ok(entry, st, hit_id):
        parsed[rel] = entry
        return entry[1]  # type: ignore[index]
    raw = read_if_unchanged(p, st)
    try:
        a = parse(pydantic_core.from_json(raw, allow_inf_nan=False), str(p), shared)
        if a.id != hit_id:
            raise ValueError("not the artifact verified")
    except Exception:  # changed since (None), or not what was verified: loaded and checked below
        return None
    parsed[rel] = (st, a)
    return a


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
