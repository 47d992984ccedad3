"""Provenance collected automatically for every run: harness tree, host, model, environment.

Never typed by a user. Engine-specific parts (build, effective config) come from the engines.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import time
from functools import lru_cache
from pathlib import Path

from harness import __version__
from harness.paths import PROJECT_ROOT

# ATEN_/ONEDNN_/DNNL_: torch's ISA switches change every kernel; EDGE_HARNESS_HW_PROFILE changes what `auto` derives
# Environment that changes what any engine computes (threading runtimes, BLAS, preloads); each engine adds its own
# prefixes (Engine.env_prefixes: VLLM_, GGML_, ...), so relevant_env records the union. PYTHONDONTWRITEBYTECODE changes
# what a Python engine's start costs (each process compiles every module it imports from source).
ENV_PREFIXES = ("OMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_PRELOAD", "CUDA_VISIBLE", "DNNL_", "EDGE_HARNESS_HW_PROFILE",
                "PYTHONDONTWRITEBYTECODE")


NOT_A_CHECKOUT = "unknown (not a git checkout)"


def harness_info(root: Path = PROJECT_ROOT) -> dict:
    """Version, git commit and dirty flag of the harness tree (artifacts/ changes do not count as dirty).

    Outside a git checkout (an sdist or tarball install) the commit is NOT_A_CHECKOUT and dirty is
    null: unknown, not guessed. `harness check` accepts such artifacts only with --allow-unknown-commit.
    """
    try:
        import git
        repo = git.Repo(root)
    except Exception:  # gitpython or git missing, or not a repository
        return {"version": __version__, "commit": NOT_A_CHECKOUT, "dirty": None, "dirty_files": []}
    try:
        commit = repo.head.commit.hexsha
    except ValueError:
        commit = "unknown (no commit yet)"
    try:
        # The store itself changes while a grid runs; only code and inputs make a tree dirty (the README's
        # published block is rendered from the store too).
        status = repo.git.status("--porcelain", "--untracked-files=normal", "--", ".", ":!artifacts", ":!baselines",
                                 ":!reports", ":!README.md")
    except Exception:  # the git binary is missing or failed: the tree's state is unknown
        return {"version": __version__, "commit": commit, "dirty": None, "dirty_files": []}
    dirty_files = [line[3:] for line in status.splitlines() if line.strip()]
    return {"version": __version__, "commit": commit, "dirty": bool(dirty_files), "dirty_files": dirty_files[:20]}


@lru_cache(maxsize=1)
def host_static() -> dict:
    """The probe's profile of this machine, probed once per process."""
    from harness.probe import probe
    return probe()


def host_info() -> dict:
    """The probe's host profile with its key; memory availability and load are read fresh each call."""
    from harness.probe import loadavg, meminfo
    host = dict(host_static())
    host["memory"] = meminfo()
    host["loadavg"] = loadavg()
    return host


def relevant_env(env: dict[str, str] | None = None) -> dict[str, str]:
    from harness.engines import env_prefixes
    env = os.environ if env is None else env
    prefixes = ENV_PREFIXES + env_prefixes()
    return {k: v for k, v in sorted(env.items()) if k.startswith(prefixes)}


def numa_policy() -> str:
    try:
        r = subprocess.run(["numactl", "--show"], capture_output=True, text=True, timeout=5)
        for line in r.stdout.splitlines():
            if line.startswith("policy:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "default (numactl not installed)"


def current_host_key() -> str:
    """The key of the machine this process runs on (probe.host_key)."""
    return host_static()["key"]


def host_key_as(emulation: str | None) -> str:
    """This machine's key when it emulates a hardware class (None: native)."""
    from harness.probe import host_key
    return host_key({**host_static(), "emulation": emulation})


def loadavg_now() -> list[float] | str:
    from harness.probe import loadavg
    return loadavg()


def machine_cpu_seconds() -> list[float] | None:
    """The whole machine's CPU seconds since boot by state, /proc/stat's first line: user, nice, system, idle,
    iowait, irq, softirq, steal (0 for a field the kernel does not give); None where it is unreadable."""
    hz = os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return [v / hz for v in vals] + [0.0] * (8 - len(vals)) if len(vals) >= 4 else None


def cpu_accounting() -> dict:
    """Busy CPU seconds of the whole machine (/proc/stat) and of this process and its waited-for children."""
    import resource
    busy = steal = None
    vals = machine_cpu_seconds()
    if vals is not None:
        busy = sum(vals) - vals[3] - vals[4]  # user..steal less idle and iowait; guest time is already inside user
        steal = vals[7]
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"machine_busy_s": busy, "steal_s": steal,
            "own_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime}


def other_load(before: dict, after: dict, duration_s: float) -> dict:
    """CPU used during a run by everything except the harness and the engine it ran, in cores.

    The load average lags by a minute and counts the previous run's engine; this does not.
    """
    if before["machine_busy_s"] is None or after["machine_busy_s"] is None or duration_s <= 0:
        return {"status": "unknown", "reason": "/proc/stat unreadable"}
    machine = after["machine_busy_s"] - before["machine_busy_s"]
    own = after["own_s"] - before["own_s"]
    out = {"status": "ok", "other_cores": round(max(0.0, machine - own) / duration_s, 3),
           "machine_busy_s": round(machine, 3), "harness_and_engine_s": round(own, 3),
           "definition": "(machine busy CPU seconds - CPU seconds of the harness and its finished children) / run wall time"}
    if before.get("steal_s") is not None and after.get("steal_s") is not None:
        # On a virtual machine the hypervisor gives this guest's CPUs to other guests ("steal"): part of
        # other_cores, and no process here; it appears when every vCPU is busy (docs/methodology.md)
        out["steal_cores"] = round((after["steal_s"] - before["steal_s"]) / duration_s, 3)
    return out


def now_utc() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Span:
    """Provenance around one measured span: the host before and after it, the CPU other processes used
    during it, and its UTC timing. Every artifact kind records its host and timing through one of these."""

    def __init__(self) -> None:
        self.host_before = host_info()
        self.cpu0 = cpu_accounting()
        self.start, self.t0 = now_utc(), time.time()

    def finish(self) -> tuple[dict, dict]:
        """(host block, timing block)."""
        end, dur = now_utc(), time.time() - self.t0
        other = other_load(self.cpu0, cpu_accounting(), dur)
        host = {**self.host_before, "loadavg_before": self.host_before["loadavg"], "loadavg_after": loadavg_now(),
                "other_load_during_run": other}
        host.pop("loadavg", None)
        return host, {"start": self.start, "end": end, "duration_s": round(dur, 6)}
