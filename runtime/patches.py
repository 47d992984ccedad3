"""The runtime's patches: each with the defect it fixes, the extension point it uses, a detector
that says whether the installed vLLM still has the defect, and a source hash for the manifest.

Selection: EDGE_HARNESS_PATCHES = "all" (default), "none", or a comma-separated list of names, where "all"
means every fix; an instrument (step-attribution: it measures, it changes no computation) and a candidate
(a speed patch whose stock-vs-patched series is not yet published: decode-gemv, cpu-norm-kernels) are
applied only when named, alone or after "all" ("all,step-attribution", "all,decode-gemv").
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
from dataclasses import dataclass
from typing import Callable

ENV = "EDGE_HARNESS_PATCHES"
KV_BLOCK = 128  # vLLM's CPU KV block size (read back as effective.block_size)


@dataclass(frozen=True)
class Patch:
    name: str
    defect: str
    extension_point: str
    detect: Callable[[], dict]
    implementation: Callable
    instrument: bool = False  # measures without changing what the engine computes; never part of "all"
    candidate: bool = False  # a speed patch on trial: opt-in (not in "all") until its A/B is published
    modules: tuple[str, ...] = ()  # runtime modules holding the implementation: their source is in the hash


def _meminfo_total() -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def detect_node_fraction_refusal() -> dict:
    """Stock CPU worker requests gpu_memory_utilization x NUMA node 0's total and refuses to start
    when that exceeds the node's available memory. Defective where the node reports less than
    the machine, or where the fraction of the node is more than it has available."""
    try:
        from vllm.utils.cpu_resource_utils import get_memory_node_info
        from vllm.v1.worker import cpu_worker
    except Exception as e:  # noqa: BLE001 - a detector reports, never raises
        return {"defective": None, "evidence": f"cannot import vLLM's CPU worker: {e}"}
    src = inspect.getsource(cpu_worker)
    uses_fraction = bool(re.search(r"total_memory\s*\*\s*memory_fraction", src))
    if not uses_fraction:
        return {"defective": False, "evidence": "CPU worker no longer sizes memory as a fraction of a node's total"}
    node = get_memory_node_info(0)
    requested = int(node.total_memory * 0.92)
    machine = _meminfo_total()
    refuses = requested > node.available_memory
    # Defective whenever the fraction rule is there: it either refuses to start or takes most of
    # the node for KV whatever the context; the node's numbers say which one happens right now.
    return {"defective": True,
            "evidence": f"node0 total {node.total_memory} B, available {node.available_memory} B, 0.92 x total = "
                        f"{requested} B ({'refuses' if refuses else 'starts'} now); /proc/meminfo total {machine} B"}


def detect_legacy_env_overrides_explicit_kv() -> dict:
    """Stock CpuPlatform.check_and_update_config lets the legacy VLLM_CPU_KVCACHE_SPACE overwrite an
    explicit kv_cache_memory_bytes (an older vLLM overwrote it unconditionally)."""
    try:
        from vllm.platforms.cpu import CpuPlatform
    except Exception as e:  # noqa: BLE001
        return {"defective": None, "evidence": f"cannot import CpuPlatform: {e}"}
    src = inspect.getsource(CpuPlatform.check_and_update_config)
    overwrites = bool(re.search(r"cache_config\.kv_cache_memory_bytes\s*=", src))
    guarded = bool(re.search(r"kv_cache_memory_bytes\s+is\s+None", src))
    return {"defective": overwrites and not guarded,
            "evidence": "check_and_update_config assigns kv_cache_memory_bytes "
                        + ("without checking for an explicit value" if overwrites and not guarded else
                           "only when unset" if overwrites else "nowhere")}


def _bind_list(env=os.environ) -> list[int]:
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if not bind or bind in ("auto", "nobind", "all") or "|" in bind:
        return []
    return _cpulist(bind)


def detect_bind_ignored_in_process() -> dict:
    """VLLM_CPU_OMP_THREADS_BIND is applied only by the multiprocess executor (OMPProcessManager sets
    OMP_NUM_THREADS/OMP_PLACES for the worker processes it spawns). With the engine core in-process,
    torch keeps one thread per core and the process its full affinity, whatever the bind list says."""
    import torch
    cpus = _bind_list()
    if not cpus:
        return {"defective": False, "evidence": "no explicit CPU list in VLLM_CPU_OMP_THREADS_BIND"}
    threads, affinity = torch.get_num_threads(), sorted(os.sched_getaffinity(0))
    ok = threads == len(cpus) and affinity == sorted(cpus)
    return {"defective": not ok,
            "evidence": f"bind list {cpus}, this process: torch threads {threads}, affinity {affinity}"}


def _cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            cpus.extend(range(int(a), int(b) + 1))
        elif part.strip():
            cpus.append(int(part))
    return cpus


APPLIED: dict[str, dict] = {}  # what each applied patch did in this process


def kv_bytes_per_token(hf_config, dtype_size: int) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x dtype size."""
    get = hf_config.get if isinstance(hf_config, dict) else (lambda k, d=None: getattr(hf_config, k, d))
    heads = get("num_attention_heads")
    kv_heads = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or get("hidden_size") // heads
    return 2 * get("num_hidden_layers") * kv_heads * head_dim * dtype_size


