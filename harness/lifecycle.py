"""No process the harness starts outlives its run, and no run folder outlives its runner.

Containment (everything started through `popen`: engine processes via engines/base.run_process, memory
balloons, the fleet's probe):
- Each process is started with a marker in its environment, `EDGE_HARNESS_RUN=<tag>`, that every descendant
  inherits whatever it does (background, setsid, double fork); the tag is `<runner pid>.<runner start
  time>.<n>`, one per process started, appended to a tag already there (a runner inside a run: its processes
  carry both). An engine (run_process) also leads a session and process group of its own.
- At the end of its run (exit, timeout, exception; `Contained.release`, called by `wait`) the process itself,
  its process group, its session and every process of this user whose environment carries its tag are
  SIGKILLed, scanning /proc again until a scan finds none left alive (a forking child can race a scan; a
  process inside an execve, whose environment cannot be read yet, is read again until it can). The
  process is waited for without being reaped first (waitid WNOWAIT), so its pid, group and session ids
  cannot be reused while they are killed.
- The runner is the children's subreaper (PR_SET_CHILD_SUBREAPER): descendants orphaned during a run are
  reparented to it, not to init, and those a release kills are reaped by it (no zombies).
- The direct child gets PR_SET_PDEATHSIG=SIGKILL: when the thread that started it dies (a `kill -9` of
  `harness run`, a Ray worker killed with its node), the kernel kills it. That does not reach its own
  children, so each runner also starts one guard process (`guard`, in a session of its own, outside every
  run's marker) that holds the read end of a pipe only the runner writes to and watches its parent: when
  the runner dies, however it dies, the guard kills every process carrying one of the runner's tags. And
  each runner, starting (`sweep_stale`), kills the marked processes of runners no longer alive (the tag's
  pid is gone or has another start time), in case the guard itself was killed.
- What escapes: a descendant that both drops the marker (`env -i`, or overwrites its environment block) and
  leaves the session with setsid, or one another user owns; only a cgroup or a PID namespace holds those.
  (cgroup v2 is not relied upon: machines differ, and where it is not delegated it is not writable.)
  A setsid'd orphan that exits on its own before its run ends stays a zombie of the runner until it exits.
- Run folders live in `<tmp>/edge-harness-<pid>-*`, removed when the runner ends; a runner that was killed
  cannot remove its own, so each runner first removes those of runners no longer alive (this user's only).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Callable, Iterable, Iterator

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PF_KTHREAD = 0x00200000
PREFIX = "edge-harness-"
_OWN = re.compile(rf"^{PREFIX}(\d+)-")
MARK = "EDGE_HARNESS_RUN"
_MARK_B = MARK.encode() + b"="
EXEC_WINDOW_S = 1.0  # how long a process seen inside an execve is read again (an exec takes milliseconds)
SWEEP_LIMIT_S = 5.0  # a scan-and-kill round goes on at most this long (a process stuck in the kernel ignores SIGKILL)


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


# ---- this user's processes, read from /proc ---------------------------------------------------------------

def _stat(pid: int) -> tuple[str, int, int, int, str] | None:
    """(state, ppid, process group, session, start time) of a process; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        rest = raw.rsplit(b")", 1)[1].split()
        return rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[3]), rest[19].decode()
    except (OSError, IndexError, ValueError):
        return None


def tags_of(pid: int, mark: str = MARK) -> list[str]:
    """The marker's tags in a process's environment (as it was at exec); [] when unmarked, gone, a zombie, or
    not readable (another user's). `mark`: another variable read the same way (harness.suitebench's)."""
    return _tags(_environ(pid), mark)


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _tags(data: bytes, mark: str = MARK) -> list[str]:
    key = _MARK_B if mark == MARK else mark.encode() + b"="
    if data.startswith(key):
        i = 0
    else:
        i = data.find(b"\0" + key)
        if i < 0:
            return []
        i += 1
    j = data.find(b"\0", i)
    value = data[i + len(key):j if j >= 0 else len(data)]
    return [t for t in value.decode(errors="replace").split(",") if t]


