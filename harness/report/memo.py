"""The rendered report of exactly these inputs (the files' stamps, the templates, the hardware classes), kept
and read back instead of rendered again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


from harness import views
from harness.report.inputs import _artifact_classes
import harness.report.jinja as jinja
from harness.report.pages import Pages


# What a rendered report may hold besides builtins and the artifact classes (some sections keep an artifact's
# records, e.g. a fidelity grid's prompt set): the numbers some rows keep as numpy scalars.
OUTPUT_CLASSES = frozenset({("numpy", "dtype"), ("numpy._core.multiarray", "scalar"),
                            ("numpy.core.multiarray", "scalar")})


class _Output:
    """The last report rendered from a list of stores with a template, under the user's cache folder (one file
    per list and template), with the key of every input it was rendered from (_output_key). Read back only
    under the same key; a file unreadable, corrupt, of another key or holding anything but builtins, artifact
    records and numpy numbers is ignored (and replaced by the next render)."""

    def __init__(self, store_dirs: list[str], template: str) -> None:
        from harness.hashcache import CACHE_FORMAT, code_version, store_cache_path
        self.store_dirs, self.template = list(store_dirs), template
        real = [str(Path(d).resolve()) for d in store_dirs]
        first = next((r for r in real if Path(r).is_dir()), "")
        self.path = store_cache_path("report-output", Path(first or "."), json.dumps([real, template]))
        self.meta = {"format": CACHE_FORMAT, "code": code_version(), "store": first}

    def key(self, inputs: list) -> str:
        return _output_key(self.store_dirs, self.template, inputs)

    def load(self, inputs: list) -> tuple[Pages, list[dict], dict] | None:
        """The memoized output, where every grid file it read (views.reads) still has the bytes it had."""
        from harness.hashcache import load_pickle
        allowed = OUTPUT_CLASSES | frozenset((c.__module__, c.__name__) for c in _artifact_classes())
        v = load_pickle(self.path, {**self.meta, "key": self.key(inputs)}, allowed)
        ok = isinstance(v, tuple) and len(v) == 4 and isinstance(v[0], dict) and isinstance(v[1], list) \
            and isinstance(v[2], dict) and views.still_valid(v[3])
        return v[:3] if ok else None  # type: ignore[index]

    def save(self, inputs: list, out: tuple[Pages, list[dict], dict], grid_reads: list) -> None:
        from harness.hashcache import save_pickle
        save_pickle(self.path, {**self.meta, "key": self.key(inputs)}, (*out, grid_reads))


def _output_key(store_dirs: list[str], template: str, inputs: list) -> str:
    """Every input of a report: the stores named (in order) and, per store read, each accepted file's path and
    id and each line left out; the template; the harness's source (hashcache.code_version: Python and
    pydantic-core too) and the versions of the libraries it renders with; the bytes of every template and
    hardware class file (the hosts table reads the classes' caps)."""
    import importlib.metadata

    from harness import hardware
    from harness.hashcache import code_version
    h = hashlib.sha256()
    libs = {}
    for lib in ("jinja2", "markupsafe", "numpy", "scipy", "pydantic"):
        try:
            libs[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            libs[lib] = None
    h.update(json.dumps({"code": code_version(), "template": template, "stores": [str(d) for d in store_dirs],
                         "libs": libs}, sort_keys=True).encode())
    for folder, pattern in ((Path(jinja.TEMPLATES), "**/*"), (Path(hardware.CLASSES_DIR), "*.yaml")):
        for p in sorted(folder.glob(pattern)):
            if p.is_file():
                h.update(b"\0" + str(p).encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    h.update(json.dumps(inputs).encode())
    return h.hexdigest()
