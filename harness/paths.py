"""Where the heavy caches live: outside the checkout, keyed by content hash.

EDGE_HARNESS_CACHE overrides the root (default ~/.cache/edge-harness).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    env = os.environ.get("EDGE_HARNESS_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "edge-harness"


def downloads_dir() -> Path:
    return cache_root() / "dl"


def llamacpp_root() -> Path:
    return cache_root() / "llama.cpp"


def models_root() -> Path:
    return cache_root() / "models"


def sha256_file(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()
