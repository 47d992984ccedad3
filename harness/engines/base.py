"""The engine contract, and what every engine shares: the run context, the result, running one process.

An engine is one module with one class implementing `Engine` and one line in harness/engines/__init__.py:
its options as a pydantic model (validated when the grid loads, so `harness plan` refuses a bad option),
the workload fields it honours (a grid asking for one it cannot honour is refused at plan), the metrics it
emits (names with one definition across engines: harness/metrics.py), `run` for speed and, for model
engines, `generate` for fidelity. Every run reports each declared setting as requested and as read back
from the engine (`settings`); `harness check` fails a run whose effective value differs.

A process (run_process) runs contained (harness/lifecycle.py: it and everything it starts are killed when it
ends), with a timeout and a peak-memory poller. Its end is its exit, not the closing of its output (a child
left holding stdout cannot stretch a run). Its output is read while it runs, never more of it in memory than
a bound: stdout whole up to the caller's limit (16 MiB; reading a longer one raises OutputTooLarge) or only its
tail where the caller does not parse it, stderr's last 64 KiB (kept for failures).
"""

from __future__ import annotations

import fcntl
import json
import locale
import os
import select
import shlex
import shutil
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.engines.capabilities import Fidelity, Limits, Packages, Sizing, capability, has
from harness.errors import UserError, require_engines
from harness.lifecycle import popen
from harness.residency import PeakMemory

if TYPE_CHECKING:
    from harness.grid import Arm, GridSpec
    from harness.schedule import RunSpec


@dataclass
class RunContext:
    spec: "GridSpec"
    run: "RunSpec"
    arm: "Arm"
    threads: int
    cpus: list[int]
    workdir: Path
    timeout_s: float
    store_root: Path | None = None  # the store the run writes to: lookups of other artifacts read it, per host
    observe: bool = True  # False (arm observe: bare): no memory poller during the run, no residency scans
    # hardware emulation (harness/emulate.py): environment for the engine, the ISA the `auto` rules read (the
    # emulated class's; None: this machine's), and the llama.cpp build variant capped at the class's tier
    env: dict[str, str] = field(default_factory=dict)
    isa: dict[str, bool] | None = None
    isa_variant: str | None = None
    profile: dict[str, Any] | None = None  # the hardware profile derivations read (the class's when emulated)

    @property
    def poll_s(self) -> float | None:
        return 0.5 if self.observe else None

    @property
    def params(self) -> dict[str, Any]:
        return self.run.cell.params

    @property
    def model(self) -> str:
        """The model this run loads: the cell's model axis value, else the grid's model."""
        return self.run.cell.params.get("model") or self.spec.model


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
    # setting -> {"requested": x, "effective": y, "source": where y was read}; see Engine.settings
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    attribution: dict[str, Any] | None = None  # per-part decode step times (metrics.attribution), where timed
    serving: dict[str, Any] | None = None  # a server engine's per-request records (harness/serving.py)


