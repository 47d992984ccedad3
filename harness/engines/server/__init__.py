"""Server engines: an OpenAI-compatible server measured under a load (harness/serving.py, docs/serving.md).

- `llama-server`: llama.cpp's server from the pinned source (its own cached build, `harness build`), started
  fresh for every run on 127.0.0.1 and a free port, its settings read back from /props and its log;
- `openai`: an endpoint the harness does not start (`url:`, `api_key_env:`): what it reports of itself is
  recorded and its build is marked "external: build not verified".

Each run is one worker process (harness/engines/server/worker.py) that starts the server as its own child
(contained with it: harness/lifecycle.py), waits for it, sends the load, stops it. The metrics are computed
from the per-request chunk stamps by harness/metrics.py (the serving definitions), here, never by the server.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from harness import metrics, models, serving
from harness.engines.base import (Engine, EngineResult, Options, RunContext, affinity_prefix, failed, run_worker,
                                  setting)
from harness.engines.capabilities import Fidelity, Limits, Packages, Patches, Serves
from harness.engines.server import loadsources, vllmbench
from harness.errors import UserError
from harness.workloads.serving import grid as serving_grid

WORKER = Path(__file__).resolve().parent / "worker.py"


def _tokenizer_dir(grid_path: str, opts: Any) -> Path:
    """An arm's `tokenizer` folder, relative to its grid file, absolute."""
    d = Path(opts.tokenizer)
    return (d if d.is_absolute() else Path(grid_path).parent / d).resolve()


def _load(ctx: RunContext) -> serving.Load:
    """This run's load (the serving workload kind's; a sweep point's rate as resolved at the run's start)."""
    return serving_grid.load_of(ctx.spec, ctx.params, ctx.run.sweep)


