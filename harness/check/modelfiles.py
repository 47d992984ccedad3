"""A run's recorded model files against this machine's zoo (hashed once per distinct file list per process)."""

from __future__ import annotations

from functools import lru_cache
from typing import Any


def _sha_cache() -> Any:
    from harness.hashcache import HashCache
    return HashCache.default()


def users_model(a: Any) -> bool:
    """A user's model (given by path, or a synthetic shape from a config): another machine may not know it."""
    return isinstance(a.model.source, dict) and ("user_source" in a.model.source or "shape_of" in a.model.source)


def check_model_files(a: Any, where: str) -> list[str]:
    files = comparable(tuple((f.path, f.sha256) for f in a.model.files))
    return [f"{where}: {p}" for p in model_file_problems(a.model.name, files, users_model(a))]


def comparable(files: tuple) -> tuple:
    """The recorded model files this machine's zoo can vouch for: not those of a derived form (harness/models.py
    derived_forms: made on each machine, on demand, by a third-party builder or quantizer, whose bytes are that build's:
    ONNX Runtime GenAI's builder stamped the commit of the checkout its venv lies in into the graph, so two builds
    of one recipe differed in bytes). Their artifacts record the sha256 of the bytes that ran, and the form's
    manifest entry (recipe, graph summary) says how it was made."""
    from harness.models import derived_forms
    return tuple((p, s) for p, s in files if p.split("/", 1)[0] not in derived_forms())


@lru_cache(maxsize=256)
def model_file_problems(name: str, files: tuple[tuple[str, str], ...], user: bool = False) -> tuple[str, ...]:
    """The recorded model files that differ from this machine's, once per distinct file list per process (a
    store of thousands of runs of one model compares its files once, not once per artifact). A user's model
    (given by path) that this machine does not know has nothing local to compare with."""
    from harness import models
    from harness import voices
    if voices.known(name):
        return voices.file_problems(name, files)
    if not models.known(name):
        return () if user else (f"model.name: unknown model {name!r}",)
    try:
        root = models.model_dir(name)
    except Exception:
        return ()
    if not root.exists():
        return ()  # the model is not prepared here: nothing local to compare with
    cache = _sha_cache()
    out = []
    for rel, sha in files:
        p = root / rel  # an absolute path (a fidelity build given as a file) stays as it is
        if p.exists() and cache.sha256(p) != sha:
            out.append(f"model.files[{rel}].sha256: differs from the local file {p}")
    cache.save()
    return tuple(out)
