"""One run on this machine: planned (plan_run), executed (the engine in a fresh process under the plan's caps,
residency before and after), and its artifact built (build).

The loop around runs (resume, locks, ETA, writing) is harness/execute.py, one for every executor.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import documents, emulate, grid, hardware, models, provenance
from harness.artifact import DerivedFrom, GridRef, Residency, StopRule, Workload
from harness.engines import get_engine
from harness.engines.base import EngineResult, RunContext
from harness.engines.capabilities import Sizing, capability
from harness.errors import UserError
from harness.residency import files_residency
from harness.schedule import RunSpec
from harness.workloads import workload_record

NO_MODEL = "none"


def model_block(model: str, form: str) -> tuple[dict, dict[str, Path]]:
    if model == NO_MODEL or form == "none":
        return {"name": model, "form": "none", "source": {"none": "command engine"}, "format": "none",
                "dtype": "none", "parameters": 1, "files": []}, {}
    if form == "external":  # a server the harness does not start (the openai engine): no weights of ours
        return {"name": model, "form": "external", "format": "external", "dtype": "unknown", "parameters": 1,
                "files": [], "source": {"external": "served by an endpoint the harness does not start; the prompts "
                                                    "are this model's token ids"}}, {}
    from harness import voices
    if voices.known(model):
        return voices.model_block(model, form)
    root = models.ensure(model, [form])
    block = models.loaded_block(model, form)  # hashed now; a file that is not the manifest's is refused
    weights = {rel: root / rel for rel in models.weight_files(model, form)}
    return block, weights


def default_cpus(threads: int) -> list[int]:
    """An arm without cpus runs on the first `threads` CPUs this process may use (not 0..threads-1: under an
    affinity that excludes CPU 0, taskset would refuse those)."""
    return sorted(os.sched_getaffinity(0))[:threads]


def threads_of(arm: grid.Arm, params: dict) -> int:
    return int(arm.options.get("threads") or params.get("threads"))


@dataclass
class RunPlan:
    """What one run will do, decided before anything runs: the engine and the form it loads, the model's files,
    the threads and CPUs, and the emulated hardware class it runs under (None: native)."""
    arm: grid.Arm
    engine: Any
    threads: int
    cpus: list[int]
    form: str
    form_override: dict
    model_block: dict
    weights: dict[str, Path]
    observe: bool
    em: emulate.Emulation | None = None
    profile: dict | None = None  # the emulated class's profile (None: this machine's)


@dataclass
class Executed:
    """What executing a plan gave: the engine's result, the host and timing around it, the weights' residency
    before and after, and whether an emulated class's memory cap held to the end."""
    res: EngineResult
    host: dict
    timing: dict
    before: dict
    after: dict
    held: bool = True


def run_one(spec: grid.GridSpec, run: RunSpec, workroot: Path, store_root: Path | None = None,
            executor: dict | None = None) -> Any:
    """One run: planned, executed in a fresh process of the engine under the plan's caps, and its artifact built."""
    plan = plan_run(spec, run)
    workdir = Path(tempfile.mkdtemp(prefix=f"run-{run.run_key}-", dir=workroot))
    ctx = RunContext(spec=spec, run=run, arm=plan.arm, threads=plan.threads, cpus=plan.cpus, workdir=workdir,
                     timeout_s=spec.timeout_s, store_root=store_root, observe=plan.observe)
    if plan.em:
        ctx.env, ctx.isa_variant = dict(plan.em.env), plan.em.isa_variant
        ctx.profile = plan.profile
        ctx.isa = plan.profile["isa"] if plan.profile else None
    out = execute(plan, ctx)
    a = build(spec, run, plan, out, executor)
    shutil.rmtree(workdir, ignore_errors=True)  # everything the artifact needs is in it
    return a


def plan_run(spec: grid.GridSpec, run: RunSpec) -> RunPlan:
    """The run's plan: its emulated class checked against this machine (emulate.plan), the form resolved (`auto`
    by the class's profile or this machine's), the model's files hashed, its CPUs chosen."""
    arm = spec.arm(run.arm)
    engine = get_engine(arm.engine)
    threads = threads_of(arm, run.cell.params)
    hw = grid.hardware_of(arm, run.cell.params)
    em = emulate.plan(hw, threads, arm.cpus, f"{spec.path}: arms[{arm.name}]", engine) if hw else None
    profile = hardware.profile_from_class(em.cls, f"class {em.cls.name} (emulated)") if em else None
    asked = run.cell.params.get("form") or arm.form
    model = grid.model_of(spec, run.cell.params)
    form = engine.check(model, asked, profile or hardware.current_profile())
    form_override = {"form": {"requested": "auto", "effective": form, "rule": capability(engine, Sizing).form_for(
        profile or hardware.current_profile())[1]}} if asked == "auto" else {}
    mblock, weights = model_block(model, form)
    return RunPlan(arm=arm, engine=engine, threads=threads, cpus=em.cpus if em else (arm.cpus or default_cpus(threads)),
                   form=form, form_override=form_override, model_block=mblock, weights=weights,
                   observe=arm.observe != "bare", em=em, profile=profile)


