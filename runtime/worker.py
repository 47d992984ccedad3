"""One vLLM measurement in a fresh process: load, then per repetition submit `batch` requests together
(the prompt token ids given by the harness), each prefilling exactly prompt_len and decoding gen_len.

Usage: python -m runtime.worker CONFIG.json RESULT.json
Records per-token timestamps of every request, the number of requests the scheduler ran together, and
reads back the effective configuration from the engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _bind_env(cfg: dict) -> None:
    """Before vLLM is imported: the arm's threads through vLLM's public knob, the engine core in-process."""
    threads = int(cfg["threads"])
    cpus = cfg.get("cpus") or list(range(threads))
    # The arm's threads, through vLLM's public knob: its OpenMP threads bound to these CPUs.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpus)
    # In-process engine core unless the arm asks otherwise (engine_core: multiprocess): measured cheaper
    # to start here (grids/runtime-startup.yaml, docs/runtime.md), and its config is readable in-process.
    if cfg.get("engine_core") == "multiprocess":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    else:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _isa_cap() -> None:
    """Hardware emulation (EDGE_HARNESS_ISA_TIER, set by the harness with ATEN_CPU_CAPABILITY): after torch is
    imported and before vLLM is, torch's AVX-512 probes answer for the emulated tier, so that vLLM loads the
    kernel library of that tier (it picks one from these probes). Below AVX2 vLLM has no kernels: it keeps its
    AVX2 ones, and the harness records that cap as not emulated."""
    tier = os.environ.get("EDGE_HARNESS_ISA_TIER")
    if not tier:
        return
    import torch
    avx512 = tier in ("avx512", "avx512-bf16", "amx")
    bf16 = tier in ("avx512-bf16", "amx")
    real512, realbf16 = torch.cpu._is_avx512_supported, torch.cpu._is_avx512_bf16_supported
    torch.cpu._is_avx512_supported = lambda: avx512 and real512()
    torch.cpu._is_avx512_bf16_supported = lambda: bf16 and realbf16()


def _kernels_loaded() -> str | None:
    """The vLLM kernel library mapped into this process (_C, _C_AVX512, _C_AVX2), read from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            names = {os.path.basename(line.split()[-1]).split(".")[0] for line in f if "/vllm/_C" in line}
    except OSError:
        return None
    return ",".join(sorted(names)) or None


def _memory_seen() -> int | None:
    """Available memory as vLLM's CPU worker sizes from it (NUMA node 0), else the kernel's MemAvailable."""
    try:
        from vllm.utils.cpu_resource_utils import get_memory_node_info
        return int(get_memory_node_info(0).available_memory)
    except Exception:
        try:
            import psutil
            return int(psutil.virtual_memory().available)
        except Exception:
            return None


def _llm(cfg: dict, **extra):
    """The vLLM engine for one worker (after _bind_env)."""
    from vllm import LLM
    kv_requested = int(cfg["kv_cache_memory_bytes"]) if cfg.get("kv_cache_memory_bytes") else None
    return LLM(model=cfg["model_dir"], dtype=cfg.get("dtype", "float32"), max_model_len=int(cfg["context_len"]),
               max_num_seqs=int(cfg.get("max_num_seqs", 1)), enforce_eager=bool(cfg.get("eager", True)),
               kv_cache_memory_bytes=kv_requested, enable_prefix_caching=False, seed=0, trust_remote_code=False,
               **extra)


def _compilation_counts() -> dict:
    """vLLM's own counters of this process: whether the model was compiled here or loaded from the AOT cache."""
    try:
        from vllm.compilation.counter import compilation_counter as c
    except ImportError:
        return {"status": "vLLM has no compilation counter"}
    return {"aot_compiles": c.num_aot_compiles, "aot_artifacts_saved": c.num_aot_artifacts_saved,
            "aot_artifacts_loaded": c.num_aot_artifacts_loaded, "inductor_compiles": c.num_inductor_compiles}


def _linear_methods(llm) -> dict | str:
    """How many of the model's layers run each linear method (and, for quantized schemes, each scheme and kernel),
    read from the loaded model itself: e.g. {"UnquantizedLinearMethod": 30} or {"CompressedTensorsLinearMethod/
    CompressedTensorsWNA16/CPUWNA16LinearKernel": 210}; the path a 4-bit form took is this, not the form's name."""
    def count(model) -> dict:
        out: dict = {}
        for _, m in model.named_modules():
            qm = getattr(m, "quant_method", None)
            if qm is None:
                continue
            scheme = getattr(m, "scheme", None)
            kernel = getattr(scheme, "kernel", None) or getattr(qm, "kernel", None)
            key = "/".join(type(x).__name__ for x in (qm, scheme, kernel) if x is not None)
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))
    try:
        found = llm.apply_model(count)
        return found[0] if found else "unreadable: no worker answered"
    except Exception as e:  # e.g. a multiprocess engine core that does not ship the function
        return f"unreadable: {type(e).__name__}: {str(e)[:200]}"


def _scheduler(engine):
    """The engine core's scheduler, when the engine core runs in this process (else None)."""
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    return getattr(core, "scheduler", None)