def kv_budget(hf_config, dtype_size: int, context_len: int, max_num_seqs: int, block: int = KV_BLOCK) -> int:
    """The KV cache for context_len x max_num_seqs in whole blocks, plus vLLM's reserved null block."""
    return kv_bytes_per_token(hf_config, dtype_size) * (-(-context_len // block) * max_num_seqs + 1) * block


def apply_kv_budget(vllm_config) -> dict:
    """Platform hook: size the KV cache exactly from the model's geometry and the run's shape."""
    import torch
    cache = vllm_config.cache_config
    if cache.kv_cache_memory_bytes is not None:
        return {"requested": cache.kv_cache_memory_bytes, "effective": cache.kv_cache_memory_bytes,
                "note": "explicit value kept"}
    mc = vllm_config.model_config
    kv_dtype = mc.dtype if cache.cache_dtype in (None, "auto") else getattr(torch, str(cache.cache_dtype), mc.dtype)
    size = torch.empty((), dtype=kv_dtype).element_size()
    budget = kv_budget(mc.hf_text_config, size, mc.max_model_len, vllm_config.scheduler_config.max_num_seqs,
                       cache.block_size or KV_BLOCK)
    cache.kv_cache_memory_bytes = budget
    return {"requested": None, "effective": budget,
            "rule": "2 x layers x kv_heads x head_dim x dtype size x (ceil(max_model_len/block) x max_num_seqs + 1) x block"}


def apply_explicit_kv_wins(vllm_config, explicit: int | None) -> dict:
    """Platform hook: an explicit kv_cache_memory_bytes survives the legacy VLLM_CPU_KVCACHE_SPACE."""
    cache = vllm_config.cache_config
    if explicit is not None and cache.kv_cache_memory_bytes != explicit:
        overwritten = cache.kv_cache_memory_bytes
        cache.kv_cache_memory_bytes = explicit
        return {"requested": explicit, "overwritten_by_stock": overwritten, "effective": explicit}
    return {"requested": explicit, "effective": cache.kv_cache_memory_bytes}


def apply_step_attribution() -> dict:
    """General plugin: time every part of each LLMEngine.step() (runtime/attribution.py)."""
    from runtime import attribution
    return attribution.install()


def _detect_step_attribution() -> dict:
    from runtime.attribution import detect_no_step_attribution
    return detect_no_step_attribution()


def apply_aot_cache_load() -> dict:
    """General plugin: vLLM's AOT compile cache loads on the CPU (runtime/aotload.py)."""
    from runtime import aotload
    return aotload.install()


def _detect_aot_cache_load() -> dict:
    from runtime.aotload import detect_finalize_on_plain_function
    return detect_finalize_on_plain_function()


def apply_decode_gemv() -> dict:
    """General plugin, before the model loads: decode-sized linear layers through runtime/gemv.py's kernel."""
    from runtime import gemv
    return gemv.install()


def _detect_decode_gemv() -> dict:
    from runtime.gemv import detect_no_decode_gemv
    return detect_no_decode_gemv()


def apply_cpu_norm_kernels() -> dict:
    """General plugin: register the CPU-kernel provider of vLLM's RMSNorm IR ops (runtime/norms.py); the
    runtime's platform puts it first in the CPU priority (EdgeCpuPlatform.get_default_ir_op_priority)."""
    from runtime import norms
    return norms.register()


def _detect_cpu_norm_kernels() -> dict:
    from runtime.norms import detect_native_norms_on_cpu
    return detect_native_norms_on_cpu()


def apply_threads_follow_bind() -> dict:
    """General plugin, before the CPU worker forbids torch.set_num_threads: this process's torch threads
    and CPU affinity follow the bind list (threads started later inherit the affinity)."""
    import torch
    cpus = _bind_list()
    before = {"torch_threads": torch.get_num_threads(), "affinity": sorted(os.sched_getaffinity(0))}
    os.sched_setaffinity(0, set(cpus))
    torch.set_num_threads(len(cpus))
    return {"requested": cpus, "before": before,
            "effective": {"torch_threads": torch.get_num_threads(), "affinity": sorted(os.sched_getaffinity(0))}}


PATCHES: tuple[Patch, ...] = (
    Patch("kv-budget-from-geometry",
          "at default settings the CPU worker sizes the KV cache as 0.92 x NUMA node 0's total memory minus its "
          "RSS, whatever the context: it refuses to start when the node has less available (node 0 reported "
          "12.5 GiB of this machine's 24 GiB), or allocates ~20 GiB of KV for a 64-token context",
          "vllm.platform_plugins: EdgeCpuPlatform.check_and_update_config", detect_node_fraction_refusal,
          apply_kv_budget),
    Patch("explicit-kv-wins",
          "the legacy VLLM_CPU_KVCACHE_SPACE silently overwrites an explicit kv_cache_memory_bytes",
          "vllm.platform_plugins: EdgeCpuPlatform.check_and_update_config",
          detect_legacy_env_overrides_explicit_kv, apply_explicit_kv_wins),
    Patch("threads-follow-bind",
          "with the engine core in-process, VLLM_CPU_OMP_THREADS_BIND is ignored (only the multiprocess "
          "executor applies it to the workers it spawns): asked for 1 thread, vLLM ran torch with 2 and the "
          "process on both CPUs (decode-threads grid, first series)",
          "vllm.general_plugins: runtime.plugin.register", detect_bind_ignored_in_process,
          apply_threads_follow_bind),
    Patch("aot-cache-load",
          "with eager: false every CPU worker compiles the model again although the compile cache holds it: "
          "vLLM's AOT loader calls finalize_loading() on what it loaded, a method of its own compiled-function "
          "class, but the CPU platform's inductor backend loads as a plain function ('function' object has no "
          "attribute 'finalize_loading'), so the load fails and the worker compiles from scratch",
          "vllm.general_plugins: runtime.plugin.register wraps torch.compiler.load_compiled_function "
          "(runtime/aotload.py)", _detect_aot_cache_load, apply_aot_cache_load, modules=("runtime.aotload",)),
    Patch("step-attribution",
          "vLLM does not say where a decode step's time goes: its statistics time requests, not the parts of a "
          "step (scheduling, input preparation, forward, sampling, output processing, detokenization)",
          "vllm.general_plugins: runtime.plugin.register (class-level wrappers, runtime/attribution.py)",
          _detect_step_attribution, apply_step_attribution, instrument=True, modules=("runtime.attribution",)),
    Patch("decode-gemv",
          "at batch 1 every CPU linear layer runs oneDNN's matmul (or ATen's) whatever the number of tokens: "
          "per weight shape it streams fp32 weights at 34-52% of the read bandwidth on the AVX2 host "
          "(runtime/gemv_bench.py), where llama.cpp's dot products reach ~70%; vLLM's decode forward is ~96% "
          "of its step (step-attribution)",
          "vllm.general_plugins: runtime.plugin.register wraps vllm.model_executor.layers.utils."
          "dispatch_cpu_unquantized_gemm (runtime/gemv.py: an AVX2 matrix-vector kernel up to 4 tokens)",
          _detect_decode_gemv, apply_decode_gemv, candidate=True, modules=("runtime.gemv",)),
    Patch("cpu-norm-kernels",
          "on the CPU every RMSNorm runs the PyTorch-native composition (~10 eager ATen calls, two norms a layer "
          "per step): vLLM's IR priority for the CPU platform is [native] and its C++ provider is registered for "
          "CUDA-alike and XPU only, though its CPU build ships the same kernels",
          "vllm.general_plugins (provider edge_cpu_c on vllm.ir.ops.rms_norm and fused_add_rms_norm) and "
          "vllm.platform_plugins: EdgeCpuPlatform.get_default_ir_op_priority (runtime/norms.py)",
          _detect_cpu_norm_kernels, apply_cpu_norm_kernels, candidate=True, modules=("runtime.norms",)),
)
NAMES = tuple(p.name for p in PATCHES)
FIXES = tuple(p.name for p in PATCHES if not (p.instrument or p.candidate))


def selected(env=os.environ) -> tuple[str, ...]:
    raw = env.get(ENV, "all").strip()
    if raw in ("", "all"):
        return FIXES
    if raw == "none":
        return ()
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    if "all" in names:
        names = FIXES + tuple(n for n in names if n != "all" and n not in FIXES)
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        raise ValueError(f"{ENV}: unknown patch {unknown[0]!r}; known: {', '.join(NAMES)}, all, none")
    return names


_VERDICTS: dict[str, dict] = {}


def verdict(name: str) -> dict:
    """The detector's verdict for one patch, once per process."""
    if name not in _VERDICTS:
        _VERDICTS[name] = next(p for p in PATCHES if p.name == name).detect()
    return _VERDICTS[name]


def should_apply(name: str, env=os.environ) -> bool:
    """Selected for this run, and the installed vLLM still has the defect (or it cannot be told)."""
    return name in selected(env) and verdict(name)["defective"] is not False


def source_sha256(p: Patch) -> str:
    import importlib
    h = hashlib.sha256(inspect.getsource(p.implementation).encode())
    for m in p.modules:
        h.update(inspect.getsource(importlib.import_module(m)).encode())
    return h.hexdigest()


def manifest(applied: dict[str, dict] | None = None, env=os.environ) -> list[dict]:
    """Each patch: name, detector verdict and evidence, whether applied (and what it did), source hash."""
    applied = applied or {}
    chosen = selected(env)
    out = []
    for p in PATCHES:
        v = verdict(p.name)
        out.append({"name": p.name, "defect": p.defect, "extension_point": p.extension_point,
                    "detector": {"defective": v["defective"], "evidence": v["evidence"]},
                    "instrument": p.instrument, "candidate": p.candidate, "selected": p.name in chosen,
                    "applied": p.name in applied and "declined" not in (applied[p.name] or {}),
                    "effect": applied.get(p.name), "source_sha256": source_sha256(p)})
    return out
