"""The command engine: any shell command as an arm, timed as a whole process (like hyperfine).

Options: cmd (required, run with /bin/sh -c). Each warm-up and repetition is a fresh process, contained: it
ends when /bin/sh exits, and whatever it left running (a background job, a setsid'd daemon) is killed then.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from pydantic import Field

from harness.engines.base import Engine, EngineResult, Options, RunContext, affinity_prefix, failed, run_process, setting, tail
from harness.engines.capabilities import Limits


class CommandOptions(Options):
    cmd: str = Field(min_length=1, description="run with /bin/sh -c")


class Command(Engine, Limits):
    """The worked example of docs/harness.md: options, what it honours, its one metric, `run`."""

    name = "command"
    weight_files = {"none": ()}  # it loads no model
    needs_model = False
    default_form = "none"
    Options = CommandOptions
    honours = frozenset({"warmups", "repetitions"})  # prompt/gen/context lengths reach it only as HARNESS_* env
    metrics = ("wall_s",)
    # OMP_NUM_THREADS is set, what the command does with it is its own; a command may exit before its
    # affinity can be read: both recorded when known, never enforced
    observe_only = frozenset({"threads", "cpus"})

    def check(self, model: str, form: str | None, profile: dict[str, Any] | None = None) -> str:
        return form or self.default_form

    def engine_info(self) -> dict[str, Any]:
        sh = os.path.realpath("/bin/sh")
        with open(sh, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        return {"name": "command", "version": "n/a", "build_commit": "n/a (user command)",
                "build": {"shell": sh, "shell_sha256": digest}}

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        cmd_text = self.options(ctx.arm).cmd
        # Cell parameters are visible to the command, so one command can serve a sweep.
        env_rec = {**ctx.arm.env, "OMP_NUM_THREADS": str(ctx.threads),
                   **{f"HARNESS_{k.upper()}": str(v) for k, v in ctx.params.items()},
                   "HARNESS_ARM": ctx.arm.name, "HARNESS_PASS": str(ctx.run.pass_index)}
        env = {**os.environ, **env_rec}
        cmd = affinity_prefix(ctx.cpus, ctx.arm.numa) + ["/bin/sh", "-c", cmd_text]
        info = self.engine_info()
        requested = {"cmd": cmd_text, "threads": ctx.threads}
        walls, warm = [], []
        peak: dict = {"status": "unknown"}
        affinity = None
        deadline = time.time() + ctx.timeout_s
        for i in range(ctx.spec.warmups + ctx.spec.repetitions):
            # stdout is not parsed: only its tail is kept, however much the command writes (like hyperfine, which
            # discards it); the process and whatever it leaves running end with the repetition (lifecycle)
            r = run_process(cmd, env, max(0.1, deadline - time.time()), poll_s=0.05 if ctx.observe else None,
                            stdout_limit=None)
            affinity = affinity if affinity is not None else r.affinity
            if r.peak_memory.get("rss_bytes", 0) >= peak.get("rss_bytes", 0):
                peak = r.peak_memory
            if r.timed_out:
                return failed("timeout", f"command exceeded the run's {ctx.timeout_s:.0f} s", cmd, env_rec, r.stderr,
                              info, requested, peak)
            if r.returncode != 0:
                return failed("failed", f"command exited {r.returncode}: {tail(r.stderr, 1)}", cmd, env_rec, r.stderr,
                              info, requested, peak)
            (warm if i < ctx.spec.warmups else walls).append(r.wall_s)
        metrics = {"wall_s": {"unit": "s", "samples": walls, "warmup_samples": warm, "higher_is_better": False,
                              "definition": "wall time of one fresh /bin/sh -c process, start to exit, per repetition"}}
        settings = {"threads": setting(ctx.threads, None, "not readable from a shell command: OMP_NUM_THREADS is set"),
                    "cpus": setting(ctx.cpus, affinity, "sched_getaffinity of the /bin/sh process"),
                    "warmups": setting(ctx.spec.warmups, len(warm), "warm-up processes run")}
        return EngineResult(status="ok", metrics=metrics, engine=info, requested=requested, settings=settings,
                            effective={"cmd": cmd_text, "threads": ctx.threads, "cpu_affinity": affinity},
                            command=cmd, env=env_rec,
                            peak_memory=peak, after_load={"status": "n/a", "reason": "a command has no load phase"},
                            prompt_token_hash="n/a (command engine)")
