"""Step attribution: where each LLMEngine.step()'s wall time goes, part by part, in the process that runs it.

Installed by the general plugin (runtime/plugin.py, `vllm.general_plugins`) when the run selects the
`step-attribution` patch: it wraps vLLM's own methods at class level, so every engine built afterwards in
this process is timed. Each wrapped call adds its *exclusive* time (its own wall time less that of wrapped
calls inside it) to its part, so nesting never counts twice. Per step:

- schedule:   Scheduler.schedule
- prepare:    the model runner's input preparation: _update_states, _prepare_inputs, _build_attention_metadata,
              _preprocess (batch state, attention metadata, input tensors)
- forward:    the model forward (GPUModelRunner._model_forward) and the LM head (LogitsProcessor.forward)
- sample:     GPUModelRunner._sample
- update:     bookkeeping after the forward: _update_states_after_model_execute, _bookkeeping_sync,
              Scheduler.update_from_output
- detokenize: the incremental detokenizer (IncrementalDetokenizer.update and its subclasses)
- output:     OutputProcessor.process_outputs less the detokenizer (request outputs, stop checks)
- rest:       the step's wall time less all of the above (Python around the calls, queues; IPC when the
              engine core runs in another process, whose parts are then not seen here)

Inside the forward (not added to the parts' sum, already counted in `forward`):
- linear_kernel: the decode-gemv kernel's own time (runtime/gemv.py's C++ clock), where that patch is applied

Cost: two perf_counter() calls and a list push/pop per wrapped call, ~12 wrapped calls a step.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable

PARTS = ("schedule", "prepare", "forward", "sample", "update", "detokenize", "output")
ALL_PARTS = PARTS + ("rest",)
INSIDE_FORWARD = ("linear_kernel",)  # timed inside the forward, by the code that runs there
MODEL_PARTS = ("forward",)  # the part the weights' bandwidth bounds; every other part is "non-model"

# (module, class, method, part)
TARGETS: tuple[tuple[str, str, str, str], ...] = (
    ("vllm.v1.core.sched.scheduler", "Scheduler", "schedule", "schedule"),
    ("vllm.v1.core.sched.scheduler", "Scheduler", "update_from_output", "update"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_update_states", "prepare"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_prepare_inputs", "prepare"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_build_attention_metadata", "prepare"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_preprocess", "prepare"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward", "forward"),
    ("vllm.model_executor.layers.logits_processor", "LogitsProcessor", "forward", "forward"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample", "sample"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_update_states_after_model_execute", "update"),
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_bookkeeping_sync", "update"),
    ("vllm.v1.engine.detokenizer", "BaseIncrementalDetokenizer", "update", "detokenize"),
    ("vllm.v1.engine.detokenizer", "FastIncrementalDetokenizer", "update", "detokenize"),
    ("vllm.v1.engine.detokenizer", "SlowIncrementalDetokenizer", "update", "detokenize"),
    ("vllm.v1.engine.output_processor", "OutputProcessor", "process_outputs", "output"),
)
STEP_TARGET = ("vllm.v1.engine.llm_engine", "LLMEngine", "step")

_clock = time.perf_counter
_current: dict[str, float] | None = None  # the parts of the step in progress (None: outside a step)
_stack: list[float] = []  # per open wrapped call: time spent in wrapped calls inside it
STEPS: list[dict[str, float]] = []  # finished steps, oldest first, until the caller takes them
INSTALLED: dict[str, str] = {}  # "module.Class.method" -> part, what install() wrapped
MISSING: dict[str, str] = {}  # what it could not find in this vLLM, and why


def timed(fn: Callable, part: str) -> Callable:
    """fn, adding its exclusive wall time to `part` of the step in progress."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _current is None:
            return fn(*args, **kwargs)
        t0 = _clock()
        _stack.append(0.0)
        try:
            return fn(*args, **kwargs)
        finally:
            dt = _clock() - t0
            inner = _stack.pop()
            if _current is not None:
                _current[part] += dt - inner
            if _stack:
                _stack[-1] += dt
    wrapper.__edge_part__ = part  # type: ignore[attr-defined]
    return wrapper


def timed_step(fn: Callable) -> Callable:
    """fn (LLMEngine.step), recording one step: its wall time and each part's share of it."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _current
        if _current is not None:  # re-entered: count it in the outer step
            return fn(*args, **kwargs)
        _current = dict.fromkeys(PARTS, 0.0)
        _stack.clear()
        inner0 = _inner_clocks()
        t0 = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            wall = _clock() - t0
            inner1 = _inner_clocks()
            rec, _current = _current, None
            rec.update({k: inner1[k] - inner0[k] for k in inner1 if k in inner0})
            rec["rest"] = wall - sum(rec[p] for p in PARTS)
            rec["step"] = wall
            STEPS.append(rec)
    wrapper.__edge_part__ = "step"  # type: ignore[attr-defined]
    return wrapper


def _inner_clocks() -> dict[str, float]:
    """Cumulative seconds of the clocks kept inside the forward, by name (those loaded in this process)."""
    from runtime import gemv
    s = gemv.kernel_seconds()
    return {} if s is None else {"linear_kernel": s}


def _wrap(module: str, cls: str, method: str, wrap: Callable[[Callable], Callable]) -> None:
    import importlib
    key = f"{module}.{cls}.{method}"
    try:
        owner = getattr(importlib.import_module(module), cls)
    except Exception as e:  # noqa: BLE001 - a part this vLLM does not have is reported, not fatal
        MISSING[key] = f"{type(e).__name__}: {e}"
        return
    if not hasattr(owner, method):  # renamed or removed in this vLLM: its part would silently read zero
        MISSING[key] = "no such method"
        return
    fn = owner.__dict__.get(method)
    if fn is None:  # inherited: the base class's wrapper already times it
        return
    if getattr(fn, "__edge_part__", None):
        return
    setattr(owner, method, wrap(fn))
    INSTALLED[key] = getattr(getattr(owner, method), "__edge_part__")


def install() -> dict:
    """Wrap every target this vLLM has (idempotent); what was wrapped and what is missing."""
    for module, cls, method, part in TARGETS:
        _wrap(module, cls, method, lambda f, p=part: timed(f, p))
    _wrap(*STEP_TARGET, timed_step)
    return {"parts": list(ALL_PARTS), "wrapped": dict(INSTALLED), "missing": dict(MISSING)}


def take() -> list[dict[str, float]]:
    """The steps recorded since the last take(), oldest first."""
    out = list(STEPS)
    STEPS.clear()
    return out


def detect_no_step_attribution() -> dict:
    """vLLM's own statistics time requests (queued, prefill, decode, per-token) and count tokens per iteration,
    but no part of a step: "defective" means "not measurable without this patch". It changes no computation."""
    import dataclasses
    try:
        from vllm.v1.metrics import stats
    except Exception as e:  # noqa: BLE001 - a detector reports, never raises
        return {"defective": None, "evidence": f"cannot import vllm.v1.metrics.stats: {e}"}
    fields: set[str] = set()
    for name in ("SchedulerStats", "IterationStats", "SchedulerIterationDetails"):
        cls = getattr(stats, name, None)
        if cls is not None:
            fields |= ({f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls)
                       else set(getattr(cls, "__annotations__", {})))
    parts = sorted(f for f in fields if any(w in f for w in ("forward", "schedule_time", "sample_time", "prepare")))
    return {"defective": not parts,
            "evidence": f"per-step stats fields that time a part: {parts}" if parts else
                        "SchedulerStats/IterationStats time requests and count tokens; no field times a part of a step"}
