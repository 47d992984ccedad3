"""The host profile: CPU, ISA, cores, NUMA, memory, cgroup limits, kernel, governor.

Read from /proc, /sys and cgroups at call time; a source that is missing gives "unknown",
never a guess. Nothing here runs at import.
"""

from __future__ import annotations

import hashlib
import json
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
    """CPU identity (vendor, family, model, stepping, microcode), the full flag set and its hash, and the
    ISA features that matter for inference kernels."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    if not text:
        return {"model": UNKNOWN, "flags": UNKNOWN, "isa": {}}
    fields: dict[str, str] = {}
    flags: set[str] = set()
    for line in text.splitlines():
        if not line.strip():
            if fields:  # the first processor's block describes the CPU
                break
            continue
        key, _, val = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features"):
            flags = set(val.split())
        fields.setdefault(key, val.strip())
    model = next((fields[k] for k in ("model name", "Model", "cpu model") if fields.get(k)), UNKNOWN)
    known = X86_FLAGS if platform.machine() in ("x86_64", "AMD64", "i686") or "avx" in " ".join(flags) else ARM_FLAGS
    isa = {f: (f in flags) for f in known}
    return {"model": model,
            "vendor": fields.get("vendor_id") or fields.get("CPU implementer") or UNKNOWN,
            "family": fields.get("cpu family") or fields.get("CPU architecture") or UNKNOWN,
            "model_number": fields.get("model") or fields.get("CPU part") or UNKNOWN,
            "stepping": fields.get("stepping") or fields.get("CPU revision") or UNKNOWN,
            "microcode": fields.get("microcode") or UNKNOWN,
            "isa": isa, "isa_tier": isa_tier(isa),
            "bf16_compute": any(f in flags for f in ("avx512_bf16", "amx_bf16", "bf16")),
            "flags": sorted(flags),
            "flags_sha256": hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()}


# ISA tiers, highest first: the first whose features are all present names the machine's tier.
ISA_TIERS = (("amx", ("amx_tile", "amx_bf16")), ("avx512-bf16", ("avx512f", "avx512_bf16")),
             ("avx512", ("avx512f", "avx512bw", "avx512vl")), ("avx2", ("avx2", "fma")),
             ("sve", ("sve",)), ("i8mm", ("i8mm",)), ("dotprod", ("asimddp",)), ("neon", ("asimd",)))


def isa_tier(isa: dict) -> str:
    """The ISA tier of a feature map (probe's `isa`): x86 baseline/avx2/avx512/avx512-bf16/amx,
    arm64 neon/dotprod/i8mm/sve."""
    for tier, needs in ISA_TIERS:
        if all(isa.get(f) for f in needs):
            return tier
    return "baseline"


def caches(sys_cpu: str = "/sys/devices/system/cpu") -> dict:
    """Cache sizes seen by CPU 0, bytes per instance (L1d, L1i, L2, L3) and the CPUs sharing each."""
    out = {}
    for d in sorted(Path(sys_cpu, "cpu0", "cache").glob("index[0-9]*")):
        level, ctype, size = (_read(d / n) for n in ("level", "type", "size"))
        if not (level and ctype and size):
            continue
        name = f"L{level.strip()}" + {"Data": "d", "Instruction": "i"}.get(ctype.strip(), "")
        m = re.match(r"(\d+)([KMG]?)", size.strip())
        if m:
            out[name] = {"bytes": int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2)],
                         "shared_cpus": (_read(d / "shared_cpu_list") or UNKNOWN).strip()}
    return out or {"status": UNKNOWN}


def machine_identity() -> dict:
    """A stable identity of the machine, hashed (the raw id is never recorded): /etc/machine-id, else
    the DMI product uuid. A fresh VM is a new machine, and measures as one."""
    for src in ("/etc/machine-id", "/var/lib/dbus/machine-id", "/sys/class/dmi/id/product_uuid"):
        raw = (_read(src) or "").strip()
        if raw:
            return {"status": "recorded", "source": src,
                    "sha256": hashlib.sha256(f"edge-harness-machine|{raw}".encode()).hexdigest()}
    return {"status": "unreadable", "source": UNKNOWN, "sha256": UNKNOWN}


def key_inputs(host: dict) -> dict:
    """What changes results, and nothing that changes every boot: machine identity, CPU identity and
    flags, cores, memory size (whole GiB), the emulated hardware class. Microcode, kernel, load and free
    memory are recorded beside it, not keyed."""
    cpu = host.get("cpu", {})
    total = host.get("memory", {}).get("total_bytes")
    ident = host.get("identity", {})
    if ident.get("status", "").startswith("legacy"):
        # a record from before identities: the key is derived from what it recorded, never invented
        return {"legacy": True, "model": cpu.get("model"), "arch": cpu.get("arch"),
                "isa": sorted(k for k, v in cpu.get("isa", {}).items() if v),
                "logical_cores": cpu.get("logical_cores"), "physical_cores": cpu.get("physical_cores"),
                "memory_gib": round(total / 2**30) if isinstance(total, int) else UNKNOWN}
    return {"machine": ident.get("sha256", UNKNOWN),
            **{k: cpu.get(k, UNKNOWN) for k in ("vendor", "model", "family", "model_number", "stepping", "arch",
                                               "flags_sha256", "logical_cores", "physical_cores", "sockets")},
            "memory_gib": round(total / 2**30) if isinstance(total, int) else UNKNOWN,
            "emulation": host.get("emulation")}


def host_key(host: dict) -> str:
    """The short name of a measuring machine: 12 hex digits of the sha256 of `key_inputs`."""
    blob = json.dumps(key_inputs(host), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def topology(sys_cpu: str = "/sys/devices/system/cpu") -> dict:
    online = _read(f"{sys_cpu}/online")
    logical = _parse_cpulist(online) if online else list(range(os.cpu_count() or 0))
    cores = set()
    packages = set()
    for c in logical:
        core = _read(f"{sys_cpu}/cpu{c}/topology/core_id")
        pkg = _read(f"{sys_cpu}/cpu{c}/topology/physical_package_id")
        if core is None:
            return {"logical_cores": len(logical), "physical_cores": UNKNOWN, "online_cpus": logical}
        cores.add((pkg.strip() if pkg else "0", core.strip()))
        packages.add(pkg.strip() if pkg else "0")
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except AttributeError:
        affinity = logical
    return {"logical_cores": len(logical), "physical_cores": len(cores), "sockets": len(packages),
            "threads_per_core": len(logical) // max(1, len(cores)), "online_cpus": logical, "affinity": affinity}


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
    """The whole host profile, as a JSON-ready dict, with its `key` (see host_key)."""
    cpu = cpu_info()
    host = {
        "identity": machine_identity(),
        "cpu": {"arch": platform.machine() or UNKNOWN, **cpu, **topology(), "caches": caches()},
        "numa": numa_nodes(),
        "memory": meminfo(),
        "cgroup": cgroup_limits(),
        "kernel": platform.release() or UNKNOWN,
        "os": os_release(),
        "governor": governor(),
        "loadavg": loadavg(),
        "hostname": platform.node() or UNKNOWN,
        "python": platform.python_version(),
        "emulation": None,  # the hardware class a run is emulating; none yet: every run is native
    }
    return {"key": host_key(host), **host}


def describe(host: dict) -> str:
    """One line naming a host for a report: key, CPU, ISA tier, cores, memory."""
    cpu = host.get("cpu", {})
    total = host.get("memory", {}).get("total_bytes")
    mem = f"{total / 2**30:.1f} GiB" if isinstance(total, int) else "memory unknown"
    ident = host.get("identity", {}).get("status", UNKNOWN)
    cpuid = "" if cpu.get("family") in (None, UNKNOWN) else \
        f" (family {cpu.get('family')} model {cpu.get('model_number')} stepping {cpu.get('stepping')})"
    legacy = "; legacy record: machine identity not recorded" if ident.startswith("legacy") else ""
    emu = f"; emulating {host['emulation']}" if host.get("emulation") else ""
    return (f"host `{host.get('key', UNKNOWN)}`: {cpu.get('model', UNKNOWN)}{cpuid}, ISA tier "
            f"{cpu.get('isa_tier') or isa_tier(cpu.get('isa', {}))}, {cpu.get('physical_cores', UNKNOWN)} physical / "
            f"{cpu.get('logical_cores', UNKNOWN)} logical cores, {mem}{emu}{legacy}")