class Options(BaseModel):
    """An engine's options: unknown keys and ill-typed values are refused when the grid loads."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    threads: int | None = None


# The settings every run reports as requested and effective (read back from the engine); an engine that
# cannot read one back names it in `observe_only`, and the artifact says so.
SETTINGS = ("threads", "cpus", "dtype", "context_len", "batch", "warmups", "kv_cache_memory_bytes")


class Engine(ABC):
    """The core engine contract: every engine has these, and nothing else is asked of all of them. What only some
    engines do is a capability (harness/engines/capabilities.py) an engine declares by inheriting it, and the
    pipeline reaches through `capability(engine, Cap)`."""

    name: ClassVar[str] = ""
    default_form: ClassVar[str] = ""
    form_prefix: ClassVar[str] = ""
    Options: ClassVar[type[BaseModel]] = Options
    metrics: ClassVar[tuple[str, ...]] = ()
    observe_only: ClassVar[frozenset[str]] = frozenset()  # settings it cannot read back (recorded, not enforced)
    needs_model: ClassVar[bool] = True  # False: runs without a model (no model block, no residency)
    # environment variables (by prefix) that change what the engine computes: recorded in every artifact's provenance
    env_prefixes: ClassVar[tuple[str, ...]] = ()

    def check(self, model: str, form: str | None, profile: dict[str, Any] | None = None) -> str:
        """The form a run loads. `auto` (engines whose Sizing has auto_form): the form the engine's dtype rule picks
        for the hardware profile (derive_dtype), on this machine or the emulated class."""
        form = form or self.default_form
        sizing = capability(self, Sizing)
        if form == "auto" and sizing.auto_form:
            if profile is None:
                return form  # resolved per run, when the profile is known
            form = sizing.form_for(profile)[0]
        if not form.startswith(self.form_prefix):
            raise UserError("arm.form", f"{self.name} needs a {self.form_prefix}* form, got {form!r}",
                            capability(self, Limits).form_hint)
        return form

    def provision(self, isa_variant: str | None = None, rebuild: bool = False) -> dict[str, Any] | None:
        """Build or check what the engine runs (cached; before anything is measured). `isa_variant`: the build
        capped at an emulated class's ISA tier, where the engine has one. Returns its build record, if any."""
        return None

    def options(self, arm: "Arm") -> BaseModel:
        """The arm's options, typed (after `validate`, never fails)."""
        return self.Options(**arm.options)

    def validate(self, path: str, arm: "Arm", workload: dict[str, tuple[str, set]], warmups: int) -> None:
        """Refuse, before anything runs, an option this engine does not know or an ill-typed one, and a
        workload this engine cannot honour (its Limits). `workload`: field -> (where the grid sets it, the values
        it takes). Errors name `arms[NAME].options.KEY` or the workload field."""
        try:
            opts = self.Options(**arm.options)
        except ValidationError as e:
            err = e.errors()[0]
            key = str(err["loc"][0]) if err["loc"] else "options"  # a union's member names are not the user's
            known = ", ".join(sorted(self.Options.model_fields))
            fix = f"known {self.name} options: {known}" if err["type"] == "extra_forbidden" else \
                f"{err['msg']} (known {self.name} options: {known})"
            if err["type"] == "extra_forbidden" and len(err["loc"]) > 1:  # a field unknown inside an option's mapping
                key = ".".join(map(str, err["loc"]))
                fix = f"{err['loc'][-1]!s} is not a field of {err['loc'][0]!s} (docs/harness.md, Engine options)"
            problem = "unknown option" if err["type"] == "extra_forbidden" else f"invalid value {err.get('input')!r}"
            raise UserError(path, f"arms[{arm.name}].options.{key}: {problem}", fix) from None
        if has(type(self), Packages):  # a client-only install has none of them: one line naming the extra
            require_engines(path, f"arms[{arm.name}].engine: {self.name}",
                            capability(self, Packages).needed(opts))
        limits = capability(self, Limits)
        where, batches = workload.get("batch", ("workload.batch", {1}))
        big = max(batches)
        if limits.max_batch is not None and big > limits.max_batch:
            raise UserError(path, f"{where}: {big} concurrent requests asked of arm {arm.name!r}, but "
                                  f"{self.name} runs at most {limits.max_batch}",
                            "use an engine with concurrency (vllm, llama.cpp) or batch: 1")
        if limits.warmup_values is not None and warmups not in limits.warmup_values:
            raise UserError(path, f"warmups: {warmups} asked of arm {arm.name!r}, but {self.name} can do "
                                  f"{' or '.join(map(str, limits.warmup_values))}",
                            f"set warmups to {limits.warmup_values[-1]} or use another engine")
        limits.validate_options(path, arm, opts, workload)

    def prepare_arm(self, spec: Any, arm: "Arm") -> None:
        """What an arm needs made before anything is measured (a user's build of the engine): called by every
        executor on the machine that measures, before its first run."""

    @abstractmethod
    def engine_info(self) -> dict[str, Any]:
        ...

    @abstractmethod
    def run(self, ctx: RunContext, form: str) -> EngineResult:
        ...


