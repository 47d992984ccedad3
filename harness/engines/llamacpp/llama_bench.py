"""The llama-bench engine: llama.cpp's own benchmark tool (JSON output), quoted as llama-bench's figures.

Prompt processing: `-p prompt_len -n 0`; token generation: `-p 0 -n gen_len -d prompt_len` (after a
context of prompt_len tokens). Two fresh processes per run. Its figures time forward passes inside
llama-bench (no sampling, no request handling), so they carry their own names (bench_pp_tok_s,
bench_tg_tok_s, bench_pp_s), never the request metrics of harness/metrics.py: the `llama.cpp` engine
measures those, the way every engine is measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
from typing import Any, Literal

from pydantic import Field

from harness import models
from harness.engines.llamacpp import build as llamacpp_build

from harness.engines.base import (Engine, EngineResult, Options, RunContext, affinity_prefix, failed, run_process,
                                  setting, tail)
from harness.engines.capabilities import Limits, Releases, Yardsticks
from harness.engines.llamacpp.kvtypes import KV_TYPES

PASSTHROUGH_OPTIONS = {"batch_size": "-b", "ubatch_size": "-ub", "flash_attn": "-fa", "cache_type_k": "-ctk",
                       "cache_type_v": "-ctv", "repack": "--repack", "load_mode": "-lm", "poll": "--poll"}


class BenchOptions(Options):
    batch_size: int | None = Field(None, ge=1)
    ubatch_size: int | None = Field(None, ge=1)
    flash_attn: Literal[0, 1] | None = None
    cache_type_k: KV_TYPES | None = None
    cache_type_v: KV_TYPES | None = None
    repack: Literal[0, 1] | None = None
    load_mode: Literal["mmap", "read", "direct"] | None = None  # not every build knows -lm
    poll: int | None = Field(None, ge=0, le=100)
    build: llamacpp_build.BuildOption | None = None  # the user's llama.cpp: a source tree or prebuilt binaries
EFFECTIVE_KEYS = ("n_threads", "n_batch", "n_ubatch", "type_k", "type_v", "flash_attn", "cpu_mask", "cpu_strict",
                  "poll", "repack", "load_mode", "model_type", "model_size", "model_n_params", "n_prompt", "n_gen",
                  "n_depth", "build_commit", "build_number", "backends", "cpu_info")


# llama-bench's fields that a CPU-only build has no choice over (no GPU, no offload, no split, no tensor
# overrides, no fitting): the export gives them these values where a run did not record them.
CPU_ONLY = {"gpu_info": "", "n_gpu_layers": 0, "n_cpu_moe": 0, "split_mode": "none", "main_gpu": 0,
            "no_kv_offload": 0, "devices": "auto", "tensor_split": "0.00", "tensor_buft_overrides": "none",
            "embeddings": 0, "no_op_offload": 0, "no_host": 0, "fit_target": 0, "fit_min_ctx": 0, "lazy_mode": "none"}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1, -1: -1, 0: 0, 1: 1}  # llama-bench's -fa values


def build_number(a: Any) -> int:
    """LLAMA_BUILD_NUMBER the build was configured with (its cmake flags), else what the tool reported."""
    for f in a.engine.build.get("flags") or []:
        if isinstance(f, str) and f.startswith("-DLLAMA_BUILD_NUMBER="):
            return int(f.split("=", 1)[1])
    return int(a.execution.effective.get("build_number") or 0)


def llama_bench_test(fixed: dict[str, Any], n_prompt: int, n_gen: int, n_depth: int, tok_s: list[float],
                     test_time: str) -> dict[str, Any]:
    """One llama-bench row from a run's throughput samples (tokens/s): llama-bench's avg_ts and stddev_ts are the
    mean and sample standard deviation of the per-repetition rates, avg_ns of the per-repetition times."""
    n = n_prompt + n_gen
    ns = [int(round(n / t * 1e9)) for t in tok_s]
    sd = (lambda xs: statistics.stdev(xs) if len(xs) > 1 else 0.0)
    return {**fixed, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": n_depth, "test_time": test_time,
            "avg_ns": int(round(statistics.fmean(ns))), "stddev_ns": int(round(sd(ns))),
            "avg_ts": statistics.fmean(tok_s), "stddev_ts": sd(tok_s), "samples_ns": ns, "samples_ts": list(tok_s)}


def bench_build_id(a: Any) -> str:
    """A build's id in llama-bench's rows: 7 characters for every kind of build, as given to compare-llama-bench.py
    (it cuts every id to the shortest one's length): a llama.cpp commit's first 7 hex digits, a user's tree its
    tree hash's (`tree-71e0f4140e`: 71e0f41), prebuilt binaries their llama-bench's sha256's."""
    found = re.search(r"[0-9a-f]{7,}", a.engine.build_commit or "")
    if found:
        return found.group(0)[:7]
    b = a.engine.build if isinstance(a.engine.build, dict) else {}
    for k in ("binary_sha256", "tree_sha256", "build_key"):
        if isinstance(b.get(k), str) and (hexes := re.search(r"[0-9a-f]{7,}", b[k])):
            return hexes.group(0)[:7]
    return hashlib.sha256(json.dumps(b, sort_keys=True, default=str).encode()).hexdigest()[:7]


def bench_cpu_info(a: Any, reported: str | None) -> str:
    """llama-bench's cpu_info, naming the host (its key) and the class it emulated: the script groups rows by it,
    and one CPU model is several hosts (two machines, an emulated class of one)."""
    cpu = reported or a.host.cpu.get("model") or "unknown"
    emu = f", emulating {a.host.emulation}" if a.host.emulation else ""
    return f"{cpu} [host {a.host.key}{emu}]"


def llama_bench_rows(a: Any, pp: str, tg: str, model_type: str) -> list[dict[str, Any]]:
    """A run as llama-bench's two tests: prompt processing (n_prompt = prompt_len) from metric `pp` and token
    generation after a prompt_len context (n_gen = gen_len, n_depth = prompt_len) from `tg`, each metric's
    per-repetition rates as llama-bench's samples_ts. Every other field is the run's recorded setting (or
    CPU_ONLY's)."""
    eff, w = a.execution.effective, a.workload
    gguf = next((f for f in a.model.files if f.path.endswith(".gguf")), a.model.files[0])
    fixed = {**CPU_ONLY, "build_commit": bench_build_id(a), "build_number": build_number(a),
             "cpu_info": bench_cpu_info(a, eff.get("cpu_info")), "backends": "CPU",
             "model_filename": gguf.path, "model_type": model_type, "model_size": eff.get("model_size") or gguf.size,
             "model_n_params": eff.get("model_n_params") or a.model.parameters,
             "n_batch": eff.get("n_batch"), "n_ubatch": eff.get("n_ubatch"), "n_threads": eff.get("n_threads"),
             "cpu_mask": eff.get("cpu_mask") or "0x0", "cpu_strict": int(bool(eff.get("cpu_strict"))),
             "poll": eff["poll"] if isinstance(eff.get("poll"), int) else -1,
             "type_k": eff.get("type_k"), "type_v": eff.get("type_v"),
             "flash_attn": FLASH_ATTN.get(eff.get("flash_attn"), -1), "load_mode": eff.get("load_mode") or "mmap",
             "repack": int(eff.get("repack", True) is not False)}
    rows = []
    if pp in a.metrics:
        rows.append(llama_bench_test(fixed, w.prompt_len, 0, 0, a.metrics[pp].samples, a.timing.start))
    if tg in a.metrics:
        rows.append(llama_bench_test(fixed, 0, w.gen_len, w.prompt_len, a.metrics[tg].samples, a.timing.start))
    return rows


def parse_bench_json(stdout: str) -> list[dict]:
    """llama-bench's JSON array; some builds print init lines on stdout first, so find the array."""
    start = stdout.find("[")
    while start != -1:
        try:
            data, _ = json.JSONDecoder().raw_decode(stdout[start:])
            if isinstance(data, list) and all(isinstance(x, dict) for x in data):
                return data
        except ValueError:
            pass
        start = stdout.find("[", start + 1)
    raise ValueError("no JSON array in llama-bench output")


class LlamaBench(Engine, Limits, Yardsticks, Releases):
    name = "llama-bench"
    read_back_keys = {**Limits.read_back_keys, "threads": ("threads", "n_threads", "decode_test.n_threads")}
    default_form = "gguf-f32"
    form_prefix = "gguf-"
    form_hint = "use gguf-f32, gguf-bf16, gguf-q8_0 ..."
    Options = BenchOptions
    honours = frozenset({"prompt_len", "gen_len", "warmups", "repetitions"})
    warmup_values = (0, 1)  # llama-bench runs one warm-up or none (--no-warmup)
    metrics = ("bench_pp_tok_s", "bench_tg_tok_s", "bench_pp_s")
    # llama-bench sizes its context to each test (prompt + generated + depth): context_len is not applied
    observe_only = frozenset({"context_len", "dtype", "kv_cache_memory_bytes"})
    env_prefixes = ("GGML_",)
    # the llama.cpp engine's request figures beside llama-bench's own (report: definition pairs)
    definition_of = "llama.cpp"
    definition_pairs = (("decode_tok_s", "bench_tg_tok_s"), ("prefill_tok_s", "bench_pp_tok_s"))

    def release_changes(self, build: dict[str, Any], old: str, new: str) -> list[str] | None:
        """The vendored llama.cpp trees of two llama-cpp-python releases compared (releases.describe)."""
        from harness.engines.llamacpp import releases
        if build.get("sdist") != releases.PACKAGE:
            return None
        return releases.describe(releases.changes(old, new))

    def llama_bench_rows(self, a: Any) -> list[dict[str, Any]]:
        """llama-bench's own figures, as it printed them."""
        return llama_bench_rows(a, "bench_pp_tok_s", "bench_tg_tok_s", a.execution.effective.get("model_type")
                                or f"{a.model.name} {a.model.dtype}")

    def provision(self, isa_variant: str | None = None, rebuild: bool = False) -> dict[str, Any]:
        """The pinned llama.cpp build (its llama-bench binary)."""
        with llamacpp_build.variant(isa_variant):
            return llamacpp_build.build(rebuild=rebuild)

    def validate_options(self, path: str, arm, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        ub = llamacpp_build.user_build_of(path, opts.build)
        if ub is not None:
            llamacpp_build.check_user_build(ub, f"{path}: arms[{arm.name}].options.build")

    def prepare_arm(self, spec: Any, arm: Any) -> None:
        ub = llamacpp_build.user_build_of(spec.path, self.options(arm).build)
        if ub is not None:
            with llamacpp_build.user_build(ub):
                llamacpp_build.build()

    def engine_info(self) -> dict[str, Any]:
        m = llamacpp_build.load_manifest()
        info = llamacpp_build.engine_block(self.name, m)
        info["build"].pop("isa_variant", None)  # llama-bench runs the native build only
        info["build"].update({"binary": "llama-bench", "binary_sha256": m["binaries"]["llama-bench"]["sha256"]})
        return info

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        with llamacpp_build.user_build(llamacpp_build.user_build_of(ctx.spec.path, self.options(ctx.arm).build)):
            return self._run(ctx, form)

    def _run(self, ctx: RunContext, form: str) -> EngineResult:
        model_path = models.form_path(ctx.model, form)
        bench = str(llamacpp_build.binary("llama-bench"))
        p, g = int(ctx.params["prompt_len"]), int(ctx.params["gen_len"])
        reps = ctx.spec.repetitions
        extra: list[str] = []
        for k, v in self.options(ctx.arm).model_dump(exclude_none=True).items():
            if k in PASSTHROUGH_OPTIONS:
                extra += [PASSTHROUGH_OPTIONS[k], str(v)]
        if ctx.spec.warmups == 0:
            extra.append("--no-warmup")
        env = {**os.environ, **ctx.arm.env, "OMP_NUM_THREADS": str(ctx.threads)}
        pre = affinity_prefix(ctx.cpus, ctx.arm.numa)
        base = pre + [bench, "-m", str(model_path), "-t", str(ctx.threads), "-r", str(reps), "-o", "json", *extra]
        tests = {"prefill": ["-p", str(p), "-n", "0"], "decode": ["-p", "0", "-n", str(g), "-d", str(p)]}
        info = self.engine_info()
        requested = {"threads": ctx.threads, "cpus": ctx.cpus, "form": form, "prompt_len": p, "gen_len": g,
                     "depth_for_decode": p, "repetitions": reps, "warmups": ctx.spec.warmups,
                     **{k: v for k, v in ctx.arm.options.items()}}
        results: dict[str, dict] = {}
        peaks = []
        commands = []
        affinity = None
        env_rec = {k: v for k, v in ctx.arm.env.items()} | {"OMP_NUM_THREADS": str(ctx.threads)}
        for name, args in tests.items():
            cmd = base + args
            commands.append(cmd)
            r = run_process(cmd, env, ctx.timeout_s, poll_s=ctx.poll_s)
            peaks.append(r.peak_memory)
            affinity = affinity if affinity is not None else r.affinity
            if r.timed_out:
                return failed("timeout", f"llama-bench {name} exceeded {ctx.timeout_s:.0f} s", cmd, env_rec, r.stderr,
                              info, requested, r.peak_memory)
            if r.returncode != 0:
                return failed("failed", f"llama-bench {name} exited {r.returncode}: {tail(r.stderr, 1)}", cmd, env_rec,
                              r.stderr, info, requested, r.peak_memory)
            try:
                rows = parse_bench_json(r.stdout)
                results[name] = rows[0]
            except (ValueError, IndexError) as e:
                return failed("failed", f"llama-bench {name}: {e}", cmd, env_rec, r.stdout + r.stderr, info, requested)
        pre_row, dec_row = results["prefill"], results["decode"]
        metrics = {
            "bench_pp_tok_s": {"unit": "tok/s", "samples": [float(x) for x in pre_row["samples_ts"]],
                               "definition": "llama-bench -p PROMPT -n 0: prompt tokens / wall time of one batch "
                                             "prefill, per repetition (its own warm-up run not reported)"},
            "bench_tg_tok_s": {"unit": "tok/s", "samples": [float(x) for x in dec_row["samples_ts"]],
                               "definition": "llama-bench -p 0 -n GEN -d PROMPT: generated tokens / wall time of the "
                                             "forward passes after a PROMPT-token context (no sampling), per repetition"},
            "bench_pp_s": {"unit": "s", "higher_is_better": False,
                           "samples": [ns / 1e9 for ns in pre_row["samples_ns"]],
                           "definition": "llama-bench -p PROMPT -n 0: wall time of the prefill, per repetition"},
        }
        effective = {k: pre_row.get(k) for k in EFFECTIVE_KEYS}
        effective["decode_test"] = {k: dec_row.get(k) for k in ("n_prompt", "n_gen", "n_depth", "n_threads")}
        effective["threads"] = pre_row.get("n_threads")
        effective["cpu_affinity"] = affinity
        peak = max(peaks, key=lambda x: x.get("rss_bytes", 0))
        token_hash = hashlib.sha256(f"llama-bench synthetic prompt tokens p={p} d={p}".encode()).hexdigest()
        n_ctx = (p, g + p)  # llama-bench's own context per test: prompt, and depth + generated
        settings = {"threads": setting(ctx.threads, pre_row.get("n_threads"), "llama-bench JSON n_threads"),
                    "cpus": setting(ctx.cpus, affinity, "sched_getaffinity of the llama-bench process"),
                    "context_len": setting(ctx.params["context_len"], f"{n_ctx[0]} (pp), {n_ctx[1]} (tg)",
                                           "llama-bench sizes the context to each test"),
                    "batch": setting(int(ctx.params.get("batch", 1)), 1, "llama-bench runs one sequence"),
                    "warmups": setting(ctx.spec.warmups, 0 if ctx.spec.warmups == 0 else 1,
                                       "llama-bench: one warm-up run, or none with --no-warmup")}
        return EngineResult(status="ok", metrics=metrics, engine=info, requested=requested, effective=effective,
                            command=commands, env=env_rec, peak_memory=peak, settings=settings,
                            after_load={"status": "not separable",
                                        "reason": "llama-bench loads and measures in one process; see after_run"},
                            prompt_token_hash=token_hash, eager=None)
