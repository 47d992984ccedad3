"""The `onnxruntime-genai` engine: ONNX Runtime GenAI's og.Model on the CPU, loading the zoo's ONNX forms.

The forms are made offline from the model's hf-fp32 by the pinned package's own builder (forms.py); one fresh
process of worker.py per run (the only code that imports onnxruntime_genai), pinned by taskset like every engine.
Per repetition the worker appends the harness's prompt token ids (harness/metrics.py: the same ids as every engine)
to a fresh generator, calls generate_next_token() once per output token (greedy, end of sequence ignored, exactly
gen_len tokens) and stamps each token after it is sampled and detokenized: one library call per token, so the stamps
are the tokens' own. The metrics are computed from those stamps by harness/metrics.py, as for every engine.

Read back: the threads that ran the model (the worker's threads with CPU time during the measured requests, from
the kernel), its CPU affinity, prompt and output token counts, the shared libraries it loaded (they must be the
ones hashed here) and the versions and commit. Not read back (observe only): the KV cache size (each generator
sizes its own to max_length = prompt_len + gen_len; context_len is a bound checked at plan) and the compute types
(the form's: float32 activations, MatMulNBits int4 weights with int8 activations in the MatMul for the int4 forms).

Fidelity (worker.py --fidelity): greedy ids from the measurement's own loop, teacher-forced log-probabilities from
the model's logits output over prompt + continuation. The reference form is onnx-fp32.
"""

from __future__ import annotations

import hashlib
import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import metrics
from harness.engines import wheels
from harness.engines.base import Options
from harness.engines.requestworker import WorkerEngine
from harness.engines.workerlib import RUNNING_THREADS
from harness.engines.onnxruntime.forms import DIST, FORMS, INSTALL_FIX, PIN, require
from harness.errors import UserError

NAME = "onnxruntime-genai"
WORKER = Path(__file__).with_name("worker.py")
# the shared libraries that make up the engine, hashed into provenance (sha256 of the installed file and the sha256
# its wheel's RECORD lists): GenAI, its Python binding, and the ONNX Runtime it loads
LIBRARY = re.compile(r"(libonnxruntime(-genai)?\.so(\.[\d.]+)?|onnxruntime_genai\.cpython-[\w-]+\.so|"
                     r"libonnxruntime_providers_shared\.so)$")
DISTS = ("onnxruntime-genai", "onnxruntime")
ENV_PREFIXES = ("ORT_", "ORTGENAI_", "OMP_", "OPENBLAS_")  # what ONNX Runtime, its thread pools and numpy read
# Every worker runs with these (recorded in the artifact's env): numpy's OpenBLAS thread (which the model never
# uses: ONNX Runtime computes with its own MLAS) otherwise spins beside the session's threads and is counted as
# one of them; GenAI's telemetry off (its 1DS worker thread wakes on the first generation; the worker also calls
# og.disable_telemetry_events()).
WORKER_ENV = {"OPENBLAS_NUM_THREADS": "1", "ORT_DISABLE_TELEMETRY": "1"}

TIMESTAMPS = ("time.perf_counter() in the worker after each og.Generator.generate_next_token() (the token sampled, "
              "greedy) and its detokenization (TokenizerStream.decode), relative to the start of the request (before "
              "the generator is made and the prompt ids appended, which runs the prefill)")
THREADS_SOURCE = (RUNNING_THREADS + "; the session's intra_op_num_threads "
                  "was set to the requested count (config overlay, inter_op_num_threads 1)")
CONTEXT_REASON = ("not settable: each og.Generator sizes its KV cache to its max_length, prompt_len + gen_len; "
                  "prompt_len + gen_len is checked not to exceed context_len")


def libraries() -> dict[str, dict[str, Any]]:
    """Each engine library: its installed path, size, sha256 and the sha256 its wheel's RECORD lists."""
    return wheels.libraries(DISTS, LIBRARY, NAME, "onnxruntime", INSTALL_FIX)


def _commit() -> str:
    """The commit onnxruntime-genai's package names (its __init__.py's __commit__), read without importing it."""
    init = Path(metadata.distribution(DIST).locate_file("onnxruntime_genai/__init__.py"))
    m = re.search(r'^__commit__ = "([0-9a-f]{7,40})"', init.read_text(), re.M)
    return m.group(1) if m else "unknown"


