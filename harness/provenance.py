"""Provenance collected automatically for every run: harness tree, host, model, environment.

Never typed by a user. Engine-specific parts (build, effective config) come from the engines.
"""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from pathlib import Path

from harness import __version__
from harness.paths import PROJECT_ROOT

ENV_PREFIXES = ("OMP_", "VLLM_", "GGML_", "KMP_", "MKL_", "OPENBLAS_", "TORCH", "LD_PRELOAD", "CUDA_VISIBLE")


def harness_info(root: Path = PROJECT_ROOT) -> dict:
    """Version, git commit and dirty flag of the harness tree (artifacts/ changes do not count as dirty)."""
    try:
        import git
        repo = git.Repo(root)
        try:
            commit = repo.head.commit.hexsha
        except ValueError:
            commit = "unknown"
        # The store itself changes while a grid runs; only code and inputs make a tree dirty.
        status = repo.git.status("--porcelain", "--untracked-files=normal", "--", ".", ":!artifacts", ":!baselines",
                                 ":!reports")
        dirty_files = [line[3:] for line in status.splitlines() if line.strip()]
        return {"version": __version__, "commit": commit, "dirty": bool(dirty_files), "dirty_files": dirty_files[:20]}
    except Exception as e:  # no git, or not a repository: say so rather than guess
        return {"version": __version__, "commit": "unknown", "dirty": True, "dirty_files": [], "git_error": str(e)[:200]}


@lru_cache(maxsize=1)
def _host_static() -> dict:
    from harness.probe import probe
    return probe()


def host_info() -> dict:
    """The probe's host profile; memory availability and load are read fresh each call."""
    from harness.probe import loadavg, meminfo
    host = dict(_host_static())
    host["memory"] = meminfo()
    host["loadavg"] = loadavg()
    return host


def relevant_env(env: dict[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def numa_policy() -> str:
    try:
        r = subprocess.run(["numactl", "--show"], capture_output=True, text=True, timeout=5)
        for line in r.stdout.splitlines():
            if line.startswith("policy:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "default (numactl not installed)"


def loadavg_now() -> list[float] | str:
    from harness.probe import loadavg
    return loadavg()
