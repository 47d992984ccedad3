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

from harness import untrusted
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
    if not p.exists() and not p.is_symlink():
        return {}
    fix = "remove it and register your models again (harness models add)"
    doc = untrusted.read_json(p, str(p), fix)
    try:
        out = {n: UserModel(n, r["kind"], Path(r["path"]), r.get("sha256")) for n, r in doc.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(str(p), f"unreadable model registry ({type(e).__name__})",
                        "remove it and register your models again (harness models add)") from None
    for n, um in out.items():  # a name becomes a cache path: only a model name, of a known kind
        if not (isinstance(n, str) and NAME.match(n)) or um.kind not in KINDS:
            raise UserError(str(p), f"entry {n!r}: not a model name of kind {'/'.join(KINDS)}",
                            "remove it and register the model again (harness models add)")
    return out


def save_registry(models: dict[str, UserModel]) -> None:
    p = registry_path()
    fix = "make the cache writable (or set EDGE_HARNESS_CACHE to a folder you can write to)"
    untrusted.make_folder(p.parent, "harness models add", fix)
    untrusted.write_file(p, (json.dumps({n: m.record() for n, m in sorted(models.items())}, indent=1) + "\n").encode(),
                         "harness models add", fix)


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
    um = UserModel(name, kinds[0], Path(os.path.normpath(p if p.is_absolute() else Path(grid_path).resolve().parent / p)),
                   pin)
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
        files = untrusted.folder(um.path, where, "give a Hugging Face model folder")
        if um.path / "config.json" not in files:
            raise UserError(where, f"{um.path} has no config.json", "give the folder save_pretrained wrote")
        hf_dtype(um.path, where)
        if not any(f.suffix == ".safetensors" and f.parent == um.path for f in files):
            raise UserError(where, f"{um.path} has no *.safetensors weights", "save the model with safetensors")
    if um.sha256:
        got = source_sha256(um)
        if got != um.sha256:
            raise UserError(where, f"sha256: {um.path} is {got}, the pin is {um.sha256}",
                            "these are not the pinned weights: fetch them again, or update the pin")


SYNTHETIC_ARCHS = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


def matmul_parameters(config: dict) -> int:
    """Weights a prompt token is multiplied with in prefill: every decoder layer's projections. The token
    embedding is a lookup, and the output head runs for the last prompt token only."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    hd = config.get("head_dim") or h // config["num_attention_heads"]
    q = config["num_attention_heads"] * hd
    kv = config["num_key_value_heads"] * hd
    return layers * (h * q + 2 * h * kv + q * h + 3 * h * inter)


# the dtypes an HF folder's weights may have, as its config.json names them (torch_dtype, or dtype in newer
# transformers): the value becomes a form's name (hf-fp32, hf-bf16, hf-fp16), never a path of its own
HF_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def hf_dtype(folder: Path, where: str) -> tuple[str, str]:
    """An HF folder's weights' dtype as its config.json says (float32 where it says nothing) and its short name."""
    cfg = untrusted.read_json(folder / "config.json", where, "give the config.json save_pretrained wrote")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    if not isinstance(dtype, str) or dtype not in HF_DTYPES:
        raise UserError(where, f"{folder / 'config.json'}: torch_dtype {str(dtype)[:40]!r} is not one of "
                        f"{', '.join(HF_DTYPES)}", "save the model in float32, bfloat16 or float16")
    return dtype, HF_DTYPES[dtype]


def synthetic_shape(um: UserModel, where: str) -> dict[str, int]:
    """A Llama/Mistral/Qwen2-style config.json's shape (what a synthetic model takes of it: the rest, tokenizer
    and vocabulary included, is SmolLM2-135M's, as for the built-in synthetic shapes); refused, with the
    numbers, when its fp32 weights cannot fit in this machine's available memory."""
    cfg = untrusted.read_json(um.path, where, "give a model's config.json")
    arch = (cfg.get("architectures") or ["?"])[0]
    if arch not in SYNTHETIC_ARCHS:
        raise UserError(where, f"{um.path}: architecture {arch} (synthetic shapes are built as Llama)",
                        f"give a config of {', '.join(SYNTHETIC_ARCHS)}")
    shape = {k: cfg[k] for k in SHAPE_KEYS if k in cfg}
    missing = [k for k in SHAPE_KEYS[:5] if not isinstance(shape.get(k), int) or shape[k] <= 0]
    if missing:
        raise UserError(where, f"{um.path}: {missing[0]} missing or not a positive integer", "give a full config")
    shape.setdefault("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    params = matmul_parameters(shape) + 2 * 49152 * shape["hidden_size"]  # + SmolLM2's vocabulary
    from harness.probe import meminfo
    avail = meminfo().get("available_bytes") or 0
    if avail and 4 * params > avail:
        raise UserError(where, f"{um.path}: {params / 1e9:.2f}B parameters need {4 * params / 2**30:.1f} GiB in fp32 "
                        f"to build, this machine has {avail / 2**30:.1f} GiB available", "give a smaller shape")
    return shape


def gguf_info(path: Path, where: str) -> dict[str, Any]:
    """What a GGUF says of itself (architecture, file type, parameter count, shape), read with gguf-py; a file
    that is not GGUF (magic bytes) or is truncated (its tensors' data past its end) is refused."""
    untrusted.regular_file(path, where, "give an existing GGUF file")
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
    end = max((data_start + off + nbytes for off, nbytes, _, _ in tensors), default=data_start)
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
    types: dict[str, int] = {}
    for _, _, _, t in tensors:
        types[t] = types.get(t, 0) + 1
    return {"architecture": arch, "file_type": dtype, "parameters": sum(n for _, _, n, _ in tensors), "shape": shape,
            "tensor_types": dict(sorted(types.items()))}


MAX_COUNT = 1 << 24  # no real GGUF has more keys, tensors or array items: a larger count is a corrupt header
MAX_ARRAY_DEPTH = 8  # arrays of arrays: real files nest none
MAX_DIMS = 4  # GGML_MAX_DIMS


def _read_gguf_header(path: Path) -> tuple[dict[str, Any], list[tuple[int, int, int, str]], int]:
    """The GGUF header without loading it whole (gguf-py's reader walks every vocabulary string in Python):
    scalar and string keys (arrays skipped), and per tensor (offset in the data section, bytes, elements, ggml type);
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

        def value(t: int, depth: int = 0) -> Any:
            if t in scalar:
                return struct.unpack(scalar[t], read(struct.calcsize(scalar[t])))[0]
            if t == 8:
                return string()
            if t == 9:  # an array: skipped
                if depth >= MAX_ARRAY_DEPTH:
                    raise ValueError(f"arrays nested deeper than {MAX_ARRAY_DEPTH}")
                inner, n = struct.unpack("<I", read(4))[0], count()
                if inner in scalar:
                    f.seek(n * struct.calcsize(scalar[inner]), 1)
                else:
                    for _ in range(n):
                        value(inner, depth + 1)
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
            n_dims = struct.unpack("<I", read(4))[0]
            if n_dims > MAX_DIMS:
                raise ValueError(f"a tensor of {n_dims} dimensions (GGML has at most {MAX_DIMS})")
            dims = [u64() for _ in range(n_dims)]
            ttype, offset = struct.unpack("<I", read(4))[0], u64()
            try:
                qtype = GGMLQuantizationType(ttype)
                block, nbytes = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise ValueError(f"unknown tensor type {ttype}") from None
            n = 1
            for d in dims:
                n *= d
            tensors.append((offset, n // block * nbytes, n, qtype.name.lower()))
        align = kv.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, int) or not 0 < align <= 1 << 20 or align % 8:
            raise ValueError(f"general.alignment {repr(align)[:20]} (the spec: a positive multiple of 8)")
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
    """A GGUF's or HF folder's part of its cache key: its content and the recipe (a synthetic shape's is the
    built-in synthetic models' key, harness.models.model_key)."""
    return {"user": {"kind": um.kind, "sha256": source_sha256(um), "recipe": USER_RECIPE}}
