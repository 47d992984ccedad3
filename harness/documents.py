"""Typed builders: the one place each artifact kind is assembled, stamped with its id and validated.

Every writer (the runner, the fleet driver's lost run, fidelity's references and results, the ceiling's
calibration) calls one of these with typed blocks; none writes a `schema_version` or `kind` itself, and the
execution block of every engine process is made by `execution`.
"""

from __future__ import annotations

from typing import Any

from harness import artifact, provenance
from harness.artifact import (CalibrationArtifact, CalibrationSource, Decoding, EngineRef, Execution, FidelityArtifact,
                              FidelityGridRef, GridRef, ModelRef, PromptSetRef, ReferenceArtifact, Residency,
                              RunArtifact, Timing, Workload)

_UNSTAMPED = "0" * 64


def stamp(a: Any) -> Any:
    """The artifact with its content id: computed over the validated, JSON-normalised form (5 -> 5.0 for a float
    field), so that the bytes on disk hash to it exactly."""
    body = a.model_dump(mode="json")
    body["id"] = artifact.compute_id(body)
    return type(a).model_validate(body)


def execution(*, threads: int, cpus: list[int], numa_policy: str, env: dict[str, str], requested: dict[str, Any],
              effective: dict[str, Any], compile_cache: dict[str, Any], eager: bool | None, command: list,
              observe: str = "full", settings: dict | None = None, emulation: dict | None = None,
              executor: dict | None = None) -> Execution:
    """How an engine process ran: for runs, references and fidelity results alike."""
    if command and isinstance(command[0], list):  # the commands, where there were several
        command = [[str(c) for c in one] for one in command]
    else:
        command = [str(c) for c in command]
    return Execution(threads=threads, cpu_affinity=list(cpus), numa_policy=numa_policy, env=env, requested=requested,
                     effective=effective, compile_cache=compile_cache, eager=eager, command=command, observe=observe,
                     settings=settings, emulation=emulation, executor=executor)


def engine_ref(block: dict[str, Any], name: str, overrides: dict | None = None) -> EngineRef:
    """The engine block from what the engine reported (missing fields say 'unknown')."""
    return EngineRef(name=block.get("name", name), version=block.get("version", "unknown"),
                     build_commit=block.get("build_commit", "unknown"), build=block.get("build", {}),
                     patches=block.get("patches", []), overrides={**block.get("overrides", {}), **(overrides or {})})


def run_artifact(*, status: str, error: str | None, stderr_tail: str | None, grid: GridRef, model: dict | ModelRef,
        engine: EngineRef, host: dict, timing: dict, execution: Execution, workload: Workload, residency: Residency,
        metrics: dict[str, Any], attribution: dict | None = None, harness: dict | None = None,
        serving: dict | None = None) -> RunArtifact:
    return stamp(RunArtifact(id=_UNSTAMPED, status=status, error=error, stderr_tail=stderr_tail, grid=grid,
                             model=model, engine=engine, harness=harness or provenance.harness_info(), host=host,
                             timing=Timing(**timing), execution=execution, workload=workload, residency=residency,
                             metrics=metrics, attribution=attribution, serving=serving))


def reference(*, grid: FidelityGridRef, model: dict, engine: dict, harness: dict, host: dict, timing: dict,
              execution: Execution, prompt_set: dict, decoding: Decoding, outputs: list[dict]) -> ReferenceArtifact:
    return stamp(ReferenceArtifact(id=_UNSTAMPED, grid=grid, model=model, engine=engine, harness=harness, host=host,
                                   timing=Timing(**timing), execution=execution,
                                   prompt_set=PromptSetRef(**prompt_set), decoding=decoding, outputs=outputs))


def fidelity(*, status: str, error: str | None, stderr_tail: str | None, grid: FidelityGridRef, model: dict,
             engine: dict, harness: dict, host: dict, timing: dict, execution: Execution, prompt_set: dict,
             decoding: Decoding, reference: dict, cross_engine: bool, prompts: list[dict], summary: dict,
             thresholds: dict, verdict: str, failures: list[str]) -> FidelityArtifact:
    return stamp(FidelityArtifact(id=_UNSTAMPED, status=status, error=error, stderr_tail=stderr_tail, grid=grid,
                                  model=model, engine=engine, harness=harness, host=host, timing=Timing(**timing),
                                  execution=execution, prompt_set=PromptSetRef(**prompt_set), decoding=decoding,
                                  reference=reference, cross_engine=cross_engine, prompts=prompts, summary=summary,
                                  thresholds=thresholds, verdict=verdict, failures=failures))


def audio_fidelity(*, status: str, error: str | None, stderr_tail: str | None, grid: FidelityGridRef, model: dict,
                   engine: dict, harness: dict, host: dict, timing: dict, execution: Execution, texts: dict,
                   reference: dict, items: list[dict], summary: dict, thresholds: dict, verdict: str,
                   failures: list[str]) -> Any:
    from harness.artifact import AudioFidelityArtifact
    return stamp(AudioFidelityArtifact(id=_UNSTAMPED, status=status, error=error, stderr_tail=stderr_tail, grid=grid,
                                       model=model, engine=engine, harness=harness, host=host,
                                       timing=Timing(**timing), execution=execution, texts=texts, reference=reference,
                                       items=items, summary=summary, thresholds=thresholds, verdict=verdict,
                                       failures=failures))


def calibration(*, command: str, host: dict, timing: dict, method: dict, results: list[dict]) -> CalibrationArtifact:
    return stamp(CalibrationArtifact(id=_UNSTAMPED, grid=CalibrationSource(path=command),
                                     harness=provenance.harness_info(), host=host, timing=Timing(**timing),
                                     method=method, results=results))
