"""The artifact store: artifacts/<grid-name>/<artifact-id>.json, written atomically, never overwritten.

Reading is strict: a file that does not parse or validate is reported, never repaired.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

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
        yield from sorted((p for p in base.rglob("*.json") if not p.name.startswith(".tmp-")), key=os.fspath)

    def load_grid(self, grid_name: str) -> list[RunArtifact]:
        with gc_paused():
            return [load_path(p) for p in self.iter_paths(grid_name)]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while many artifacts are read. Parsed artifacts are trees
    (no reference cycles), but each allocates hundreds of containers, and every 700 allocations the
    collector rescans the young objects: over 10,000 artifacts that was 60% of the reading time (make bench).
    Reference counting still frees everything; the collector resumes, as it was, on exit."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def load_path(path: Path) -> RunArtifact:
    import pydantic_core
    try:  # the fast parser; anything it refuses is read again below, for the standard library's error
        doc = pydantic_core.from_json(path.read_bytes(), allow_inf_nan=False)
    except (OSError, ValueError):
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