def measure(cfg: dict) -> dict:
    threads = int(cfg["threads"])
    cpus = cfg.get("cpus") or list(range(threads))
    _bind_env(cfg)
    t_import = time.time()
    import torch
    _isa_cap()
    import vllm
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    model_dir = cfg["model_dir"]
    with open(os.path.join(model_dir, "config.json")) as f:
        hf_config = json.load(f)
    dtype = cfg.get("dtype", "float32")
    dtype_size = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    prompt_len, gen_len, context_len = int(cfg["prompt_len"]), int(cfg["gen_len"]), int(cfg["context_len"])
    max_num_seqs = int(cfg.get("max_num_seqs", 1))
    # None means vLLM's default sizing (stock) or the runtime's geometry-derived budget (patched)
    kv_requested = int(cfg["kv_cache_memory_bytes"]) if cfg.get("kv_cache_memory_bytes") else None
    memory_seen = _memory_seen()
    t0 = time.time()
    llm = _llm(cfg)
    t_loaded = time.time()
    after_load: dict = {"status": "not observed (arm observe: bare)"}
    try:
        if not cfg.get("observe", True):
            raise LookupError("not observed")
        from harness.residency import file_residency, smaps_rollup
        after_load = {"files": {f: file_residency(os.path.join(model_dir, f)) for f in cfg.get("weight_files", [])},
                      "memory": smaps_rollup(os.getpid()), "status": "ok"}
    except LookupError:
        pass
    except Exception as e:  # residency is provenance, not a reason to lose the run
        after_load = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    engine = llm.llm_engine
    linear_methods = _linear_methods(llm)
    from runtime import patches
    from vllm.platforms import current_platform
    patch_manifest = patches.manifest(patches.APPLIED)
    vc = engine.vllm_config
    scheduler = _scheduler(engine)
    from runtime import attribution
    # the parts are timed where the engine core runs: in this process unless it is multiprocess
    attributing = "step-attribution" in patches.APPLIED and scheduler is not None

    samples = []
    warmups = int(cfg.get("warmups", 1))
    for i, batch_ids in enumerate(cfg["prompts"]):
        if any(len(ids) != prompt_len for ids in batch_ids):
            raise ValueError(f"repetition {i}: a prompt is not {prompt_len} tokens")
        params = SamplingParams(max_tokens=gen_len, min_tokens=gen_len, ignore_eos=True, temperature=0.0)
        stamps: dict[str, list[float]] = {}
        seen: dict[str, int] = {}
        concurrent = 0
        t_start = time.perf_counter()
        for j, ids in enumerate(batch_ids):  # submitted together: the scheduler sees them all at its first step
            rid = f"r{i}-{j}"
            engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), params)
            stamps[rid], seen[rid] = [], 0
        steps: list[dict] = []
        if attributing:
            attribution.take()  # nothing before the first step of this repetition counts
        while engine.has_unfinished_requests():
            running = len(scheduler.running) if scheduler is not None else None
            outs = engine.step()
            now = time.perf_counter()
            emitted = first = 0
            for o in outs:
                n = len(o.outputs[0].token_ids)
                if n > seen[o.request_id]:
                    emitted += 1
                    first += seen[o.request_id] == 0
                stamps[o.request_id].extend([now] * (n - seen[o.request_id]))  # k tokens in one step: stamped at its end
                seen[o.request_id] = n
            # requests decoded together: the scheduler's running queue where readable, else those that emitted
            concurrent = max(concurrent, running if running is not None else emitted)
            if attributing:
                for rec in attribution.take():  # one per LLMEngine.step(): this step's parts, in seconds
                    steps.append({**rec, "emitted": emitted, "first_tokens": first, "end_s": now - t_start})
        sample = {"warmup": i < warmups, "max_concurrent": concurrent,
                  "concurrency_source": "scheduler.running" if scheduler is not None else "outputs per step",
                  "requests": [{"token_times_s": [t - t_start for t in st]} for st in stamps.values()]}
        if attributing:
            sample["steps"] = steps
        samples.append(sample)

    if attributing and not any(st.get("forward") for s in samples for st in s.get("steps", [])):
        # e.g. a model runner other than the one wrapped (vLLM's V2 runner): every part would land in "rest"
        raise RuntimeError("step-attribution: no step timed a forward (this vLLM's model runner is not the one "
                           f"runtime/attribution.py wraps; missing: {attribution.MISSING})")
    cache = vc.cache_config
    result = {
        "status": "ok",
        "engine": {"name": "vllm", "version": vllm.__version__, "torch": torch.__version__},
        "effective": {
            "dtype": str(vc.model_config.dtype).replace("torch.", ""),
            "max_model_len": vc.model_config.max_model_len,
            "torch_threads": torch.get_num_threads(),
            "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
            "cpu_affinity": sorted(os.sched_getaffinity(0)),
            "kv_cache_memory_bytes": cache.kv_cache_memory_bytes,
            "num_kv_blocks": getattr(cache, "num_gpu_blocks", None),
            "block_size": cache.block_size,
            "kv_tokens": (cache.num_gpu_blocks or 0) * cache.block_size if getattr(cache, "num_gpu_blocks", None) else None,
            "enforce_eager": vc.model_config.enforce_eager,
            "max_num_seqs": vc.scheduler_config.max_num_seqs,
            "compilation_mode": getattr(vc.compilation_config.mode, "name", str(vc.compilation_config.mode)),
            "compilation": _compilation_counts(),
            "multiprocess_engine_core": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1",
            "engine_core_client": type(getattr(engine, "engine_core", None)).__name__,
            "prefix_caching": cache.enable_prefix_caching,
            "runtime_plugin_loaded": os.environ.get("EDGE_HARNESS_RUNTIME_LOADED") == "1",
            "platform": type(current_platform).__name__,
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "vllm_kernels": _kernels_loaded(),
            "linear_methods": linear_methods,
            "memory_available_seen": memory_seen,
        },
        "requested": {"dtype": dtype, "threads": threads, "cpus": cpus, "kv_cache_memory_bytes": kv_requested,
                      "context_len": context_len, "max_num_seqs": max_num_seqs, "eager": bool(cfg.get("eager", True)),
                      "engine_core": cfg.get("engine_core", "inprocess")},
        "kv_bytes_per_token": patches.kv_bytes_per_token(hf_config, dtype_size),
        "patches": patch_manifest,
        "overrides": {k: v for k, v in patches.APPLIED.items()},
        "timings": {"import_s": t0 - t_import, "load_s": t_loaded - t0},
        "after_load": after_load,
        "samples": samples,
    }
    return result