class ServerEngine(Engine, Limits, Fidelity, Serves):
    """What every server engine shares: the load, the prompts, the worker, the serving metrics."""

    # an open loop's achieved rate is read back, never equal to the asked one: recorded, not enforced
    observe_only = frozenset({"load.rate"})
    honours = frozenset({"prompt_len", "gen_len", "context_len", "warmups", "repetitions", "load"})
    metrics = tuple(metrics.SERVING_METRICS)
    health: ClassVar[str] = "/health"
    info_paths: ClassVar[tuple[str, ...]] = ()
    log_patterns: ClassVar[tuple[str, ...]] = ()  # lines of the server's log its settings are read from

    def refuse_load(self, path: str, arm: Any, load: dict[str, Any]) -> None:
        """vllm bench serve (the cross-check's client, options.client) sends poisson or gamma arrivals only."""
        for fld, what in (("turns", "conversations"), ("trace", "trace"), ("dataset", "dataset")):
            if arm.options.get("client") == "vllm-bench" and fld in load:
                raise UserError(path, f"workload.load.{what}: vllm bench serve sends the harness's prompts at one "
                                      f"length, not a {what}'s (arm {arm.name!r}'s options.client)",
                                "use client: harness")
        if arm.options.get("client") == "vllm-bench" and load["arrival"] == "constant":
            raise UserError(path, f"workload.load.arrival: constant arrivals cannot be sent by vllm bench serve "
                                  f"(arm {arm.name!r}'s options.client)",
                            "use arrival: poisson or gamma, or client: harness")

    def printed_medians(self, effective: dict[str, Any], medians: tuple[str, ...]) -> tuple[str, dict[str, float]]:
        """vllm bench serve's own medians, from the reports it printed (execution.effective.tool_report)."""
        reports = effective.get("tool_report")
        if not isinstance(reports, list) or not reports:
            return "harness", {}
        return "vllm-bench", vllmbench.printed_medians(reports, medians)

    def server(self, ctx: RunContext, form: str, opts: Any) -> dict[str, Any] | None:
        """The server to start ({cmd with {port}, env}), or None: an endpoint the harness does not start."""
        return None

    def extra(self, opts: Any, gen_len: int) -> dict[str, Any]:
        """What each request carries beyond the OpenAI fields (harness/serving.py _body)."""
        return {}

    def read_back(self, ctx: RunContext, res: dict[str, Any], load: serving.Load, opts: Any, form: str
                  ) -> tuple[dict[str, Any], dict[str, dict]]:
        """(effective, settings) from what the server said of itself."""
        return {}, {}

    def api_model(self, ctx: RunContext, opts: Any) -> str:
        return ctx.model

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        opts = self.options(ctx.arm)
        p, g, c = int(ctx.params["prompt_len"]), int(ctx.params["gen_len"]), int(ctx.params["context_len"])
        load = _load(ctx)
        if load.unresolved:  # a sweep point whose pass's probes did not measure: nothing is sent at a guessed rate
            return failed("failed", f"rate sweep point {load.sweep['point']}: {load.unresolved}", [], dict(ctx.arm.env),
                          engine=self.engine_info_for(opts), requested={"threads": ctx.threads, "load": load.record()})
        w, reps = ctx.spec.warmups, ctx.spec.repetitions
        # pool 0: the warm-up requests; pool i: repetition i's measured requests (harness/metrics.py's seeds)
        firsts = load.conversations if load.turns > 1 else load.requests  # conversations: their first turns
        src = self.vocab_source(ctx, opts)  # the model, or an endpoint arm's own tokenizer file
        pools = metrics.request_prompts(src, p, max(firsts, w, 1), 1 + reps)
        if load.shared_prefix:  # every prompt opens with the same tokens (warm-ups too: a hot system prompt)
            pools = metrics.with_shared_prefix(src, pools, load.shared_prefix)
        prompts = [pools[0][:w]] + [pool[:firsts] for pool in pools[1:]]
        # a conversation's later turns: user_len new tokens each, seeded apart from every first turn's
        users = [metrics.user_turns(src, load.user_len, firsts, load.turns - 1, i) for i in range(reps)] \
            if load.turns > 1 else None
        tok_dir = self.tokenizer(ctx)
        trace = loadsources.of_load(ctx, load, tok_dir, src)  # a trace's or a dataset's own requests
        if isinstance(trace, str):
            return failed("failed", trace, [], dict(ctx.arm.env), engine=self.engine_info_for(opts),
                          requested={"threads": ctx.threads, "load": load.record()})
        if trace is not None:  # every repetition replays the trace: its prompts, lengths and schedule
            prompts = [prompts[0]] + [trace["prompts"]] * reps
        srv = self.server(ctx, form, opts)
        log = ctx.workdir / "server.log"
        request = {"timeout_s": ctx.timeout_s, "health": self.health, "info_paths": list(self.info_paths),
                   "log_patterns": list(self.log_patterns),
                   "model": self.api_model(ctx, opts), "extra": self.extra(opts, g), "gen_len": g,
                   "load": load.record(),
                   "repetitions": [{"warmup_prompts": prompts[0] if i == 0 else [], "prompts": prompts[1 + i],
                                    **({"users": users[i]} if users else {}),
                                    **({"gen_lens": trace["gen_lens"], "schedule": trace.get("schedule")}
                                       if trace else {})}
                                   for i in range(reps)],
                   "api_key_env": getattr(opts, "api_key_env", None),
                   "client": opts.client, "tokenizer": tok_dir}
        if srv is not None:
            request["server"] = {"cmd": srv["cmd"], "env": srv["env"], "log": str(log)}
        else:
            request["url"] = opts.url
        req_path, out_path = ctx.workdir / "request.json", ctx.workdir / "result.json"
        req_path.write_text(json.dumps(request))
        cmd = [sys.executable, str(WORKER), str(req_path), str(out_path)]
        # the client's process (and a started server) run with these; without a server, the client is alone in it
        env_rec = {**ctx.arm.env, **ctx.env, **(srv["env"] if srv else {"OMP_NUM_THREADS": "1"})}
        info = self.engine_info_for(opts)
        requested = {"threads": ctx.threads, "cpus": ctx.cpus, "form": form, "prompt_len": p, "gen_len": g,
                     "context_len": c, "warmups": w, "repetitions": reps, "load": load.record(),
                     "slo": serving_grid.slo(ctx.spec), **ctx.arm.options}
        worker = run_worker(cmd, {**os.environ, **env_rec}, ctx.timeout_s + 30, out_path, f"the {self.name} run",
                            poll_s=ctx.poll_s)
        shown = srv["cmd"] if srv else cmd
        if worker.result is None:
            return worker.failed(shown, env_rec, info, requested)
        res = worker.result
        shown = res.get("command", shown)  # the server's command as it ran: its port filled in
        effective, settings = self.read_back(ctx, res, load, opts, form)
        samples = res["repetitions"]
        measured = [r for s in samples for r in s["requests"]]
        errors = [r for r in measured if r.get("error")]
        sched = [serving.schedule_check(load, s["requests"]) for s in samples]
        got = [serving.achieved([r for r in s["requests"] if not r.get("error")]) for s in samples]
        usage = serving.usage_check([r for r in measured if not r.get("error")], g)
        most = min(s["most_in_flight"] for s in samples)
        if load.concurrency is not None and load.rate is None:
            settings["load.concurrency"] = setting(load.concurrency, most, "most requests in flight at once, "
                                                   "counted by the client; fewest over repetitions")
        if load.rate is not None:
            settings["load.rate"] = setting(load.rate, [x["rate_req_s"] for x in got],
                                            "(sends - 1) / (last send - first send), per repetition")
        if opts.client == "vllm-bench":
            settings["warmups"] = setting(w, samples[0].get("warmups_sent_by_tool") if samples else 0,
                                          "vllm bench serve's --num-warmups, as passed (it reports no count)")
        else:
            settings["warmups"] = setting(w, len(samples[0]["warmup_requests"]) if samples else 0,
                                          "warm-up requests sent")
        cache = serving.cache_check(measured, load.shared_prefix, getattr(opts, "prefix_cache", None))
        row = self.prefix_cache_setting(opts, effective, cache) if hasattr(opts, "prefix_cache") else None
        if row is not None:
            settings["options.prefix_cache"] = row
        if trace and "dataset" in trace:
            effective["dataset"] = trace["dataset"]
        effective |= {"load": load.record(), "achieved": got, "schedule": sched, "usage_check": usage, "cache": cache,
                      "requests_failed": len(errors), "ready_s": res.get("ready_s"),
                      "client_affinity": res.get("client_affinity"),
                      "metric_definitions": metrics.SERVING_DEFINITIONS_VERSION,
                      "client": vllmbench.VLLM_BENCH if opts.client == "vllm-bench" else
                      "harness/serving.py (asyncio + aiohttp), stamps each streamed chunk on arrival (time.perf_counter)"}
        if opts.client == "vllm-bench":
            effective["tool_report"] = [s.get("tool_report") for s in samples]
        serving_block = {"repetitions": samples, "schedule": sched, "usage_check": usage,
                         "server_log_tail": res.get("log_tail")}
        status, error = "ok", None
        limit = serving_grid.errors_allowed(ctx.spec)
        if len(errors) > limit * len(measured):
            status = "failed"
            error = (f"{len(errors)} of {len(measured)} requests failed (more than {limit:.0%}): "
                     f"{errors[0]['error']}")
        else:
            flags = [*(["client_behind: the client could not keep the load's schedule (see schedule)"]
                       if any(s["client_behind"] for s in sched) else []),
                     *([f"cache: {cache['flag']} (see cache)"] if cache.get("flag") else []),
                     *([f"usage_mismatch: the server's token count differs from the client's or the asked length in "
                        f"{usage['n_mismatched']} request(s) (see usage_check)"] if not usage["ok"] else [])]
            if flags:
                effective["flag"] = "; ".join(flags)
        return EngineResult(status=status, metrics=metrics.from_serving(samples, serving_grid.slo(ctx.spec)) if status == "ok" else {},
                            engine=info, requested=requested, effective=effective, command=shown, env=env_rec,
                            peak_memory=worker.proc.peak_memory,
                            after_load={"status": "not separable",
                                        "reason": "the server loads and serves in one process; see after_run"},
                            prompt_token_hash=metrics.prompts_hash(prompts + (users or [])), eager=None,
                            settings=settings,
                            error=error, stderr_tail=res.get("log_tail") if error else None, serving=serving_block)

    def engine_info_for(self, opts: Any) -> dict[str, Any]:
        return self.engine_info()

    def prefix_cache_setting(self, opts: Any, effective: dict[str, Any], cache: dict[str, Any]) -> dict | None:
        """The prefix cache as asked and as in effect: what the server reports of its setting where it does, else
        whether it reported cached tokens where a hit was possible (a shared prefix); None: nothing to observe."""
        if not (cache["requests_reporting"] and cache["shared_prefix"]):
            return None
        return setting(opts.prefix_cache, cache["cached_tokens"] > 0, "cached prompt tokens reported by the server "
                                                                      "(usage), with a shared prefix")

    # ---- fidelity: the server started as for a run, the request answered over its API (fidelity.py) ----------
    def fidelity_server(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, request: dict,
                        workdir: Path) -> dict[str, Any]:
        """The server to start for a fidelity request ({cmd with {port}, env}): one sequence at a time."""
        raise UserError(self.name, "has no fidelity mode", "use llama-server or vllm-server")

    def fidelity_command(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, req_path: Path,
                         out_path: Path, workdir: Path, options: dict | None = None) -> tuple[list[str], dict[str, str]]:
        request = json.loads(req_path.read_text())
        srv = self.fidelity_server(model_path, threads, cpus, dtype, request, workdir)
        wreq = {"timeout_s": FIDELITY_TIMEOUT_S, "health": self.health, "info_paths": list(self.info_paths),
                "log_patterns": list(self.log_patterns), "model": FIDELITY_MODEL, "dialect": self.name,
                "fidelity": request, "server": {"cmd": srv["cmd"], "env": srv["env"], "log": str(workdir / "server.log")}}
        wpath = workdir / "serving-request.json"
        wpath.write_text(json.dumps(wreq))
        return [sys.executable, str(WORKER), str(wpath), str(out_path)], srv["env"]

    def fidelity_block(self, options: dict | None = None) -> dict[str, Any]:
        """The engine block, with how its fidelity mode asks the server (part of the build a reference is reused
        for: a reference made through another version of the API is made anew)."""
        eng = super().fidelity_block(options)
        return {**eng, "build": {**eng["build"], "fidelity_api": FIDELITY_API[self.name]}}

    def vocab_source(self, ctx: RunContext, opts: Any) -> str:
        """Where the prompts' token ids come from: the grid's model (its vocabulary), or an arm's own tokenizer
        file (`tokenizer`: an endpoint's, where no model is prepared here)."""
        tok = getattr(opts, "tokenizer", None)
        return str(_tokenizer_dir(ctx.spec.path, opts) / "tokenizer.json") if tok else ctx.model

    def tokenizer(self, ctx: RunContext) -> str | None:
        """The model's Hugging Face directory (or the arm's `tokenizer` folder), for a client that counts tokens
        itself (vllm bench serve) or reads text (conversations, datasets)."""
        opts = self.options(ctx.arm)
        if getattr(opts, "tokenizer", None):
            return str(_tokenizer_dir(ctx.spec.path, opts))
        try:
            forms = models.load_manifest(ctx.model)["forms"]
        except UserError:  # an external endpoint's model need not be prepared here
            return None
        for form in ("hf-fp32", "hf-bf16"):
            if form in forms and (p := models.form_path(ctx.model, form)).is_dir():
                return str(p)
        return None


