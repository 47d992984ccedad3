"""The OpenVINO GenAI engine: openvino_genai.LLMPipeline on the CPU, loading the zoo's GGUF files directly.

The very GGUF file a llama.cpp arm loads (same path, same sha256) is loaded by OpenVINO GenAI's own GGUF
reader, so an arm of each engine on one form is a like-for-like A/B. One fresh process of worker.py per run
(the only code that imports openvino), pinned by taskset like every engine: per repetition it submits one
request of the harness's prompt token ids (harness/metrics.py: the same ids as every engine), decodes greedily
with end-of-sequence ignored for exactly gen_len tokens, and stamps every output token in a streamer after
it is sampled and detokenized. The metrics are computed from those stamps by harness/metrics.py, as for
llama.cpp and vLLM. docs/engines.md walks through this package as the example of adding an engine.

Read back: the threads that ran the model (the worker's threads with CPU time during the measured
requests, from the kernel: LLMPipeline does not expose its compiled model, so INFERENCE_NUM_THREADS cannot be
read from it), the worker's CPU affinity, prompt and output token counts, sequences per step, the build
strings. Not read back (observe only): the KV cache size (the paged-attention cache is allocated by the
library as the request grows; context_len is a bound checked against prompt_len + gen_len, not passed to
it) and the weight types (the GGUF file's).

Fidelity (`harness fidelity`, worker.py --fidelity): greedy ids from the very LLMPipeline and GenerationConfig a
measurement uses, and teacher-forced log-probabilities (top-k, argmax, the reference's candidates: the full
vocabulary) from one forward pass of the model GenAI itself converted from the GGUF file, saved by the pipeline
(`enable_save_ov_model`) into the run's folder and compiled on the CPU with the same threads: LLMPipeline gives no
per-position distribution (one summed log-probability per sequence), so the forced pass runs the converted model
with SDPA attention, not the pipeline's paged attention. The reference form is gguf-q8_0, the most precise GGUF
form the library loads.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

from harness import metrics
from harness.engines import wheels
from harness.engines.base import Options
from harness.engines.requestworker import WorkerEngine
from harness.engines.workerlib import RUNNING_THREADS
from harness.errors import UserError

DIST = "openvino-genai"
PIN = "2026.4.1.0"  # pyproject.toml's extra `openvino`
INSTALL_FIX = "pip install -e '.[openvino]' in the project's venv (make installs it)"
# The GGUF weight types this engine accepts. Verified by hand with openvino-genai 2026.4.1.0 on the zoo's
# smollm2-135m files: q8_0, q4_0 and q4_1 load and generate; f32 and bf16 are refused by the library itself
# ("Unsupported quantization type"), so they are refused here at plan, before anything runs.
GGUF_TYPES = ("q8_0", "q4_0", "q4_1")
FORMS = tuple(f"gguf-{t}" for t in GGUF_TYPES)
# Paged attention (the continuous-batching backend), GenAI's default on CPU, pinned so that a changed default
# cannot change what is measured; with it, the threads that run the model are exactly INFERENCE_NUM_THREADS.
ATTENTION_BACKEND = "PA"
WORKER = Path(__file__).with_name("worker.py")
# The shared libraries that make up the engine, hashed into provenance (sha256 of the installed file, and the
# sha256 the wheel's RECORD lists for it): the runtime, the CPU plugin, the GGUF reader, GenAI, the tokenizers.
LIBRARY = re.compile(r"lib(openvino|openvino_intel_cpu_plugin|openvino_gguf_frontend|openvino_genai|"
                     r"openvino_tokenizers)\.so(\.\d+)*$")
DISTS = ("openvino", "openvino-genai", "openvino-tokenizers")
ENV_PREFIXES = ("OV_", "OPENVINO_", "TBB_")  # what OpenVINO and its TBB threads read

TIMESTAMPS = ("time.perf_counter() in the worker's StreamerBase.write, after each token is sampled (OpenVINO GenAI's "
              "greedy sampler) and detokenized (Tokenizer.decode of the token, in the callback), relative to the "
              "generate() call that submits the request; the library's own per-token times "
              "(perf_metrics.raw_metrics, stamped before the streamer) are kept beside them in library_times")
THREADS_SOURCE = (RUNNING_THREADS + ": LLMPipeline does not expose its "
                  "compiled model, whose INFERENCE_NUM_THREADS the worker set")
CONTEXT_REASON = ("not settable: OpenVINO GenAI's paged KV cache is allocated by the library as the request grows "
                  "(no context size is passed); prompt_len + gen_len is checked not to exceed context_len")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        raise UserError("engine openvino", f"{dist} is not installed (the optional extra `openvino`)",
                        INSTALL_FIX) from None


def require() -> str:
    """The installed openvino-genai version, or a one-line UserError naming the extra (never imports openvino)."""
    v = _version(DIST)
    if v != PIN:
        raise UserError("engine openvino", f"{DIST} {v} is installed, the harness pins {PIN} (the forms it accepts "
                        "were verified with that version)", INSTALL_FIX)
    return v


@lru_cache(maxsize=None)
def _build_string(path: str, size: int, mtime_ns: int, version: str) -> str:
    """The build string compiled into a library (what openvino.get_version() returns), found in its bytes."""
    pattern = re.compile(re.escape(version.encode()) + rb"-\d+-[0-9a-f]{7,}[\w./-]*")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        at = m.find(version.encode() + b"-")
        while at >= 0:
            hit = pattern.match(m[at:at + 256])
            if hit:
                return hit.group().decode()
            at = m.find(version.encode() + b"-", at + 1)
    return "unknown"


def libraries() -> dict[str, dict[str, Any]]:
    """Each engine library: its installed path, size, sha256 (hash cache: read once per file version), and the
    sha256 its wheel's RECORD lists (equal unless the file was changed after install)."""
    return wheels.libraries(DISTS, LIBRARY, "openvino", "openvino", INSTALL_FIX)


