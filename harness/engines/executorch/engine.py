"""The `executorch` engine: ExecuTorch's runtime on the CPU running the zoo's XNNPACK `.pte` programs.

The forms are exported offline from the model's hf-fp32 by the pinned ExecuTorch in an environment of its own
(forms.py); one fresh process of worker.py per run under that environment's python (the only code that imports
executorch), pinned by taskset like every engine. Per repetition the worker runs the prefill as one forward call
over the harness's prompt token ids (harness/metrics.py: the same ids as every engine) and one forward call per
further token, greedy, exactly gen_len tokens, each stamped after its argmax: one call per token, so the stamps are
the tokens' own. The metrics are computed from those stamps by harness/metrics.py, as for every engine.

Read back: the runtime thread pool's size and the threads that ran the model (from the kernel), the CPU affinity,
prompt and output token counts, the program's metadata (its context length), the shared libraries it loaded (they
must be the ones hashed here) and the version. Not read back (observe only): the KV cache size (fixed by the form at
export: forms.MAX_CONTEXT tokens; prompt_len + gen_len checked against it at plan) and the compute types (the
form's: float32, or int4 weights with int8 dynamic activations for 8da4w).

Fidelity (worker.py --fidelity): greedy ids from the measurement's own loop, teacher-forced log-probabilities from
the same forward calls (prefill, then one call per forced token). The reference form is pte-fp32.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from harness import envs, metrics
from harness.engines import wheels
from harness.engines.base import Options
from harness.engines.requestworker import WorkerEngine
from harness.engines.workerlib import RUNNING_THREADS
from harness.engines.executorch import forms
from harness.engines.executorch.forms import ENV, FORMS, MAX_CONTEXT, MAX_SEQ, PIN, PINS
from harness.errors import UserError

NAME = "executorch"
WORKER = Path(__file__).with_name("worker.py")
# the shared libraries of the runtime, hashed into provenance: every one the executorch wheel installs (18 files,
# 23 MB in 1.5.1: the Python binding, the runtime, its XNNPACK backend, kernels, thread pool, custom and quantized
# ops; the worker maps several of them, and each it maps must be one of these)
LIBRARY = re.compile(r"\.so(\.[\d.]+)?$")
DISTS = ("executorch",)
ENV_PREFIXES = ("ET_", "OMP_", "OPENBLAS_", "MKL_")
# Every worker runs with these (recorded in the artifact's env): torch's own intra-op pool and numpy's OpenBLAS
# (which the program never uses: XNNPACK runs on ExecuTorch's thread pool) kept to one thread each
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
INSTALL_FIX = "run `make` (or `harness build --engine executorch`); a grid that loads a pte form makes it too"

TIMESTAMPS = ("time.perf_counter() in the worker after each token's argmax (the prefill's forward call for the first, "
              "one forward call per token after it), relative to the start of the request (before the prefill)")
THREADS_SOURCE = (RUNNING_THREADS + "; the runtime's thread pool was reset to "
                  "the requested count (portable_lib._unsafe_reset_threadpool, read back as pool_threads)")
CONTEXT_REASON = (f"not settable: the program's KV cache is fixed at export (get_max_context_len, "
                  f"{MAX_CONTEXT} tokens); prompt_len + gen_len is checked not to exceed context_len")


def site_packages() -> list[str]:
    return [str(p) for p in sorted((envs.env_dir(ENV, PINS) / "lib").glob("python3*/site-packages"))]


def libraries() -> dict[str, dict[str, Any]]:
    """Each runtime library in the environment: its installed path, size, sha256 and the sha256 its wheel lists."""
    if not site_packages():
        raise UserError(f"engine {NAME}", f"ExecuTorch's environment {envs.env_dir(ENV, PINS)} is not made",
                        INSTALL_FIX)
    return wheels.libraries(DISTS, LIBRARY, NAME, "executorch", INSTALL_FIX, path=site_packages())


class ExecuTorch(WorkerEngine):
    name = NAME
    weight_files = {"pte": (".pte",)}  # its program (its weights inside), beside its params
    worker = WORKER
    timestamps, threads_source, context_reason = TIMESTAMPS, THREADS_SOURCE, CONTEXT_REASON
    batch_source = "the batch dimension of the logits the program returned (its first calls)"
    compile_state = "n/a (the program is compiled ahead of time: the form's model.pte)"
    prompt_counted = "the program was fed"
    default_form = "pte-fp32"
    form_prefix = "pte-"
    form_maker = "harness.engines.executorch.forms"  # capability: its exporter derives the pte-* forms
    environment = "harness.engines.executorch.forms:env_python"  # its own environment (pins clash with vLLM's)
    form_hint = f"executorch {PIN} loads {', '.join(FORMS)} (exported from the model's hf-fp32)"
    Options = Options  # threads only
    honours = frozenset({"prompt_len", "gen_len", "context_len", "warmups", "repetitions"})
    max_batch = 1
    metrics = metrics.NAMES
    observe_only = frozenset({"dtype", "kv_cache_memory_bytes", "context_len"})
    reference_form = "pte-fp32"
    env_prefixes = ENV_PREFIXES

    def refuse_form(self, where: str, form: str) -> None:
        _refuse_form(where, form)

    def require(self) -> str:
        return forms.require()

    def provision(self, isa_variant: str | None = None, rebuild: bool = False) -> dict[str, Any]:
        """The engine runs in an environment of its own (its pins clash with vLLM's): made here once, cached."""
        forms.env_python()
        return {"version": PIN}

    def validate_options(self, path: str, arm: Any, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        super().validate_options(path, arm, opts, workload)
        for k, bound in (("context_len", MAX_CONTEXT), ("prompt_len", MAX_SEQ)):
            where, values = workload.get(k, (f"workload.{k}", set()))
            over = sorted(v for v in values if int(v) > bound)
            if over:
                raise UserError(path, f"{where}: {over[0]} for arm {arm.name!r}, but the ExecuTorch forms are exported "
                                      f"with {'a KV cache of' if k == 'context_len' else 'forward calls of at most'} "
                                      f"{bound} tokens", f"use {k} <= {bound}")

    def engine_info(self) -> dict[str, Any]:
        libs = libraries()
        freeze = envs.freeze(ENV, PINS)
        main = next((k for k in libs if k.startswith("_C.cpython")), None)
        return {"name": NAME, "version": f"executorch=={freeze.get('executorch', 'unknown')}, "
                                         f"torch=={freeze.get('torch', 'unknown')} (PyPI, own environment)",
                "build_commit": "unknown (the wheel names none)",
                "build": {"distributions": {d: freeze.get(d, "missing") for d in ("executorch", "torch", "torchao")},
                          "environment": f"{ENV}-{envs.key(PINS)}",
                          "environment_freeze_sha256": hashlib.sha256(
                              (envs.env_dir(ENV, PINS) / "freeze.txt").read_bytes()).hexdigest(),
                          "binary": main or "unknown", "binary_sha256": libs[main]["sha256"] if main else "unknown",
                          "libraries": wheels.build_block(libs), "backend": "xnnpack",
                          "worker": "harness/engines/executorch/worker.py",
                          "worker_sha256": hashlib.sha256(WORKER.read_bytes()).hexdigest()}}

    def _env(self, ctx_env: dict[str, str] | None = None) -> dict[str, str]:
        return {**{k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}, **WORKER_ENV,
                **(ctx_env or {}), "PYTHONNOUSERSITE": "1", "PYTHONPATH": ""}

    def worker_python(self) -> str:
        return str(forms.env_python()[0])

    def model_file(self, form_path: Path) -> Path:
        return form_path / "model.pte"

    def too_long(self, prompt_len: int, gen_len: int, context_len: int) -> str | None:
        if prompt_len + gen_len > min(context_len, MAX_CONTEXT) or prompt_len > MAX_SEQ:
            return (f"prompt_len {prompt_len} + gen_len {gen_len} exceed context_len {context_len} (the program holds "
                    f"{MAX_CONTEXT}, prompts up to {MAX_SEQ})")
        return None

    def build_mismatch(self, info: dict, eff: dict, threads: int) -> str | None:
        if eff.get("executorch_version") != PIN:
            return f"the worker imported executorch {eff.get('executorch_version')}, the harness pins {PIN}"
        if eff.get("pool_threads") != threads:
            return f"the runtime's thread pool holds {eff.get('pool_threads')} threads, {threads} were asked"
        ctx = (eff.get("program_metadata") or {}).get("get_max_context_len")
        if ctx != MAX_CONTEXT:
            return f"the program's context is {ctx} tokens, its form was exported with {MAX_CONTEXT}"
        return _foreign_libraries(eff)

    def read_batch(self, eff: dict) -> int:
        return min(s[0] for s in eff["logits_shapes"])

    # ---- fidelity -------------------------------------------------------------------------------------
    def fidelity_result_block(self, eng: dict, result: dict) -> dict:
        """The engine block, once the worker is shown to have loaded the hashed libraries."""
        problem = _foreign_libraries(result.get("effective") or {})
        if problem:
            raise UserError(f"{NAME} fidelity worker", problem, "remake ExecuTorch's environment")
        return eng


def _refuse_form(where: str, form: str) -> None:
    if form not in FORMS:
        raise UserError(where, f"{NAME} cannot load form {form!r}: it loads {', '.join(FORMS)} (XNNPACK programs "
                               "exported from the model's hf-fp32)", f"use one of {', '.join(FORMS)}")


def _foreign_libraries(eff: dict) -> str | None:
    """A loaded ExecuTorch library that is not one of the hashed ones."""
    hashed = {os.path.realpath(v["path"]) for v in libraries().values()}
    loaded = [p for p in eff.get("libraries") or [] if LIBRARY.search(os.path.basename(p))]
    if not loaded:
        return "the worker reported no ExecuTorch library loaded"
    foreign = [p for p in loaded if p not in hashed]
    return f"the worker loaded {foreign[0]}, which is not the hashed build" if foreign else None