def execute(plan: RunPlan, ctx: RunContext) -> Executed:
    """The engine's run, under the plan's emulated caps (emulate.applied: the capped build, the balloon held from
    before the residency scan to after the last one), with residency scanned around it. A harness-side crash in
    the run is a failed result (the grid goes on); a refusal (UserError) stops it."""
    with emulate.applied(plan.em, plan.engine) as caps:
        before = files_residency(plan.weights) if plan.observe else {}
        span = provenance.Span()
        try:
            res: EngineResult = plan.engine.run(ctx, plan.form)
        except UserError:
            raise
        except Exception as e:  # a harness-side crash in one run is stored, the grid goes on
            from harness.engines.base import failed
            res = failed("failed", f"{type(e).__name__}: {e}", [], {})
        host, timing = span.finish()
        after = files_residency(plan.weights) if plan.observe else {}
    return Executed(res=res, host=host, timing=timing, before=before, after=after, held=caps.held)


def build(spec: grid.GridSpec, run: RunSpec, plan: RunPlan, out: Executed, executor: dict | None = None) -> Any:
    """The run's artifact: the host (an emulated class is a host of its own), the emulation's record, the
    residency and page-cache state, and what the engine returned."""
    host, emulation = out.host, None
    if plan.em:
        host = emulate.as_host(plan.em, host)
        emulation = emulate.record(plan.em, plan.engine.name, out.res.effective, out.res.settings, out.held)
    before = out.before
    page_cache = "not observed (arm observe: bare)" if not plan.observe else "none" if not before else (
        "warm" if all(v["resident_bytes"] >= 0.99 * v["total_bytes"] for v in before.values()) else
        "cold" if all(v["resident_bytes"] == 0 for v in before.values()) else "partial")
    residency = {"before": before, "after_load": out.res.after_load, "after_run": out.after,
                 "peak_memory": out.res.peak_memory, "page_cache": page_cache}
    return document(spec, run, out.res, host, out.timing, model_block=plan.model_block, threads=plan.threads,
                    cpus=plan.cpus, form_override=plan.form_override, emulation=emulation, residency=residency,
                    executor=executor)


def document(spec: grid.GridSpec, run: RunSpec, res: EngineResult, host: dict, timing: dict, *, model_block: dict,
             threads: int, cpus: list[int], form_override: dict | None = None, emulation: dict | None = None,
             residency: dict | None = None, executor: dict | None = None, env: dict | None = None) -> Any:
    """A run's artifact from what the engine returned and the host it ran on."""
    arm = spec.arm(run.arm)
    engine = get_engine(arm.engine)
    p = run.cell.params
    return documents.run_artifact(
        status=res.status, error=res.error, stderr_tail=res.stderr_tail,
        grid=GridRef(path=spec.path, sha256=spec.sha256, name=spec.name, cell=run.cell.id, cell_params=p, arm=arm.name,
                     pass_index=run.pass_index, position=run.position, order=spec.order, seed=spec.seed,
                     run_key=run.run_key, baseline_arm=spec.baseline, primary=spec.primary,
                     looks=list(spec.looks) or None,
                     stop=StopRule(until="step", alpha=spec.step_alpha, metrics=list(spec.primary["metrics"]))
                     if spec.looks and spec.until == "step" else None,
                     derived_from=DerivedFrom(**spec.derived_from) if spec.derived_from else None),
        model=model_block, engine=documents.engine_ref(res.engine, arm.engine, form_override), host=host, timing=timing,
        execution=documents.execution(
            threads=threads, cpus=cpus, numa_policy=provenance.numa_policy() if arm.numa is not None
            else "default (no numa option)", env={**provenance.relevant_env(), **res.env} if env is None else env,
            requested=res.requested, effective=res.effective, compile_cache=res.compile_cache, eager=res.eager,
            command=res.command, observe=arm.observe, settings=settings_block(res.settings, engine, arm),
            emulation=emulation, executor=executor),
        workload=Workload(prompt_len=p.get("prompt_len"), context_len=p.get("context_len"), gen_len=p.get("gen_len"),
                          batch=p.get("batch", 1), warmups=spec.warmups, repetitions=spec.repetitions,
                          prompt_token_hash=res.prompt_token_hash,
                          **workload_record(spec, p, run.sweep)),
        residency=Residency(**(residency or {"before": {}, "after_load": res.after_load, "after_run": {},
                                             "peak_memory": res.peak_memory,
                                             "page_cache": "not observed (the run did not complete)"})),
        metrics=res.metrics, attribution=res.attribution, **({"serving": res.serving} if res.serving else {}))


def settings_block(settings: dict, engine, arm: grid.Arm) -> dict:
    """Each declared setting as requested and as read back, with the rule `harness check` applies to it:
    enforced (effective must equal requested), or observe only (declared so by the engine or the arm)."""
    out = {}
    for name, row in settings.items():
        if name in engine.observe_only:
            rule = f"observe only ({engine.name} cannot apply or read it back)"
        elif name in arm.observe_only:
            rule = "observe only (arm)"
        else:
            rule = "enforced"
        out[name] = {**row, "rule": rule}
    return out