def _scanned_tags(pid: int) -> list[str] | None:
    """A scan's read of a live process's tags; None while it is inside an execve (no environment to read yet).
    An environment read empty is read again once its arguments are there: a read begun on the memory an exec
    was replacing comes back empty."""
    data = _environ(pid)
    if data:
        return _tags(data)
    state = _exec_state(pid)
    return None if state == "exec" else [] if state == "kernel" else _tags(_environ(pid))


def _pids() -> Iterator[int]:
    """This user's processes but this one."""
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: nothing to find
        return
    uid, me = os.getuid(), os.getpid()
    for n in names:
        if n.isdigit() and int(n) != me:
            try:
                if os.stat(f"/proc/{n}").st_uid != uid:
                    continue
            except OSError:
                continue
            yield int(n)


def marked(match: Callable[[list[str]], bool], mark: str = MARK) -> list[int]:
    """The live processes of this user whose tags (of `mark`) satisfy `match`."""
    return [p for p in _pids() if (t := tags_of(p, mark)) and match(t)]


def kill_marked(match: Callable[[list[str]], bool], group: int | None = None, session: int | None = None,
                exclude: Iterable[int] = (), limit_s: float = SWEEP_LIMIT_S, reap: bool = True,
                orphans_since: int | None = None) -> list[int]:
    """SIGKILL every process of this user whose tags satisfy `match`, or that is in process group `group` or
    session `session`, scanning again until no new one appears and every one killed is dead (a forking
    process can race a scan); with `reap`, those that are this process's children (orphans it is the
    subreaper of: only a run's own processes are matched, never a Popen of another caller) are reaped.
    `orphans_since` (a start time, in clock ticks): also reap the zombie children of this process that started
    since, in a session not its own, and that no live Contained is (a run's setsid'd orphans that exited on
    their own before its end: their marker went with their memory). The pids killed."""
    skip = {os.getpid(), *exclude, *_guard_pids()}
    me = os.getpid()
    if orphans_since is not None:
        own_sid = os.getsid(0)
        known = {p.pid for p in list(_LIVE) if p.returncode is None}
    killed: dict[int, str] = {}  # pid -> its start time (a pid reused meanwhile is not the one killed)
    zombies: set[int] = set()
    in_exec: dict[tuple[int, str], float] = {}  # (pid, start) -> when first seen inside an execve
    deadline = time.monotonic() + limit_s
    while True:
        if group is not None:
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        new = False
        for pid in _pids():
            if pid in skip:
                continue
            st = _stat(pid)
            if st is None:
                continue
            state, ppid, pgrp, sid, start = st
            if (orphans_since is not None and state == "Z" and ppid == me and sid != own_sid and pid not in known
                    and start.isdigit() and int(start) >= orphans_since):
                zombies.add(pid)
                continue
            t = _scanned_tags(pid) if state not in ("Z", "X") else tags_of(pid)
            if t is None and time.monotonic() - in_exec.setdefault((pid, start), time.monotonic()) < EXEC_WINDOW_S:
                new = True  # its environment not there yet: scan again
            if not ((group is not None and pgrp == group) or (session is not None and sid == session)
                    or (t and match(t))):
                continue
            if state in ("Z", "X"):
                if ppid == me:
                    zombies.add(pid)
                continue
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed[pid] = start
                    new = True
        if (not new and not any(_running(p, t) for p, t in killed.items())) or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    if reap:
        _reap(set(killed) | zombies)
    return sorted(killed)


