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


# The metrics each engine emits, by name (one definition per name across engines): known without
# importing the engine, so `harness plan` can size a grid's family of comparisons.
METRICS: dict[str, tuple[str, ...]] = {
    "llama.cpp": ("prefill_tok_s", "decode_tok_s", "prefill_latency_s"),
    "vllm": ("prefill_tok_s", "decode_tok_s", "ttft_s", "itl_median_s", "startup_s", "peak_rss_mib"),
    "command": ("wall_s",),
}


def engine_metrics(name: str) -> tuple[str, ...]:
    return METRICS.get(name, ())
