"""Environments of their own for tools whose pins clash with the project's venv (llm-compressor, ExecuTorch):
made once on demand under the cache, keyed by the Python version and the pins, under a lock; the environment's
`pip freeze` is kept beside it and its sha256 is what a form's recipe or an engine's provenance records."""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

from harness.errors import UserError
from harness.paths import cache_root


# The environments of their own the project makes besides the engines' ("module:function" returning its python and
# freeze sha256); an engine declares its own (`environment` on its class: harness.engines.environments).
# `harness build --environments` (so `make`) makes them all, beside the llama.cpp builds
ENVIRONMENTS = ("harness.quantizers:ensure_env",)


def ensure_all() -> dict[str, dict[str, str]]:
    """Make (or find made) every environment, the engines' and ENVIRONMENTS: by folder name, its python and `pip
    freeze` sha256."""
    import importlib

    from harness.engines import environments
    out = {}
    for target in (*environments(), *ENVIRONMENTS):
        mod, fn = target.split(":")
        py, sha = getattr(importlib.import_module(mod), fn)()
        out[Path(py).parent.parent.name] = {"python": str(py), "freeze_sha256": sha}
    return out


def key(pins: tuple[str, ...], drop: tuple[str, ...] = ()) -> str:
    return hashlib.sha256(json.dumps([sys.version_info[:2], list(pins), *([list(drop)] if drop else [])]).encode()
                          ).hexdigest()[:16]


def env_dir(name: str, pins: tuple[str, ...], drop: tuple[str, ...] = ()) -> Path:
    return cache_root() / "envs" / f"{name}-{key(pins, drop)}"


def made(name: str, pins: tuple[str, ...], drop: tuple[str, ...] = ()) -> bool:
    """Whether the environment is made (its install finished: ensure's stamp)."""
    return (env_dir(name, pins, drop) / ".installed").is_file()


def ensure(name: str, pins: tuple[str, ...], what: str, drop: tuple[str, ...] = ()) -> tuple[Path, str]:
    """The environment's python (made once, under a lock) and the sha256 of its `pip freeze`. `drop`: distributions
    the pins pull that are uninstalled after (part of the environment's key)."""
    d = env_dir(name, pins, drop)
    py, stamp = d / "bin" / "python", d / ".installed"
    d.parent.mkdir(parents=True, exist_ok=True)
    with open(d.parent / f"{d.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            shutil.rmtree(d, ignore_errors=True)
            print(f"[models] making {what}'s environment {d} (minutes, once)", file=sys.stderr)
            log = d.parent / f"{d.name}.log"
            with open(log, "w") as out:
                steps = [[sys.executable, "-m", "venv", str(d)],
                         [str(py), "-m", "pip", "install", "--no-input", "--no-compile", *pins],
                         *([[str(py), "-m", "pip", "uninstall", "-y", *drop]] if drop else [])]
                for cmd in steps:
                    if subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode != 0:
                        shutil.rmtree(d, ignore_errors=True)
                        raise UserError(str(log), f"making {what}'s environment failed at `{' '.join(cmd[:4])}`",
                                        "check network to the package index; the log says more")
            freeze = subprocess.run([str(py), "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                                    check=True).stdout
            (d / "freeze.txt").write_text(freeze)
            stamp.write_text(hashlib.sha256(freeze.encode()).hexdigest())
    return py, stamp.read_text().strip()


def freeze(name: str, pins: tuple[str, ...], drop: tuple[str, ...] = ()) -> dict[str, str]:
    """The made environment's `pip freeze` as {distribution: version} (empty when it is not made)."""
    f = env_dir(name, pins, drop) / "freeze.txt"
    out = {}
    for line in (f.read_text().splitlines() if f.is_file() else []):
        if "==" in line:
            k, v = line.split("==", 1)
            out[k.strip().lower()] = v.strip()
    return out
