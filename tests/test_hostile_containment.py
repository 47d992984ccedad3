"""Containment (issue 30): whatever a command's children do (background, setsid, double fork, hold stdout open,
outlive a `kill -9` of the runner), nothing it started outlives its run, and its output is never held whole.

Each test's processes are found by a `sleep` of a duration no other process uses (made per test), and killed in
a `finally` whatever the outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness import execute, lifecycle
from harness.engines.base import OutputTooLarge, run_process

ROOT = Path(__file__).resolve().parents[1]


def _duration() -> str:
    """A sleep duration no other process has: its cmdline names this test's processes."""
    return f"{300 + random.random() * 600:.6f}"


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _sleeps(duration: str) -> list[int]:
    """Live (not zombie) processes running `sleep <duration>`."""
    want = b"sleep\0" + duration.encode() + b"\0"
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes()
        except OSError:
            continue
        if cmd.endswith(want) and os.path.basename(cmd.split(b"\0")[0]) == b"sleep" and _state(int(p.name)) not in (
                None, "Z", "X"):
            out.append(int(p.name))
    return out


def _exited(pids: list[int], within_s: float) -> list[int]:
    """Those of pids still alive after waiting on their pidfds (the kernel says when each exits: no clock is
    polled; within_s only bounds a wait that would otherwise hang)."""
    import select
    fds = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            continue  # already gone
    deadline = time.monotonic() + within_s
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(list(fds), [], [], left)
            for fd in ready:
                os.close(fd)
                fds.pop(fd)
        return [pid for pid in fds.values() if _state(pid) not in (None, "Z", "X")]
    finally:
        for fd in fds:
            os.close(fd)


def _gone(duration: str, within_s: float = 3.0) -> bool:
    """Whether no `sleep <duration>` is alive, waiting at most within_s for those alive now to exit (the kill is
    synchronous; the wait only absorbs a loaded machine)."""
    return not _exited(_sleeps(duration), within_s)


def _cleanup(duration: str) -> None:
    for pid in _sleeps(duration):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def _zombie_children() -> set[int]:
    me = os.getpid()
    kids = set()
    for task in Path(f"/proc/{me}/task").iterdir():
        try:
            kids |= {int(k) for k in (task / "children").read_text().split()}
        except OSError:
            pass
    return {k for k in kids if _state(k) == "Z"}


def _sh(cmd: str, timeout_s: float = 20, **kw):
    return run_process(["/bin/sh", "-c", cmd], dict(os.environ), timeout_s, **kw)


def test_a_background_child_is_killed_after_an_ok_run():
    d = _duration()
    try:
        r = _sh(f"sleep {d} >/dev/null 2>&1 & echo started")
        assert r.returncode == 0 and not r.timed_out and r.stdout == "started\n"
        assert _gone(d), "the background child outlived its ok run"
    finally:
        _cleanup(d)


def test_a_setsid_double_forked_child_is_killed_after_an_ok_run_and_reaped():
    d = _duration()
    before = _zombie_children()
    try:
        # the subshell forks a setsid'd sh (another session and group) that forks the sleep and exits: the sleep is
        # an orphan in a session of its own, out of reach of the run's process group
        r = _sh(f"( setsid sh -c 'sleep {d} >/dev/null 2>&1 & exit 0' & ) ; sleep 0.2; exit 0")
        assert r.returncode == 0 and not r.timed_out
        assert _gone(d), "the setsid'd, double-forked child outlived its ok run"
        assert not (_zombie_children() - before), "the run's orphans were left as zombies of the runner"
    finally:
        _cleanup(d)


def test_a_setsid_double_forked_child_is_killed_at_a_timeout():
    d = _duration()
    try:
        t0 = time.time()
        r = _sh(f"( setsid sh -c 'sleep {d} & exit 0' & ) ; sleep 60", timeout_s=1)
        assert r.timed_out and time.time() - t0 < 15
        assert _gone(d), "the setsid'd child outlived the timeout"
    finally:
        _cleanup(d)


def test_stdout_held_open_by_a_background_child_is_an_ok_run_ended_at_exit():
    d = _duration()
    try:
        t0 = time.time()
        r = _sh(f"sleep {d} & echo hi", timeout_s=30)
        took = time.time() - t0
        assert r.returncode == 0 and not r.timed_out and r.stdout == "hi\n"
        assert took < 10 and r.wall_s < 10, f"the run waited for the pipe, not the exit ({took:.1f} s)"
        assert _gone(d)
    finally:
        _cleanup(d)


