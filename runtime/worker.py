"""One vLLM measurement in a fresh process: load, prefill exactly prompt_len, decode gen_len.

Usage: python -m runtime.worker CONFIG.json RESULT.json
Records per-token timestamps and reads back the effective configuration from the engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _prompt_ids(seed: int, n: int, vocab: int, special: set[int]) -> list[int]:
    import random
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n:
        t = rng.randrange(100, vocab)
        if t not in special:
            ids.append(t)
    return ids


def run(cfg: dict) -> dict:
    threads = int(cfg["threads"])
    cpus = cfg.get("cpus") or list(range(threads))
    # The arm's threads, through vLLM's public knob: its OpenMP threads bound to these CPUs.
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in cpus)
    # In-process engine core: ~25 s start instead of ~55 s here, and the config is readable in-process.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t_import = time.time()
    import torch
    import vllm
    from vllm import LLM, SamplingParams
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
    t0 = time.time()
    llm = LLM(model=model_dir, dtype=dtype, max_model_len=context_len, max_num_seqs=max_num_seqs,
              enforce_eager=bool(cfg.get("eager", True)), kv_cache_memory_bytes=kv_requested,
              enable_prefix_caching=False, seed=0, trust_remote_code=False)
    t_loaded = time.time()
    after_load = {}
    try:
        from harness.residency import file_residency, smaps_rollup
        after_load = {"files": {f: file_residency(os.path.join(model_dir, f)) for f in cfg.get("weight_files", [])},
                      "memory": smaps_rollup(os.getpid()), "status": "ok"}
    except Exception as e:  # residency is provenance, not a reason to lose the run
        after_load = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    engine = llm.llm_engine
    from runtime import patches
    from vllm.platforms import current_platform
    patch_manifest = patches.manifest(patches.APPLIED)
    vc = engine.vllm_config
    tok = llm.get_tokenizer()
    special = set(getattr(tok, "all_special_ids", []) or [])
    vocab = hf_config["vocab_size"]

    samples = []
    import hashlib
    prompt_hash = hashlib.sha256()
    reps = int(cfg.get("warmups", 1)) + int(cfg.get("repetitions", 3))
    for i in range(reps):
        ids = _prompt_ids(1000 + i, prompt_len, vocab, special)
        prompt_hash.update(json.dumps(ids).encode())
        params = SamplingParams(max_tokens=gen_len, min_tokens=gen_len, ignore_eos=True, temperature=0.0)
        rid = f"r{i}"
        stamps: list[float] = []
        t_start = time.perf_counter()
        engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), params)
        seen = 0
        while engine.has_unfinished_requests():
            outs = engine.step()
            now = time.perf_counter()
            for o in outs:
                n = len(o.outputs[0].token_ids)
                stamps.extend([now] * (n - seen))  # a step that emits k tokens stamps all k at its end
                seen = n
        token_times = [s - t_start for s in stamps]
        samples.append({"warmup": i < int(cfg.get("warmups", 1)), "prompt_seed": 1000 + i,
                        "tokens_generated": len(token_times), "token_times_s": token_times})

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
            "compilation_mode": getattr(vc.compilation_config.mode, "name", str(vc.compilation_config.mode)),
            "multiprocess_engine_core": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1",
            "prefix_caching": cache.enable_prefix_caching,
            "runtime_plugin_loaded": os.environ.get("EDGE_HARNESS_RUNTIME_LOADED") == "1",
            "platform": type(current_platform).__name__,
            "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        },
        "requested": {"dtype": dtype, "threads": threads, "cpus": cpus, "kv_cache_memory_bytes": kv_requested,
                      "context_len": context_len, "max_num_seqs": max_num_seqs, "eager": bool(cfg.get("eager", True))},
        "kv_bytes_per_token": patches.kv_bytes_per_token(hf_config, dtype_size),
        "patches": patch_manifest,
        "overrides": {k: v for k, v in patches.APPLIED.items()},
        "timings": {"import_s": t0 - t_import, "load_s": t_loaded - t0},
        "after_load": after_load,
        "prompt_token_hash": prompt_hash.hexdigest(),
        "samples": samples,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cfg_path, out_path = argv[0], argv[1]
    with open(cfg_path) as f:
        cfg = json.load(f)
    try:
        result = run(cfg)
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
