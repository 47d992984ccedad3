"""vLLM general-plugin entry point (group `vllm.general_plugins`): runs in every vLLM process.

Applies the process-level patches (threads and affinity follow the bind list; step attribution when
selected) and marks that the runtime loaded. vLLM loads general plugins while it builds the engine config, before the CPU
worker replaces torch.set_num_threads with a no-op.
"""

from __future__ import annotations

import os

LOADED_ENV = "EDGE_HARNESS_RUNTIME_LOADED"


def register() -> None:
    from runtime import patches
    os.environ[LOADED_ENV] = "1"
    try:
        apply = patches.should_apply("threads-follow-bind")
    except ValueError:
        apply = False
    if apply and "threads-follow-bind" not in patches.APPLIED:
        patches.APPLIED["threads-follow-bind"] = patches.apply_threads_follow_bind()
    try:
        attribute = patches.should_apply("step-attribution")
    except ValueError:
        attribute = False
    if attribute and "step-attribution" not in patches.APPLIED:
        patches.APPLIED["step-attribution"] = patches.apply_step_attribution()