FIDELITY_MODEL = "fidelity"  # the name a fidelity server serves its model under
FIDELITY_TIMEOUT_S = 24 * 3600.0  # the worker's own limit; harness fidelity's run_worker stops it at the grid's timeout_s
FIDELITY_API = {"llama-server": "v2: POST /completion, one position a request, n_probs: greedy = argmax of the "
                                "logits (EOS included, ties: lowest id), teacher-forced the same on the continuation",
                "vllm-server": "v1: POST /v1/completions: greedy with logprobs (min_tokens, ignore_eos, as the vllm "
                               "engine); teacher-forced by prompt_logprobs"}


# ---- llama-server -------------------------------------------------------------------------------------------

class ServerOptions(Options):
    # who sends the load: this harness's client, or vLLM's serving benchmark (the cross-check, docs/serving.md)
    client: Literal["harness", "vllm-bench"] = "harness"


class LlamaServerOptions(ServerOptions):
    parallel: Annotated[int, Field(ge=1, le=256)] | None = None  # slots; default: the load's concurrency, else 4
    # each request's cache_prompt: a slot keeps its last prompt's KV and reuses its common prefix (off: prefill all)
    prefix_cache: bool = False
    n_batch: Annotated[int, Field(ge=1)] | None = None
    n_ubatch: Annotated[int, Field(ge=1)] | None = None


