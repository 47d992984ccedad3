"""The shared libraries of an engine installed from wheels, hashed into provenance (OpenVINO, ONNX Runtime GenAI)."""

from __future__ import annotations

import base64
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.errors import UserError


def record_hex(h) -> str | None:
    """A RECORD entry's hash (urlsafe base64 of the digest) as hex."""
    if h is None or h.mode != "sha256":
        return None
    return base64.urlsafe_b64decode(h.value + "=" * (-len(h.value) % 4)).hex()


def libraries(dists: tuple[str, ...], pattern: re.Pattern, engine: str, extra: str, fix: str,
              path: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Each library of these distributions whose name matches: its installed path, size, sha256 (hash cache: read
    once per file version), and the sha256 its wheel's RECORD lists (equal unless the file changed after install).
    `path`: the site-packages of another environment to find them in (default: this one). A missing distribution
    is one line naming the optional extra."""
    from harness.hashcache import HashCache
    cache = HashCache.default()
    out: dict[str, dict[str, Any]] = {}
    try:
        for dist in dists:
            d = next(iter(metadata.distributions(name=dist, path=path)), None) if path else metadata.distribution(dist)
            if d is None:
                raise metadata.PackageNotFoundError(dist)
            for f in d.files or ():
                if not pattern.search(f.name):
                    continue
                p = Path(f.locate())
                digest, rec = cache.sha256(p), record_hex(f.hash)
                out[f.name] = {"dist": dist, "path": str(p), "size": p.stat().st_size, "sha256": digest,
                               "record_sha256": rec, "matches_record": rec == digest}
    except metadata.PackageNotFoundError as e:
        raise UserError(f"engine {engine}", f"{e.name} is not installed (the optional extra `{extra}`)", fix) from None
    finally:
        cache.save()
    return out


def build_block(libs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The libraries as an artifact's engine.build.libraries records them (no local paths)."""
    return {k: {x: v[x] for x in ("dist", "size", "sha256", "record_sha256", "matches_record")}
            for k, v in sorted(libs.items())}
