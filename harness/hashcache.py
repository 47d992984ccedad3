"""Caches keyed by a file's stat: a sha256 cache for big files, keyed by (path, size, mtime_ns, inode), so a weight
file is hashed once (stored as JSON in the cache root; a file whose key changed is hashed again); and the
verification caches of stores (StoreCache, below).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from harness.paths import cache_root, sha256_file


class HashCache:
    _default: "HashCache | None" = None

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dirty = False
        try:
            self.entries: dict[str, list] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}

    @classmethod
    def default(cls) -> "HashCache":
        if cls._default is None:
            cls._default = cls(cache_root() / "sha256-cache.json")
        return cls._default

    def sha256(self, p: Path) -> str:
        st = p.stat()
        key = str(p.resolve())
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = self.entries.get(key)
        if hit and hit[:3] == stamp:
            return hit[3]
        digest = sha256_file(p)
        self.entries[key] = [*stamp, digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.entries))
        os.replace(tmp, self.path)
        self.dirty = False


# ---- verification caches of stores: what a per-file step found, for files unchanged since ----------------------
#
# A store is untrusted input; its verification cache is not: it lives under the user's cache folder (never in the
# store, where whoever writes the store could plant "verified" entries), one file per store (keyed by the store's
# real path) and purpose, replaced atomically (a temporary file made with O_EXCL, then os.replace, which replaces a
# link in its place instead of writing through it). Its body carries its own sha256: a cache that is unreadable,
# truncated, corrupt, of another harness version or of another store is ignored whole (a full check follows).
#
# A file's entry is reused only while its stamp, (size, mtime_ns, ctime_ns, inode, device) as lstat gives them,
# is the one taken before the file was read: an edit changes mtime and ctime (ctime cannot be set by the file's
# owner), a replacement the inode. The limit: a file rewritten in place within the file system's timestamp
# granularity of the read that verified it, to the same size, would keep its stamp; files changed less than
# RACY_NS before they were read are therefore never cached (as git's racy index entries). Only a clock set back,
# or writes to the block device, defeat that; remove the cache folder for a full check.

RACY_NS = 2_000_000_000
CACHE_FORMAT = 1


def stamp(st: os.stat_result) -> list[int]:
    from harness.store import stamp as store_stamp  # defined with the store's reads (store never imports this)
    return store_stamp(st)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """What the cached results were computed by: every source file of the harness, pydantic-core, Python."""
    import sys

    import pydantic_core
    h = hashlib.sha256(f"{sys.version}|{pydantic_core.__version__}".encode())
    root = Path(__file__).resolve().parent
    for p in sorted(root.rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def store_cache_path(purpose: str, store: Path, options: str = "") -> Path:
    key = hashlib.sha256(f"{Path(store).resolve()}\0{options}".encode()).hexdigest()[:32]
    return cache_root() / "verified" / f"{purpose}-{key}.cache"


class StoreCache:
    """One store's cache for one purpose: relative path -> (stamp, value); value is JSON (orjson)."""

    def __init__(self, purpose: str, store: Path, options: str = "") -> None:
        self.real = str(Path(store).resolve())
        self.meta = {"format": CACHE_FORMAT, "code": code_version(), "store": self.real, "options": options}
        self.path = store_cache_path(purpose, store, options)
        self.old = self._read()
        self.new: dict[str, list] = {}

    def _read(self) -> dict[str, list]:
        import orjson
        try:
            from harness.store import read_bytes
            head, _, body = read_bytes(self.path, limit=4 << 30).partition(b"\n")
            meta = json.loads(head)
            if meta != {**self.meta, "sha256": hashlib.sha256(body).hexdigest()}:
                return {}
            entries = orjson.loads(body)
            return entries if isinstance(entries, dict) else {}
        except Exception:  # missing, unreadable, a link, corrupt: nothing is trusted, everything is verified
            return {}

    def get(self, rel: str, st: list[int]) -> Any:
        hit = self.old.get(rel)
        if isinstance(hit, list) and len(hit) == 2 and hit[0] == st:
            self.new[rel] = hit
            return hit[1]
        return None

    def put(self, rel: str, st: list[int], value: Any, read_at_ns: int) -> None:
        """Record what verifying the file found; not when it changed less than RACY_NS before it was read."""
        if read_at_ns - max(st[1], st[2]) >= RACY_NS:
            self.new[rel] = [st, value]

    def save(self) -> None:
        """Write the entries of this run (those of files gone are dropped); nothing when nothing changed. A cache
        folder that cannot be written leaves the next run a full check, never an error."""
        if self.new == self.old:
            return
        import orjson
        import tempfile
        body = orjson.dumps(self.new)
        head = json.dumps({**self.meta, "sha256": hashlib.sha256(body).hexdigest()}).encode()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(head + b"\n" + body)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
            _prune(self.path.parent)
        except OSError:
            pass


def _prune(folder: Path) -> None:
    """Remove the caches of stores that are gone (a test's temporary store): each names its store in its head."""
    for p in folder.glob("*.cache"):
        try:
            with open(p, "rb") as f:
                store = json.loads(f.readline(1 << 16)).get("store")
            if isinstance(store, str) and not os.path.isdir(store):
                p.unlink()
        except (OSError, ValueError, AttributeError):
            continue
