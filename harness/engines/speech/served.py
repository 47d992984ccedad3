"""A speech engine served (docs/speech.md, "Served speech"): where a speech grid gives a load, each run starts
server.py around the engine (pinned to the run's CPUs, its peak memory watched), waits for its /health, sends each
repetition's requests with harness/workloads/speech/client.py under the load, and stops it. The texts: one per
request, chosen by the seed every arm of a pass shares (the warm-ups first)."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness.engines.base import EngineResult, RunContext, affinity_prefix, failed, setting, tail


SERVER = Path(__file__).with_name("server.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read(1 << 20)) if r.status == 200 else None
    except (OSError, ValueError):
        return None


def outcome(ctx: RunContext, load: Any, reps_out: list[dict]) -> tuple[list, list, str, str | None, dict]:
    """A served speech run's requests, its failed ones, its status and error (more failed than the grid allows:
    failed), and the settings the client read back of what it sent (warm-ups, the concurrency it reached)."""
    from harness.workloads.serving import grid as serving_grid
    recs = [r for rep in reps_out for r in rep["requests"]]
    errors = [r for r in recs if r["error"]]
    status, error = ("failed", f"{len(errors)} of {len(recs)} requests failed: {errors[0]['error']}") \
        if len(errors) > serving_grid.errors_allowed(ctx.spec) * len(recs) else ("ok", None)
    sent = {"warmups": setting(ctx.spec.warmups, len(reps_out[0]["warmup_requests"]) if reps_out else 0,
                               "warm-up requests sent")}
    if load.concurrency is not None and load.rate is None:
        sent["load.concurrency"] = setting(load.concurrency, min(rep["most_in_flight"] for rep in reps_out),
                                           "most requests in flight at once, counted by the client; fewest over "
                                           "repetitions")
    return recs, errors, status, error, sent


def run_served(engine: Any, ctx: RunContext, form: str) -> EngineResult:
    from harness import voices
    from harness.lifecycle import popen
    from harness.residency import PeakMemory
    from harness.serving import arrivals
    from harness.workloads.serving import grid as serving_grid
    from harness.workloads.speech import client, playback, texts
    load = serving_grid.load_of(ctx.spec, ctx.params, ctx.run.sweep)
    opts = engine.options(ctx.arm)
    workers = int(getattr(opts, "workers", None) or load.concurrency or 1)
    workers = min(workers, engine.MAX_WORKERS or workers)
    d = voices.ensure(ctx.model, form)
    name = ctx.params["text"]
    w, reps, n = ctx.spec.warmups, ctx.spec.repetitions, load.requests
    picks = texts.chosen(name, ctx.spec.seed, ctx.run.cell.id, ctx.run.pass_index, w + reps * n)
    spoken = [(f"{name}[{i}]", texts.TEXTS[name][i]) for i in picks]
    warm, rest = spoken[:w], spoken[w:]
    cfg = {"engine": engine.name, "threads": ctx.threads, "workers": workers, **engine.voice_files(d, form)}
    cfg_path, log = ctx.workdir / "server.json", ctx.workdir / "server.log"
    cfg_path.write_text(json.dumps(cfg))
    port = _free_port()
    env_rec = {**{k: v for k, v in sorted(os.environ.items()) if k.startswith(engine.env_prefixes)}, **engine.worker_env,
               **ctx.env,
               "PYTHONNOUSERSITE": "1"}
    cmd = affinity_prefix(ctx.cpus, ctx.arm.numa) + [sys.executable, str(SERVER), str(cfg_path), str(port)]
    info = engine.engine_info()
    requested = {"threads": ctx.threads, "form": form, "text": name, "workers": workers, "load": load.record()}
    base = f"http://127.0.0.1:{port}"
    launched = time.time()
    with open(log, "wb") as logf:
        proc = popen(cmd, stdout=logf, stderr=logf, env={**os.environ, **env_rec}, start_new_session=True)
    try:
        with PeakMemory(proc.pid, ctx.poll_s or 0.5) as pm:
            deadline, ready = launched + ctx.timeout_s, None
            while ready is None and time.time() < deadline and proc.poll() is None:
                ready = _health(base + "/health")
                if ready is None:
                    time.sleep(0.05)
            if ready is None:
                why = "exited" if proc.poll() is not None else f"was not ready in {ctx.timeout_s:.0f} s"
                return failed("failed", f"the speech server {why}: {tail(log.read_text(errors='replace'), 1)}", cmd,
                              env_rec, log.read_text(errors="replace"), info, requested)
            startup = time.time() - launched
            reps_out = client.run(base + "/v1/audio/speech", warm, [rest[i * n:(i + 1) * n] for i in range(reps)],
                                  load.concurrency if load.rate is None else None, arrivals(load), ctx.timeout_s)
            peak = pm
    finally:
        proc.release()
        proc.wait()
    recs, errors, status, error, sent = outcome(ctx, load, reps_out)
    settings = {"threads": setting(ctx.threads, ready.get("intra_op_num_threads", ready.get("num_threads")),
                                   f"the server's {engine.THREADS_KEY}, from its /health"),
                "cpus": setting(ctx.cpus, ready.get("cpu_affinity"), "sched_getaffinity in the server, from /health"),
                "workers": setting(workers, ready.get("workers"), "the server's speaking threads, from its /health"),
                "dtype": setting(voices.dtype(ctx.model, form), None,
                                 "the form's types (not readable from the engine)"),
                **sent}
    effective = {"threads": ready.get("intra_op_num_threads", ready.get("num_threads")), **ready,
                 "cpu_affinity": ready.get("cpu_affinity"), "load": load.record(), "requests_failed": len(errors),
                 "ready_s": startup, "texts": [r["id"] for r in recs], "client": "harness/workloads/speech/client.py "
                 "(asyncio + aiohttp): a chunk stamped when its last byte is read"}
    effective.pop("status", None)
    return EngineResult(status=status, metrics=playback.served_metrics(reps_out, startup) if status == "ok" else {},
                        engine=info, requested=requested, effective=effective, command=cmd, env=env_rec,
                        peak_memory=peak.result(), after_load={"status": "not separable", "reason": "the server loads "
                                                               "and serves in one process; see after_run"},
                        prompt_token_hash=f"texts sha256 {texts.set_sha256(name)}", settings=settings, error=error,
                        stderr_tail=tail(log.read_text(errors="replace")) if error else None,
                        serving={"repetitions": reps_out, "server_log_tail": tail(log.read_text(errors="replace"))})