def test_kill_9_of_the_runner_kills_its_commands_grandchildren(tmp_path):
    d = _duration()
    import select
    ready = tmp_path / "ready"
    os.mkfifo(ready)
    # the setsid'd grandchild says its pid and its marker through a FIFO, then becomes `sleep` (same pid and
    # environment): no clock is polled, and nothing reads /proc/<pid>/environ while the exec replaces it
    script = textwrap.dedent(f"""
        import os, sys
        from harness.engines.base import run_process
        run_process(["/bin/sh", "-c", "(setsid sh -c 'echo $$ $EDGE_HARNESS_RUN > {ready}; exec sleep {d}' &); sleep 120"],
                    dict(os.environ), 120)
    """)
    reader = os.open(ready, os.O_RDWR | os.O_NONBLOCK)  # a writer always open: select waits for data, not EOF
    runner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    runner_fd = os.pidfd_open(runner.pid)
    mine = f"EDGE_HARNESS_RUN={runner.pid}.".encode()
    try:
        got, _, _ = select.select([reader, runner_fd], [], [], 60)
        assert got == [reader], "the grandchild never started (or the runner exited first)"
        said = os.read(reader, 256).decode().split()
        sleep = int(said[0])
        marked = len(said) == 2 and f"EDGE_HARNESS_RUN={said[1]}".startswith(mine.decode())
        os.kill(runner.pid, signal.SIGKILL)
        runner.wait()
        assert not _exited([sleep], 5), "a grandchild outlived a kill -9 of its runner"
        assert marked, "the runner's processes carry its marker"
        left = lifecycle.marked(lambda tags: any(t.startswith(f"{runner.pid}.") for t in tags))
        assert not _exited(left, 5), "processes with the dead runner's marker remain"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
        os.close(reader)
        os.close(runner_fd)
        _cleanup(d)


def test_the_next_runner_sweeps_marked_processes_of_dead_runners():
    d = _duration()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{dead.pid}.1.1"  # a runner no longer alive (and, were the pid reused, with another start time)
    live = lifecycle.runner().tag()  # this process: alive
    procs = []
    try:
        for tag in (stale, live):
            procs.append(subprocess.Popen(["sleep", d], env={**os.environ, lifecycle.MARK: tag}))
        assert _state(procs[1].pid) not in (None, "Z", "X")  # Popen returns once the child has exec'd
        killed = lifecycle.sweep_stale_processes()
        # swept: by this sweep, or first by a runner that another test worker started meanwhile (the same code)
        assert procs[0].wait(5) == -signal.SIGKILL
        assert procs[1].pid not in killed and procs[1].poll() is None
    finally:
        for p in procs:
            p.kill()
            p.wait()
        _cleanup(d)


