"""vLLM general-plugin entry point (group `vllm.general_plugins`): runs in every vLLM process.

Applies the process-level patches (threads and affinity follow the bind list; vLLM's AOT compile cache loads; when selected, the
decode-sized linear kernel, the CPU norm kernels' provider and step attribution) and marks that the runtime loaded. vLLM loads general plugins while it builds the engine config, before the CPU
worker replaces torch.set_num_threads with a no-op.
"""

from __future__ import annotations

import os

LOADED_ENV = "EDGE_HARNESS_RUNTIME_LOADED"


def register() -> None:
    from runtime import patches
    os.environ[LOADED_ENV] = "1"
    for name, apply in (("threads-follow-bind", patches.apply_threads_follow_bind),
                        ("aot-cache-load", patches.apply_aot_cache_load),
                        ("decode-gemv", patches.apply_decode_gemv),
                        ("cpu-norm-kernels", patches.apply_cpu_norm_kernels),
                        ("step-attribution", patches.apply_step_attribution)):
        try:
            selected = patches.should_apply(name)
        except ValueError:  # a bad selection is reported by the worker, not here
            selected = False
        if selected and name not in patches.APPLIED:
            patches.APPLIED[name] = apply()
    record()


RECORD_ENV = "EDGE_HARNESS_RECORD_DIR"


def record() -> None:
    """Where a process of vLLM's is not the harness's own worker (vLLM's API server and its engine core, the
    vllm-server engine), each one says what the runtime did in it: <EDGE_HARNESS_RECORD_DIR>/<pid>.json with the
    patches applied there, written now and again at exit (platform hooks apply after the plugins load)."""
    d = os.environ.get(RECORD_ENV)
    if not d:
        return
    import atexit
    import json
    import sys
    from runtime import patches

    def write() -> None:
        try:
            path = os.path.join(d, f"{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"pid": os.getpid(), "argv": sys.argv[:3], "selected": os.environ.get("EDGE_HARNESS_PATCHES"),
                           "applied": patches.APPLIED}, f, default=str)
            os.replace(path + ".tmp", path)
        except OSError:
            pass
    write()
    if not getattr(record, "_registered", False):
        atexit.register(write)
        record._registered = True  # type: ignore[attr-defined]
