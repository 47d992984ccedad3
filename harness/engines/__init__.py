"""Engines, registered by name ("module:Class"): one module and one line here per engine (docs/harness.md).

Every class implements the contract of harness/engines/base.py:Engine. Importing an engine module never
imports torch or vLLM (those run in the engine's own process). An unknown name fails with the known ones.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any

from harness.engines.capabilities import Sizing, capability
from harness.errors import UserError

ENGINES: dict[str, str] = {
    "llama.cpp": "harness.engines.llamacpp.engine:LlamaCpp",
    "llama-bench": "harness.engines.llamacpp.llama_bench:LlamaBench",
    "vllm": "harness.engines.vllm:Vllm",
    "command": "harness.engines.command:Command",
    "openvino": "harness.engines.openvino:OpenVino",
    "onnxruntime-genai": "harness.engines.onnxruntime.engine:OnnxRuntimeGenAi",
    "executorch": "harness.engines.executorch.engine:ExecuTorch",
    "llama-server": "harness.engines.server:LlamaServer",
    "vllm-server": "harness.engines.server:VllmServer",
    "openai": "harness.engines.server:OpenAi",
    "openai-speech": "harness.engines.speech.external:OpenAiSpeech",
    "piper": "harness.engines.speech.piper:Piper",
    "sherpa-onnx": "harness.engines.speech.sherpa:SherpaOnnx",
    "kokoro": "harness.engines.speech.kokoro:Kokoro",
}


@lru_cache(maxsize=None)
def engine_class(name: str):
    if name not in ENGINES:
        raise UserError("engine", f"unknown engine {name!r}", f"known engines: {', '.join(sorted(ENGINES))}")
    mod, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(mod), cls)


def get_engine(name: str):
    return engine_class(name)()


# Capabilities an engine's package offers the engine-free pipeline, declared on its class by module name (the
# pipeline reaches them here, never by importing the package):
# - form_maker: the module whose offline converter derives forms from a prepared model's hf-fp32 (FORMS,
#   recipe(form), build(hf_dir, out, form)), made when a grid or fidelity build first loads one;
# - gguf_toolchain: the module whose pinned build converts and quantizes the zoo's GGUF forms (variant,
#   user_build, source_dir, binary, code_key, TOOL_KEY);
# - environment: the "module:function" that makes the engine's environment of its own (harness/envs.py);
# - weight_files: for each on-disk format it reads, which of a form's files hold the weights (path suffixes; ""
#   every file): the bytes residency, bandwidth shares and admission count.
def _declared(attr: str) -> tuple[str, ...]:
    """What the registered engines declare under `attr` (by module name), each once, in registry order."""
    return tuple(dict.fromkeys(v for name in ENGINES if (v := getattr(engine_class(name), attr, None))))


@lru_cache(maxsize=1)
def form_makers() -> dict[str, Any]:
    """Each derived form -> the module that makes it, from every engine that declares a form_maker."""
    return {f: m for m in map(importlib.import_module, _declared("form_maker")) for f in m.FORMS}


def environments() -> tuple[str, ...]:
    """The environments of their own the engines need ("module:function" returning its python and freeze
    sha256, harness/envs.py), from every engine that declares an `environment`."""
    return _declared("environment")


@lru_cache(maxsize=1)
def gguf_toolchain() -> Any:
    """The module of the one engine that declares a gguf_toolchain."""
    mods = _declared("gguf_toolchain")
    if len(mods) != 1:
        raise RuntimeError(f"engines declare {len(mods)} GGUF toolchains; the zoo needs exactly one")
    return importlib.import_module(mods[0])


@lru_cache(maxsize=1)
def weight_rules() -> dict[str, tuple[str, ...]]:
    """Each format -> the path suffixes of a form's weight files, from every engine's `weight_files` (engines that
    read one format agree on it)."""
    out: dict[str, tuple[str, ...]] = {}
    for name in ENGINES:
        for fmt, suffixes in (getattr(engine_class(name), "weight_files", None) or {}).items():
            if out.setdefault(fmt, tuple(suffixes)) != tuple(suffixes):
                raise RuntimeError(f"engines disagree on the weight files of format {fmt!r}")
    return out


def weight_paths(fmt: str, paths: Any) -> list[str] | None:
    """The weight files among a form's files, by its format's rule (weight_rules); None: no engine reads the format
    (a format without a rule has no known weight files, and the figures that need them are not computed, never from
    zero bytes)."""
    suffixes = weight_rules().get(fmt)
    return None if suffixes is None else [p for p in paths if p.endswith(suffixes)]


def weight_files(model: Any) -> list | None:
    """An artifact's model block's weight files (its ModelFile entries), by its format's rule; None: no rule."""
    keep = weight_paths(model.format, [f.path for f in model.files])
    return None if keep is None else [f for f in model.files if f.path in keep]


def weight_bytes(model: Any) -> int | None:
    files = weight_files(model)
    return None if files is None else sum(f.size for f in files)


def engine_metrics(name: str) -> tuple[str, ...]:
    """The metrics an engine emits, by name (one definition per name across engines)."""
    return engine_class(name).metrics if name in ENGINES else ()


def adapt(model: str, profile: dict, context_len: int = 1024, gen_len: int = 128, store=None,
          host: str | None = None) -> dict[str, list[dict]]:
    """`harness adapt`: per engine with derivation rules (each engine's own `adapt`), the settings this
    profile should use, each with its value, rule and evidence."""
    out = {}
    for name in ENGINES:
        rows = capability(get_engine(name), Sizing).adapt(model, profile, context_len, gen_len, store, host)
        if rows is not None:
            out[name] = [{k: v for k, v in r.items() if k != "admission"} for r in rows]
    return out


@lru_cache(maxsize=1)
def env_prefixes() -> tuple[str, ...]:
    """The environment prefixes every registered engine names (recorded in provenance)."""
    return tuple(dict.fromkeys(p for name in ENGINES for p in engine_class(name).env_prefixes))
