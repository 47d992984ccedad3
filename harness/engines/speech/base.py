"""What the speech engines share (piper.py, sherpa.py): one fresh process of worker.py per run, pinned by taskset
like every engine. Per request the worker hands one text to the engine and stamps each audio chunk as it arrives
(time.perf_counter() from the call); the metrics (time to first audio, real-time factors, the playback model's start
and stalls, chunk gaps) are computed here from those stamps and the chunks' durations
(harness/workloads/speech/playback.py). Start-up is the process's launch to the voice loaded and its phonemizer
initialized. Synthesis is deterministic (noise scales 0; each stream's audio sha256 is recorded).

Read back: the threads that ran the voice (the worker's threads with CPU time during the measured requests, from
the kernel), the engine's own thread setting, the CPU affinity, the sample rate, the ONNX Runtime library it loaded
(it must be the installed wheel's, hashed here).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from harness.engines import wheels
from harness.engines.base import Engine, EngineResult, Options, RunContext, affinity_prefix, run_worker, setting
from harness.engines.capabilities import Limits, Serves, Speaks
from harness.engines.workerlib import RUNNING_THREADS
from harness.errors import UserError
from harness.workloads.speech.playback import SERVED_METRICS, SPEECH_METRICS

INSTALL_FIX = "pip install -e '.[speech]' in the project's venv (make installs it)"
WORKER = Path(__file__).with_name("worker.py")
ENV_PREFIXES = ("ORT_", "OMP_", "OPENBLAS_")
WORKER_ENV = {"OPENBLAS_NUM_THREADS": "1"}  # numpy's pool never runs the voice: kept from spinning beside it


class SpeechOptions(Options):
    workers: int | None = Field(None, ge=1, le=64, description="served (a grid with a load): requests the server "
                                                               "speaks at once (default: the load's concurrency)")


class SpeechEngine(Engine, Limits, Speaks, Serves):
    """A speech engine: its distribution pinned (DIST, PIN), the distributions whose libraries it loads (DISTS,
    LIBRARY), the thread setting it reads back (THREADS_KEY) and how the worker stamps its chunks (timestamps)."""

    DIST: ClassVar[str] = ""
    PIN: ClassVar[str] = ""
    DISTS: ClassVar[tuple[str, ...]] = ()
    LIBRARY: ClassVar[re.Pattern] = re.compile(r"$^")
    RUNTIME: ClassVar[re.Pattern] = re.compile(r"libonnxruntime")  # the loaded libraries that must be the hashed ones
    THREADS_KEY: ClassVar[str] = ""
    MAX_WORKERS: ClassVar[int | None] = None  # requests its server can speak at once (None: as many as asked)
    timestamps: ClassVar[str] = ""
    weight_files = {"piper-onnx": (".onnx",)}
    default_form = "voice-fp32"
    form_prefix = "voice-"
    form_hint = "a speech engine speaks a voice's forms: voice-fp32, voice-int8 (harness/voices.py)"
    Options = SpeechOptions
    honours = frozenset({"warmups", "repetitions", "load"})
    max_batch = 1
    metrics = tuple(SPEECH_METRICS) + tuple(SERVED_METRICS)  # the speech kind's (harness/workloads/speech/playback.py)
    load_required = False  # in-process without a load; served (server.py) with one
    observe_only = frozenset({"dtype"})  # the form's types
    env_prefixes = ENV_PREFIXES
    worker_env = WORKER_ENV
    chunking = ("sentence", "engine")  # the engine's own unit is a sentence: either name says what it streams
    formats: ClassVar[tuple[str, ...]] = ("piper-onnx",)  # the voices it reads (harness/voices.py Voice.format)

    def require(self) -> str:
        try:
            v = metadata.version(self.DIST)
        except metadata.PackageNotFoundError:
            raise UserError(f"engine {self.name}", f"{self.DIST} is not installed (the optional extra `speech`)",
                            INSTALL_FIX) from None
        if v != self.PIN:
            raise UserError(f"engine {self.name}", f"{self.DIST} {v} is installed, the harness pins {self.PIN}",
                            INSTALL_FIX)
        return v

    def libraries(self) -> dict[str, dict[str, Any]]:
        return wheels.libraries(self.DISTS, self.LIBRARY, self.name, "speech", INSTALL_FIX)

    def check(self, model: str, form: str | None, profile: dict[str, Any] | None = None) -> str:
        from harness import voices
        form = form or self.default_form
        if not voices.known(model):
            raise UserError(f"model {model}", f"{self.name} speaks a voice, not a language model",
                            f"set the grid's model to a voice: {', '.join(voices.VOICES)}")
        voices.refuse_reader(f"model {model}", model, self.name, self.formats)
        voices.check_form(f"model {model}: form", form, model)
        self.require()
        return form

    def validate_options(self, path: str, arm: Any, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        from harness import voices
        if arm.form is not None:
            voices.check_form(f"{path}: arms[{arm.name}].form", arm.form)
        where, forms = workload.get("form", ("axes.form", set()))
        for f in sorted(forms):
            voices.check_form(f"{path}: {where} (arm {arm.name})", f)

    def engine_info(self) -> dict[str, Any]:
        version = self.require()
        libs = self.libraries()
        return {"name": self.name, "version": f"{self.DIST}=={version} (PyPI)",
                "build_commit": f"{self.DIST} {version} (PyPI wheel)",
                "build": {"distributions": {d: metadata.version(d) for d in self.DISTS},
                          "libraries": wheels.build_block(libs), "execution_provider": "cpu",
                          "worker": "harness/engines/speech/worker.py",
                          "worker_sha256": hashlib.sha256(WORKER.read_bytes()).hexdigest()}}

    def voice_files(self, voice_dir: Path, form: str) -> dict[str, Any]:
        """What the worker loads of the form's folder (an engine may derive files of its own from it)."""
        from harness import voices
        return {"onnx": str(voice_dir / voices.ONNX_NAME), "config": str(voice_dir / voices.CONFIG_NAME)}

    def request_fields(self, opts: Any) -> dict[str, Any]:
        """What the worker is asked besides the voice and the texts (recorded as requested)."""
        return {"noise_scale": 0.0, "noise_w_scale": 0.0}

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        from harness.workloads.serving import grid as serving_grid
        if serving_grid.load(ctx.spec) is not None:
            from harness.engines.speech.served import run_served
            return run_served(self, ctx, form)
        if getattr(self.options(ctx.arm), "client", "worker") == "cli":
            from harness.engines.speech.cli import run_cli
            return run_cli(self, ctx, form)
        from harness import voices
        from harness.workloads.speech import playback, texts
        d = voices.ensure(ctx.model, form)
        name = ctx.params["text"]
        n = ctx.spec.warmups + ctx.spec.repetitions
        picks = texts.chosen(name, ctx.spec.seed, ctx.run.cell.id, ctx.run.pass_index, n)
        asked = self.request_fields(self.options(ctx.arm))
        req = {"engine": self.name, "threads": ctx.threads, **self.voice_files(d, form), **asked,
               "requests": [{"id": f"{name}[{i}]", "text": texts.TEXTS[name][i], "warmup": k < ctx.spec.warmups}
                            for k, i in enumerate(picks)]}
        req_path, out_path = ctx.workdir / "request.json", ctx.workdir / "result.json"
        req_path.write_text(json.dumps(req))
        env_rec = {**{k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}, **WORKER_ENV,
                   **ctx.env, "PYTHONNOUSERSITE": "1"}
        cmd = affinity_prefix(ctx.cpus, ctx.arm.numa) + [sys.executable, str(WORKER), str(req_path), str(out_path)]
        info = self.engine_info()
        requested = {"threads": ctx.threads, "form": form, "text": name, **asked}
        launched = time.time()
        w = run_worker(cmd, {**os.environ, **env_rec}, ctx.timeout_s, out_path, f"{self.name} worker",
                       poll_s=ctx.poll_s)
        if w.status != "ok":
            return w.failed(cmd, env_rec, info, requested)
        res = w.result or {}
        eff = res["effective"]
        foreign = self._foreign_libraries(eff)
        if foreign:
            return EngineResult(status="failed", metrics={}, engine=info, requested=requested, effective=eff,
                                command=cmd, env=env_rec, peak_memory=w.proc.peak_memory,
                                after_load={"status": "unknown"}, prompt_token_hash="n/a", error=foreign)
        startup = max(0.0, float(res["ready_unix"]) - launched)
        metrics = playback.metrics(res["streams"], startup)
        settings = {"threads": setting(ctx.threads, eff["threads"], RUNNING_THREADS + f"; the engine's {self.THREADS_KEY} "
                                       f"was {eff.get(self.THREADS_KEY)}"),
                    "cpus": setting(ctx.cpus, eff["cpu_affinity"], "sched_getaffinity in the worker"),
                    "warmups": setting(ctx.spec.warmups, sum(1 for s in res["streams"] if s["warmup"]),
                                       "warm-up requests the worker ran"),
                    "dtype": setting(voices.dtype(ctx.model, form), None,
                                     "the form's types (not readable from the engine)")}
        effective = {**eff, "timestamps": self.timestamps, "texts": [s["id"] for s in res["streams"]],
                     "audio_sha256": [s["audio_sha256"] for s in res["streams"]],
                     "chunk_samples": [s["samples"] for s in res["streams"]], "load_s": res["load_s"],
                     "ready_s": startup}
        return EngineResult(status="ok", metrics=metrics, engine=info, requested=requested, settings=settings,
                            effective=effective, command=cmd, env=env_rec, peak_memory=w.proc.peak_memory,
                            after_load={"status": "n/a", "reason": "the worker loads and speaks in one process; "
                                                                   "ready_s times its load"},
                            prompt_token_hash=f"texts sha256 {texts.set_sha256(name)}")

    def speak_all(self, model: str, form: str, spoken: list[tuple[str, str]], threads: int, cpus: list[int],
                  workdir: Path, timeout_s: float) -> dict[str, Any]:
        """Every (id, text) spoken whole by one fresh worker (audio fidelity, harness/workloads/speech/fidelity.py):
        {status, items: [{id, audio (float32 samples), audio_sha256}], effective, engine, command, env, error, stderr}."""
        import numpy as np

        from harness import voices
        d = voices.ensure(model, form)
        audio_out = workdir / "audio.npz"
        req = {"engine": self.name, "threads": threads, **self.voice_files(d, form), "audio_out": str(audio_out),
               "texts": [{"id": i, "text": t} for i, t in spoken]}
        req_path, out_path = workdir / "request.json", workdir / "result.json"
        req_path.write_text(json.dumps(req))
        env_rec = {**{k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}, **WORKER_ENV,
                   "PYTHONNOUSERSITE": "1"}
        cmd = affinity_prefix(cpus, None) + [sys.executable, str(WORKER), "--fidelity", str(req_path), str(out_path)]
        info = self.engine_info()
        w = run_worker(cmd, {**os.environ, **env_rec}, timeout_s, out_path, f"{self.name} fidelity worker")
        common = {"engine": info, "command": cmd, "env": env_rec}
        if w.status != "ok":
            return {**common, "status": w.status, "error": w.error, "stderr": w.stderr[-4000:]}
        res = w.result or {}
        foreign = self._foreign_libraries(res.get("effective") or {})
        if foreign:
            return {**common, "status": "failed", "error": foreign}
        with np.load(audio_out) as z:
            audio = [z[f"t{k}"] for k in range(len(spoken))]
        return {**common, "status": "ok", "effective": res["effective"],
                "items": [{**it, "audio": a} for it, a in zip(res["items"], audio)]}

    def _foreign_libraries(self, eff: dict) -> str | None:
        """A loaded ONNX Runtime library that is not the installed wheel's (whose files engine_info hashed)."""
        try:
            installed = {os.path.realpath(f.locate()) for d in self.DISTS for f in metadata.distribution(d).files or ()
                         if self.LIBRARY.search(f.name)}
        except metadata.PackageNotFoundError as e:
            return f"{e.name} is not installed"
        loaded = [p for p in eff.get("libraries") or [] if self.RUNTIME.search(os.path.basename(p))]
        if not loaded:
            return "the worker reported no ONNX Runtime library loaded"
        foreign = [p for p in loaded if p not in installed]
        return f"the worker loaded {foreign[0]}, which is not the hashed build" if foreign else None