def _exec_state(pid: int) -> str:
    """"exec": a live process that reads as having neither arguments nor environment, inside an execve (its new
    memory not yet set up: a scan cannot tell whether it carries a run's marker); "kernel": a kernel thread (it has
    neither, always); else "other"."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            if int(f.read().rsplit(b")", 1)[1].split()[6]) & PF_KTHREAD:
                return "kernel"
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return "other" if f.read(1) else "exec"
    except (OSError, IndexError, ValueError):
        return "other"


def _running(pid: int, start: str) -> bool:
    st = _stat(pid)
    return st is not None and st[4] == start and st[0] not in ("Z", "X")


def _reap(pids: Iterable[int], wait_s: float = 1.0) -> None:
    """waitpid those of `pids` that are this process's children (only pids found carrying a run's marker or
    in a run's group or session: never another thread's Popen)."""
    pending = set(pids)
    deadline = time.monotonic() + wait_s
    while pending:
        for pid in list(pending):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not ours (reparented elsewhere, or reaped by its own parent)
                done = pid
            except OSError:
                done = pid
            if done:
                pending.discard(pid)
        if not pending or time.monotonic() > deadline:
            return
        time.sleep(0.002)


# ---- the runner: its key, its subreaper flag, its guard ----------------------------------------------------

class _Runner:
    """This process as a runner: the key its tags start with, the counter of processes it started, its guard."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        st = _stat(self.pid)
        self.key = f"{self.pid}.{st[4] if st else int(time.time())}"
        self.count = itertools.count(1)
        self.guard: subprocess.Popen | None = None
        self.wfd: int | None = None
        if _PRCTL is not None:
            _PRCTL(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def tag(self) -> str:
        return f"{self.key}.{next(self.count)}"

    def ensure_guard(self) -> None:
        if self.guard is not None and self.guard.poll() is None:
            return
        if self.wfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.wfd)
            self.wfd = None
        r, w = os.pipe()  # both ends close-on-exec; the read end is passed to the guard alone
        try:
            self.guard = subprocess.Popen(
                [sys.executable, "-I", "-c", _GUARD_CODE, str(self.pid), self.key, str(r),
                 str(Path(__file__).resolve().parents[1])],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(r,), start_new_session=True)
            self.wfd = w
        except OSError:  # runs are still contained; only a kill -9 of this runner is left to the next sweep
            self.guard = None
            os.close(w)
        finally:
            os.close(r)


_GUARD_CODE = ("import sys; sys.path.insert(0, sys.argv[4]); from harness.lifecycle import guard; "
               "guard(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))")
_STATE: _Runner | None = None
_STATE_LOCK = threading.Lock()


def runner() -> _Runner:
    """This process's runner state, made at its first contained start (again in a forked child)."""
    global _STATE
    with _STATE_LOCK:
        if _STATE is None or _STATE.pid != os.getpid():
            _STATE = _Runner()
        _STATE.ensure_guard()
        return _STATE


def _guard_pids() -> set[int]:
    s = _STATE
    return {s.guard.pid} if s is not None and s.pid == os.getpid() and s.guard is not None else set()


def guard(runner_pid: int, key: str, fd: int) -> None:
    """The guard's body: wait for the runner's death (EOF on the pipe it alone writes to, or a new parent),
    then kill every process that carries one of its tags."""
    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    while os.getppid() == runner_pid:
        if poller.poll(1000) and not os.read(fd, 1):  # a forked child of the runner may hold the pipe: getppid too
            break
    prefix = key + "."
    kill_marked(lambda tags: any(t.startswith(prefix) for t in tags))


def _runner_alive(tag: str, cache: dict[str, bool]) -> bool:
    """Whether the runner a tag names is alive (its pid there with the same start time); a tag not of this
    form is not ours to judge: alive."""
    key = tag.rsplit(".", 1)[0]
    if key not in cache:
        try:
            pid, start = key.split(".")
            st = _stat(int(pid))
            cache[key] = st is not None and st[4] == start and st[0] not in ("Z", "X")
        except ValueError:
            cache[key] = True
    return cache[key]


def sweep_stale_processes() -> list[int]:
    """Kill the marked processes of runners no longer alive (one killed together with its guard); the pids."""
    mine = set(tags_of(os.getpid()))  # the tags this process carries itself (a runner inside another's run)
    cache: dict[str, bool] = {}
    return kill_marked(lambda tags: any(t not in mine and not _runner_alive(t, cache) for t in tags), reap=False)


# ---- starting a contained process ---------------------------------------------------------------------------