SYSTEM_INFO = r"llama threadpool init, n_threads = (\d+)"


class LlamaServer(ServerEngine):
    name = "llama-server"
    default_form = "gguf-f32"
    form_prefix = "gguf-"
    form_hint = "use a gguf-* form (gguf-f32, gguf-bf16, gguf-q8_0, ...)"
    Options = LlamaServerOptions
    env_prefixes = ("GGML_", "LLAMA_ARG_")
    info_paths = ("/props", "/slots")
    log_patterns = (SYSTEM_INFO,)

    def provision(self, isa_variant: str | None = None, rebuild: bool = False) -> dict[str, Any]:
        from harness.engines.llamacpp import build as llamacpp_build
        if isa_variant is not None:
            raise UserError("hardware", "llama-server has no ISA-capped build", "run llama-server natively")
        with llamacpp_build.server():
            return llamacpp_build.build(rebuild=rebuild)

    def engine_info(self) -> dict[str, Any]:
        from harness.engines.llamacpp import build as llamacpp_build
        with llamacpp_build.server():
            info = llamacpp_build.engine_block(self.name)
            b = llamacpp_build.load_manifest()["binaries"]["llama-server"]
        return {**info, "build": {**info["build"], "binary": "llama-server", "binary_sha256": b["sha256"]}}

    def slots(self, ctx: RunContext, opts: Any) -> int:
        load = _load(ctx)
        return opts.parallel or load.server_slots or 4

    def server(self, ctx: RunContext, form: str, opts: Any) -> dict[str, Any]:
        return self._server(models.form_path(ctx.model, form), ctx.model, ctx.threads, ctx.cpus, ctx.arm.numa,
                            int(ctx.params["context_len"]), self.slots(ctx, opts), opts)

    def _server(self, model_path: Path, alias: str, threads: int, cpus: list[int], numa: Any, n_ctx: int, slots: int,
                opts: Any) -> dict[str, Any]:
        from harness.engines.llamacpp import build as llamacpp_build
        with llamacpp_build.server():
            exe = llamacpp_build.binary("llama-server")
        cmd = affinity_prefix(cpus, numa) + [
            str(exe), "-m", str(model_path), "--host", "127.0.0.1", "--port", "{port}",
            "-a", alias, "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx * slots), "-np", str(slots),
            "--no-kv-unified", "--no-ui", "--slots", "--seed", "0"]
        if opts.n_batch:
            cmd += ["-b", str(opts.n_batch)]
        if opts.n_ubatch:
            cmd += ["-ub", str(opts.n_ubatch)]
        return {"cmd": cmd, "env": {"OMP_NUM_THREADS": str(threads)}}

    reference_form = "gguf-bf16"

    def fidelity_server(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, request: dict,
                        workdir: Path) -> dict[str, Any]:
        from harness.engines.llamacpp.engine import CTX_PAD
        n_ctx = -(-int(request["n_ctx"]) // CTX_PAD) * CTX_PAD  # llama.cpp pads a slot's context to this
        return self._server(model_path, FIDELITY_MODEL, threads, cpus, None, n_ctx, 1, LlamaServerOptions())

    def extra(self, opts: Any, gen_len: int) -> dict[str, Any]:
        return {"top_k": 1, "cache_prompt": bool(opts.prefix_cache)}

    def validate_options(self, path: str, arm, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        from harness.engines.llamacpp.engine import CTX_PAD
        where, ctxs = workload.get("context_len", ("workload.context_len", set()))
        bad = sorted(c for c in ctxs if c % CTX_PAD)
        if bad:
            raise UserError(path, f"{where}: {bad[0]} for arm {arm.name!r}: llama.cpp pads each slot's context to a "
                                  f"multiple of {CTX_PAD}, so it would use {-(-bad[0] // CTX_PAD) * CTX_PAD}",
                            f"set context_len to a multiple of {CTX_PAD}")

    def read_back(self, ctx: RunContext, res: dict[str, Any], load: serving.Load, opts: Any, form: str
                  ) -> tuple[dict[str, Any], dict[str, dict]]:
        props = res.get("info", {}).get("/props") or {}
        slots = res.get("info", {}).get("/slots")
        m = re.search(SYSTEM_INFO, (res.get("log_matches") or {}).get(SYSTEM_INFO) or "")
        threads = int(m.group(1)) if m else None
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        total = props.get("total_slots")
        settings = {
            "threads": setting(ctx.threads, threads, "llama-server's log line `llama threadpool init, n_threads = N`"),
            "cpus": setting(ctx.cpus, res.get("server_affinity"), "sched_getaffinity of the llama-server process"),
            "context_len": setting(int(ctx.params["context_len"]), n_ctx, "GET /props: default_generation_settings"
                                                                            ".n_ctx (per slot)"),
            "options.parallel": setting(self.slots(ctx, opts), total, "GET /props: total_slots"),
        }
        eff = {"threads": threads, "n_ctx_per_slot": n_ctx, "total_slots": total,
               "build_info": props.get("build_info"), "model_path": props.get("model_path"),
               "slots": [{k: s.get(k) for k in ("id", "n_ctx", "speculative", "is_processing")} for s in slots]
               if isinstance(slots, list) else slots,
               "sampling": ((props.get("default_generation_settings") or {}).get("params") or {}).get("samplers"),
               "threadpool": (res.get("log_matches") or {}).get(SYSTEM_INFO)}
        return eff, settings


# ---- vLLM's OpenAI server, with the patched runtime ----------------------------------------------------------

class VllmServerOptions(ServerOptions):
    dtype: Literal["float32", "bfloat16"] | None = None  # default: the form's
    eager: bool = True
    max_num_seqs: Annotated[int, Field(ge=1)] | None = None  # default: the load's concurrency, else 4
    kv_cache_memory_bytes: Annotated[int, Field(ge=1)] | None = None
    prefix_cache: bool = False  # vLLM's --enable-prefix-caching (off: --no-enable-prefix-caching)


VLLM_CONFIG = r"Initializing a V1 LLM engine \(v[^)]*\) with config: "
VLLM_BIND = r"local_rank=\d+, core ids=\[[\d, ]*\]"
VLLM_ARGS = r"non-default args: \{"


def _field(line: str | None, name: str) -> str | None:
    m = re.search(rf"\b{name}=([^,]+)", line or "")
    return m.group(1).strip() if m else None


class VllmServer(ServerEngine, Patches, Packages):
    """`vllm.entrypoints.openai.api_server` on the run's CPUs, the edge-harness runtime loaded in each of its
    processes (the plugin, `patches` as for the vllm engine); its settings read back from its log (the engine's
    config line, the CPU worker's OpenMP binding) and GET /v1/models, what the runtime did from the plugin's own
    record of each process."""

    name = "vllm-server"
    packages = ("vllm", "torch")
    read_back_keys = {**Limits.read_back_keys, "dtype": ("dtype",), "context_len": ("max_model_len",)}
    default_form = "hf-fp32"
    form_prefix = "hf-"
    form_hint = "use an hf-* form (hf-fp32, hf-bf16)"
    Options = VllmServerOptions
    env_prefixes = ("VLLM_", "EDGE_HARNESS_PATCHES")
    info_paths = ("/v1/models", "/version")
    log_patterns = (VLLM_CONFIG, VLLM_BIND, VLLM_ARGS)
    observe_only = frozenset({"load.rate", "options.max_num_seqs"})

    def validate_patches(self, path: str, where: str, patches: Any) -> None:
        from harness.engines.vllm import Vllm
        Vllm().validate_patches(path, where, patches)

    def engine_info(self) -> dict[str, Any]:
        from harness.engines.vllm import Vllm
        info = Vllm().engine_info()
        return {**info, "name": self.name, "build": {**info["build"], "entry": "vllm.entrypoints.openai.api_server"}}

    def seqs(self, ctx: RunContext, opts: Any) -> int:
        return opts.max_num_seqs or _load(ctx).server_slots or 4

    def dtype(self, form: str, opts: Any) -> str:
        return opts.dtype or ("bfloat16" if form == "hf-bf16" else "float32")

    def server(self, ctx: RunContext, form: str, opts: Any) -> dict[str, Any]:
        return self._server(models.form_path(ctx.model, form), ctx.model, ctx.cpus or list(range(ctx.threads)),
                            ctx.arm.numa, self.dtype(form, opts), int(ctx.params["context_len"]), self.seqs(ctx, opts),
                            opts, ctx.arm.patches, ctx.workdir)

    def _server(self, model_path: Path, alias: str, cpus: list[int], numa: Any, dtype: str, max_len: int, seqs: int,
                opts: Any, patches: Any, workdir: Path, extra: list[str] = ()) -> dict[str, Any]:
        from harness.engines.vllm import patches_env
        records = workdir / "records"
        records.mkdir(exist_ok=True)
        cmd = affinity_prefix(cpus, numa) + [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_path),
            "--served-model-name", alias, "--host", "127.0.0.1", "--port", "{port}",
            "--dtype", dtype, "--max-model-len", str(max_len),
            "--max-num-seqs", str(seqs), "--seed", "0",
            "--enable-prefix-caching" if getattr(opts, "prefix_cache", False) else "--no-enable-prefix-caching",
            "--enable-prompt-tokens-details", "--disable-uvicorn-access-log", *extra]
        if opts.eager:
            cmd.append("--enforce-eager")
        if opts.kv_cache_memory_bytes:
            cmd += ["--kv-cache-memory-bytes", str(opts.kv_cache_memory_bytes)]
        env = {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, cpus)), "EDGE_HARNESS_PATCHES": patches_env(patches),
               "EDGE_HARNESS_RECORD_DIR": str(records), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_DO_NOT_TRACK": "1"}
        return {"cmd": cmd, "env": env}

    reference_form = "hf-bf16"

    def fidelity_result_block(self, eng: dict, result: dict) -> dict:
        """The patches each of the server's processes applied, from the runtime's own record of it."""
        applied: dict[str, dict] = {}
        for r in result.get("runtime_records") or []:
            for name, effect in (r.get("applied") or {}).items():
                applied.setdefault(name, {"name": name, "applied": "declined" not in (effect or {}), "effect": effect,
                                          "pids": []})["pids"].append(r.get("pid"))
        return {**super().fidelity_result_block(eng, result), "patches": [applied[n] for n in sorted(applied)],
                "overrides": {n: p["effect"] for n, p in sorted(applied.items())}}

    def fidelity_dtype(self, form: str | None, options: dict) -> str | None:
        return self.dtype(form or "", VllmServerOptions())

    def fidelity_execution(self) -> dict[str, Any]:
        return {"compile_cache": {"key": "n/a", "state": "n/a (eager)"}, "eager": True}

    def fidelity_server(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, request: dict,
                        workdir: Path) -> dict[str, Any]:
        # eager, every runtime patch, one sequence: as the vllm engine's fidelity mode; logprobs up to the request's k
        return self._server(model_path, FIDELITY_MODEL, cpus, None, dtype or "float32", int(request["n_ctx"]), 1,
                            VllmServerOptions(), "all", workdir, ["--max-logprobs", str(int(request["top_k"]))])

    def extra(self, opts: Any, gen_len: int) -> dict[str, Any]:
        return {"min_tokens": gen_len, "return_token_ids": True, "top_k": 1}

    def prefix_cache_setting(self, opts: Any, effective: dict[str, Any], cache: dict[str, Any]) -> dict[str, Any]:
        on = {"True": True, "False": False}.get(effective.get("enable_prefix_caching") or "")
        return setting(opts.prefix_cache, on, "the engine config line of vLLM's log (enable_prefix_caching)")

    def read_back(self, ctx: RunContext, res: dict[str, Any], load: serving.Load, opts: Any, form: str
                  ) -> tuple[dict[str, Any], dict[str, dict]]:
        lm = res.get("log_matches") or {}
        cfg, bind = lm.get(VLLM_CONFIG), lm.get(VLLM_BIND)
        m = re.search(r"core ids=\[([\d, ]*)\]", bind or "")
        cores = [int(x) for x in m.group(1).split(",") if x.strip()] if m else None
        dtype = _field(cfg, "dtype")
        dtype = dtype.replace("torch.", "") if dtype else None
        models_ = (res.get("info") or {}).get("/v1/models") or {}
        data = (models_.get("data") or [{}])[0] if isinstance(models_, dict) else {}
        args = lm.get(VLLM_ARGS) or ""
        ms = re.search(r"'max_num_seqs': (\d+)", args)
        records = []
        for p in sorted((ctx.workdir / "records").glob("*.json")):
            try:
                records.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        settings = {
            "threads": setting(ctx.threads, len(cores) if cores is not None else None,
                               "the CPU worker's OpenMP binding, `core ids=[...]` in vLLM's log"),
            "cpus": setting(ctx.cpus, cores, "the CPU worker's OpenMP binding, `core ids=[...]` in vLLM's log"),
            "dtype": setting(self.dtype(form, opts),
                             dtype, "the engine config line of vLLM's log"),
            "context_len": setting(int(ctx.params["context_len"]), data.get("max_model_len"),
                                   "GET /v1/models: max_model_len"),
            "options.max_num_seqs": setting(self.seqs(ctx, opts), int(ms.group(1)) if ms else None,
                                            "vLLM's `non-default args` log line (as parsed, not read from the "
                                            "scheduler)"),
            "options.eager": setting(opts.eager, {"True": True, "False": False}.get(_field(cfg, "enforce_eager") or ""),
                                     "the engine config line of vLLM's log"),
        }
        eff = {"dtype": dtype, "max_model_len": data.get("max_model_len"), "omp_core_ids": cores,
               "server_affinity": res.get("server_affinity"), "version": (res.get("info") or {}).get("/version"),
               "enable_prefix_caching": _field(cfg, "enable_prefix_caching"),
               "runtime_records": records,
               "patches_applied": sorted({k for r in records for k in (r.get("applied") or {})})}
        return eff, settings


