"""One request at a time in a worker process that reads its settings back (openvino, onnxruntime-genai, executorch): the run
(request file, worker, read-back checks, settings, result) and the fidelity command, once. A subclass names its
worker, its python, the model file of a form, the texts its settings cite, and what in the worker's read-back
contradicts the request (`mismatch`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from harness import metrics, models
from harness.engines.base import EngineResult, OneRequestEngine, RunContext, affinity_prefix, failed, run_worker, setting


class WorkerEngine(OneRequestEngine):
    worker: Path
    timestamps: str  # how the worker stamps each token
    threads_source: str  # how the threads it ran were read back
    context_reason: str  # why context_len is not a setting of its own
    batch_source: str  # where the batch read back comes from
    compile_state: str  # what the run's compile_cache block says (nothing is compiled per run)
    prompt_counted: str  # who counted the prompt tokens the worker reads back ("the library counted")

    def _env(self, ctx_env: dict[str, str] | None = None) -> dict[str, str]:
        raise NotImplementedError

    def worker_python(self) -> str:
        return sys.executable

    def model_file(self, form_path: Path) -> Path:
        """What the worker loads of a form's folder or file."""
        return form_path

    def too_long(self, prompt_len: int, gen_len: int, context_len: int) -> str | None:
        """Why a request does not fit (refused at plan; a cell of several values is refused here, per run)."""
        if prompt_len + gen_len > context_len:
            return f"prompt_len {prompt_len} + gen_len {gen_len} exceed context_len {context_len}"
        return None

    def mismatch(self, info: dict, eff: dict, prompt_len: int, gen_len: int, n: int, want: int,
                 threads: int) -> str | None:
        """What the worker read back that contradicts the request or the hashed build (`info`), if anything: the
        request and token counts here, the engine's own read-back in `build_mismatch`."""
        if n != want:
            return f"the worker ran {n} requests, {want} were asked"
        if any(t != prompt_len for t in eff["prompt_tokens"]):
            return f"{self.prompt_counted} {eff['prompt_tokens']} prompt tokens, prompt_len is {prompt_len}"
        if any(t != gen_len for t in eff["output_tokens"]):
            return f"the requests returned {eff['output_tokens']} tokens, gen_len is {gen_len}"
        return self.build_mismatch(info, eff, threads)

    def build_mismatch(self, info: dict, eff: dict, threads: int) -> str | None:
        """What of the engine's own read-back (its libraries, threads, program) contradicts the hashed build."""
        raise NotImplementedError

    def request_extra(self) -> dict[str, Any]:
        """What else the worker's request and fidelity config carry (a backend the engine pins)."""
        return {}

    def fidelity_extra(self, workdir: Path) -> dict[str, Any]:
        return self.request_extra()

    def read_batch(self, eff: dict) -> int:
        raise NotImplementedError

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        p, g = int(ctx.params["prompt_len"]), int(ctx.params["gen_len"])
        c, b = int(ctx.params["context_len"]), int(ctx.params.get("batch", 1))
        w, reps = ctx.spec.warmups, ctx.spec.repetitions
        requested = {"threads": ctx.threads, "cpus": ctx.cpus, "form": form, "prompt_len": p, "gen_len": g,
                     "context_len": c, "batch": b, "warmups": w, "repetitions": reps, **ctx.arm.options}
        env_rec = self._env({**ctx.arm.env, **ctx.env})
        info = self.engine_info()
        cmd = affinity_prefix(ctx.cpus, ctx.arm.numa) + [self.worker_python(), str(self.worker), "request.json",
                                                         "result.json"]
        why = f"batch {b}: {self.name} runs one request at a time" if b != 1 else self.too_long(p, g, c)
        if why:
            return failed("failed", why, cmd, env_rec, "", info, requested)
        prompts = metrics.request_prompts(ctx.model, p, b, w + reps)
        request = {"model_path": str(self.model_file(models.form_path(ctx.model, form))), "threads": ctx.threads,
                   "gen_len": g, **self.request_extra(),
                   "repetitions": [{"warmup": i < w, "prompts": ids} for i, ids in enumerate(prompts)]}
        req_path, out_path = ctx.workdir / "request.json", ctx.workdir / "result.json"
        req_path.write_text(json.dumps(request))
        cmd = cmd[:-2] + [str(req_path), str(out_path)]
        worker = run_worker(cmd, {**os.environ, **env_rec}, ctx.timeout_s, out_path, f"{self.name} worker",
                            cwd=ctx.workdir, poll_s=ctx.poll_s)
        if worker.result is None:
            return worker.failed(cmd, env_rec, info, requested)
        r, res = worker.proc, worker.result
        eff, samples = res["effective"], res["samples"]
        problem = self.mismatch(info, eff, p, g, len(samples), w + reps, ctx.threads)
        if problem:
            return failed("failed", problem, cmd, env_rec, r.stderr, info, requested, r.peak_memory)
        settings = {
            "threads": setting(ctx.threads, eff["threads"], self.threads_source),
            "cpus": setting(ctx.cpus, eff["cpu_affinity"], f"sched_getaffinity(0) inside the {self.name} worker"),
            "context_len": setting(c, None, self.context_reason),
            "batch": setting(b, self.read_batch(eff), self.batch_source),
            "warmups": setting(w, sum(1 for s in samples if s["warmup"]), "warm-up requests the worker ran"),
        }
        recipe = models.load_manifest(ctx.model)["forms"][form].get("recipe")  # a form made on demand: its recipe
        effective = {**eff, "load_s": res.get("load_s"), "timestamps": self.timestamps,
                     **({"form_recipe": recipe} if recipe is not None else {}),
                     "metric_definitions": metrics.DEFINITIONS_VERSION}
        return EngineResult(status="ok", metrics=metrics.from_timestamps(samples, p), engine=info, requested=requested,
                            effective=effective, command=cmd, env=env_rec, peak_memory=r.peak_memory,
                            after_load={"status": "not separable", "reason": f"the {self.name} worker loads and "
                                                                             "measures in one process; see after_run"},
                            prompt_token_hash=metrics.prompts_hash(prompts),
                            compile_cache={"key": "n/a", "state": self.compile_state}, eager=None, settings=settings)

    def fidelity_command(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, req_path: Path,
                         out_path: Path, workdir: Path, options: dict | None = None) -> tuple[list[str], dict[str, str]]:
        cfg = {"model_path": str(self.model_file(model_path)), "threads": threads, **self.fidelity_extra(workdir),
               "request_path": str(req_path)}
        cfg_path = workdir / "fidelity-config.json"
        cfg_path.write_text(json.dumps(cfg))
        cmd = affinity_prefix(cpus, None) + [self.worker_python(), str(self.worker), "--fidelity", str(cfg_path),
                                             str(out_path)]
        return cmd, self._env()

    def fidelity_execution(self) -> dict[str, Any]:
        return {"compile_cache": {"key": "n/a", "state": self.compile_state}, "eager": None}