def fidelity(cfg: dict) -> dict:
    """Greedy token ids with top-k log-probabilities, and teacher-forced scoring of a given continuation,
    for `harness fidelity`: the same request and result format as harness/engines/llamacpp/native/edge-fidelity.cpp."""
    req = cfg["request"]
    n, k = int(req["n_predict"]), int(req["top_k"])
    kk = 2 * k  # the build's own top-2k: a reference candidate outside it gets a bound, counted
    _bind_env(cfg)
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    import vllm
    import torch
    llm = _llm({**cfg, "context_len": req["n_ctx"]}, max_logprobs=kk)
    out = []
    for p in req["prompts"]:
        ids = list(p["ids"])
        sp = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=0.0, logprobs=k, seed=0)
        o = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0].outputs[0]
        g_ids = list(o.token_ids)
        g_lp, g_top = [], []
        for t, d in zip(g_ids, o.logprobs):
            g_lp.append(float(d[t].logprob))
            g_top.append([[int(i), float(lp.logprob)] for i, lp in sorted(d.items(), key=lambda x: x[1].rank)][:k])
        res = {"greedy": {"ids": g_ids, "logprobs": g_lp, "top": g_top}}
        if "forced" in p or p.get("self_forced"):
            forced = list(p["forced"]) if "forced" in p else list(g_ids)
            cands = p.get("candidates") or [[] for _ in forced]
            sp2 = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=kk, seed=0)
            o2 = llm.generate([TokensPrompt(prompt_token_ids=ids + forced)], sp2, use_tqdm=False)[0]
            f_arg, f_lp, f_c, f_floor, f_top = [], [], [], [], []
            for j, t in enumerate(forced):
                d = o2.prompt_logprobs[len(ids) + j]
                ranked = sorted(d.items(), key=lambda x: x[1].rank)
                f_arg.append(int(ranked[0][0]))
                f_top.append([[int(i), float(lp.logprob)] for i, lp in ranked[:k]])
                f_lp.append(float(d[t].logprob))
                f_c.append([float(d[c].logprob) if c in d else None for c in cands[j]])
                f_floor.append(min(float(x.logprob) for x in d.values()))
            res["forced"] = {"argmax": f_arg, "logprobs": f_lp, "candidates": f_c, "floor": f_floor, "top": f_top}
        out.append(res)
    vc = llm.llm_engine.vllm_config
    from runtime import patches
    return {"status": "ok", "prompts": out, "n_predict": n, "top_k": k,
            "engine": {"name": "vllm", "version": vllm.__version__, "torch": torch.__version__},
            "effective": {"dtype": str(vc.model_config.dtype).replace("torch.", ""),
                          "max_model_len": vc.model_config.max_model_len, "torch_threads": torch.get_num_threads(),
                          "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
                          "enforce_eager": vc.model_config.enforce_eager, "compilation": _compilation_counts(),
                          "max_num_seqs": vc.scheduler_config.max_num_seqs, "max_logprobs": kk},
            "patches": patches.manifest(patches.APPLIED), "overrides": dict(patches.APPLIED)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    mode = measure
    if argv and argv[0] == "--fidelity":
        mode, argv = fidelity, argv[1:]
    cfg_path, out_path = argv[0], argv[1]
    with open(cfg_path) as f:
        cfg = json.load(f)
    try:
        result = mode(cfg)
        rc = 0
    except Exception as e:  # the harness stores a failed run as an artifact, never drops it
        result = {"status": "failed", "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        rc = 1
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out_path)
    return rc


if __name__ == "__main__":
    # vLLM may spawn processes: the __main__ guard is required
    sys.exit(main())
