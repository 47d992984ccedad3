"""The llama.cpp engine: llama-bench (JSON output) for prefill and decode at the requested shape.

Prefill: `-p prompt_len -n 0`; decode: `-p 0 -n gen_len -d prompt_len` (decode after a context
of prompt_len tokens, like a real request). Two fresh processes per run.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from harness import llamacpp_build, models
from harness.engines.base import EngineResult, ModelEngine, RunContext, affinity_prefix, failed, run_process, tail
from harness.errors import UserError

PASSTHROUGH_OPTIONS = {"batch_size": "-b", "ubatch_size": "-ub", "flash_attn": "-fa", "cache_type_k": "-ctk",
                       "cache_type_v": "-ctv", "repack": "--repack", "load_mode": "-lm", "poll": "--poll"}
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


class LlamaCpp(ModelEngine):
    name = "llama.cpp"
    default_form = "gguf-f32"
    form_prefix = "gguf-"
    form_hint = "use gguf-f32, gguf-bf16, gguf-q8_0 ..."

    def engine_info(self) -> dict[str, Any]:
        m = llamacpp_build.load_manifest()
        return {"name": "llama.cpp", "version": f"{m['source']['package']}=={m['source']['version']} (vendored)",
                "build_commit": m["build_commit"],
                "build": {"flags": m["flags"], "compiler": m["compiler"], "build_key": m["build_key"],
                          "native_isa": m.get("native_isa", "unknown"), "sdist_sha256": m["source"]["sdist_sha256"],
                          "binary": "llama-bench", "binary_sha256": m["binaries"]["llama-bench"]["sha256"]}}

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        model_path = models.form_path(ctx.spec.model, form)
        bench = str(llamacpp_build.binary("llama-bench"))
        p, g = int(ctx.params["prompt_len"]), int(ctx.params["gen_len"])
        reps = ctx.spec.repetitions
        extra: list[str] = []
        for k, v in ctx.arm.options.items():
            if k in PASSTHROUGH_OPTIONS:
                extra += [PASSTHROUGH_OPTIONS[k], str(v)]
            elif k not in ("threads",):
                raise UserError(f"arms[{ctx.arm.name}].options.{k}", "unknown llama.cpp option",
                                f"known: threads, {', '.join(sorted(PASSTHROUGH_OPTIONS))}")
        if ctx.spec.warmups == 0:
            extra.append("--no-warmup")
        env = {**os.environ, **ctx.arm.env, "OMP_NUM_THREADS": str(ctx.threads)}
        pre = affinity_prefix(ctx.cpus if ctx.arm.cpus else None, ctx.arm.numa)
        base = pre + [bench, "-m", str(model_path), "-t", str(ctx.threads), "-r", str(reps), "-o", "json", *extra]
        tests = {"prefill": ["-p", str(p), "-n", "0"], "decode": ["-p", "0", "-n", str(g), "-d", str(p)]}
        info = self.engine_info()
        requested = {"threads": ctx.threads, "cpus": ctx.cpus, "form": form, "prompt_len": p, "gen_len": g,
                     "depth_for_decode": p, "repetitions": reps, **{k: v for k, v in ctx.arm.options.items()}}
        results: dict[str, dict] = {}
        peaks = []
        commands = []
        env_rec = {k: v for k, v in ctx.arm.env.items()} | {"OMP_NUM_THREADS": str(ctx.threads)}
        for name, args in tests.items():
            cmd = base + args
            commands.append(cmd)
            r = run_process(cmd, env, ctx.timeout_s, poll_s=ctx.poll_s)
            peaks.append(r.peak_memory)
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
            "prefill_tok_s": {"unit": "tok/s", "samples": [float(x) for x in pre_row["samples_ts"]],
                              "definition": f"llama-bench -p {p} -n 0: prompt tokens / wall time of one batch prefill, "
                                            "per repetition (its own warm-up run not reported)"},
            "decode_tok_s": {"unit": "tok/s", "samples": [float(x) for x in dec_row["samples_ts"]],
                             "definition": f"llama-bench -p 0 -n {g} -d {p}: generated tokens / wall time after a "
                                           f"{p}-token context, per repetition"},
            "prefill_latency_s": {"unit": "s", "higher_is_better": False,
                                  "samples": [ns / 1e9 for ns in pre_row["samples_ns"]],
                                  "definition": f"llama-bench -p {p}: wall time of the prefill, per repetition"},
        }
        effective = {k: pre_row.get(k) for k in EFFECTIVE_KEYS}
        effective["decode_test"] = {k: dec_row.get(k) for k in ("n_prompt", "n_gen", "n_depth", "n_threads")}
        effective["threads"] = pre_row.get("n_threads")
        peak = max(peaks, key=lambda x: x.get("rss_bytes", 0))
        token_hash = hashlib.sha256(f"llama-bench synthetic prompt tokens p={p} d={p}".encode()).hexdigest()
        return EngineResult(status="ok", metrics=metrics, engine=info, requested=requested, effective=effective,
                            command=commands[0] + ["&&"] + commands[1][len(base):], env=env_rec, peak_memory=peak,
                            after_load={"status": "not separable",
                                        "reason": "llama-bench loads and measures in one process; see after_run"},
                            prompt_token_hash=token_hash, eager=None)


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
