"""One run on this machine: the engine in a fresh process, residency before and after, the artifact.

The loop around runs (resume, locks, ETA, writing) is harness/execute.py, one for every executor.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from harness import documents, emulate, grid, hardware, models, provenance
from harness.artifact import GridRef, Residency, Workload
from harness.engines import get_engine
from harness.engines.base import EngineResult, RunContext
from harness.engines.capabilities import Sizing, capability
from harness.errors import UserError
from harness.probe import host_key as key_of
from harness.residency import files_residency
from harness.schedule import RunSpec

NO_MODEL = "none"

def model_block(model: str, form: str) -> tuple[dict, dict[str, Path]]:
    if model == NO_MODEL or form == "none":
        return {"name": model, "form": "none", "source": {"none": "command engine"}, "format": "none",
                "dtype": "none", "parameters": 1, "files": []}, {}
    if form == "external":  # a server the harness does not start (the openai engine): no weights of ours
        return {"name": model, "form": "external", "format": "external", "dtype": "unknown", "parameters": 1,
                "files": [], "source": {"external": "served by an endpoint the harness does not start; the prompts "
                                                    "are this model's token ids"}}, {}
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


def run_one(spec: grid.GridSpec, run: RunSpec, workroot: Path, store_root: Path | None = None,
            executor: dict | None = None) -> Any:
    """One run: residency before, the engine in a fresh process, residency after, the artifact."""
    arm = spec.arm(run.arm)
    engine = get_engine(arm.engine)
    threads = threads_of(arm, run.cell.params)
    hw = grid.hardware_of(arm, run.cell.params)
    em = emulate.plan(hw, threads, arm.cpus, f"{spec.path}: arms[{arm.name}]") if hw else None
    profile = hardware.profile_from_class(em.cls, f"class {em.cls.name} (emulated)") if em else None
    asked = run.cell.params.get("form") or arm.form
    model = grid.model_of(spec, run.cell.params)
    form = engine.check(model, asked, profile or hardware.current_profile())
    form_override = {"form": {"requested": "auto", "effective": form, "rule": capability(engine, Sizing).form_for(
        profile or hardware.current_profile())[1]}} if asked == "auto" else {}
    mblock, weights = model_block(model, form)
    cpus = em.cpus if em else (arm.cpus or default_cpus(threads))
    observe = arm.observe != "bare"
    workdir = Path(tempfile.mkdtemp(prefix=f"run-{run.run_key}-", dir=workroot))
    ctx = RunContext(spec=spec, run=run, arm=arm, threads=threads, cpus=cpus, workdir=workdir, timeout_s=spec.timeout_s,
                     store_root=store_root, observe=observe)
    if em:
        ctx.env, ctx.isa_variant = dict(em.env), em.isa_variant
        ctx.profile = profile
        ctx.isa = profile["isa"] if profile else None
        if em.isa_variant:
            engine.provision(em.isa_variant)  # the capped build, made before anything is measured
        emulate.inflate(em)  # the balloon holds from before the residency scan to after the last one
    held = True
    try:
        before = files_residency(weights) if observe else {}
        span = provenance.Span()
        try:
            res: EngineResult = engine.run(ctx, form)
        except UserError:
            raise
        except Exception as e:  # a harness-side crash in one run is stored, the grid goes on
            from harness.engines.base import failed
            res = failed("failed", f"{type(e).__name__}: {e}", [], {})
        host, timing = span.finish()
        after = files_residency(weights) if observe else {}
    finally:
        if em:
            held = emulate.deflate(em)
    emulation = None
    if em:
        host["machine_key"] = host["key"]  # the machine the class was emulated on (the report's series)
        host["emulation"] = em.cls.name  # part of the host key: an emulated class is a host of its own
        host["key"] = key_of(host)
        emulation = emulate.record(em, engine.name, res.effective, res.settings, held)
    page_cache = "not observed (arm observe: bare)" if not observe else "none" if not before else (
        "warm" if all(v["resident_bytes"] >= 0.99 * v["total_bytes"] for v in before.values()) else
        "cold" if all(v["resident_bytes"] == 0 for v in before.values()) else "partial")
    residency = {"before": before, "after_load": res.after_load, "after_run": after,
                 "peak_memory": res.peak_memory, "page_cache": page_cache}
    a = document(spec, run, res, host, timing, model_block=mblock, threads=threads, cpus=cpus,
                   form_override=form_override, emulation=emulation, residency=residency, executor=executor)
    shutil.rmtree(workdir, ignore_errors=True)  # everything the artifact needs is in it
    return a


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
                     run_key=run.run_key, baseline_arm=spec.baseline, primary=spec.primary),
        model=model_block, engine=documents.engine_ref(res.engine, arm.engine, form_override), host=host, timing=timing,
        execution=documents.execution(
            threads=threads, cpus=cpus, numa_policy=provenance.numa_policy() if arm.numa is not None
            else "default (no numa option)", env={**provenance.relevant_env(), **res.env} if env is None else env,
            requested=res.requested, effective=res.effective, compile_cache=res.compile_cache, eager=res.eager,
            command=res.command, observe=arm.observe, settings=settings_block(res.settings, engine, arm),
            emulation=emulation, executor=executor),
        workload=Workload(prompt_len=p["prompt_len"], context_len=p["context_len"], gen_len=p["gen_len"],
                          batch=p.get("batch", 1), warmups=spec.warmups, repetitions=spec.repetitions,
                          prompt_token_hash=res.prompt_token_hash,
                          **({"load": spec.load_of(p, run.sweep).record(), "slo": spec.slo} if spec.load is not None else {})),
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