class OneRequestEngine(Engine, Limits, Fidelity):
    """An engine that loads a fixed list of forms and runs one request at a time whose prompt and output must fit
    context_len (openvino, onnxruntime-genai): the form and the context refused at plan, the package checked when a
    run starts. A subclass gives refuse_form (the one-line error) and require (the pinned package's version)."""

    def refuse_form(self, where: str, form: str) -> None:
        raise NotImplementedError

    def require(self) -> str:
        raise NotImplementedError

    def check(self, model: str, form: str | None, profile: dict[str, Any] | None = None) -> str:
        form = form or self.default_form
        self.refuse_form(f"model {model}", form)
        self.require()
        return form

    def validate_options(self, path: str, arm: "Arm", opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        if arm.form is not None:
            self.refuse_form(f"{path}: arms[{arm.name}].form", arm.form)
        where, forms = workload.get("form", ("axes.form", set()))  # given where the grid passes its form axis
        for f in sorted(forms):
            self.refuse_form(f"{path}: {where} (arm {arm.name})", f)
        sizes = {k: workload.get(k, (f"workload.{k}", set())) for k in ("prompt_len", "gen_len", "context_len")}
        if all(len(v[1]) == 1 for v in sizes.values()):  # several values: checked per run (their cells differ)
            (p,), (g,), (c,) = (v[1] for v in sizes.values())
            if p + g > c:
                raise UserError(path, f"{sizes['context_len'][0]}: {c} for arm {arm.name!r}, but prompt_len {p} + "
                                      f"gen_len {g} = {p + g} tokens do not fit in it",
                                "raise context_len or shorten the request")

    def fidelity_dtype(self, form: str | None, options: dict) -> str | None:
        if form is not None:  # a zoo form the library cannot load is refused before its build runs
            self.refuse_form(f"fidelity build form {form!r}", form)
        return None  # the form's own types


def setting(requested: Any, effective: Any, source: str) -> dict[str, Any]:
    """One row of EngineResult.settings."""
    return {"requested": requested, "effective": effective, "source": source}


def process_affinity(pid: int) -> list[int] | None:
    """The CPUs a live process may run on, read from the kernel."""
    try:
        return sorted(os.sched_getaffinity(pid))
    except OSError:
        return None


STDOUT_LIMIT = 16 << 20  # the most stdout run_process reads back whole for a caller that parses it
TAIL_BYTES = 64 << 10  # what is kept of stderr (and of stdout where the caller does not parse it): the last bytes


class OutputTooLarge(RuntimeError):
    """A process wrote more to stdout than its caller reads back (run_process's stdout_limit)."""


class ProcResult:
    """One process's outcome. `stdout`: whole, or (run_process with stdout_limit=None) its last TAIL_BYTES;
    reading it raises OutputTooLarge where it was longer than the limit. `stderr`: its last TAIL_BYTES.
    `*_bytes`: how much the process wrote."""

    def __init__(self, returncode: int | None, stdout: str, stderr: str, timed_out: bool, peak_memory: dict,
                 wall_s: float, affinity: list[int] | None = None, stdout_bytes: int | None = None,
                 stderr_bytes: int | None = None, too_large: str | None = None) -> None:
        self.returncode = returncode
        self._stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.peak_memory = peak_memory
        self.wall_s = wall_s
        self.affinity = affinity  # the CPUs the kernel let the engine process run on (read after exec)
        self.stdout_bytes = len(stdout) if stdout_bytes is None else stdout_bytes
        self.stderr_bytes = len(stderr) if stderr_bytes is None else stderr_bytes
        self.too_large = too_large

    @property
    def stdout(self) -> str:
        if self.too_large:
            raise OutputTooLarge(self.too_large)
        return self._stdout

    def __repr__(self) -> str:
        return (f"ProcResult(returncode={self.returncode}, timed_out={self.timed_out}, wall_s={self.wall_s:.3f}, "
                f"stdout_bytes={self.stdout_bytes}, stderr_bytes={self.stderr_bytes})")


def affinity_prefix(cpus: list[int] | None, numa: int | None) -> list[str]:
    """taskset / numactl in front of a command: every engine process is pinned to the run's CPUs."""
    pre: list[str] = []
    if numa is not None:
        if not shutil.which("numactl"):
            raise UserError("numa", "numactl is not installed", "apt-get install numactl, or drop the arm's numa option")
        pre += ["numactl", f"--cpunodebind={numa}", f"--membind={numa}"]
    elif cpus:
        if not shutil.which("taskset"):
            raise UserError("taskset", "is not installed: the engine cannot be pinned to the run's CPUs",
                            "apt-get install util-linux")
        pre += ["taskset", "-c", ",".join(str(c) for c in cpus)]
    return pre


def run_process(cmd: list[str], env: dict[str, str], timeout_s: float, cwd: Path | None = None,
                poll_s: float | None = 0.5, stdout_limit: int | None = STDOUT_LIMIT) -> ProcResult:
    """Run one process, contained (its own session; it and all it starts are killed at its end), watching peak
    memory. It ends when it exits (or at timeout_s): what it left running is killed then, holding its output or
    not. stdout_limit: the stdout read back whole (beyond it, reading ProcResult.stdout raises OutputTooLarge);
    None: the caller does not parse stdout, only its tail is kept."""
    t0 = time.time()
    proc = popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd, start_new_session=True)
    drain = None
    try:
        drain = _Drain(proc, stdout_limit)
        affinity = _engine_affinity(proc.pid, cmd)
        with (PeakMemory(proc.pid, poll_s) if poll_s else _NotObserved()) as pm:
            timed_out = not proc.exited(max(0.0, t0 + timeout_s - time.time()))
            wall = time.time() - t0
    finally:
        proc.release()  # the run's end: the process (at a timeout) and whatever it started, killed
        proc.wait()
        if drain is not None:
            drain.finish()
    out, err = drain.streams
    too_large = None
    if stdout_limit is not None and out.n > stdout_limit:
        shown = shlex.join(cmd)
        too_large = (f"{shown[:200]}{'...' if len(shown) > 200 else ''} wrote {out.n} bytes to stdout, more than the "
                     f"{_size(stdout_limit)} the harness reads back: have it write its output to a file")
    return ProcResult(proc.returncode, out.text(), err.text(), timed_out, pm.result(), wall, affinity, out.n, err.n,
                      too_large)


