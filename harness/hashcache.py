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


# ---- parsed-object caches of stores: what reading a file gave, for files unchanged since -----------------------
#
# The same rules as StoreCache (under the user's cache folder, one set of files per store and purpose, its body's
# sha256 in its head, of this code version only, replaced atomically), the body a pickle: unpickled only after its
# sha256 matched, and then by an unpickler that builds no object of a class outside `allowed` ((module, name)
# pairs of modules already imported): a cache planted or damaged is ignored, never run. Sharded by a hash of the
# entry's key, so that one file changed in a large store rewrites one shard, not the whole cache.

PICKLE_SHARDS = 32


class _Unpickler:
    """pickle.Unpickler that resolves only the (module, name) pairs it is given."""

    def __new__(cls, data: bytes, allowed: frozenset):
        import io
        import pickle
        import sys

        class Restricted(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                if (module, name) not in allowed or module not in sys.modules:
                    raise pickle.UnpicklingError(f"{module}.{name}: not a class this cache may hold")
                return getattr(sys.modules[module], name)
        return Restricted(io.BytesIO(data))


def shard_of(key: str) -> int:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()[0] % PICKLE_SHARDS


def load_pickle(path: Path, meta: dict, allowed: frozenset) -> Any:
    """The value of a pickle cache file whose head is `meta` with its body's sha256, unpickled resolving only the
    `allowed` classes; None where the file is missing, unreadable, corrupt, of other meta, or not allowed."""
    try:
        from harness.store import read_bytes
        head, _, body = read_bytes(path, limit=4 << 30).partition(b"\n")
        if json.loads(head) != {**meta, "sha256": hashlib.sha256(body).hexdigest()}:
            return None
        return _Unpickler(body, allowed).load()
    except Exception:  # missing, unreadable, a link, corrupt, a class not allowed: nothing is trusted
        return None


def save_pickle(path: Path, meta: dict, value: Any) -> None:
    """Write a pickle cache file (head: `meta` and the body's sha256) atomically; a cache folder that cannot be
    written, or a value that cannot be pickled, is no error (the next run computes again)."""
    import pickle
    import tempfile
    try:
        body = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        head = json.dumps({**meta, "sha256": hashlib.sha256(body).hexdigest()}).encode()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(head + b"\n" + body)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        pass


class PickleCache:
    """One store's parsed-object cache for one purpose: key -> value (picklable), in PICKLE_SHARDS files. `load`
    gives the entries of every intact shard (a shard unreadable, corrupt, of another code version, or holding a
    class outside `allowed`, gives none: its files are read again); `save` rewrites the shards whose entries
    changed."""

    def __init__(self, purpose: str, store: Path, allowed: frozenset, options: str = "") -> None:
        self.real = str(Path(store).resolve())
        self.meta = {"format": CACHE_FORMAT, "code": code_version(), "store": self.real, "options": options}
        self.base = store_cache_path(purpose, store, options)
        self.allowed = allowed

    def _path(self, shard: int) -> Path:
        return self.base.with_name(f"{self.base.stem}-{shard:02d}.cache")

    def load(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for shard in range(PICKLE_SHARDS):
            entries = load_pickle(self._path(shard), {**self.meta, "shard": shard}, self.allowed)
            if isinstance(entries, dict) and all(isinstance(k, str) and shard_of(k) == shard for k in entries):
                out.update(entries)
        return out

    def save(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """Write the shards whose entries differ from `old` (what load gave): by identity of their values, so a
        value read from the cache is never pickled again; nothing when nothing changed. A cache folder that
        cannot be written leaves the next run to read the files again, never an error."""
        changed = {shard_of(k) for k in old.keys() ^ new.keys()}
        changed |= {shard_of(k) for k, v in new.items() if k in old and old[k] is not v}
        shards: dict[int, dict[str, Any]] = {s: {} for s in changed}
        for k, v in new.items():
            s = shard_of(k)
            if s in shards:
                shards[s][k] = v
        for shard, entries in sorted(shards.items()):
            save_pickle(self._path(shard), {**self.meta, "shard": shard}, entries)
