"""Engines, registered lazily by name ("module:Class"): importing the harness never imports torch or vLLM.

An unknown name fails with the list of known ones.
"""

from __future__ import annotations

import importlib

from harness.errors import UserError

ENGINES: dict[str, str] = {
    "llama.cpp": "harness.engines.llamacpp:LlamaCpp",
    "vllm": "harness.engines.vllm:Vllm",
    "command": "harness.engines.command:Command",
}


def get_engine(name: str):
    if name not in ENGINES:
        raise UserError("engine", f"unknown engine {name!r}", f"known engines: {', '.join(sorted(ENGINES))}")
    mod, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(mod), cls)()
