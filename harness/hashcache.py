"""A sha256 cache for big files, keyed by (path, size, mtime_ns, inode): a weight file is hashed once.

Stored as JSON in the cache root; a file whose key changed is hashed again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

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
