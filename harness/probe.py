"""The host profile: CPU, ISA, cores, NUMA, memory, cgroup limits, kernel, governor.

Read from /proc, /sys and cgroups at call time; a source that is missing gives "unknown",
never a guess. Nothing here runs at import.
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

UNKNOWN = "unknown"

# ISA features worth knowing for inference kernels, by the names /proc/cpuinfo uses
X86_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
ARM_FLAGS = ("asimd", "asimddp", "i8mm", "bf16", "sve", "sve2", "sme")


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _parse_cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def cpu_info(cpuinfo: str | None = None) -> dict:
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    if not text:
        return {"model": UNKNOWN, "flags": UNKNOWN, "isa": {}}
    model = UNKNOWN
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and model == UNKNOWN:
            model = val.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(val.split())
    known = X86_FLAGS if platform.machine() in ("x86_64", "AMD64", "i686") or "avx" in " ".join(flags) else ARM_FLAGS
    return {"model": model, "isa": {f: (f in flags) for f in known},
            "bf16_compute": any(f in flags for f in ("avx512_bf16", "amx_bf16", "bf16")),
            "flags": sorted(flags)}


def topology(sys_cpu: str = "/sys/devices/system/cpu") -> dict:
    online = _read(f"{sys_cpu}/online")
    logical = _parse_cpulist(online) if online else list(range(os.cpu_count() or 0))
    cores = set()
    for c in logical:
        core = _read(f"{sys_cpu}/cpu{c}/topology/core_id")
        pkg = _read(f"{sys_cpu}/cpu{c}/topology/physical_package_id")
        if core is None:
            return {"logical_cores": len(logical), "physical_cores": UNKNOWN, "online_cpus": logical}
        cores.add((pkg.strip() if pkg else "0", core.strip()))
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:
        affinity = logical
    return {"logical_cores": len(logical), "physical_cores": len(cores), "online_cpus": logical,
            "affinity": affinity}


def numa_nodes(sys_node: str = "/sys/devices/system/node") -> list[dict] | str:
    base = Path(sys_node)
    if not base.exists():
        return UNKNOWN
    nodes = []
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = _read(d / "cpulist")
        mem = _read(d / "meminfo")
        total = None
        if mem:
            m = re.search(r"MemTotal:\s+(\d+) kB", mem)
            total = int(m.group(1)) * 1024 if m else None
        nodes.append({"node": int(d.name[4:]), "cpus": _parse_cpulist(cpus) if cpus else UNKNOWN,
                      "mem_total_bytes": total if total is not None else UNKNOWN})
    return nodes or UNKNOWN


def meminfo(text: str | None = None) -> dict:
    text = _read("/proc/meminfo") if text is None else text
    if not text:
        return {"total_bytes": UNKNOWN, "available_bytes": UNKNOWN}
    vals = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+) kB", line)
        if m:
            vals[m.group(1)] = int(m.group(2)) * 1024
    return {"total_bytes": vals.get("MemTotal", UNKNOWN), "available_bytes": vals.get("MemAvailable", UNKNOWN)}


def cgroup_limits(root: str = "/sys/fs/cgroup") -> dict:
    """cgroup v2 (or v1) CPU and memory limits of this process; 'max' means unlimited."""
    cg = _read("/proc/self/cgroup") or ""
    rel = "/"
    for line in cg.splitlines():
        if line.startswith("0::"):
            rel = line[3:].strip() or "/"
    base = Path(root) / rel.lstrip("/")
    out: dict = {"version": UNKNOWN, "cpu_max": UNKNOWN, "memory_max": UNKNOWN}
    for b in (base, Path(root)):
        cpu = _read(b / "cpu.max")
        mem = _read(b / "memory.max")
        if cpu is not None or mem is not None:
            out["version"] = 2
            if cpu is not None:
                quota, period = (cpu.split() + ["100000"])[:2]
                out["cpu_max"] = "max" if quota == "max" else round(int(quota) / int(period), 3)
            if mem is not None:
                out["memory_max"] = "max" if mem.strip() == "max" else int(mem)
            return out
    q = _read(Path(root) / "cpu/cpu.cfs_quota_us")
    if q is not None:
        out["version"] = 1
        p = _read(Path(root) / "cpu/cpu.cfs_period_us") or "100000"
        out["cpu_max"] = "max" if int(q) < 0 else round(int(q) / int(p), 3)
        m = _read(Path(root) / "memory/memory.limit_in_bytes")
        # v1 writes "unlimited" as a page-rounded 2**63-1
        out["memory_max"] = UNKNOWN if not m else ("max" if int(m) >= 1 << 62 else int(m))
    return out


def governor() -> str:
    g = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    return g.strip() if g else UNKNOWN


def loadavg() -> list[float] | str:
    t = _read("/proc/loadavg")
    return [float(x) for x in t.split()[:3]] if t else UNKNOWN


def os_release() -> str:
    t = _read("/etc/os-release") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', t, re.M)
    return m.group(1) if m else UNKNOWN


def probe() -> dict:
    """The whole host profile, as a JSON-ready dict."""
    cpu = cpu_info()
    return {
        "cpu": {"model": cpu["model"], "arch": platform.machine() or UNKNOWN, "isa": cpu["isa"],
                "bf16_compute": cpu.get("bf16_compute", UNKNOWN), **topology()},
        "numa": numa_nodes(),
        "memory": meminfo(),
        "cgroup": cgroup_limits(),
        "kernel": platform.release() or UNKNOWN,
        "os": os_release(),
        "governor": governor(),
        "loadavg": loadavg(),
        "hostname": platform.node() or UNKNOWN,
        "python": platform.python_version(),
    }
