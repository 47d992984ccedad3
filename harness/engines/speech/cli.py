"""Piper's own command line as the measured process (docs/speech.md, "Cross-check"): the `piper` engine with
`options: {client: cli}` runs `python -m piper --output-raw` (pinned like every engine process) in place of the
harness's worker, writes each text to its stdin as one line, and stamps in this process every read of its stdout
(raw 16-bit PCM, which the CLI writes and flushes a sentence at a time). A text's stream has ended when the CLI is
back waiting for its next line (its main thread blocked in read(2) on stdin, read from /proc/PID/syscall) and every
byte it wrote has been read. A chunk is one read; its duration its bytes / 2 / the voice's sample rate (its config,
which the CLI reads). The metrics are the speech kind's (playback.py) from these stamps: the same definitions,
measured another way, by a plain client of the engine's own program with no code of the harness in the process.

ready_s is not reported: the CLI initializes its phonemizer at its first text (a warm-up), where the worker does
so before it is ready, so the two would not be one measurement; the launch to the CLI's first wait for input is
recorded (execution.effective.cli_waiting_s). Its ONNX Runtime session is the CLI's own (PiperVoice.load: ONNX
Runtime's default threads), so the threads that ran it are read back, not set.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import select
import struct
import subprocess
import sys
import termios
import time
from importlib import metadata
from typing import Any

from harness.engines.base import EngineResult, RunContext, affinity_prefix, failed, process_affinity, setting, tail
from harness.engines.workerlib import add_busy, running_threads, thread_times_ns
from harness.errors import UserError

READ_SYSCALL = {"x86_64": 0, "aarch64": 63}  # read(2)'s number, as /proc/PID/syscall gives it
QUIET_S = 0.02  # no byte for this long: look whether the CLI is back waiting for a line
THREADS = ("threads of the CLI process whose time on a CPU or runnable waiting for one was at least 10% of the "
           "busiest one's (/proc/PID/task/*/schedstat) over the measured texts; ONNX Runtime's default (the CLI "
           "sets none)")
CLIENT = ("piper's CLI (python -m piper --output-raw), a text a line on its stdin; a chunk is one read of its stdout "
          "(raw int16 PCM), stamped with time.perf_counter() in the harness's process from the line's write; a "
          "text ends when the CLI waits on stdin again with every byte read")


def read_syscall() -> int:
    """read(2)'s number on this machine; a machine whose number is not known here cannot tell when the CLI waits."""
    nr = READ_SYSCALL.get(platform.machine())
    if nr is None:
        raise UserError("options.client", f"cli: this machine ({platform.machine()}) has no known read(2) number to "
                        "tell when Piper's CLI waits for input", "use the worker (drop options.client)")
    return nr


def waiting_for_input(pid: int, nr: int) -> bool:
    """Whether process pid's main thread is blocked in read(2) on its stdin (fd 0)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            parts = f.read().split()
    except OSError:
        return False
    return len(parts) >= 2 and parts[0] == str(nr) and parts[1] == "0x0"


def pending(fd: int) -> int:
    """Bytes written to the pipe and not yet read."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]


class Ended(RuntimeError):
    """The CLI exited, or did not answer in time."""


def stream(fd: int, pid: int, nr: int, t0: float, deadline: float) -> tuple[list[float], list[int], str]:
    """One text's stream: each read's arrival (s after t0) and size in bytes, and the bytes' sha256, until the CLI
    waits for its next line with nothing left in the pipe."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    arrivals: list[float] = []
    sizes: list[int] = []
    digest = hashlib.sha256()
    while True:
        if time.time() > deadline:
            raise Ended(f"the CLI spoke {sum(sizes)} bytes and did not finish its text in time")
        if poller.poll(QUIET_S * 1000):
            data = os.read(fd, 1 << 20)
            now = time.perf_counter()
            if not data:
                raise Ended("the CLI closed its stdout (exited)")
            arrivals.append(now - t0)
            sizes.append(len(data))
            digest.update(data)
        elif arrivals and waiting_for_input(pid, nr) and pending(fd) == 0:
            return arrivals, sizes, digest.hexdigest()


def wait_for_input(proc: Any, nr: int, deadline: float) -> float:
    """The moment (time.perf_counter()) the CLI first waits for a line: its voice loaded."""
    while not waiting_for_input(proc.pid, nr):
        if proc.poll() is not None:
            raise Ended("the CLI exited before it asked for input")
        if time.time() > deadline:
            raise Ended("the CLI did not ask for input in time")
        time.sleep(0.005)
    return time.perf_counter()


def speak(proc: Any, fd: int, nr: int, spoken: list[tuple[str, str, bool]], sr: int,
          deadline: float) -> tuple[list[dict], dict]:
    """Each (id, text, warm-up) written to the CLI in turn and its stream read: the streams (as the worker reports
    them) and the CLI's threads' times over the measured texts."""
    streams: list[dict] = []
    busy: dict = {}
    for tid, text, warm in spoken:
        before = thread_times_ns(proc.pid)
        t0 = time.perf_counter()
        proc.stdin.write(text.replace("\n", " ").encode() + b"\n")
        proc.stdin.flush()
        arrivals, sizes, digest = stream(fd, proc.pid, nr, t0, deadline)
        if not warm:
            add_busy(busy, before, thread_times_ns(proc.pid))
        streams.append({"warmup": warm, "id": tid, "arrivals_s": arrivals, "durations_s": [n / 2 / sr for n in sizes],
                        "bytes": sizes, "audio_sha256": digest})
    return streams, busy


def loaded_libraries(pid: int, pattern: Any) -> list[str]:
    """The shared libraries mapped into process pid whose names the engine's LIBRARY pattern matches."""
    out = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and pattern.search(os.path.basename(parts[-1])):
                    out.add(os.path.realpath(parts[-1]))
    except OSError:
        pass
    return sorted(out)


