"""Residency and memory ledger: what is really in RAM, not what was allocated.

mincore(2) over an mmap of each weight file gives its resident bytes; /proc/PID/smaps_rollup
gives RSS, PSS, anonymous and file-backed memory. ctypes only; standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import threading
import time
from pathlib import Path

_libc = None


def _get_libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
        _libc.mincore.restype = ctypes.c_int
        _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        _libc.mmap.restype = ctypes.c_void_p
        _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc.munmap.restype = ctypes.c_int
    return _libc


def file_residency(path: str | Path) -> dict:
    """Resident bytes of one file in the page cache, by mincore(2); does not fault pages in."""
    size = os.path.getsize(path)
    if size == 0:
        return {"resident_bytes": 0, "total_bytes": 0}
    libc = _get_libc()
    page = mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap failed: {os.strerror(err)}", str(path))
        try:
            npages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * npages)()
            if libc.mincore(addr, size, vec) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore failed: {os.strerror(err)}", str(path))
            resident_pages = sum(1 for b in bytes(vec) if b & 1)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return {"resident_bytes": min(resident_pages * page, size), "total_bytes": size}


def files_residency(paths: dict[str, Path]) -> dict[str, dict]:
    return {name: file_residency(p) for name, p in paths.items()}


SMAPS_KEYS = {"Rss": "rss_bytes", "Pss": "pss_bytes", "Anonymous": "anon_bytes",
              "Pss_Anon": "pss_anon_bytes", "Pss_File": "pss_file_bytes", "Swap": "swap_bytes"}


def smaps_rollup(pid: int) -> dict | None:
    """RSS, PSS, anonymous and file-backed bytes of one process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[0].rstrip(":") in SMAPS_KEYS:
            out[SMAPS_KEYS[parts[0].rstrip(":")]] = int(parts[1]) * 1024
    if "rss_bytes" in out and "anon_bytes" in out:
        out["file_bytes"] = out["rss_bytes"] - out["anon_bytes"]
    return out


def _children(pid: int) -> list[int]:
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    out = [int(k) for k in kids]
    for k in list(out):
        out.extend(_children(k))
    return out


class PeakMemory:
    """Polls smaps_rollup of a process tree in a thread; keeps the sample with the highest RSS."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak: dict | None = None
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            total: dict[str, int] = {}
            for p in [self.pid, *_children(self.pid)]:
                s = smaps_rollup(p)
                if s:
                    for k, v in s.items():
                        total[k] = total.get(k, 0) + v
            if total:
                self.samples += 1
                if self.peak is None or total.get("rss_bytes", 0) > self.peak.get("rss_bytes", 0):
                    self.peak = {**total, "t": time.time()}
            self._stop.wait(self.interval_s)

    def result(self) -> dict:
        if self.peak is None:
            return {"status": "unknown", "reason": "process ended before the first sample", "samples": self.samples}
        peak = {k: v for k, v in self.peak.items() if k != "t"}
        return {"status": "ok", "samples": self.samples, "interval_s": self.interval_s, **peak}
