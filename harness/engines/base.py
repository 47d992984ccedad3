"""What every engine shares: the run context, the result, and running one process under watch.

A process runs with a timeout and a peak-memory poller; its stderr tail is kept for failures.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.grid import Arm, GridSpec
from harness.residency import PeakMemory
from harness.schedule import RunSpec


@dataclass
class RunContext:
    spec: GridSpec
    run: RunSpec
    arm: Arm
    threads: int
    cpus: list[int]
    workdir: Path
    timeout_s: float
    store_root: Path | None = None  # the store the run writes to: lookups of other artifacts read it, per host
    observe: bool = True  # False (arm observe: bare): no memory poller during the run, no residency scans

    @property
    def poll_s(self) -> float | None:
        return 0.5 if self.observe else None

    @property
    def params(self) -> dict[str, Any]:
        return self.run.cell.params


@dataclass
class EngineResult:
    status: str  # ok | failed | timeout
    metrics: dict[str, dict]
    engine: dict[str, Any]
    requested: dict[str, Any]
    effective: dict[str, Any]
    command: list[str]
    env: dict[str, str]
    peak_memory: dict[str, Any]
    after_load: dict[str, Any]
    prompt_token_hash: str
    compile_cache: dict[str, Any] = field(default_factory=lambda: {"key": "n/a", "state": "n/a (no compile cache)"})
    eager: bool | None = None
    error: str | None = None
    stderr_tail: str | None = None


class ModelEngine:
    """An engine that runs a model form: which forms it takes, and the default."""

    name = ""
    default_form = ""
    form_prefix = ""
    form_hint = ""

    def check(self, model: str, form: str | None) -> str:
        form = form or self.default_form
        if not form.startswith(self.form_prefix):
            from harness.errors import UserError
            raise UserError("arm.form", f"{self.name} needs a {self.form_prefix}* form, got {form!r}", self.form_hint)
        return form


@dataclass
class ProcResult:
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    peak_memory: dict
    wall_s: float


def affinity_prefix(cpus: list[int] | None, numa: int | None) -> list[str]:
    """taskset / numactl in front of a command, where asked for and present."""
    pre: list[str] = []
    if numa is not None:
        if not shutil.which("numactl"):
            from harness.errors import UserError
            raise UserError("numa", "numactl is not installed", "apt-get install numactl, or drop the arm's numa option")
        pre += ["numactl", f"--cpunodebind={numa}", f"--membind={numa}"]
    elif cpus and shutil.which("taskset"):
        pre += ["taskset", "-c", ",".join(str(c) for c in cpus)]
    return pre


def run_process(cmd: list[str], env: dict[str, str], timeout_s: float, cwd: Path | None = None,
                poll_s: float | None = 0.5) -> ProcResult:
    """Run one process (its own session, so a timeout kills the whole tree), watching peak memory."""
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                            start_new_session=True, text=True, errors="replace")
    timed_out = False
    with (PeakMemory(proc.pid, poll_s) if poll_s else _NotObserved()) as pm:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        except BaseException:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return ProcResult(proc.returncode, out, err, timed_out, pm.result(), time.time() - t0)


class _NotObserved:
    """Stands in for PeakMemory when a run is not observed: no thread, no /proc reads."""

    def __enter__(self) -> "_NotObserved":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def result(self) -> dict:
        return {"status": "not observed (arm observe: bare)"}


def tail(text: str, n: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def failed(status: str, error: str, cmd: list[str], env: dict, stderr: str = "", engine: dict | None = None,
           requested: dict | None = None, peak: dict | None = None) -> EngineResult:
    return EngineResult(status=status, metrics={}, engine=engine or {}, requested=requested or {}, effective={},
                        command=cmd, env=env, peak_memory=peak or {"status": "unknown"},
                        after_load={"status": "unknown", "reason": "run did not complete"},
                        prompt_token_hash="n/a (run did not complete)", error=error, stderr_tail=tail(stderr) or None)