def cli_info(engine: Any) -> dict[str, Any]:
    """The engine's provenance with Piper's CLI (its module, hashed) in place of the harness's worker."""
    import piper
    main = os.path.join(os.path.dirname(piper.__file__), "__main__.py")
    with open(main, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    info = engine.engine_info()
    build = {k: v for k, v in info["build"].items() if not k.startswith("worker")}
    return {**info, "build": {**build, "client": "python -m piper (piper-tts's own command line)",
                              "client_sha256": digest}}


def run_cli(engine: Any, ctx: RunContext, form: str) -> EngineResult:
    from harness import voices
    from harness.lifecycle import popen
    from harness.residency import PeakMemory
    from harness.workloads.speech import playback, texts
    nr = read_syscall()
    files = engine.voice_files(voices.ensure(ctx.model, form), form)
    with open(files["config"], encoding="utf-8") as f:
        sr = int(json.load(f)["audio"]["sample_rate"])
    name = ctx.params["text"]
    picks = texts.chosen(name, ctx.spec.seed, ctx.run.cell.id, ctx.run.pass_index,
                         ctx.spec.warmups + ctx.spec.repetitions)
    spoken = [(f"{name}[{i}]", texts.TEXTS[name][i], k < ctx.spec.warmups) for k, i in enumerate(picks)]
    env_rec = {**{k: v for k, v in sorted(os.environ.items()) if k.startswith(engine.env_prefixes)},
               **engine.worker_env, **ctx.env, "PYTHONNOUSERSITE": "1"}
    cmd = affinity_prefix(ctx.cpus, ctx.arm.numa) + [
        sys.executable, "-m", "piper", "-m", files["onnx"], "-c", files["config"], "--output-raw",
        "--noise-scale", "0", "--noise-w-scale", "0", "--no-normalize"]
    info = cli_info(engine)
    requested = {"threads": ctx.threads, "form": form, "text": name, "noise_scale": 0.0, "noise_w_scale": 0.0,
                 "client": "cli"}
    log = ctx.workdir / "cli.log"
    launched = time.perf_counter()
    deadline = time.time() + ctx.timeout_s
    with open(log, "wb") as logf:
        proc = popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                     env={**os.environ, **env_rec}, start_new_session=True)

    def fail(why: str) -> EngineResult:
        text = log.read_text(errors="replace")
        status = "timeout" if "in time" in why else "failed"
        return failed(status, f"{why}: {tail(text, 1)}", cmd, env_rec, text, info, requested, pm.result())

    try:
        with PeakMemory(proc.pid, ctx.poll_s or 0.5) as pm:
            fd = proc.stdout.fileno()
            try:
                fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ: a sentence fits; the CLI never waits on the pipe
            except OSError:
                pass
            try:
                waiting_s = wait_for_input(proc, nr, deadline) - launched
                streams, busy = speak(proc, fd, nr, spoken, sr, deadline)
            except Ended as e:
                return fail(str(e))
            running = running_threads(busy)
            libs = loaded_libraries(proc.pid, engine.LIBRARY)
            affinity = process_affinity(proc.pid)
    finally:
        proc.release()
        proc.wait()
    eff = {"threads": len(running), "thread_cpu_s": [round(ns / 1e9, 6) for ns in running], "cpu_affinity": affinity,
           "sample_rate": sr, "libraries": libs, "client": CLIENT, "cli_waiting_s": waiting_s,
           "noise_scale": 0.0, "noise_w_scale": 0.0, "normalize_audio": False,
           "piper_version": metadata.version("piper-tts"), "chunks": [len(s["arrivals_s"]) for s in streams]}
    foreign = engine._foreign_libraries(eff)
    if foreign:
        return failed("failed", foreign, cmd, env_rec, log.read_text(errors="replace"), info, requested, pm.result())
    settings = {"threads": setting(ctx.threads, len(running), THREADS),
                "cpus": setting(ctx.cpus, affinity, "sched_getaffinity of the CLI process"),
                "warmups": setting(ctx.spec.warmups, sum(1 for s in streams if s["warmup"]),
                                   "warm-up texts written to the CLI"),
                "dtype": setting(voices.dtype(ctx.model, form), None,
                                 "the form's types (not readable from the engine)")}
    effective = {**eff, "timestamps": CLIENT, "texts": [s["id"] for s in streams],
                 "audio_sha256": [s["audio_sha256"] for s in streams],
                 "chunk_samples": [[n // 2 for n in s["bytes"]] for s in streams]}
    return EngineResult(status="ok", metrics=playback.metrics(streams, None), engine=info, requested=requested,
                        settings=settings, effective=effective, command=cmd, env=env_rec, peak_memory=pm.result(),
                        after_load={"status": "n/a", "reason": "the CLI loads and speaks in one process"},
                        prompt_token_hash=f"texts sha256 {texts.set_sha256(name)}")