@dataclass
class WorkerRun:
    """One engine process that answers a request with a result file (speed runs and fidelity alike): its
    process outcome, the parsed result where it reported ok, else why not (status failed | timeout)."""
    proc: ProcResult
    status: str
    result: dict | None = None
    error: str | None = None
    stderr: str = ""

    def failed(self, cmd: list[str], env: dict, engine: dict | None = None,
               requested: dict | None = None) -> EngineResult:
        """The failed run's EngineResult (status, error, stderr tail, peak memory)."""
        return failed(self.status, self.error or "unknown", cmd, env, self.stderr, engine, requested,
                      self.proc.peak_memory)


def run_worker(cmd: list[str], env: dict[str, str], timeout_s: float, out_path: Path, what: str,
               cwd: Path | None = None, poll_s: float | None = 0.5) -> WorkerRun:
    """Run an engine's worker (run_process: contained, timed out, memory watched) and read the JSON result it
    writes to out_path: ok only where it exited 0 and its result says ok (or says nothing of status). The one
    process-running path of every engine's `run` and of fidelity's `generate`."""
    r = run_process(cmd, env, timeout_s, cwd=cwd, poll_s=poll_s)
    if r.timed_out:
        return WorkerRun(r, "timeout", error=f"{what} exceeded {timeout_s:.0f} s", stderr=r.stderr)
    try:
        res = json.loads(out_path.read_text())
        if not isinstance(res, dict):
            raise ValueError("not an object")
    except (OSError, ValueError):
        return WorkerRun(r, "failed", error=f"{what} exited {r.returncode} without a result: {tail(r.stderr, 1)}",
                         stderr=r.stderr)
    if r.returncode != 0 or res.get("status", "ok") != "ok":
        tb = res.get("traceback") or ""
        return WorkerRun(r, "failed", error=res.get("error") or f"{what} exited {r.returncode}",
                         stderr=f"{tb}\n{r.stderr}" if tb else r.stderr)
    return WorkerRun(r, "ok", result=res, stderr=r.stderr)


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n} bytes"


F_SETPIPE_SZ = 1031


class _Stream:
    """One output stream's bytes: whole while within `limit` (None: 0), then only the last TAIL_BYTES."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit or 0
        self.buf = bytearray()
        self.n = 0

    def add(self, data: bytes) -> None:
        self.n += len(data)
        self.buf += data
        if self.n > self.limit and len(self.buf) > 2 * TAIL_BYTES:
            del self.buf[:-TAIL_BYTES]

    def text(self) -> str:
        data = bytes(self.buf[-TAIL_BYTES:] if self.n > self.limit else self.buf)
        text = data.decode(locale.getpreferredencoding(False), errors="replace")
        return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as text=True reads


class _Drain:
    """Reads a process's stdout and stderr in a thread while it runs, so that it never blocks on a full pipe and
    no more than a bound is held; `finish` (after the run's end) drains what is left and closes the pipes."""

    def __init__(self, proc: subprocess.Popen, stdout_limit: int | None) -> None:
        self.streams = (_Stream(stdout_limit), _Stream(None))
        self.files = (proc.stdout, proc.stderr)
        self.stop = threading.Event()
        for f in self.files:
            try:  # fewer wake-ups for a chatty process (at most the user's pipe-max-size)
                fcntl.fcntl(f.fileno(), F_SETPIPE_SZ, 1 << 20)
            except OSError:
                pass
        self.thread = threading.Thread(target=self._loop, daemon=True, name=f"drain-{proc.pid}")
        self.thread.start()

    def _loop(self) -> None:
        fds = {f.fileno(): s for f, s in zip(self.files, self.streams)}
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN | select.POLLHUP)
        while fds:
            ready = poller.poll(50 if self.stop.is_set() else 250)
            if not ready and self.stop.is_set():  # ended, killed, and nothing more comes: a holder not ours
                return
            for fd, _ in ready:
                try:
                    data = os.read(fd, 1 << 20)
                except OSError:
                    data = b""
                if data:
                    fds[fd].add(data)
                else:
                    poller.unregister(fd)
                    del fds[fd]

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)
        if not self.thread.is_alive():
            for f in self.files:
                f.close()


WRAPPERS = ("taskset", "numactl")


def _engine_affinity(pid: int, cmd: list[str], wait_s: float = 2.0) -> list[int] | None:
    """The affinity of the engine process itself: once a taskset/numactl wrapper has exec'd the engine
    (its /proc/PID/exe no longer the wrapper), read from the kernel. None if the process is already gone."""
    wrapped = bool(cmd) and os.path.basename(cmd[0]) in WRAPPERS
    deadline = time.time() + wait_s
    while True:
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            return None
        if not wrapped or exe not in WRAPPERS or time.time() > deadline:
            return process_affinity(pid)
        time.sleep(0.001)


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
