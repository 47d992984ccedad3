"""A memory balloon: a helper process that holds N bytes of locked, resident memory until its stdin closes.

Hardware emulation inflates one before an engine starts so that the machine's available memory (what
/proc/meminfo and every engine's own sizing read) is the emulated class's; it is released after the run.
Run as `python -m harness.balloon BYTES`: prints one JSON line when inflated, then waits.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import resource
import select
import subprocess
import sys
import time

from harness.lifecycle import popen

PAGE = mmap.PAGESIZE


def hold(nbytes: int) -> int:
    buf = mmap.mmap(-1, max(PAGE, nbytes), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:  # lockable beyond the default 8 MiB where the process may raise its limit (root)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass
    try:  # the kernel's OOM killer takes the engine, never the balloon (a killed balloon would end the cap)
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("-1000")
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    anchor = ctypes.c_char.from_buffer(buf)  # the mapping's first byte: its address is the mapping's
    locked = libc.mlock(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(len(buf))) == 0  # populates
    err = "" if locked else os.strerror(ctypes.get_errno())
    del anchor
    if not locked:  # not lockable (no CAP_IPC_LOCK, limit): touch every page so it is at least resident
        for off in range(0, len(buf), PAGE):
            buf[off] = 1
    print(json.dumps({"status": "inflated", "bytes": len(buf), "locked": locked, "lock_error": err}), flush=True)
    sys.stdin.read()  # until the harness closes our stdin (or dies)
    return 0


class Balloon:
    """Inflate in a child process (contained: harness/lifecycle.py); `close()` (or leaving the `with` block)
    deflates it, and kills it and anything it started if it does not exit."""

    stderr = ""  # its stderr, read when it failed to inflate

    def __init__(self, nbytes: int, timeout_s: float = 120.0) -> None:
        self.requested = int(nbytes)
        self.proc = popen([sys.executable, "-m", "harness.balloon", str(self.requested)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        ready = select.poll()
        ready.register(self.proc.stdout.fileno(), select.POLLIN | select.POLLHUP)
        line = self.proc.stdout.readline() if ready.poll(int(timeout_s * 1000)) else ""  # one line, flushed
        self.inflate_s = round(time.time() - t0, 3)
        try:
            self.state = json.loads(line)
        except ValueError:
            self.close(read_stderr=True)
            late = " (took too long to inflate)" if time.time() - t0 > timeout_s else ""
            raise RuntimeError(f"memory balloon of {self.requested} bytes failed{late}: "
                               f"{self.stderr.strip()[-300:] or 'no output'}") from None
        if time.time() - t0 > timeout_s:
            self.close()
            raise RuntimeError("memory balloon took too long to inflate")

    def close(self, read_stderr: bool = False) -> None:
        stdin = self.proc.stdin
        if stdin and not stdin.closed:
            try:
                stdin.close()  # it deflates and exits when its stdin closes
            except OSError:  # it is gone already
                pass
        try:
            self.proc.wait(timeout=30)  # contained: what it started dies with it
        except subprocess.TimeoutExpired:
            pass
        self.proc.release()  # if it did not exit: killed now
        self.proc.wait()
        if read_stderr and self.proc.stderr and not self.proc.stderr.closed:
            self.stderr = self.proc.stderr.read(64 << 10)  # it is dead: bounded, and no wait for EOF
        for f in (self.proc.stdout, self.proc.stderr):
            if f and not f.closed:
                f.close()

    def __enter__(self) -> "Balloon":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(hold(int(sys.argv[1])))
