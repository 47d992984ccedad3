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


def read_utf8(path: Path, fix_encoding: str) -> str:
    """A user's input file as text; unreadable or non-UTF-8 is a one-line UserError naming it."""
    from harness.errors import UserError
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(str(path), f"unreadable: {e.strerror}", "check the path") from e
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(str(path), f"not UTF-8 at byte {e.start}", fix_encoding) from e


def sha256_file(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()
