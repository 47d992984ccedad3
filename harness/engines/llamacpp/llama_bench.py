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
from typing import Any, Literal

from pydantic import Field

from harness import models
from harness.engines.llamacpp import build as llamacpp_build

from harness.engines.base import (Engine, EngineResult, Options, RunContext, affinity_prefix, failed, run_process,
                                  setting, tail)

PASSTHROUGH_OPTIONS = {"batch_size": "-b", "ubatch_size": "-ub", "flash_attn": "-fa", "cache_type_k": "-ctk",
                       "cache_type_v": "-ctv", "repack": "--repack", "load_mode": "-lm", "poll": "--poll"}
KV_TYPES = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


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


class LlamaBench(Engine):
    name = "llama-bench"
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
