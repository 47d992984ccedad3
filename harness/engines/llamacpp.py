"""The llama.cpp engine: requests served by harness/native/edge-bench.cpp, linked against the pinned build.

edge-bench takes the same prompt token ids as every engine (harness/metrics.py), submits `batch` requests
together as parallel sequences of one context (n_ctx = context_len per sequence), prefills them in one
batch, then decodes greedily with llama.cpp's sampler, detokenizing each token, and stamps every output
token. The metrics are computed from those stamps by harness/metrics.py, as for vLLM. The effective
context, threads, sequences and the process's CPU affinity are read back by the tool itself.
For fidelity the engine answers requests with harness/native/edge-fidelity.cpp.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from harness import llamacpp_build, metrics, models
from harness.engines.base import (Engine, EngineResult, Options, RunContext, affinity_prefix, failed, run_process,
                                  setting, tail)
from harness.errors import UserError

TOOL = "edge-bench"
FIDELITY_TOOL = "edge-fidelity"
CTX_PAD = 256  # this llama.cpp pads each sequence's context to a multiple of 256 tokens (read back: n_ctx_per_seq)
KV_TYPES = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]


ATTRIBUTION_SOURCE = ("edge-bench (harness/native/edge-bench.cpp) with options.attribution: steady_clock around "
                      "each call of the step; engine_forward from llama.cpp's own eval timer (llama_perf_context)")


class LlamaCppOptions(Options):
    n_batch: int | None = Field(None, ge=1)
    n_ubatch: int | None = Field(None, ge=1)
    flash_attn: Literal["on", "off", "auto"] | None = None
    type_k: KV_TYPES | None = None
    type_v: KV_TYPES | None = None
    poll: int | None = Field(None, ge=0, le=100)
    attribution: bool | None = None  # edge-bench times each decode step's parts (artifact `attribution`)


class LlamaCpp(Engine):
    name = "llama.cpp"
    default_form = "gguf-f32"
    form_prefix = "gguf-"
    form_hint = "use gguf-f32, gguf-bf16, gguf-q8_0 ..."
    Options = LlamaCppOptions
    honours = frozenset({"prompt_len", "gen_len", "context_len", "batch", "warmups", "repetitions"})
    max_batch = None
    metrics = metrics.NAMES
    observe_only = frozenset({"dtype", "kv_cache_memory_bytes"})  # the GGUF's types; KV sized by n_ctx
    reference_form = "gguf-bf16"
    accepts_file = True

    def validate_options(self, path: str, arm, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        where, ctxs = workload.get("context_len", ("workload.context_len", set()))
        bad = sorted(c for c in ctxs if c % CTX_PAD)
        if bad:
            c = bad[0]
            raise UserError(path, f"{where}: {c} for arm {arm.name!r}: llama.cpp pads each sequence's context to a "
                                  f"multiple of {CTX_PAD}, so it would use {-(-c // CTX_PAD) * CTX_PAD}",
                            f"set context_len to a multiple of {CTX_PAD}")

    def engine_info(self) -> dict[str, Any]:
        m = llamacpp_build.load_manifest()
        return {"name": "llama.cpp", "version": f"{m['source']['package']}=={m['source']['version']} (vendored)",
                "build_commit": m["build_commit"],
                "build": {"flags": m["flags"], "compiler": m["compiler"], "build_key": m["build_key"],
                          "native_isa": m.get("native_isa", "unknown"), "sdist_sha256": m["source"]["sdist_sha256"],
                          **({"isa_variant": m["isa_variant"]} if m.get("isa_variant") else {})}}

    def _tool_block(self, name: str) -> dict[str, Any]:
        info = self.engine_info()
        t = llamacpp_build.tool_info(name)
        return {**info, "build": {**info["build"], "binary": name, "binary_sha256": t["sha256"],
                                  "tool_source_sha256": t["source_sha256"]}}

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        with llamacpp_build.variant(ctx.isa_variant):  # the build capped at an emulated class's ISA tier
            if ctx.isa_variant is not None:
                llamacpp_build.build()  # cached: built once per tier (`harness build --isa TIER` ahead of time)
            return self._run(ctx, form)

    def _run(self, ctx: RunContext, form: str) -> EngineResult:
        opts = self.options(ctx.arm)
        p, g = int(ctx.params["prompt_len"]), int(ctx.params["gen_len"])
        c, b = int(ctx.params["context_len"]), int(ctx.params.get("batch", 1))
        w, reps = ctx.spec.warmups, ctx.spec.repetitions
        prompts = metrics.request_prompts(ctx.model, p, b, w + reps)
        request = {"n_ctx_per_seq": c, "batch": b, "gen_len": g,
                   "repetitions": [{"warmup": i < w, "prompts": ids} for i, ids in enumerate(prompts)],
                   "options": opts.model_dump(exclude_none=True, exclude={"threads"})}
        req_path, out_path = ctx.workdir / "request.json", ctx.workdir / "result.json"
        req_path.write_text(json.dumps(request))
        info = self._tool_block(TOOL)
        cmd = affinity_prefix(ctx.cpus, ctx.arm.numa) + [
            str(llamacpp_build.tool(TOOL)), "-m", str(models.form_path(ctx.model, form)), "-t", str(ctx.threads),
            "-i", str(req_path), "-o", str(out_path)]
        env_rec = {**ctx.arm.env, **ctx.env, "OMP_NUM_THREADS": str(ctx.threads)}
        requested = {"threads": ctx.threads, "cpus": ctx.cpus, "form": form, "prompt_len": p, "gen_len": g,
                     "context_len": c, "batch": b, "warmups": w, "repetitions": reps, **ctx.arm.options}
        r = run_process(cmd, {**os.environ, **env_rec}, ctx.timeout_s, poll_s=ctx.poll_s)
        if r.timed_out:
            return failed("timeout", f"{TOOL} exceeded {ctx.timeout_s:.0f} s", cmd, env_rec, r.stderr, info, requested,
                          r.peak_memory)
        try:
            res = json.loads(out_path.read_text())
        except (OSError, ValueError):
            return failed("failed", f"{TOOL} exited {r.returncode} without a result: {tail(r.stderr, 1)}", cmd, env_rec,
                          r.stderr, info, requested, r.peak_memory)
        if r.returncode != 0 or res.get("status") != "ok":
            return failed("failed", res.get("error", f"{TOOL} exited {r.returncode}"), cmd, env_rec, r.stderr, info,
                          requested, r.peak_memory)
        eff = res["effective"]
        samples = res["samples"]
        concurrent = min(s["max_concurrent"] for s in samples)
        settings = {
            "threads": setting(ctx.threads, eff["n_threads"], "llama_n_threads(ctx), read by edge-bench"),
            "cpus": setting(ctx.cpus, eff["cpu_affinity"], "sched_getaffinity(0) inside edge-bench"),
            "context_len": setting(c, eff["n_ctx_per_seq"], "llama.cpp context per sequence, read by edge-bench"),
            "batch": setting(b, concurrent, "fewest sequences decoded together in one llama_decode, over repetitions"),
            "warmups": setting(w, sum(1 for s in samples if s["warmup"]), "warm-up repetitions edge-bench ran"),
        }
        for k, tool_key in (("n_batch", "n_batch"), ("n_ubatch", "n_ubatch"), ("type_k", "type_k"),
                            ("type_v", "type_v"), ("flash_attn", "flash_attn"), ("attribution", "attribution")):
            if getattr(opts, k) is not None:
                settings[f"options.{k}"] = setting(getattr(opts, k), eff.get(tool_key), "read by edge-bench")
        effective = {**eff, "threads": eff["n_threads"], "system_info": res.get("system_info"),
                     "load_s": res.get("load_s"), "prefill_batch_tokens": samples[0].get("prefill_batch_tokens"),
                     "timestamps": "steady_clock after each token is sampled (llama.cpp greedy sampler) and "
                                   "detokenized (llama_token_to_piece), in edge-bench",
                     "metric_definitions": metrics.DEFINITIONS_VERSION}
        return EngineResult(status="ok", metrics=metrics.from_timestamps(samples, p), engine=info, requested=requested,
                            effective=effective, command=cmd, env=env_rec, peak_memory=r.peak_memory,
                            after_load={"status": "not separable",
                                        "reason": "edge-bench loads and measures in one process; see after_run"},
                            prompt_token_hash=metrics.prompts_hash(prompts), eager=None, settings=settings,
                            attribution=metrics.attribution(samples, ATTRIBUTION_SOURCE))

    # ---- fidelity -------------------------------------------------------------------------------------
    def fidelity_block(self) -> dict[str, Any]:
        return {**self._tool_block(FIDELITY_TOOL), "patches": [], "overrides": {}}

    def fidelity_command(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, req_path: Path,
                         out_path: Path, workdir: Path, options: dict | None = None) -> tuple[list[str], dict[str, str]]:
        cmd = [str(llamacpp_build.tool(FIDELITY_TOOL)), "-m", str(model_path), "-t", str(threads), "-i", str(req_path),
               "-o", str(out_path)]
        return cmd, {"OMP_NUM_THREADS": str(threads)}


def greedy_text(model: str, form: str, prompt: str, n_predict: int, threads: int = 2,
                timeout_s: float = 300) -> dict[str, Any]:
    """Greedy (temperature 0) continuation of a prompt with llama-completion, as text.

    The raw prompt is sent as is (no chat template, no conversation mode); the prompt itself is
    not echoed, so `text` is only the continuation.
    """
    path = models.form_path(model, form)
    exe = str(llamacpp_build.binary("llama-completion"))
    cmd = [exe, "-m", str(path), "-p", prompt, "-n", str(n_predict), "--temp", "0", "--top-k", "1", "-s", "0",
           "-t", str(threads), "-no-cnv", "--no-display-prompt", "--simple-io", "--no-warmup"]
    r = run_process(cmd, {**os.environ}, timeout_s)
    if r.timed_out or r.returncode != 0:
        raise UserError("llama-completion", f"exited {r.returncode}{' (timeout)' if r.timed_out else ''}: "
                        f"{tail(r.stderr, 1)}", "run it by hand with the command in this message to see why")
    return {"text": r.stdout, "command": cmd, "binary_sha256": llamacpp_build.load_manifest()["binaries"]
            ["llama-completion"]["sha256"]}
