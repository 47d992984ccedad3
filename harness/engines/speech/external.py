"""The `openai-speech` engine: an OpenAI-style speech endpoint the harness does not start (`url:`), sent the speech
grid's load (docs/speech.md, "Served speech"): POST {url}/v1/audio/speech with {model, input, voice,
response_format: pcm}, each response read as it streams (harness/workloads/speech/client.py, a piece per read: an
outside server's HTTP chunks mean nothing), its audio 16-bit mono PCM at the X-Sample-Rate header's rate or, where the
server sends none (OpenAI's own API), the arm's `sample_rate`. What it reports at `health` is recorded; its build
is marked "external: build not verified"; its threads, CPUs and start-up are not ours to read. The texts: one per
request, chosen by the seed every arm of a pass shares, as for the harness's own server."""

from __future__ import annotations

import os
from typing import Any

from pydantic import Field

from harness.engines.base import Engine, EngineResult, Options, RunContext, setting
from harness.engines.capabilities import Limits, Serves, Speaks
from harness.errors import UserError
from harness.workloads.speech.playback import SERVED_METRICS

SPEECH_PATH = "/v1/audio/speech"
NOT_OURS = {"status": "n/a", "reason": "an external server: its memory is not readable (the client runs in the harness)"}


class OpenAiSpeechOptions(Options):
    url: str = Field(pattern=r"^https?://[^\s]+$", description="base URL, e.g. http://127.0.0.1:8880")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                                    description="the environment variable holding the API key (never recorded)")
    served_model: str | None = Field(None, min_length=1, max_length=200, description="the requests' `model` field "
                                     "(default: the grid's model name)")
    voice: str = Field("alloy", min_length=1, max_length=200, description="the requests' `voice` field")
    sample_rate: int = Field(24000, ge=1000, le=384000, description="the PCM's rate where the server sends no "
                             "X-Sample-Rate header (OpenAI's pcm: 24000)")
    health: str = Field("/v1/models", pattern=r"^/[^\s]*$", description="the path asked before anything is measured "
                        "(its answer recorded)")


