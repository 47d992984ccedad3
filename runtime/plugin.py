"""vLLM general-plugin entry point (group `vllm.general_plugins`).

vLLM calls `register()` in every process it starts. Patches are added here as they are
proven (see docs/runtime.md); today the plugin only records that it was loaded.
"""

from __future__ import annotations

import os

LOADED_ENV = "EDGE_HARNESS_RUNTIME_LOADED"


def register() -> None:
    # A marker the worker reads back, proving the plugin ran in this process tree.
    os.environ[LOADED_ENV] = "1"
