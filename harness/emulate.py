"""Hardware emulation: run an engine under a smaller hardware class's caps on a machine that exceeds them.

Each cap is applied and read back, and recorded in the artifact's `execution.emulation`:
- cores: the engine is pinned to the class's core count (the affinity read back from the engine process);
- memory: a locked balloon (harness/balloon.py) takes the machine's available memory down to the class's
  before the engine starts (MemAvailable read back at engine start; vLLM also records what it saw);
- ISA: each engine's IsaCap says how (harness/engines/capabilities.py): the environment its process gets
  (isa_env; by default torch's ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA), the build it provisions for the
  tier (llama.cpp's capped build), and what it read back (isa_record: llama.cpp's system info, the vLLM
  worker's torch capability and kernel library). A cap an engine cannot take is recorded "not emulated: why",
  never silently native.
The emulated class is part of the host key (probe.key_inputs): emulated and native runs never pool.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from harness import hardware
from harness.engines.capabilities import IsaCap, capability
from harness.errors import UserError
from harness.rules import MEMORY_TOLERANCE  # the balloon is judged to hold the class's memory within it


@dataclass
class Emulation:
    cls: hardware.HardwareClass
    native: dict[str, Any]  # this machine's profile
    cpus: list[int]
    env: dict[str, str] = field(default_factory=dict)
    isa_variant: str | None = None  # the ISA tier the engines' builds are capped at (their variant); None: native
    balloons: list = field(default_factory=list)
    balloon_bytes: int = 0
    available_at_start: int | None = None
    settled: dict | None = None  # the wait after the balloon was released (settle())

    @property
    def isa_capped(self) -> bool:
        return self.cls.isa_tier != self.native["isa_tier"]


def class_sha256(name: str) -> str:
    return hashlib.sha256((hardware.CLASSES_DIR / f"{name}.yaml").read_bytes()).hexdigest()


def plan(name: str, threads: int, arm_cpus: list[int] | None, where: str, engine: Any = None) -> Emulation:
    """Check that this machine can emulate the class at these threads; no side effect. The ISA cap's environment
    is the engine's (its IsaCap.isa_env; no engine: the default's, torch's switches, as calibration's kernels)."""
    hc = hardware.get_class(name)
    native = hardware.profile_from_probe(_probe())
    why = hardware.exceeds(hc, native)
    if why:
        raise UserError(where, f"hardware {name}: this machine cannot emulate it ({'; '.join(why)})",
                        "choose a class within this machine (`harness probe` lists them) or run it on a bigger one")
    if threads > hc.cores:
        raise UserError(where, f"threads {threads} exceed hardware {name}'s {hc.cores} cores",
                        f"use at most {hc.cores} threads with this class")
    cpus = arm_cpus or native["cpus"][:threads]  # as natively: the first `threads` CPUs, within the class's cores
    if len(cpus) > hc.cores:
        raise UserError(where, f"cpus {cpus} are more than hardware {name}'s {hc.cores} cores", "list fewer cpus")
    em = Emulation(cls=hc, native=native, cpus=list(cpus))
    if hc.arch == "x86_64" and em.isa_capped:
        em.env = (capability(engine, IsaCap) if engine is not None else IsaCap()).isa_env(hc.isa_tier)
        em.isa_variant = hc.isa_tier
    return em


def _probe() -> dict:
    from harness.provenance import host_static
    return host_static()


def inflate(em: Emulation) -> None:
    """Take the machine's available memory down to the class's (a locked balloon); read it back."""
    from harness.balloon import Balloon
    from harness.probe import meminfo
    target = int(em.cls.memory_gib * hardware.GIB)
    em.balloons = []
    # MemAvailable counts reclaimable page cache: locking N bytes can lower it by less than N. Top up (at most
    # three balloons) until it is within the tolerance above the class's memory.
    for _ in range(3):
        avail = meminfo().get("available_bytes")
        if not isinstance(avail, int) or avail <= target * (1 + MEMORY_TOLERANCE / 2):
            break
        try:
            em.balloons.append(Balloon(avail - target))
        except RuntimeError as e:
            deflate(em)
            raise UserError(f"hardware {em.cls.name}", f"memory cap: {e}", "free memory on this machine, or use a "
                            "class with more memory") from e
    em.balloon_bytes = sum(b.requested for b in em.balloons)
    after = meminfo().get("available_bytes")
    em.available_at_start = after if isinstance(after, int) else None


class Applied:
    """emulate.applied's handle: after the block, whether the memory cap held to the end."""
    held: bool = True


@contextlib.contextmanager
def applied(em: "Emulation | None", engine: Any):
    """Run the block under an emulated class's caps (nothing for None): the engine's build capped at the class's
    ISA tier, provisioned first where the engine has one (`engine` None: none, as calibration's kernels); the
    balloon inflated before the block and released after it, the handle's `held` then saying whether it held."""
    handle = Applied()
    if em is None:
        yield handle
        return
    if em.isa_variant and engine is not None:
        engine.provision(em.isa_variant)  # the capped build, made before anything is measured
    inflate(em)
    try:
        yield handle
    finally:
        handle.held = deflate(em)


def as_host(em: Emulation, host: dict) -> dict:
    """The host of a run under an emulated class: a host of its own (the class is part of its key), the machine
    it was emulated on kept as machine_key (the report's series)."""
    from harness.probe import host_key
    out = {**host, "machine_key": host["key"], "emulation": em.cls.name}
    out["key"] = host_key(out)
    return out


