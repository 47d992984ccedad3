"""The machine's physical ceiling: memory read bandwidth and peak matrix FLOP/s at 1..N threads.

`harness probe --bandwidth` measures both in a fresh process per thread count (torch, whose
OpenMP pool is sized once per process) and stores a `calibration` artifact. The report divides
each engine's decode (weight bytes per token x tokens per second) by the bandwidth at the same
thread count, and its prefill (2 x parameters FLOP per token x tokens per second) by the peak.

Bandwidth kernel, STREAM-like: a sum over a 1 GiB fp32 tensor (read-only, far beyond the caches),
bytes read / wall time; FLOP/s kernel: a 2048 x 2048 matrix product, 2n^3 / wall time, in fp32
and bf16. Each is the best of its repetitions after one warm-up (the ceiling is the best the
machine reached; the samples are all kept).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from harness import artifact, documents, hardware, provenance
from harness.engines.base import run_process
from harness.errors import UserError
from harness.paths import PROJECT_ROOT
from harness.store import Store

BANDWIDTH_BYTES = 1 << 30
MATMUL_N = 2048
# Without bf16 compute (no AVX512-BF16 / AMX), torch emulates bf16 matmul two orders of magnitude slower
# than fp32: a 2048^2 product then takes minutes per repetition. Such hosts measure bf16 at 512^2.
MATMUL_N_EMULATED_BF16 = 512
DEFINITIONS = {
    "read_bandwidth_gb_s": f"torch.sum over a {BANDWIDTH_BYTES >> 20} MiB fp32 tensor: bytes read / wall time, "
                           "10^9 bytes per GB; one warm-up, then each repetition a sample",
    "matmul_gflop_s_fp32": f"torch.mm of two {MATMUL_N}x{MATMUL_N} fp32 matrices: 2n^3 / wall time, 10^9 FLOP",
    "matmul_gflop_s_bf16": f"torch.mm of two nxn bf16 matrices, n = {MATMUL_N} where the CPU computes in bf16, else "
                           f"{MATMUL_N_EMULATED_BF16} (emulated bf16; n per run in results[].matmul_n): 2n^3 / wall "
                           "time, 10^9 FLOP",
}


def _kernel(threads: int, reps: int, bf16_compute: bool | None = None) -> dict:
    """Runs inside a fresh process: the measurements at one thread count. `bf16_compute`: the emulated class's
    (None: this CPU's)."""
    import torch
    torch.set_num_threads(threads)
    out: dict[str, list[float]] = {}
    x = torch.ones(BANDWIDTH_BYTES // 4, dtype=torch.float32)
    samples = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        x.sum()
        dt_ = time.perf_counter() - t0
        if i:
            samples.append(BANDWIDTH_BYTES / dt_ / 1e9)
    out["read_bandwidth_gb_s"] = samples
    del x
    from harness.probe import cpu_info
    bf16 = cpu_info().get("bf16_compute") if bf16_compute is None else bf16_compute
    sizes = {"fp32": MATMUL_N, "bf16": MATMUL_N if bf16 else MATMUL_N_EMULATED_BF16}
    for key, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        n = sizes[key]
        a = torch.randn(n, n).to(dtype)
        b = torch.randn(n, n).to(dtype)
        samples = []
        for i in range(reps + 1):
            t0 = time.perf_counter()
            torch.mm(a, b)
            dt_ = time.perf_counter() - t0
            if i:
                samples.append(2 * n ** 3 / dt_ / 1e9)
        out[f"matmul_gflop_s_{key}"] = samples
    return {"threads": threads, "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "samples": out,
            "matmul_n": sizes, "torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}


def measure(max_threads: int | None = None, reps: int = 5, store_root: str = "baselines", out=None,
            hw_class: str | None = None) -> Path:
    """The calibration of this machine, or of a hardware class emulated on it (`hw_class`: its cores, memory
    and ISA caps; the artifact's host is then that class's, and the report sets that class's runs against it)."""
    out = out or sys.stderr
    allowed = sorted(os.sched_getaffinity(0))
    em = None
    if hw_class:
        from harness import emulate
        cls = emulate.hardware.get_class(hw_class)
        em = emulate.plan(hw_class, cls.cores, None, "harness probe --bandwidth --class")
        allowed = em.cpus
        max_threads = min(max_threads or len(allowed), len(allowed))
    n = len(allowed) if max_threads is None else max_threads
    if not 1 <= n <= len(allowed):
        raise UserError("harness probe --bandwidth", f"--max-threads: {n} is not between 1 and the {len(allowed)} CPU(s) "
                        "this process may use", f"pass --max-threads 1..{len(allowed)}")
    if reps < 1:
        raise UserError("harness probe --bandwidth", f"--repetitions: must be at least 1, got {reps}", "pass 1 or more")
    bf16 = None
    if em:
        from harness import hardware
        bf16 = bool(hardware.profile_from_class(em.cls, "")["isa"].get("avx512_bf16"))
    from harness import emulate
    with emulate.applied(em, None) as applied:  # no engine: the kernels run under the class's env caps
        span = provenance.Span()
        per_threads = _measure_threads(n, reps, allowed, em.env if em else {}, bf16, out)
        host, timing = span.finish()
    held = applied.held
    method_emulation = None
    if em:
        host = emulate.as_host(em, host)
        caps = {"torch_cpu_capability": sorted({r["torch_cpu_capability"] for r in per_threads}),
                "memory_available_at_start": em.available_at_start, "balloon_held": held,
                "cpus": allowed, "env": em.env}
        method_emulation = {"class": em.cls.name, "class_sha256": emulate.class_sha256(em.cls.name), **caps}
    a = documents.calibration(
        command=f"harness probe --bandwidth --max-threads {n} --repetitions {reps}"
        + (f" --class {hw_class}" if hw_class else ""), host=host, timing=timing,
        method={"definitions": DEFINITIONS, "repetitions": reps, "warmups": 1, "process_per_thread_count": True,
                "affinity": "taskset to the first N allowed CPUs",
                **({"emulation": method_emulation} if method_emulation else {})},
        results=per_threads)
    return Store(Path(store_root)).write(a)


KERNEL_TIMEOUT_S = 1800  # one thread count's kernel run; minutes on a 2-core machine at most


def _measure_threads(n: int, reps: int, allowed: list[int], extra_env: dict, bf16: bool | None, out) -> list[dict]:
    per_threads = []
    for t in range(1, n + 1):
        cmd = [sys.executable, "-c", "import json; from harness.ceiling import _kernel; "
               f"print(json.dumps(_kernel({t}, {reps}, {bf16!r})))"]
        env = {**os.environ, "OMP_NUM_THREADS": str(t), **extra_env}
        cpus = ",".join(str(c) for c in allowed[:t])
        # contained like every process the harness starts (it and anything it starts die at its end)
        r = run_process(["taskset", "-c", cpus, *cmd], env, KERNEL_TIMEOUT_S, poll_s=None)
        if r.timed_out:
            raise UserError("harness probe --bandwidth", f"kernel at {t} thread(s) ran past {KERNEL_TIMEOUT_S} s",
                            "run it on an idle machine, or with fewer --repetitions")
        if r.returncode != 0:
            raise UserError("harness probe --bandwidth", f"kernel at {t} thread(s) exited {r.returncode}: "
                            f"{(r.stderr.strip().splitlines() or ['no output'])[-1]}", "see the message")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        per_threads.append(res)
        best = {k: max(v) for k, v in res["samples"].items()}
        print(f"[ceiling] {t} thread(s): read {best['read_bandwidth_gb_s']:.1f} GB/s, fp32 "
              f"{best['matmul_gflop_s_fp32']:.0f} GFLOP/s, bf16 {best['matmul_gflop_s_bf16']:.0f} GFLOP/s", file=out)
    return per_threads


def best_by_threads(cal: "artifact.CalibrationArtifact") -> dict[int, dict[str, float]]:
    return {r["threads"]: {k: max(v) for k, v in r["samples"].items()} for r in cal.results}


BANDWIDTH_TIERS = ((10.0, "<10 GB/s"), (25.0, "10-25 GB/s"), (50.0, "25-50 GB/s"), (float("inf"), ">=50 GB/s"))


def bandwidth_tier(host_key: str, store: Path | None = None, emulation: str | None = None) -> tuple[str | None, str]:
    """The read-bandwidth tier of a host (or of a class emulated on it) from its newest calibration at its
    most threads; None where it has none (with the command that measures one)."""
    from harness.store import Store
    root = Path(store or PROJECT_ROOT / "baselines")
    from harness.check.accepted import load_accepted
    cals = [a for a in load_accepted(Store(root), "calibration")[0]
            if a.host.key == host_key and (a.host.emulation or None) == emulation]
    if not cals:
        return None, f"no calibration of host {host_key} in {root}: run `harness probe --bandwidth`"
    cal = max(cals, key=lambda c: c.timing.end)
    best = best_by_threads(cal)
    n = max(best)
    gbs = best[n].get("read_bandwidth_gb_s")
    if gbs is None:
        return None, f"calibration {cal.id[:12]} has no read bandwidth"
    tier = next(name for top, name in BANDWIDTH_TIERS if gbs < top)
    return tier, f"{gbs:.1f} GB/s read at {n} threads, calibration {cal.id[:12]}"


def describe_machine(host: dict) -> dict[str, Any]:
    """What `harness probe` adds about the machine's class: its descriptive class, tier, cores, memory,
    bandwidth tier, the committed classes it matches and those it can emulate (and why not the others)."""
    prof = hardware.profile_from_probe(host)
    bw, bw_ev = bandwidth_tier(host["key"])
    can, cannot = [], {}
    for name, hc in hardware.classes().items():
        why = hardware.exceeds(hc, prof)
        (cannot.__setitem__(name, "; ".join(why)) if why else can.append(name))
    return {"class": hardware.class_name_of(prof), "arch": prof["arch"], "isa_tier": prof["isa_tier"], "cores": prof["cores"],
            "clusters": prof["clusters"] or "none reported (all cores alike)",
            "memory_gib": round(prof["memory_total_bytes"] / hardware.GIB, 1) if isinstance(prof["memory_total_bytes"], int)
            else "unknown", "bandwidth_tier": bw, "bandwidth_evidence": bw_ev,
            "can_emulate": can, "cannot_emulate": cannot}
