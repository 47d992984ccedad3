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
    """Inflate in a child process; `close()` (or leaving the `with` block) deflates it."""

    def __init__(self, nbytes: int, timeout_s: float = 120.0) -> None:
        self.requested = int(nbytes)
        self.proc = popen([sys.executable, "-m", "harness.balloon", str(self.requested)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        self.inflate_s = round(time.time() - t0, 3)
        try:
            self.state = json.loads(line)
        except ValueError:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.close()
            raise RuntimeError(f"memory balloon of {self.requested} bytes failed: {err.strip()[-300:] or 'no output'}")
        if time.time() - t0 > timeout_s:
            self.close()
            raise RuntimeError("memory balloon took too long to inflate")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "Balloon":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(hold(int(sys.argv[1])))