# ---- an endpoint the harness does not start ---------------------------------------------------------------

class OpenAiOptions(ServerOptions):
    url: str = Field(pattern=r"^https?://[^\s]+$", description="base URL, e.g. http://127.0.0.1:8000")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    served_model: str | None = None  # the `model` field requests carry (default: the grid's model name)
    # a folder holding the served model's tokenizer.json (relative to the grid file): the prompts' ids drawn from its
    # vocabulary, and text read with it, where the grid's model is not prepared here (model: none)
    tokenizer: str | None = None


class OpenAi(ServerEngine):
    name = "openai"
    default_form = "external"
    Options = OpenAiOptions
    observe_only = frozenset({"threads", "cpus", "context_len", "load.rate"})  # not our server: recorded only
    needs_model = False  # no weights of ours are loaded; the grid's model gives the prompts' token ids
    health = "/v1/models"
    info_paths = ("/v1/models",)

    def check(self, model: str, form: str | None, profile: dict[str, Any] | None = None) -> str:
        return form or self.default_form

    def engine_info(self) -> dict[str, Any]:
        return {"name": self.name, "version": "external", "build_commit": "external: build not verified",
                "build": {"external": True, "status": "external: build not verified"}}

    def engine_info_for(self, opts: Any) -> dict[str, Any]:
        info = self.engine_info()
        return {**info, "build": {**info["build"], "url": opts.url}}

    def api_model(self, ctx: RunContext, opts: Any) -> str:
        return opts.served_model or ctx.model

    def validate_options(self, path: str, arm, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        from urllib.parse import urlparse
        u = urlparse(opts.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UserError(path, f"arms[{arm.name}].options.url: {opts.url!r} is no http(s) URL",
                            "give the server's base URL, e.g. http://127.0.0.1:8000")
        if opts.tokenizer is not None and not (_tokenizer_dir(path, opts) / "tokenizer.json").is_file():
            raise UserError(path, f"arms[{arm.name}].options.tokenizer: no tokenizer.json in {opts.tokenizer}",
                            "give the folder of the served model's tokenizer.json (relative to the grid file)")

    def prepare_arm(self, spec: Any, arm: Any) -> None:
        """An unreachable endpoint is one line at start, before anything is measured."""
        from harness.engines.server.worker import get_json
        opts = self.options(arm)
        key = os.environ.get(opts.api_key_env) if opts.api_key_env else None
        try:
            get_json(opts.url.rstrip("/") + self.health, timeout=5.0, api_key=key)
        except (OSError, ValueError) as e:
            raise UserError(spec.path, f"arms[{arm.name}].options.url: {opts.url} is unreachable ({e})",
                            "start the server first, or fix the URL") from None

    def read_back(self, ctx: RunContext, res: dict[str, Any], load: serving.Load, opts: Any, form: str
                  ) -> tuple[dict[str, Any], dict[str, dict]]:
        return {"reported": res.get("info"), "external": "build not verified"}, {
            "threads": setting(ctx.threads, None, "an external server: not readable"),
            "cpus": setting(ctx.cpus, None, "an external server: not readable")}
