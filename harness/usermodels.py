"""Your model: a GGUF file or a Hugging Face folder given by path (docs/models.md).

In a grid, `model: {name: NAME, gguf: PATH}` or `{name: NAME, hf: DIR}` (paths relative to the grid file,
`~` expanded), optionally `sha256:` (the GGUF's sha256, or of an HF folder's file list) to pin the exact
weights; or once for every grid, `harness models add NAME --gguf PATH | --hf DIR`, kept in a registry
beside the zoo cache (outside the checkout), after which `model: NAME` names it. The model is then prepared
as the zoo's are (harness/models.py): cached by the source's sha256, the recipe and the llama.cpp build, every
form derived with the pinned tools and recorded in a manifest with each file's size and sha256; its source
path, architecture, parameter count and the source's own dtype (read from the file's metadata) beside them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.paths import cache_root

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
KINDS = ("gguf", "hf", "synthetic")
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim")
GGUF_MAGIC = b"GGUF"
# Architectures whose GGUF transformers can dequantize into a model (so vLLM gets hf-* forms of it), as the
# pinned transformers maps them (transformers.integrations.ggml.GGUF_CONFIG_MAPPING), decoder LLMs only.
GGUF_TO_HF = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "stablelm", "starcoder2", "falcon")
USER_RECIPE = 1  # bump when a user model's derivation changes its output


@dataclass(frozen=True)
class UserModel:
    name: str
    kind: str  # gguf | hf | synthetic (path: the config.json whose shape it takes)
    path: Path
    sha256: str | None = None  # the pin, if given

    def record(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), **({"sha256": self.sha256} if self.sha256 else {})}


def registry_path() -> Path:
    return cache_root() / "user-models.json"


def load_registry() -> dict[str, UserModel]:
    """The models `harness models add` registered on this machine; a registry that cannot be read is refused."""
    p = registry_path()
    if not p.exists():
        return {}
    try:
        doc = json.loads(p.read_text())
        return {n: UserModel(n, r["kind"], Path(r["path"]), r.get("sha256")) for n, r in doc.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(str(p), f"unreadable model registry ({type(e).__name__})",
                        "remove it and register your models again (harness models add)") from None


def save_registry(models: dict[str, UserModel]) -> None:
    p = registry_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)  # a link planted under this name is removed, never written through
    tmp.write_text(json.dumps({n: m.record() for n, m in sorted(models.items())}, indent=1) + "\n")
    os.replace(tmp, p)


def from_mapping(grid_path: str, fld: str, v: dict) -> UserModel:
    """A grid's `model:` mapping, checked: one line naming the grid file and field otherwise."""
    where = f"{grid_path}: {fld}"
    unknown = sorted(set(v) - {"name", "sha256", *KINDS})
    if unknown:
        raise UserError(where, f"unknown key {unknown[0]!r}", "a model is {name, gguf: PATH | hf: DIR | synthetic: "
                        "{config: PATH}, sha256}")
    name, kinds = v.get("name"), [k for k in KINDS if k in v]
    if not isinstance(name, str) or not NAME.match(name):
        raise UserError(where, f"name: {name!r} is not a model name", "lower-case letters, digits, '.', '_', '-'")
    if len(kinds) == 1 and kinds[0] == "synthetic":
        syn = v["synthetic"]
        if not isinstance(syn, dict) or set(syn) != {"config"} or not isinstance(syn["config"], str):
            raise UserError(where, "synthetic: must be {config: PATH} (a config.json)", "e.g. {name: my-1b-shape, "
                            "synthetic: {config: shapes/llama-3.2-1b.json}}")
        v = {**v, "synthetic": syn["config"]}
    if len(kinds) != 1 or not isinstance(v[kinds[0]], str):
        raise UserError(where, "give exactly one of gguf: PATH, hf: DIR and synthetic: {config: PATH}",
                        "e.g. {name: mine, gguf: model.gguf}")
    pin = v.get("sha256")
    if pin is not None and not (isinstance(pin, str) and re.fullmatch(r"[0-9a-f]{64}", pin)):
        raise UserError(where, f"sha256: {pin!r} is not 64 hex digits", "pin the file's sha256 (sha256sum FILE)")
    p = Path(v[kinds[0]]).expanduser()
    um = UserModel(name, kinds[0], p if p.is_absolute() else (Path(grid_path).resolve().parent / p), pin)
    check_source(um, f"{where}.{kinds[0]}")
    return um