def deflate(em: Emulation) -> bool:
    """Release the balloon; whether it held to the end (a balloon killed mid-run means the cap lapsed)."""
    alive = all(b.proc.poll() is None for b in em.balloons)
    for b in em.balloons:
        b.close()
    if em.balloons:
        em.settled = settle()
    return alive


def settle(quiet_cores: float = 0.1, window_s: float = 0.5, quiet_for_s: float = 8.0, max_s: float = 120.0,
           probe=None) -> dict:
    """Wait until the host is quiet after a balloon is released, with every CPU busy while it watches.

    Returning tens of GiB makes the hypervisor reclaim them in bursts for about half a minute (seen with a
    busy-CPU probe after deflating a balloon on the AVX2 host; not stored). An idle guest hardly sees steal
    (a vCPU that does not ask to run is not robbed), so watching an idle machine says "quiet" at once, and
    in hardware-ladder's first two series the native llama.cpp runs after an emulated one lost steal. So:
    spin on every CPU for window_s, read steal and other busy time from /proc/stat, and return once every
    window for quiet_for_s stayed below quiet_cores of steal (at most max_s). Returns what it saw: seconds
    waited, windows, the largest steal seen, whether it settled."""
    import time
    t0 = time.time()
    probe = probe or _steal_probe
    quiet_since, worst, windows = None, 0.0, 0
    while time.time() - t0 < max_s:
        steal = probe(window_s)
        windows += 1
        worst = max(worst, steal)
        now = time.time()
        if steal >= quiet_cores:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now - window_s
        if quiet_since is not None and now - quiet_since >= quiet_for_s:
            return {"waited_s": round(now - t0, 1), "windows": windows, "max_steal_cores": round(worst, 3),
                    "settled": True, "rule": f"every {window_s} s window under {quiet_cores} cores of steal for "
                                             f"{quiet_for_s} s, all CPUs busy"}
    return {"waited_s": round(time.time() - t0, 1), "windows": windows, "max_steal_cores": round(worst, 3),
            "settled": False, "rule": f"gave up after {max_s} s"}


def _spin(seconds: float) -> None:
    import time
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _steal_probe(window_s: float) -> float:
    """Cores of steal while every CPU of this process's affinity spins for window_s (multiprocessing)."""
    import multiprocessing as mp
    import time

    from harness.provenance import cpu_accounting
    ctx = mp.get_context("fork")
    a, t0 = cpu_accounting().get("steal_s"), time.time()
    procs = [ctx.Process(target=_spin, args=(window_s,)) for _ in os.sched_getaffinity(0)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    b = cpu_accounting().get("steal_s")
    return 0.0 if a is None or b is None else (b - a) / max(time.time() - t0, 1e-6)


def status(ok: bool, why: str) -> str:
    return "emulated" if ok else f"not emulated: {why}"



UNVERIFIED = "unverified: the run failed before the engine reported what it used"


def record(em: Emulation, engine: str, effective: dict, settings: dict, balloon_held: bool) -> dict:
    """The artifact's execution.emulation: each cap as requested, applied and read back, with its status."""
    hc = em.cls
    aff = (settings.get("cpus") or {}).get("effective")
    cores_ok = isinstance(aff, list) and 0 < len(aff) <= hc.cores
    target = int(hc.memory_gib * hardware.GIB)
    avail = em.available_at_start
    mem_ok = balloon_held and isinstance(avail, int) and abs(avail - target) <= MEMORY_TOLERANCE * target
    locked = bool(em.balloons) and all(b.state.get("locked") for b in em.balloons)
    caps: dict[str, Any] = {
        "cores": {"requested": hc.cores, "applied": f"taskset -c {','.join(map(str, em.cpus))}",
                  "effective": aff, "source": "the engine process's affinity (execution.settings.cpus)",
                  "status": status(cores_ok, f"the engine ran on {aff}")},
        "memory": {"requested_bytes": target,
                   "applied": (f"balloon of {em.balloon_bytes} B in {len(em.balloons)} part(s) "
                               f"({'locked' if locked else 'resident, not all locked'})"
                               if em.balloons else "none needed: the machine had no more available"),
                   "effective_available_bytes": avail, "source": "MemAvailable (/proc/meminfo) at engine start",
                   "engine_view_bytes": effective.get("memory_available_seen"),
                   "status": status(mem_ok, "the balloon did not hold" if not balloon_held else
                                     f"{avail} B available at start, class {target} B")},
    }
    caps["isa"] = isa_record(em, engine, effective)
    if not settings:  # a failed run read nothing back: its caps were applied, never confirmed
        caps["cores"]["status"] = UNVERIFIED
        if caps["isa"]["status"] != "emulated" or em.isa_capped:
            caps["isa"]["status"] = UNVERIFIED
    return {"class": hc.name, "class_sha256": class_sha256(hc.name), "native_tier": em.native["isa_tier"],
            "caps": caps, "emulated": all(c["status"] == "emulated" for c in caps.values()),
            "after_release": em.settled,
            "not_emulated": "cache sizes, memory bandwidth, clock and thermal limits are the machine's own "
                            "(docs/hardware.md)"}


def isa_record(em: Emulation, engine: str, effective: dict) -> dict:
    """The ISA cap: how the engine took it and read it back (its package's isa_record)."""
    from harness.engines import get_engine
    tier = em.cls.isa_tier
    base = {"requested": tier, "native": em.native["isa_tier"]}
    if not em.isa_capped:
        return {**base, "applied": "none: the class's tier is this machine's", "status": "emulated"}
    return {**base, **capability(get_engine(engine), IsaCap).isa_record(tier, em.env, effective)}
