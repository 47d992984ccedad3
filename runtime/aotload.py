"""vLLM's AOT compile cache, loadable on the CPU (patch `aot-cache-load`, #17).

With `eager: false` the CPU platform compiles the model once per worker with torch.compile
(CompilationMode.DYNAMO_TRACE_ONCE, backend "inductor") and saves the result as an AOT artifact under
VLLM_CACHE_ROOT; the next worker on the same cache should load it instead of compiling again. It never
does: the loader (vllm/compilation/decorators.py, _try_load_aot_compiled_fn) finalises what it loaded by
calling `loaded_fn._artifacts.compiled_fn.finalize_loading(vllm_config)`, a method of vLLM's own
VllmSerializableFunction, the backend of CompilationMode.VLLM_COMPILE. Under the inductor backend torch
wraps the compiled function in BundledAOTAutogradSerializableCallable instead, and its deserialisation
gives back a plain function: the call raises "'function' object has no attribute 'finalize_loading'",
the loader logs "Compiling model again due to a load failure" and every worker compiles from scratch
(minutes a run for SmolLM2-135M on the AVX2 host).

The patch: torch.compiler.load_compiled_function, as vLLM's loader calls it in this process, gives the
loaded plain function a `finalize_loading` that does nothing (an inductor artifact is whole once
deserialised: there is no backend left to build). Nothing else changes; what it loaded is what was
compiled and saved. The effect counts the loads it made whole, and the worker reads vLLM's own
compilation counters back (effective.compilation: AOT artifacts loaded vs compiled).
"""

from __future__ import annotations

import inspect

MARK = "_edge_harness_aot_load"


def detect_finalize_on_plain_function() -> dict:
    """Defective where the loader calls finalize_loading unconditionally and the CPU platform compiles
    with the inductor backend (whose loaded artifact is a plain function)."""
    try:
        from vllm.compilation import decorators
        from vllm.platforms.cpu import CpuPlatform
    except Exception as e:  # noqa: BLE001 - a detector reports, never raises
        return {"defective": None, "evidence": f"cannot import vLLM's compilation decorators: {e}"}
    loader = getattr(decorators, "_try_load_aot_compiled_fn", None)
    if loader is None:
        return {"defective": False, "evidence": "vllm.compilation.decorators has no _try_load_aot_compiled_fn"}
    src = inspect.getsource(loader)
    calls = "compiled_fn.finalize_loading(" in src
    guarded = bool(calls) and ("hasattr(" in src or "getattr(" in src) and "finalize_loading\"" in src
    cpu = inspect.getsource(CpuPlatform.check_and_update_config)
    inductor = "DYNAMO_TRACE_ONCE" in cpu and "inductor" in cpu
    defective = calls and not guarded and inductor
    return {"defective": defective,
            "evidence": ("_try_load_aot_compiled_fn calls compiled_fn.finalize_loading() "
                         + ("unguarded" if calls and not guarded else "guarded" if calls else "nowhere")
                         + "; CpuPlatform compiles with "
                         + ("DYNAMO_TRACE_ONCE + inductor (loads a plain function)" if inductor
                            else "another mode/backend"))}


def install() -> dict:
    """Wrap torch.compiler.load_compiled_function in this process (idempotent)."""
    import torch.compiler
    effect = {"wrapped": "torch.compiler.load_compiled_function",
              "rule": "a loaded compiled_fn without finalize_loading gets a no-op one", "loads": 0, "made_whole": 0}
    original = torch.compiler.load_compiled_function
    if getattr(original, MARK, False):
        return getattr(original, "effect")

    def load_compiled_function(*args, **kwargs):
        fn = original(*args, **kwargs)
        effect["loads"] += 1
        compiled = getattr(getattr(fn, "_artifacts", None), "compiled_fn", None)
        if compiled is not None and not hasattr(compiled, "finalize_loading"):
            try:
                compiled.finalize_loading = _nothing_to_finalize
                effect["made_whole"] += 1
            except AttributeError:  # an object without attributes of its own: vLLM's loader falls back as before
                pass
        return fn

    setattr(load_compiled_function, MARK, True)
    load_compiled_function.effect = effect
    torch.compiler.load_compiled_function = load_compiled_function
    return effect


def _nothing_to_finalize(vllm_config) -> None:
    """An inductor AOT artifact is complete when deserialised."""