def check_source(um: UserModel, where: str) -> None:
    """The source is what it says: a readable, complete GGUF (or an HF folder with config.json and weights),
    of an architecture something here can run; and, when pinned, the pinned weights."""
    if um.kind == "gguf":
        info = gguf_info(um.path, where)
        if info["architecture"] is None:
            raise UserError(where, f"{um.path}: no general.architecture in its metadata", "give a model's GGUF")
    elif um.kind == "synthetic":
        synthetic_shape(um, where)
    else:
        if not um.path.is_dir():
            raise UserError(where, f"{um.path} is not a directory", "give a Hugging Face model folder")
        if not (um.path / "config.json").is_file():
            raise UserError(where, f"{um.path} has no config.json", "give the folder save_pretrained wrote")
        if not any(um.path.glob("*.safetensors")):
            raise UserError(where, f"{um.path} has no *.safetensors weights", "save the model with safetensors")
    if um.sha256:
        got = source_sha256(um)
        if got != um.sha256:
            raise UserError(where, f"sha256: {um.path} is {got}, the pin is {um.sha256}",
                            "these are not the pinned weights: fetch them again, or update the pin")


SYNTHETIC_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def synthetic_shape(um: UserModel, where: str) -> dict[str, int]:
    """A Llama/Mistral/Qwen2-style config.json's shape (what a synthetic model takes of it: the rest, tokenizer
    and vocabulary included, is SmolLM2-135M's, as for the built-in synthetic shapes); refused, with the
    numbers, when its fp32 weights cannot fit in this machine's available memory."""
    try:
        cfg = json.loads(um.path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(where, f"{um.path}: unreadable config.json ({type(e).__name__})", "give a model's "
                        "config.json") from None
    if not isinstance(cfg, dict):
        raise UserError(where, f"{um.path}: not a JSON object", "give a model's config.json")
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch not in SYNTHETIC_ARCHS:
        raise UserError(where, f"{um.path}: architecture {arch} (synthetic shapes are built as Llama)",
                        f"give a config of {', '.join(SYNTHETIC_ARCHS)}")
    shape = {k: cfg[k] for k in SHAPE_KEYS if k in cfg}
    missing = [k for k in SHAPE_KEYS[:5] if not isinstance(shape.get(k), int) or shape[k] <= 0]
    if missing:
        raise UserError(where, f"{um.path}: {missing[0]} missing or not a positive integer", "give a full config")
    shape.setdefault("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    from harness import models
    params = models.matmul_parameters(shape) + 2 * 49152 * shape["hidden_size"]  # + SmolLM2's vocabulary
    from harness.probe import meminfo
    avail = meminfo().get("available_bytes") or 0
    if avail and 4 * params > avail:
        raise UserError(where, f"{um.path}: {params / 1e9:.2f}B parameters need {4 * params / 2**30:.1f} GiB in fp32 "
                        f"to build, this machine has {avail / 2**30:.1f} GiB available", "give a smaller shape")
    return shape


def gguf_info(path: Path, where: str) -> dict[str, Any]:
    """What a GGUF says of itself (architecture, file type, parameter count, shape), read with gguf-py; a file
    that is not GGUF (magic bytes) or is truncated (its tensors' data past its end) is refused."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise UserError(where, f"{path}: {e.strerror}", "give an existing GGUF file") from None
    if magic != GGUF_MAGIC:
        raise UserError(where, f"{path} is not a GGUF file (magic {magic!r}, not b'GGUF')", "give a .gguf model file")
    try:
        kv, tensors, data_start = _read_gguf_header(path)
    except (ValueError, EOFError, OverflowError, MemoryError) as e:
        raise UserError(where, f"{path}: unreadable GGUF header ({str(e)[:120]})",
                        "the file is truncated or corrupted: copy it again") from None
    size = path.stat().st_size
    end = max((data_start + off + nbytes for off, nbytes, _ in tensors), default=data_start)
    if end > size:
        raise UserError(where, f"{path}: truncated ({size} bytes, its tensors end at {end})", "copy the file again")
    arch = kv.get("general.architecture")
    from gguf.constants import LlamaFileType
    ft = kv.get("general.file_type")
    try:
        dtype = LlamaFileType(ft).name.replace("MOSTLY_", "").replace("ALL_", "").lower() if ft is not None else None
    except ValueError:
        dtype = None
    shape = {k: kv.get(f"{arch}.{g}") for k, g in (
        ("hidden_size", "embedding_length"), ("intermediate_size", "feed_forward_length"),
        ("num_hidden_layers", "block_count"), ("num_attention_heads", "attention.head_count"),
        ("num_key_value_heads", "attention.head_count_kv"))} if arch else {}
    return {"architecture": arch, "file_type": dtype, "parameters": sum(n for _, _, n in tensors), "shape": shape}


MAX_COUNT = 1 << 24  # no real GGUF has more keys, tensors or array items: a larger count is a corrupt header


def _read_gguf_header(path: Path) -> tuple[dict[str, Any], list[tuple[int, int, int]], int]:
    """The GGUF header without loading it whole (gguf-py's reader walks every vocabulary string in Python):
    scalar and string keys (arrays skipped), and per tensor (offset in the data section, bytes, elements);
    the data section's start. Spec: ggml/docs/gguf.md (version 2 and 3: 64-bit counts)."""
    import struct

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        def read(n: int) -> bytes:
            b = f.read(n)
            if len(b) != n:
                raise EOFError("file ends inside its header")
            return b

        def u64() -> int:
            return struct.unpack("<Q", read(8))[0]

        def count() -> int:
            n = u64()
            if n > MAX_COUNT:
                raise ValueError(f"a count of {n}")
            return n

        def string() -> str:
            return read(count()).decode("utf-8", "replace")

        def value(t: int) -> Any:
            if t in scalar:
                return struct.unpack(scalar[t], read(struct.calcsize(scalar[t])))[0]
            if t == 8:
                return string()
            if t == 9:  # an array: skipped
                inner, n = struct.unpack("<I", read(4))[0], count()
                if inner in scalar:
                    f.seek(n * struct.calcsize(scalar[inner]), 1)
                else:
                    for _ in range(n):
                        value(inner)
                return None
            raise ValueError(f"unknown value type {t}")

        read(4)
        version = struct.unpack("<I", read(4))[0]
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} (this reads 2 and 3)")
        n_tensors, n_kv = count(), count()
        kv = {}
        for _ in range(n_kv):
            key = string()
            kv[key] = value(struct.unpack("<I", read(4))[0])
        tensors = []
        for _ in range(n_tensors):
            string()
            dims = [u64() for _ in range(struct.unpack("<I", read(4))[0])]
            ttype, offset = struct.unpack("<I", read(4))[0], u64()
            try:
                block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
            except (ValueError, KeyError):
                raise ValueError(f"unknown tensor type {ttype}") from None
            n = 1
            for d in dims:
                n *= d
            tensors.append((offset, n // block * nbytes, n))
        align = kv.get("general.alignment", 32)
        pos = f.tell()
        return kv, tensors, pos + (-pos % align)


def source_sha256(um: UserModel) -> str:
    """The GGUF file's sha256; of an HF folder, the sha256 of its files' `path sha256` lines (through the hash
    cache: an unchanged file is not re-read)."""
    from harness.hashcache import HashCache
    cache = HashCache.default()
    try:
        if um.kind in ("gguf", "synthetic"):
            return cache.sha256(um.path)
        lines = [f"{p.relative_to(um.path)} {cache.sha256(p)}\n" for p in sorted(um.path.rglob("*")) if p.is_file()]
        return hashlib.sha256("".join(lines).encode()).hexdigest()
    finally:
        cache.save()


def key_inputs(um: UserModel) -> dict[str, Any]:
    if um.kind == "synthetic":
        from harness import models
        shape = synthetic_shape(um, str(um.path))
        return {"synthetic": {"shape": shape, "std": models.SYNTHETIC_STD, "forms": list(models.SYNTHETIC_FORMS),
                              "seed": models.synthetic_seed(um.name), "builder": models.SYNTHETIC_BUILDER}}
    return {"user": {"kind": um.kind, "sha256": source_sha256(um), "recipe": USER_RECIPE}}


def build(um: UserModel, work: Path) -> dict[str, Any]:
    """Every form of the model, with the pinned tools: from a GGUF, the file as given (`gguf-<its type>`), hf-fp32
    and hf-bf16 dequantized by transformers where its architecture allows, and from those gguf-f32/bf16 and
    q8_0/q4_0; from an HF folder, the folder as given (`hf-<its dtype>`), gguf-f32/bf16 (convert_hf_to_gguf.py)
    and q8_0/q4_0 (llama-quantize)."""
    import shutil
    import sys

    from harness import models
    if um.kind == "synthetic":  # the built-in synthetic shapes' builder, on this config's shape
        info = models.build_synthetic(work, um.name, synthetic_shape(um, str(um.path)))
        info["source"] = {**info["source"], "shape_of": str(um.path), "config_sha256": source_sha256(um)}
        return info
    src = {"user_source": str(um.path), "kind": um.kind, "sha256": source_sha256(um)}
    forms: dict[str, dict] = {}
    (work / "gguf").mkdir(parents=True)
    need = um.path.stat().st_size if um.kind == "gguf" else sum(p.stat().st_size for p in um.path.rglob("*")
                                                                 if p.is_file())
    print(f"[models] {um.name}: deriving its forms from {um.path} ({need / 2**30:.2f} GiB of source; expect ~10x "
          "that on disk and minutes per GiB)", file=sys.stderr)
    if um.kind == "gguf":
        info = gguf_info(um.path, str(um.path))
        own = info["file_type"] or "unknown"
        shutil.copyfile(um.path, work / "gguf" / f"model-{own}.gguf")
        forms[f"gguf-{own}"] = {"path": f"gguf/model-{own}.gguf", "format": "gguf", "dtype": own, "from": "source"}
        if info["architecture"] not in GGUF_TO_HF:
            return {"source": src, "architecture": [info["architecture"]], "parameters": info["parameters"],
                    "config": info["shape"], "forms": forms,
                    "note": f"architecture {info['architecture']}: transformers cannot dequantize it, so no hf-* forms"}
        hf32, hf16 = work / "hf-fp32", work / "hf-bf16"
        meta = models._hf_from_gguf(work / "gguf" / f"model-{own}.gguf", hf32, hf16)
        forms["hf-fp32"] = {"path": "hf-fp32", "format": "safetensors", "dtype": "float32", "from": f"{own} dequantized"}
        forms["hf-bf16"] = {"path": "hf-bf16", "format": "safetensors", "dtype": "bfloat16", "from": f"{own} dequantized"}
    else:
        cfg = json.loads((um.path / "config.json").read_text())
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)
        hf32 = work / f"hf-{short}"
        shutil.copytree(um.path, hf32, ignore=shutil.ignore_patterns(".git", "*.gguf"))
        forms[f"hf-{short}"] = {"path": f"hf-{short}", "format": "safetensors", "dtype": dtype, "from": "source"}
        meta = {"parameters": None, "architecture": cfg.get("architectures") or ["unknown"]}
        hf16 = hf32
    for outtype, hf in (("f32", hf32), ("bf16", hf16)):
        if f"gguf-{outtype}" not in forms:
            models._convert_gguf(hf, work / "gguf" / f"model-{outtype}.gguf", outtype)
            forms[f"gguf-{outtype}"] = {"path": f"gguf/model-{outtype}.gguf", "format": "gguf", "dtype": outtype,
                                        "from": hf.name}
    for q in ("q8_0", "q4_0"):
        if f"gguf-{q}" not in forms:
            models._quantize(work / "gguf" / "model-f32.gguf", work / "gguf" / f"model-{q}.gguf", q.upper())
            forms[f"gguf-{q}"] = {"path": f"gguf/model-{q}.gguf", "format": "gguf", "dtype": q, "from": "gguf-f32"}
    hf_cfg = json.loads((hf32 / "config.json").read_text())
    params = meta["parameters"] or gguf_info(work / "gguf" / "model-f32.gguf", um.name)["parameters"]
    return {"source": src, "architecture": meta["architecture"], "parameters": params,
            "config": {k: hf_cfg.get(k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                   "num_attention_heads", "num_key_value_heads", "head_dim")},
            "forms": forms}
