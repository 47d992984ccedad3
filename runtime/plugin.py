"""vLLM general-plugin entry point (group `vllm.general_plugins`): runs in every vLLM process.

Applies the process-environment patches (torch threads) and marks that the runtime loaded.
"""

from __future__ import annotations

import os

LOADED_ENV = "EDGE_HARNESS_RUNTIME_LOADED"


def register() -> None:
    from runtime import patches
    os.environ[LOADED_ENV] = "1"
    try:
        apply = patches.should_apply("torch-threads")
    except ValueError:
        apply = False
    if apply and "torch-threads" not in patches.APPLIED:
        patches.APPLIED["torch-threads"] = patches.apply_torch_threads()
