"""No engine process outlives its runner, and no run folder outlives it either.

- Every engine (and balloon) process is started with PR_SET_PDEATHSIG=SIGKILL: when the thread that
  started it dies (a `kill -9` of `harness run`, a Ray worker killed with its node), the kernel kills the
  engine, though it runs in a session of its own (so that a timeout kills its whole process group).
  The signal survives exec (taskset and numactl exec the engine), not fork: an engine's own children are
  the engine's to reap (vLLM's multiprocess engine core watches its parent the same way).
- Run folders live in `<tmp>/edge-harness-<pid>-*`, removed when the runner ends; a runner that was killed
  cannot remove its own, so each runner first removes those of runners no longer alive (this user's only).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

PR_SET_PDEATHSIG = 1
PREFIX = "edge-harness-"
_OWN = re.compile(rf"^{PREFIX}(\d+)-")


try:  # resolved here, in the parent: a forked child of a threaded process (a Ray worker) must not dlopen
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


HELD = {signal.SIGINT, signal.SIGTERM}


def die_with_parent() -> None:
    """A preexec_fn: the child gets SIGKILL when its parent thread exits (Linux; elsewhere a no-op), and the
    signals `popen` held in the parent are open again in the child."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD)


def popen(cmd: list[str], **kw) -> subprocess.Popen:
    """subprocess.Popen with die_with_parent, Ctrl-C and SIGTERM held while the child is forked.

    A preexec_fn makes CPython run the os.register_at_fork callbacks (logging's among them) around the fork,
    and an exception raised inside one of them is reported as "Exception ignored" and dropped: a Ctrl-C
    arriving then was lost, and the grid ran on (tests/test_runner.py caught it, about one time in six). Held,
    the signal is delivered once the child exists; the child is then killed before the interrupt goes on."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    proc = None
    try:
        proc = subprocess.Popen(cmd, preexec_fn=die_with_parent, **kw)
    finally:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held signal is raised here
        except BaseException:
            if proc is not None:
                _kill(proc, kw.get("start_new_session", False))
            raise
    return proc


def _kill(proc: subprocess.Popen, group: bool) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill()
    except OSError:
        pass
    proc.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(tmp: Path | None = None) -> list[Path]:
    """Remove the run folders of runners that are no longer alive (owned by this user); the removed paths."""
    root = Path(tmp or tempfile.gettempdir())
    removed = []
    for p in root.glob(f"{PREFIX}*"):
        m = _OWN.match(p.name)
        if not m or not p.is_dir() or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        try:
            if p.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def new_root(kind: str = "run") -> Path:
    """This runner's folder for its runs' work directories: stale ones swept first; this one removed when
    the process exits normally (after a kill -9, by the next runner's sweep)."""
    sweep_stale()
    root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-{kind}-"))
    atexit.register(shutil.rmtree, root, True)
    return root


MACHINE_LOCK = "edge-harness-measuring.lock"


@contextlib.contextmanager
def measuring(out=None, what: str = "a run") -> Iterator[None]:
    """One measurement per machine at a time, across every runner on it (local `harness run`s, fleet agents of
    any Ray node on this machine): an exclusive lock on a file in the machine's temp dir, waited for."""
    import fcntl
    path = Path(tempfile.gettempdir()) / MACHINE_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # another user's lock file: that user's runs are theirs to keep apart
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            if out is not None:
                print(f"[harness] waiting: another runner is measuring on this machine ({holder}); {what} starts "
                      "when it is done", file=out, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # closing releases the lock