def test_large_output_is_not_held_in_memory():
    script = textwrap.dedent("""
        import json, os
        from harness.engines import base

        def hwm_mib():  # this process's own peak RSS (ru_maxrss would carry over the forking pytest's peak)
            line = next(x for x in open("/proc/self/status") if x.startswith("VmHWM:"))
            return int(line.split()[1]) / 1024
        res = {}
        try:
            r = base.run_process(["head", "-c", "200000000", "/dev/zero"], dict(os.environ), 60)
            res |= {"rc": r.returncode, "maxrss_mib": hwm_mib()}
            try:
                r.stdout
            except base.OutputTooLarge as e:
                res["error"] = str(e)
            res["bytes"] = r.stdout_bytes
            t = base.run_process(["head", "-c", "200000000", "/dev/zero"], dict(os.environ), 60, stdout_limit=None)
            res |= {"tail": len(t.stdout), "tail_rc": t.returncode,
                    "maxrss_mib": hwm_mib()}
        finally:
            print(json.dumps(res))
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert res.get("rc") == 0, p.stderr[-2000:]
    assert res["maxrss_mib"] < 150, f"the harness held the output: peak RSS {res['maxrss_mib']:.0f} MiB"
    assert p.returncode == 0, p.stderr[-2000:]
    assert res["bytes"] == 200_000_000 and res["tail_rc"] == 0 and res["tail"] <= 64 << 10
    assert "wrote 200000000 bytes to stdout" in res["error"] and "16 MiB" in res["error"]


def test_a_parsed_stdout_within_the_limit_is_whole_and_stderr_is_a_bounded_tail():
    r = _sh("head -c 100000 /dev/zero | tr '\\0' a; head -c 300000 /dev/zero | tr '\\0' b >&2")
    assert r.returncode == 0 and r.stdout == "a" * 100000 and r.stdout_bytes == 100000
    assert r.stderr_bytes == 300000 and r.stderr == "b" * (64 << 10)
    with pytest.raises(OutputTooLarge, match="wrote 2000 bytes to stdout, more than the 1000 bytes"):
        _ = _sh("head -c 2000 /dev/zero", stdout_limit=1000).stdout


def test_affinity_and_peak_memory_are_still_read():
    hold = "import time; b = bytearray(64 << 20); time.sleep(0.5)"
    r = run_process(["taskset", "-c", "0", sys.executable, "-c", hold], dict(os.environ), 30, poll_s=0.05)
    assert r.returncode == 0 and r.affinity == [0]
    assert r.peak_memory["status"] == "ok" and r.peak_memory["rss_bytes"] >= 60 << 20


def test_a_process_started_with_popen_is_contained_by_a_caller_that_only_communicates():
    d = _duration()
    try:
        proc = lifecycle.popen(["/bin/sh", "-c", f"sleep {d} >/dev/null 2>&1 & echo CONNECTED"],
                               stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=20)  # as harness/fleet.py's probe does
        assert "CONNECTED" in out and proc.returncode == 0
        assert _gone(d)
    finally:
        _cleanup(d)


def test_a_balloon_is_contained_and_deflates():
    from harness.balloon import Balloon
    with Balloon(1 << 20) as b:
        assert b.state["status"] == "inflated" and b.proc.returncode is None
        assert lifecycle.tags_of(b.proc.pid) == [b.proc.tag]
    assert b.proc.returncode == 0


def test_the_command_engine_leaves_nothing_running_after_an_ok_run(write_grid, tmp_path):
    from harness.store import Store, load_path
    d = _duration()
    g = write_grid(f"""
        name: hostile
        arms:
          - {{name: bg, engine: command, options: {{cmd: "(setsid sleep {d} &); sleep {d} & echo out"}}}}
        workload: {{prompt_len: 1, context_len: 1, gen_len: 1}}
        threads: 1
        passes: 1
        repetitions: 1
        warmups: 0
        timeout_s: 30
    """)
    try:
        s = execute.run_grid(str(g), store_root=tmp_path / "st")
        (art,) = [load_path(p) for p in Store(tmp_path / "st").iter_paths("hostile")]
        assert s.done == 1 and art.status == "ok", art.error
        assert art.metrics["wall_s"].samples[0] < 10
        assert _gone(d), "the command's children outlived its ok run"
    finally:
        _cleanup(d)


def test_a_prebuilt_binarys_version_is_asked_contained(tmp_path, monkeypatch):
    """A user's prebuilt llama-bench (build: {bin: DIR}) whose --version leaves a detached child holding its stdout
    open: the answer is read at its exit, and the child does not outlive it; one that never answers is one line."""
    from harness.engines.llamacpp import build
    from harness.errors import UserError
    d = _duration()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "llama-bench"
    exe.write_text(f"#!/bin/sh\n( setsid sleep {d} & ) ; echo 'version: 1 (abc1234)'\n")
    exe.chmod(0o755)
    try:
        t0 = time.time()
        m = build._prebuilt_manifest(build.UserBuild(bin=bindir))
        assert time.time() - t0 < 10 and m["build_commit"] == "abc1234"
        assert _gone(d), "the version probe's child outlived it"
    finally:
        _cleanup(d)
    exe.write_text("#!/bin/sh\nsleep 600\n")
    os.utime(exe, ns=(1, 1))  # another binary: asked again
    monkeypatch.setattr(build, "VERSION_TIMEOUT_S", 1.0)
    with pytest.raises(UserError, match="--version did not answer within 1 s"):
        build._prebuilt_manifest(build.UserBuild(bin=bindir))


@pytest.mark.parametrize("inside_exec", [True, False])
def test_a_process_caught_inside_an_exec_is_read_again_and_killed(monkeypatch, inside_exec):
    """A scan that meets a marked process inside an execve reads its environment empty (its new memory is not
    set up yet, or the read began on the memory being replaced): it is read again, not passed over (CI saw a
    setsid'd `sleep` outlive its run, about one release in a hundred under load)."""
    d = _duration()
    tag = f"test-exec-{d}"
    proc = subprocess.Popen(["sleep", d], env={**os.environ, lifecycle.MARK: tag}, start_new_session=True)
    try:
        reads = {"environ": 0}
        real_environ, real_state = lifecycle._environ, lifecycle._exec_state

        def environ(pid):
            if pid == proc.pid:
                reads["environ"] += 1
                if reads["environ"] <= (3 if inside_exec else 1):
                    return b""
            return real_environ(pid)

        monkeypatch.setattr(lifecycle, "_environ", environ)
        monkeypatch.setattr(lifecycle, "_exec_state",
                            lambda pid: ("exec" if inside_exec else "other") if pid == proc.pid else real_state(pid))
        killed = lifecycle.kill_marked(lambda tags: tag in tags, reap=False)
        assert killed == [proc.pid] and proc.wait(5) == -signal.SIGKILL
    finally:
        _cleanup(d)
        with contextlib.suppress(Exception):
            proc.kill()
            proc.wait(5)
