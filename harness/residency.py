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


STATUS_KEYS = {"VmHWM": "hwm_bytes", "VmRSS": "rss_now_bytes", "RssAnon": "anon_bytes", "RssFile": "file_bytes",
               "RssShmem": "shmem_bytes", "VmSwap": "swap_bytes"}


def proc_status(pid: int) -> dict | None:
    """Memory counters of one process from /proc/<pid>/status (kernel counters: no page-table walk), or None
    once it is gone. VmHWM is the kernel's own high-water mark of the process's RSS."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if key in STATUS_KEYS:
            parts = val.split()
            if parts:
                out[STATUS_KEYS[key]] = int(parts[0]) * 1024
    return out


PEAK_METHOD = ("VmHWM (the kernel's high-water mark of RSS) from /proc/<pid>/status of each process of the tree, "
               "summed (exact for one process, an upper bound for several), read every interval_s; anon/file "
               "from the sample with the highest summed RSS. Not smaps_rollup: walking the engine's page tables "
               "during the run slowed it measurably (grids/footprint-*.yaml, series 1)")


class PeakMemory:
    """Watches a process tree's peak RSS from cheap kernel counters (/proc/<pid>/status) in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.hwm: dict[int, int] = {}  # pid -> its latest VmHWM
        self.best: dict | None = None
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
                s = proc_status(p)
                if s:
                    self.hwm[p] = max(self.hwm.get(p, 0), s.get("hwm_bytes", 0))
                    for k, v in s.items():
                        total[k] = total.get(k, 0) + v
            if total:
                self.samples += 1
                if self.best is None or total.get("rss_now_bytes", 0) > self.best.get("rss_now_bytes", 0):
                    self.best = total
            self._stop.wait(self.interval_s)

    def result(self) -> dict:
        if self.best is None:
            return {"status": "unknown", "reason": "process ended before the first sample", "samples": self.samples}
        return {"status": "ok", "samples": self.samples, "interval_s": self.interval_s, "method": PEAK_METHOD,
                "rss_bytes": sum(self.hwm.values()), "processes": len(self.hwm),
                **{k: v for k, v in self.best.items() if k in ("anon_bytes", "file_bytes", "shmem_bytes", "swap_bytes")}}