def _build(libs: dict[str, dict], stem: str, dist: str) -> str:
    lib = next((v for k, v in libs.items() if k.startswith(f"lib{stem}.so")), None)
    if lib is None:
        return "unknown"
    st = os.stat(lib["path"])
    return _build_string(lib["path"], st.st_size, st.st_mtime_ns, metadata.version(dist))


def _commit(build: str) -> str:
    """The commit in a build string (2026.4.1-22982-e213a147257-releases/2026/4 -> e213a147257)."""
    m = re.match(r"[\d.]+-\d+-([0-9a-f]{7,})", build)
    return m.group(1) if m else "unknown"


class OpenVino(WorkerEngine):
    name = "openvino"
    worker = WORKER
    timestamps, threads_source, context_reason = TIMESTAMPS, THREADS_SOURCE, CONTEXT_REASON
    batch_source = "most sequences in one generation step (perf_metrics.raw_metrics.m_batch_sizes), fewest over repetitions"
    compile_state = "n/a (no CACHE_DIR: the model is converted and compiled in every run)"
    prompt_counted = "the library counted"
    default_form = "gguf-q8_0"
    form_prefix = "gguf-"
    form_hint = f"openvino-genai {PIN} loads {', '.join(FORMS)}"
    Options = Options  # threads only: nothing else is both settable and readable back
    honours = frozenset({"prompt_len", "gen_len", "context_len", "warmups", "repetitions"})
    max_batch = 1  # LLMPipeline streams (and so stamps) one request at a time
    metrics = metrics.NAMES
    observe_only = frozenset({"dtype", "kv_cache_memory_bytes", "context_len"})  # the GGUF's types; see CONTEXT_REASON
    # fidelity: builds are compared against the most precise GGUF form the library loads (it refuses f32 and bf16)
    reference_form = "gguf-q8_0"
    accepts_file = True  # a build may be a GGUF file by path, as for llama.cpp
    env_prefixes = ENV_PREFIXES  # recorded in every artifact's provenance, as the other engines' are

    def refuse_form(self, where: str, form: str) -> None:
        _refuse_form(where, form)

    def require(self) -> str:
        return require()

    def engine_info(self) -> dict[str, Any]:
        version = require()
        libs = libraries()
        ov_build, genai_build = _build(libs, "openvino", "openvino"), _build(libs, "openvino_genai", DIST)
        genai = next((k for k in libs if k.startswith("libopenvino_genai.so")), None)
        return {"name": "openvino", "version": f"{DIST}=={version}, openvino=={metadata.version('openvino')} (PyPI)",
                "build_commit": f"openvino {_commit(ov_build)}, openvino-genai {_commit(genai_build)}",
                "build": {"openvino_build": ov_build, "openvino_genai_build": genai_build,
                          "distributions": {d: metadata.version(d) for d in DISTS},
                          "binary": genai or "unknown", "binary_sha256": libs[genai]["sha256"] if genai else "unknown",
                          "libraries": wheels.build_block(libs),
                          "attention_backend": ATTENTION_BACKEND,
                          "worker": "harness/engines/openvino/worker.py",
                          "worker_sha256": hashlib.sha256(WORKER.read_bytes()).hexdigest()}}

    def _env(self, ctx_env: dict[str, str] | None = None) -> dict[str, str]:
        # the environment OpenVINO and its TBB threads read (passed through from the harness's own, recorded), and
        # no user site-packages: the worker imports the openvino whose libraries engine_info hashed
        return {**{k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}, **(ctx_env or {}),
                "PYTHONNOUSERSITE": "1"}

    def request_extra(self) -> dict[str, Any]:
        return {"attention_backend": ATTENTION_BACKEND}

    def fidelity_extra(self, workdir: Path) -> dict[str, Any]:
        return {"attention_backend": ATTENTION_BACKEND, "ir_dir": str(workdir / "openvino-model")}

    def build_mismatch(self, info: dict, eff: dict, threads: int) -> str | None:
        want_dir = os.path.dirname(str(metadata.distribution("openvino").locate_file("openvino/__init__.py")))
        if os.path.realpath(eff["openvino_dir"]) != os.path.realpath(want_dir):
            return f"the worker imported openvino from {eff['openvino_dir']}, the hashed one is in {want_dir}"
        if eff["openvino_build"] != info["build"]["openvino_build"]:
            return (f"the worker loaded openvino {eff['openvino_build']}, the hashed library is "
                    f"{info['build']['openvino_build']} (another openvino on the path?)")
        if eff["openvino_genai_build"] != info["build"]["openvino_genai_build"]:
            return (f"the worker loaded openvino-genai {eff['openvino_genai_build']}, the hashed library is "
                    f"{info['build']['openvino_genai_build']}")
        return None

    def read_batch(self, eff: dict) -> int | None:
        return min(eff["batch_sizes"]) if None not in eff["batch_sizes"] else None

    # ---- fidelity -------------------------------------------------------------------------------------
    def fidelity_result_block(self, eng: dict, result: dict) -> dict:
        """The engine block, once the worker is shown to have run the hashed build."""
        eff = result.get("effective") or {}
        want_dir = os.path.dirname(str(metadata.distribution("openvino").locate_file("openvino/__init__.py")))
        for key, want in (("openvino_build", eng["build"]["openvino_build"]),
                          ("openvino_genai_build", eng["build"]["openvino_genai_build"])):
            if eff.get(key) != want:
                raise UserError("openvino fidelity worker", f"loaded {key} {eff.get(key)!r}, the hashed library is "
                                f"{want!r}", "remove the other openvino from the path")
        if os.path.realpath(str(eff.get("openvino_dir"))) != os.path.realpath(want_dir):
            raise UserError("openvino fidelity worker", f"imported openvino from {eff.get('openvino_dir')}, the hashed "
                            f"one is in {want_dir}", "remove the other openvino from the path")
        return eng



def _refuse_form(where: str, form: str) -> None:
    if form not in FORMS:
        raise UserError(where, f"openvino cannot load form {form!r}: it accepts {', '.join(FORMS)} (openvino-genai "
                               f"{PIN} refuses GGUF f32 and bf16)", f"use one of {', '.join(FORMS)}")
