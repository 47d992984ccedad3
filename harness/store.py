"""The artifact store: artifacts/<grid-name>/<artifact-id>.json, written atomically, never overwritten.

Reading is strict: a file that does not parse or validate is reported, never repaired.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from harness.artifact import RunArtifact, dumps, parse
from harness.errors import UserError
from harness.paths import read_utf8


@dataclass
class Store:
    root: Path

    def grid_dir(self, grid_name: str) -> Path:
        return self.root / grid_name

    def path_for(self, a: RunArtifact) -> Path:
        return self.grid_dir(a.grid.name) / f"{a.id}.json"

    def write(self, a: RunArtifact) -> Path:
        """Atomic: temporary file, fsync, rename. An existing artifact is never overwritten."""
        dest = self.path_for(a)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            return dest  # same id means same content: nothing to do
        data = dumps(a).encode()
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, dest)  # fails rather than overwrite if another writer got there first
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        dfd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return dest

    def iter_paths(self, grid_name: str | None = None) -> Iterator[Path]:
        base = self.grid_dir(grid_name) if grid_name else self.root
        if not base.exists():
            return
        yield from sorted(p for p in base.rglob("*.json") if not p.name.startswith(".tmp-"))

    def load_grid(self, grid_name: str) -> list[RunArtifact]:
        return [load_path(p) for p in self.iter_paths(grid_name)]


def load_path(path: Path) -> RunArtifact:
    text = read_utf8(path, "restore the artifact from git")
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UserError(str(path), f"invalid JSON: {e}", "restore the artifact from git (truncated?)") from e
    from pydantic import ValidationError
    try:
        return parse(doc, str(path))
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"])
        raise UserError(str(path), f"{field}: {err['msg']}", "restore the artifact from git") from e


# ---- reading many artifacts fast: a cache of parsed artifacts, and parsing in parallel when cold ---------

CACHE_NAME = ".parsed.pickle"  # in the store root, git-ignored: derived data, never an artifact
PARALLEL_FROM = 400  # files to parse; below this a process pool costs more than it saves


@lru_cache(maxsize=1)
def _code_key() -> str:
    """The artifact models' source: a cache written by other model code is not read."""
    src = Path(__file__).with_name("artifact.py").read_bytes()
    return hashlib.sha256(src).hexdigest()[:16]


def _parse_chunk(paths: list[str]) -> list[Any]:
    return [load_path(Path(p)) for p in paths]


def load_many(root: Path, paths: list[Path]) -> list[Any]:
    """Parsed artifacts of `paths` (all under the store `root`), in order. A file whose size and mtime match
    the cache (`root/.parsed.pickle`) is taken from it; the others are parsed (in a process pool when many)
    and the cache rewritten. Strictness is unchanged: a file that does not parse raises as load_path does."""
    cache_path = root / CACHE_NAME
    cached: dict[str, tuple[int, int, Any]] = {}
    try:
        with open(cache_path, "rb") as f:
            head, body = pickle.load(f)
        if head == _code_key():
            cached = body
    except (OSError, EOFError, pickle.UnpicklingError, ValueError, TypeError, AttributeError, ImportError):
        pass
    out: list[Any] = [None] * len(paths)
    keys, todo = [], []
    for i, p in enumerate(paths):
        st = p.stat()
        key = str(p.relative_to(root))
        keys.append((key, st.st_size, st.st_mtime_ns))
        hit = cached.get(key)
        if hit is not None and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
            out[i] = hit[2]
        else:
            todo.append(i)
    if todo:
        workers = min(len(os.sched_getaffinity(0)), 8)
        if len(todo) >= PARALLEL_FROM and workers > 1:
            from concurrent.futures import ProcessPoolExecutor
            n = max(1, len(todo) // (workers * 4))
            chunks = [[str(paths[i]) for i in todo[j:j + n]] for j in range(0, len(todo), n)]
            with ProcessPoolExecutor(workers) as pool:
                parsed = [a for chunk in pool.map(_parse_chunk, chunks) for a in chunk]
        else:
            parsed = [load_path(paths[i]) for i in todo]
        for i, a in zip(todo, parsed):
            out[i] = a
    if todo or len(cached) != len(paths):
        body = {k: (size, mtime, a) for (k, size, mtime), a in zip(keys, out)}
        try:
            fd, tmp = tempfile.mkstemp(prefix=".tmp-parsed-", dir=root)
            with os.fdopen(fd, "wb") as f:
                pickle.dump((_code_key(), body), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, cache_path)
        except OSError:
            pass  # a read-only store is read without a cache
    return out