class OnnxRuntimeGenAi(WorkerEngine):
    name = NAME
    # its folder: the graph and its external weights, beside its config and tokenizer files
    weight_files = {"onnx": (".onnx", ".onnx.data")}
    worker = WORKER
    timestamps, threads_source, context_reason = TIMESTAMPS, THREADS_SOURCE, CONTEXT_REASON
    batch_source = "sequences per step: the batch dimension of the model's logits output after each request's last step, fewest over repetitions"
    compile_state = "n/a (the session is created in every run; no optimized model is saved)"
    prompt_counted = "the generator held"
    default_form = "onnx-fp32"
    form_prefix = "onnx-"
    form_maker = "harness.engines.onnxruntime.forms"  # capability: its builder derives the onnx-* forms
    form_hint = f"onnxruntime-genai {PIN} loads {', '.join(FORMS)} (made from the model's hf-fp32)"
    Options = Options  # threads only: nothing else is both settable and readable back
    honours = frozenset({"prompt_len", "gen_len", "context_len", "warmups", "repetitions"})
    max_batch = 1  # one generator, one sequence: its tokens stamped one call at a time
    metrics = metrics.NAMES
    observe_only = frozenset({"dtype", "kv_cache_memory_bytes", "context_len"})  # the form's types; CONTEXT_REASON
    reference_form = "onnx-fp32"
    env_prefixes = ENV_PREFIXES

    def refuse_form(self, where: str, form: str) -> None:
        _refuse_form(where, form)

    def require(self) -> str:
        return require()

    def engine_info(self) -> dict[str, Any]:
        version = require()
        libs = libraries()
        genai = next((k for k in libs if k.startswith("libonnxruntime-genai.so")), None)
        return {"name": NAME, "version": f"{DIST}=={version}, onnxruntime=={metadata.version('onnxruntime')} (PyPI)",
                "build_commit": f"onnxruntime-genai {_commit()}",
                "build": {"distributions": {d: metadata.version(d) for d in DISTS},
                          "binary": genai or "unknown", "binary_sha256": libs[genai]["sha256"] if genai else "unknown",
                          "libraries": wheels.build_block(libs),
                          "execution_provider": "cpu",
                          "worker": "harness/engines/onnxruntime/worker.py",
                          "worker_sha256": hashlib.sha256(WORKER.read_bytes()).hexdigest()}}

    def _env(self, ctx_env: dict[str, str] | None = None) -> dict[str, str]:
        return {**{k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}, **WORKER_ENV,
                **(ctx_env or {}), "PYTHONNOUSERSITE": "1"}

    def build_mismatch(self, info: dict, eff: dict, threads: int) -> str | None:
        if eff.get("onnxruntime_genai_version") != PIN:
            return (f"the worker imported onnxruntime-genai {eff.get('onnxruntime_genai_version')}, the harness "
                    f"pins {PIN}")
        return _foreign_libraries(eff)

    def read_batch(self, eff: dict) -> int:
        return min(eff["batch_sizes"])

    # ---- fidelity -------------------------------------------------------------------------------------
    def fidelity_result_block(self, eng: dict, result: dict) -> dict:
        """The engine block, once the worker is shown to have loaded the hashed libraries."""
        problem = _foreign_libraries(result.get("effective") or {})
        if problem:
            raise UserError(f"{NAME} fidelity worker", problem, "remove the other onnxruntime from the path")
        return eng


def _refuse_form(where: str, form: str) -> None:
    if form not in FORMS:
        raise UserError(where, f"{NAME} cannot load form {form!r}: it loads {', '.join(FORMS)} (ONNX models its "
                               "builder makes from the model's hf-fp32)", f"use one of {', '.join(FORMS)}")


def _foreign_libraries(eff: dict) -> str | None:
    """A loaded ONNX Runtime library that is not one of the installed wheels' (whose files engine_info hashed)."""
    try:
        installed = {os.path.realpath(f.locate()) for d in DISTS for f in metadata.distribution(d).files or ()
                     if LIBRARY.search(f.name)}
    except metadata.PackageNotFoundError as e:
        return f"{e.name} is not installed"
    loaded = eff.get("libraries") or []
    if not loaded:
        return "the worker reported no ONNX Runtime library loaded"
    foreign = [p for p in loaded if p not in installed]
    return f"the worker loaded {foreign[0]}, which is not the hashed build" if foreign else None
