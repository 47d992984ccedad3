"""The llama.cpp engine: requests served by harness/engines/llamacpp/native/edge-bench.cpp, linked against the pinned build.

edge-bench takes the same prompt token ids as every engine (harness/metrics.py), submits `batch` requests
together as parallel sequences of one context (n_ctx = context_len per sequence), prefills them in one
batch, then decodes greedily with llama.cpp's sampler, detokenizing each token, and stamps every output
token. The metrics are computed from those stamps by harness/metrics.py, as for vLLM. The effective
context, threads, sequences and the process's CPU affinity are read back by the tool itself.
For fidelity the engine answers requests with harness/engines/llamacpp/native/edge-fidelity.cpp.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from harness import metrics, models
from harness.engines.llamacpp import build as llamacpp_build
from harness.engines.llamacpp import tools as llamacpp_tools
from harness.engines.base import (Engine, EngineResult, Options, RunContext, affinity_prefix, run_process, run_worker,
                                  setting, tail)
from harness.engines.capabilities import Fidelity, IsaCap, Limits, Sizing, StepParts, Yardsticks
from harness.engines.llamacpp.kvtypes import KV_TYPE_BYTES, KV_TYPES
from harness.errors import UserError

TOOL = "edge-bench"
FIDELITY_TOOL = "edge-fidelity"
CTX_PAD = 256  # this llama.cpp pads each sequence's context to a multiple of 256 tokens (read back: n_ctx_per_seq)
MAX_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ: the most parallel sequences one context holds
DEFAULT_OVERHEAD = 64 << 20  # runtime memory beyond weights and KV where no run was measured yet (a default)
# llama.cpp's system info names of the instruction sets above each tier: none may read "= 1" under the cap
# llama_print_system_info()'s features and host.cpu.isa's names for them
SYSTEM_INFO_ISA = {"AVX": "avx", "AVX2": "avx2", "FMA": "fma", "F16C": "f16c", "AVX512": "avx512f",
                   "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16", "AVX_VNNI": "avx_vnni",
                   "AMX_INT8": "amx_int8"}
_FEATURE_ON = re.compile(r"\b([A-Z0-9_]+) = 1\b")  # a feature system info reports on
ABOVE_TIER = {"baseline": ("AVX", "AVX2", "FMA", "F16C", "AVX512", "AVX512_BF16", "AMX_INT8"),
              "avx2": ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8"),
              "avx512": ("AVX512_VNNI", "AVX512_BF16", "AMX_INT8"), "avx512-bf16": ("AMX_INT8",), "amx": ()}


def derive_dtype(profile: dict[str, Any]) -> tuple[str, str]:
    """bf16 weights from AVX2 up (decode reads half the bytes; measured faster than f32 on both the AVX2 and the
    AVX512-BF16 host, vllm-vs-llamacpp), f32 below (no measurement, scalar conversions)."""
    from harness.hardware import tier_rank
    if profile["arch"] == "x86_64" and tier_rank("x86_64", profile["isa_tier"]) < tier_rank("x86_64", "avx2"):
        return "f32", "below AVX2: bf16 weights convert in scalar code (unmeasured), f32 is the safe form"
    return "bf16", "decode is memory-bound: bf16 weights halve the bytes read per token (measured faster than f32)"


ATTRIBUTION_SOURCE = ("edge-bench (harness/engines/llamacpp/native/edge-bench.cpp) with options.attribution: steady_clock around "
                      "each call of the step; engine_forward from llama.cpp's own eval timer (llama_perf_context)")


class LlamaCppOptions(Options):
    n_batch: int | None = Field(None, ge=1)
    n_ubatch: int | None = Field(None, ge=1)
    flash_attn: Literal["on", "off", "auto"] | None = None
    type_k: KV_TYPES | None = None
    type_v: KV_TYPES | None = None
    poll: int | None = Field(None, ge=0, le=100)
    attribution: bool | None = None  # edge-bench times each decode step's parts (artifact `attribution`)
    build: llamacpp_build.BuildOption | None = None  # the user's llama.cpp source tree (build.py)


class LlamaCpp(Engine, Limits, Fidelity, Sizing, IsaCap, StepParts, Yardsticks):
    name = "llama.cpp"
    weight_files = {"gguf": ("",)}  # a GGUF form is its one file, mapped whole
    read_back_keys = {**Limits.read_back_keys, "threads": ("threads", "n_threads"), "context_len": ("n_ctx_per_seq",)}
    summary_reference = "gguf-f32"  # the summary's yardstick: llama.cpp on full-precision weights
    default_form = "gguf-f32"
    form_prefix = "gguf-"
    gguf_toolchain = "harness.engines.llamacpp.build"  # capability: the zoo's GGUF converter and quantizer
    form_hint = "use gguf-f32, gguf-bf16, gguf-q8_0 ..."
    Options = LlamaCppOptions
    honours = frozenset({"prompt_len", "gen_len", "context_len", "batch", "warmups", "repetitions"})
    max_batch = None
    metrics = metrics.NAMES
    observe_only = frozenset({"dtype", "kv_cache_memory_bytes"})  # the GGUF's types; KV sized by n_ctx
    reference_form = "gguf-bf16"
    accepts_file = True
    auto_form = True
    fidelity_options = frozenset({"build"})  # a build of your llama.cpp tree, scored against the reference
    step_parts = {"schedule": "llama.cpp: none, the loop decodes every unfinished sequence",
                  "prepare": "llama.cpp: filling the llama_batch",
                  "forward": "llama.cpp: llama_decode, graph build and compute",
                  "sample": "llama.cpp: llama_sampler_sample, which also reads the logits",
                  "update": "llama.cpp: none",
                  "detokenize": "llama.cpp: llama_token_to_piece",
                  "output": "llama.cpp: storing the id and timestamp"}
    step_parts_order = 1
    env_prefixes = ("GGML_",)
    default_overhead = DEFAULT_OVERHEAD

    def derive_dtype(self, profile: dict[str, Any]) -> tuple[str, str]:
        return derive_dtype(profile)

    def form_for(self, profile: dict[str, Any]) -> tuple[str, str]:
        dtype, rule = derive_dtype(profile)
        return f"gguf-{dtype}", rule

    def admission(self, model: str, profile: dict[str, Any], form: str | None, options: dict[str, Any],
                  context_len: int, store: Path | None = None, host: str | None = None) -> dict[str, Any]:
        """Parallel sequences of context_len one process fits on this profile: the form's mapped weights (its
        weight files' sizes), an f16 KV cache (the default) per sequence padded to CTX_PAD tokens."""
        from harness import hardware
        from harness.provenance import current_host_key
        form = form or self.default_form
        if form == "auto":
            form = self.form_for(profile)[0]
        geo = hardware.geometry(model)
        overhead, oev = hardware.measured_overhead(type(self), store, host or current_host_key())
        weights = sum(f["size"] for f in models.weight_files(model, form).values())
        adm = hardware.admission(int(profile["memory_available_bytes"]), weights, overhead,
                                 geo["kv_bytes_per_token_per_byte"] * 2, context_len, block=CTX_PAD, cap=MAX_SEQ,
                                 reserved_blocks=1)  # one padded sequence's margin, as the rule has always kept
        return {**adm, "overhead_evidence": oev, "profile": profile["source"]}

    @classmethod
    def kv_bytes_per_token(cls, effective: dict[str, Any], kv_values: int) -> tuple[float, str] | None:
        """The K and V types it read back (type_k, type_v), half the values each."""
        tk, tv = effective.get("type_k"), effective.get("type_v")
        if tk in KV_TYPE_BYTES and tv in KV_TYPE_BYTES:
            return kv_values / 2 * (KV_TYPE_BYTES[tk] + KV_TYPE_BYTES[tv]), f"{tk}/{tv} x model geometry"
        return None

    @classmethod
    def overhead_parts(cls, a: Any) -> tuple[int, int]:
        """The mapped GGUF, and an f16 KV cache of the context it read back."""
        from harness import hardware
        eff = a.execution.effective
        kv = int(eff.get("n_ctx", 0)) * hardware.geometry(a.model.name)["kv_bytes_per_token_per_byte"] * 2
        return eff.get("model_size") or 0, kv

    def adapt(self, model: str, profile: dict[str, Any], context_len: int, gen_len: int,
              store: Path | None = None, host: str | None = None) -> list[dict[str, Any]]:
        from harness import hardware
        form, rule = self.form_for(profile)
        return hardware.adapt_rows(self, model, profile, ("form", form, rule), {}, context_len, store, host,
                                   "parallel sequences")

    @classmethod
    def isa_in_use(cls, effective: dict[str, Any]) -> list[str]:
        """The features its system info reports on (`AVX2 = 1`), as host.cpu.isa names them."""
        info = effective.get("system_info")
        on = set(_FEATURE_ON.findall(info)) if isinstance(info, str) else set()
        return [feat for name, feat in SYSTEM_INFO_ISA.items() if name in on]

    def isa_record(self, tier: str, env: dict[str, str], effective: dict[str, Any]) -> dict[str, Any]:
        """The build variant capped at the tier (`harness build --isa TIER`), its system info read back."""
        from harness.emulate import status
        info = effective.get("system_info") or ""
        on = [n for n in ABOVE_TIER.get(tier, ()) if re.search(rf"\b{re.escape(n)} = 1\b", info)]
        return {"applied": f"llama.cpp build variant {tier} (harness build --isa {tier})",
                "effective": info.strip(), "source": "llama_print_system_info(), read by edge-bench",
                "status": status(bool(info) and not on, f"system info reports {', '.join(on) or 'nothing'}")}

    def provision(self, isa_variant: str | None = None, rebuild: bool = False) -> dict[str, Any]:
        """The pinned llama.cpp build (cached by content; the variant capped at an ISA tier where asked) and the
        project's tools linked against it (edge-bench; edge-fidelity with the native build)."""
        with llamacpp_build.variant(isa_variant):
            m = llamacpp_build.build(rebuild=rebuild)
            llamacpp_tools.tools((TOOL,) if isa_variant else (TOOL, FIDELITY_TOOL))
        return m

    def validate_options(self, path: str, arm, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        ub = llamacpp_build.user_build_of(path, opts.build)
        if ub is not None:
            llamacpp_build.check_user_build(ub, f"{path}: arms[{arm.name}].options.build")
            if ub.bin is not None:
                raise UserError(path, f"arms[{arm.name}].options.build.bin: the llama.cpp engine runs edge-bench, "
                                "which links against a build's static libraries; prebuilt binaries come without them",
                                "use engine llama-bench with build.bin, or build: {source: DIR}")
            if ub.release is not None:
                raise UserError(path, f"arms[{arm.name}].options.build.sdist: the llama.cpp engine runs edge-bench, "
                                "which is written against the pinned llama.cpp's API; a release's is another",
                                "use engine llama-bench for a release (it needs none of the harness's native code)")
        where, ctxs = workload.get("context_len", ("workload.context_len", set()))
        bad = sorted(c for c in ctxs if c % CTX_PAD)
        if bad:
            c = bad[0]
            raise UserError(path, f"{where}: {c} for arm {arm.name!r}: llama.cpp pads each sequence's context to a "
                                  f"multiple of {CTX_PAD}, so it would use {-(-c // CTX_PAD) * CTX_PAD}",
                            f"set context_len to a multiple of {CTX_PAD}")

    def engine_info(self) -> dict[str, Any]:
        return llamacpp_build.engine_block(self.name)

    def llama_bench_rows(self, a: Any) -> list[dict[str, Any]]:
        """The request loop's figures (harness/metrics.py: prefill_tok_s, decode_tok_s), not llama-bench's: its
        prompt rate times a request's prefill, its generation rate the decode after it, sampling included."""
        from harness.engines.llamacpp.llama_bench import llama_bench_rows
        return llama_bench_rows(a, "prefill_tok_s", "decode_tok_s", a.execution.effective.get("model_desc")
                                or f"{a.model.name} {a.model.dtype}")

    def prepare_arm(self, spec: Any, arm: Any) -> None:
        ub = llamacpp_build.user_build_of(spec.path, self.options(arm).build)
        if ub is not None:
            with llamacpp_build.user_build(ub):
                llamacpp_build.build()
                llamacpp_tools.tool(TOOL)

    def _tool_block(self, name: str) -> dict[str, Any]:
        info = self.engine_info()
        t = llamacpp_tools.tool_info(name)
        return {**info, "build": {**info["build"], "binary": name, "binary_sha256": t["sha256"],
                                  "tool_source_sha256": t["source_sha256"]}}

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        ub = llamacpp_build.user_build_of(ctx.spec.path, self.options(ctx.arm).build)
        with llamacpp_build.variant(ctx.isa_variant), llamacpp_build.user_build(ub):
            if ctx.isa_variant is not None or ub is not None:
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
                   "options": opts.model_dump(exclude_none=True, exclude={"threads", "build"})}
        req_path, out_path = ctx.workdir / "request.json", ctx.workdir / "result.json"
        req_path.write_text(json.dumps(request))
        info = self._tool_block(TOOL)
        cmd = affinity_prefix(ctx.cpus, ctx.arm.numa) + [
            str(llamacpp_tools.tool(TOOL)), "-m", str(models.form_path(ctx.model, form)), "-t", str(ctx.threads),
            "-i", str(req_path), "-o", str(out_path)]
        env_rec = {**ctx.arm.env, **ctx.env, "OMP_NUM_THREADS": str(ctx.threads)}
        requested = {"threads": ctx.threads, "cpus": ctx.cpus, "form": form, "prompt_len": p, "gen_len": g,
                     "context_len": c, "batch": b, "warmups": w, "repetitions": reps, **ctx.arm.options}
        worker = run_worker(cmd, {**os.environ, **env_rec}, ctx.timeout_s, out_path, TOOL, poll_s=ctx.poll_s)
        if worker.result is None:
            return worker.failed(cmd, env_rec, info, requested)
        r, res = worker.proc, worker.result
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
    def fidelity_check_options(self, path: str, fld: str, options: dict) -> dict:
        """A build's `build: {source: DIR | pinned, flags: [...]}` (as a speed arm's), its source resolved against
        the grid file: the fidelity tool is linked against that build's libraries."""
        if options.get("build") is None:
            return options
        try:
            opt = llamacpp_build.BuildOption.model_validate(options["build"])
        except Exception as e:
            raise UserError(path, f"{fld}.build: {str(e).splitlines()[-1].strip()}", "build: {source: DIR, flags: "
                            "[-DNAME=VALUE]}") from None
        if opt.bin is not None:
            raise UserError(path, f"{fld}.build.bin: the fidelity tool links against a build's static libraries; "
                            "prebuilt binaries come without them", "build: {source: DIR}")
        if opt.sdist is not None:
            raise UserError(path, f"{fld}.build.sdist: the fidelity tool is written against the pinned llama.cpp's "
                            "API; a release's is another", "build: {source: DIR} (a llama.cpp tree)")
        ub = llamacpp_build.user_build_of(path, opt)
        llamacpp_build.check_user_build(ub, f"{path}: {fld}.build")
        return {**options, "build": {"source": str(ub.source), "flags": list(ub.flags)}}

    def reference_options(self, options: dict) -> dict:
        return {"build": options["build"]} if options.get("build") else {}

    @staticmethod
    def _fidelity_build(options: dict | None):
        b = (options or {}).get("build")
        return llamacpp_build.user_build_of("/", llamacpp_build.BuildOption.model_validate(b)) if b else None

    def fidelity_block(self, options: dict | None = None) -> dict[str, Any]:
        ub = self._fidelity_build(options)
        with llamacpp_build.user_build(ub):
            if ub is not None:
                llamacpp_build.build()  # cached by tree and flags
            return {**self._tool_block(FIDELITY_TOOL), "patches": [], "overrides": {}}

    def fidelity_command(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, req_path: Path,
                         out_path: Path, workdir: Path, options: dict | None = None) -> tuple[list[str], dict[str, str]]:
        with llamacpp_build.user_build(self._fidelity_build(options)):
            exe = llamacpp_tools.tool(FIDELITY_TOOL)
        cmd = [str(exe), "-m", str(model_path), "-t", str(threads), "-i", str(req_path), "-o", str(out_path)]
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
    return {"text": r.stdout, "command": cmd, "stderr_tail": tail(r.stderr, 8), "stdout_bytes": r.stdout_bytes,
            "binary_sha256": llamacpp_build.load_manifest()["binaries"]["llama-completion"]["sha256"]}