class Contained(subprocess.Popen):
    """A Popen whose end kills what it started: `release` (called by `wait` once the process has exited, before
    it is reaped) kills the process, its group and session when it leads them, and every process carrying its
    tag."""

    tag: str | None = None
    group = False
    start: int | None = None
    _released = False

    def __init__(self, *args, tag: str | None = None, **kw) -> None:
        self.tag = tag
        self.group = bool(kw.get("start_new_session"))
        super().__init__(*args, **kw)
        st = _stat(self.pid)
        self.start = int(st[4]) if st and st[4].isdigit() else None  # clock ticks since boot
        _LIVE.add(self)

    def exited(self, timeout: float | None = None) -> bool:
        """Wait at most `timeout` s for the process to exit, without reaping it (its pid, group and session
        ids stay reserved while what it left is killed); whether it has."""
        if self.returncode is not None:
            return True
        return _wait_exit(self.pid, timeout)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self.exited(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        self.release()
        return super().wait(timeout)

    def release(self) -> list[int]:
        """The end of its run: SIGKILL the process (if still running) and everything it started; the pids
        killed besides it. Idempotent."""
        if self._released or self.tag is None:
            return []
        self._released = True
        leader = None
        if self.returncode is None:  # not reaped: its pid (and the group and session it leads) are still its own
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            leader = self.pid if self.group else None
        tag = self.tag
        return kill_marked(lambda tags: tag in tags, group=leader, session=leader, exclude={self.pid},
                           orphans_since=self.start)


_LIVE: "weakref.WeakSet[Contained]" = weakref.WeakSet()  # contained processes started: never reaped by a sweep


def _wait_exit(pid: int, timeout: float | None) -> bool:
    """Whether process `pid` (a child) exits within `timeout` s; it is not reaped."""
    if timeout is None:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        return True
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # already reaped
        return True
    except (AttributeError, OSError):  # no pidfd (not Linux >= 5.3): a thread waits instead
        done = threading.Event()

        def waiter() -> None:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            done.set()
        threading.Thread(target=waiter, daemon=True, name=f"wait-{pid}").start()
        return done.wait(max(0.0, timeout))
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        ms = min(max(0, int(timeout * 1000 + 0.999)), 2**31 - 1)
        return bool(poller.poll(ms))  # retried on EINTR (PEP 475), the time left recomputed
    finally:
        os.close(fd)


def popen(cmd: list[str], **kw) -> Contained:
    """A contained process (see the module docstring): marked, with die_with_parent, Ctrl-C and SIGTERM held
    while the child is forked.

    A preexec_fn makes CPython run the os.register_at_fork callbacks (logging's among them) around the fork,
    and an exception raised inside one of them is reported as "Exception ignored" and dropped: a Ctrl-C
    arriving then was lost, and the grid ran on (tests/test_runner.py caught it, about one time in six). Held,
    the signal is delivered once the child exists; the child is then killed before the interrupt goes on."""
    tag = runner().tag()
    env = dict(os.environ if kw.get("env") is None else kw["env"])
    env[MARK] = ",".join([t for t in env.get(MARK, "").split(",") if t] + [tag])
    kw["env"] = env
    old = signal.pthread_sigmask(signal.SIG_BLOCK, HELD)
    proc = None
    try:
        proc = Contained(cmd, preexec_fn=die_with_parent, tag=tag, **kw)
    finally:
        try:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held signal is raised here
        except BaseException:
            if proc is not None:
                _kill(proc)
            raise
    return proc


def _kill(proc: Contained) -> None:
    proc.release()
    proc.wait()


# ---- run folders ----------------------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(tmp: Path | None = None) -> list[Path]:
    """Kill the marked processes of runners no longer alive (sweep_stale_processes), and remove the run
    folders of runners no longer alive (owned by this user); the removed paths."""
    sweep_stale_processes()
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


def machine_lock() -> Path:
    """The file every runner on this machine locks while it measures (in the machine's temp dir)."""
    return Path(tempfile.gettempdir()) / MACHINE_LOCK


@contextlib.contextmanager
def measuring(out=None, what: str = "a run") -> Iterator[None]:
    """One measurement per machine at a time, across every runner on it (local `harness run`s, fleet agents of
    any Ray node on this machine): an exclusive lock on a file in the machine's temp dir, waited for."""
    import fcntl
    path = machine_lock()
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