class OpenAiSpeech(Engine, Limits, Speaks, Serves):
    name = "openai-speech"
    default_form = "external"
    form_hint = "an external endpoint speaks its own voice: no form (or form: external)"
    Options = OpenAiSpeechOptions
    honours = frozenset({"warmups", "repetitions", "load"})
    max_batch = 1
    metrics = tuple(SERVED_METRICS)  # no ready_s: its start-up is not the harness's to time
    load_required = True  # served only: there is nothing in-process to run
    needs_model = False  # no voice of ours is loaded
    observe_only = frozenset({"threads", "cpus", "dtype"})  # not our server: recorded, not read back
    chunking = ("engine",)  # pieces as the server streams them, its own unit

    def check(self, model: str, form: str | None, profile: dict[str, Any] | None = None) -> str:
        if form not in (None, self.default_form):
            raise UserError("arm.form", f"{self.name} speaks through an endpoint, got form {form!r}", self.form_hint)
        return self.default_form

    def engine_info(self) -> dict[str, Any]:
        return {"name": self.name, "version": "external", "build_commit": "external: build not verified",
                "build": {"external": True, "status": "external: build not verified"}}

    def validate_options(self, path: str, arm: Any, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        from urllib.parse import urlparse
        u = urlparse(opts.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UserError(path, f"arms[{arm.name}].options.url: {opts.url!r} is no http(s) URL",
                            "give the server's base URL, e.g. http://127.0.0.1:8880")
        if arm.form not in (None, self.default_form):
            raise UserError(path, f"arms[{arm.name}].form: {self.name} speaks through an endpoint, got {arm.form!r}",
                            self.form_hint)

    def _key(self, path: str, arm: Any, opts: Any) -> str | None:
        if opts.api_key_env is None:
            return None
        key = os.environ.get(opts.api_key_env)
        if not key:
            raise UserError(path, f"arms[{arm.name}].options.api_key_env: {opts.api_key_env} is not set",
                            f"export {opts.api_key_env}=... before the run, or drop api_key_env")
        return key

    def prepare_arm(self, spec: Any, arm: Any) -> None:
        """An unreachable or failing endpoint, an unset key, a model unnamed: one line at start, before anything
        is measured."""
        from harness.engines.server.worker import get_json
        opts = self.options(arm)
        if opts.served_model is None and spec.model == "none":
            raise UserError(spec.path, f"arms[{arm.name}].options.served_model: the grid has no model to name the "
                            "requests' `model` by", "served_model: tts-1 (what the server serves)")
        key = self._key(spec.path, arm, opts)
        where = opts.url.rstrip("/") + opts.health
        try:
            status, _ = get_json(where, timeout=5.0, api_key=key)
        except (OSError, ValueError) as e:
            raise UserError(spec.path, f"arms[{arm.name}].options.url: {where} is unreachable ({e})",
                            "start the server first, or fix the URL") from None
        if status >= 400:
            raise UserError(spec.path, f"arms[{arm.name}].options.health: {where} answered HTTP {status}",
                            "check the server, its health path (options.health) and its key (options.api_key_env)")

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        from harness.engines.server.worker import get_json
        from harness.engines.speech.served import outcome
        from harness.serving import arrivals
        from harness.workloads.serving import grid as serving_grid
        from harness.workloads.speech import client, playback, texts
        load = serving_grid.load_of(ctx.spec, ctx.params, ctx.run.sweep)
        opts = self.options(ctx.arm)
        info = {**self.engine_info(), "build": {**self.engine_info()["build"], "url": opts.url}}
        name = ctx.params["text"]
        w, reps, n = ctx.spec.warmups, ctx.spec.repetitions, load.requests
        picks = texts.chosen(name, ctx.spec.seed, ctx.run.cell.id, ctx.run.pass_index, w + reps * n)
        spoken = [(f"{name}[{i}]", texts.TEXTS[name][i]) for i in picks]
        warm, rest = spoken[:w], spoken[w:]
        model = opts.served_model or ctx.model
        requested = {"threads": ctx.threads, "form": form, "text": name, "load": load.record(), "model": model,
                     "voice": opts.voice, "sample_rate": opts.sample_rate}
        key = self._key(ctx.spec.path, ctx.arm, opts)
        base = opts.url.rstrip("/")
        try:
            status, reported = get_json(base + opts.health, timeout=5.0, api_key=key)
        except (OSError, ValueError) as e:
            status, reported = 0, f"{type(e).__name__}: {e}"
        if not 200 <= status < 300:
            return EngineResult(status="failed", metrics={}, engine=info, requested=requested,
                                effective={"reported": reported}, command=[base + SPEECH_PATH], env={},
                                peak_memory=NOT_OURS, after_load=NOT_OURS, prompt_token_hash="n/a",
                                error=f"{base + opts.health} answered {status or 'nothing'} before the run")
        ask = client.Ask(body={"model": model, "voice": opts.voice, "response_format": "pcm"}, pieces="read",
                         sample_rate=opts.sample_rate, headers={"Authorization": f"Bearer {key}"} if key else {})
        reps_out = client.run(base + SPEECH_PATH, warm, [rest[i * n:(i + 1) * n] for i in range(reps)],
                              load.concurrency if load.rate is None else None, arrivals(load), ctx.timeout_s, ask)
        recs, errors, state, error, sent = outcome(ctx, load, reps_out)
        settings = {"threads": setting(ctx.threads, None, "an external server: not readable"),
                    "cpus": setting(ctx.cpus, None, "an external server: not readable"),
                    "dtype": setting(None, None, "an external server: not readable"), **sent}
        rates = sorted({r["sample_rate"] for r in recs if r.get("sample_rate")})
        effective = {"reported": reported, "external": "build not verified", "load": load.record(),
                     "requests_failed": len(errors), "texts": [r["id"] for r in recs], "sample_rates": rates,
                     "pieces": "a piece per read of the response (the server's own streaming unit)",
                     "client": "harness/workloads/speech/client.py (asyncio + aiohttp): a piece stamped as it is read"}
        return EngineResult(status=state, metrics=playback.served_metrics(reps_out, None) if state == "ok" else {},
                            engine=info, requested=requested, effective=effective, command=[base + SPEECH_PATH],
                            env={}, peak_memory=NOT_OURS, after_load=NOT_OURS,
                            prompt_token_hash=f"texts sha256 {texts.set_sha256(name)}", settings=settings, error=error,
                            serving={"repetitions": reps_out})
