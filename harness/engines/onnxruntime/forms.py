"""ONNX Runtime GenAI's model forms, made offline from a prepared model's hf-fp32 by the pinned package's own model
builder (`python -m onnxruntime_genai.models.builder`), on demand: when a grid or fidelity build loads one, the
model zoo (harness/models.py) adds it to the prepared copy, hashed into its manifest like every other file.

- `onnx-fp32`: the decoder in float32 (`-p fp32`), the reference of this engine's builds.
- `onnx-int4`: weight-only int4 (MatMulNBits, `-p int4`): every linear layer's weights in blocks of 32, symmetric,
  round-to-nearest, int8 activations in the MatMul (accuracy_level 4, the builder's CPU default), the output
  head left in float32 (`nodes_to_exclude=/lm_head/MatMul`) and the tied embedding not shared with it, so it stays
  float32 too (`shared_embeddings=false`).
- `onnx-int4-head`: the builder's own int4 defaults: the output head quantized as well, and (the zoo's models tie
  their embeddings) the embedding table shared with it in int4 (GatherBlockQuantized). The planted head trap
  (docs/quantization.md): a build that fails fidelity early.

Every option is passed explicitly (a changed builder default cannot change a form) and recorded in the form's
`recipe`; a form whose recorded recipe is not the current one is made again. Imports nothing of the harness but
errors and paths (harness/models.py imports this module).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.errors import UserError

DIST = "onnxruntime-genai"
PIN = "0.18.0"  # pyproject.toml's extra `onnxruntime`
INSTALL_FIX = "pip install -e '.[onnxruntime]' in the project's venv (make installs it)"
COMMON_INT4 = ["block_size=32", "is_symmetric=true", "accuracy_level=4", "algo_config=default"]
# form -> (the builder's precision, its extra options, dtype recorded in the manifest, what the form is)
FORMS: dict[str, tuple[str, list[str], str, str]] = {
    "onnx-fp32": ("fp32", ["shared_embeddings=false"], "float32", "float32 decoder"),
    "onnx-int4": ("int4", COMMON_INT4 + ["nodes_to_exclude=/lm_head/MatMul", "shared_embeddings=false"], "int4",
                  "int4 weights (block 32, symmetric RTN, int8 activations), output head and embedding float32"),
    "onnx-int4-head": ("int4", COMMON_INT4 + ["shared_embeddings=true"], "int4",
                       "int4 weights with the output head and the tied embedding quantized too (the head trap)"),
}
# the builder's outputs a run needs (the rest, e.g. its cache folder, is not kept)
OUTPUTS = ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json", "tokenizer_config.json",
           "chat_template.jinja", "special_tokens_map.json")


def require() -> str:
    """The installed onnxruntime-genai version, or a one-line UserError naming the extra (never imports it)."""
    try:
        v = metadata.version(DIST)
    except metadata.PackageNotFoundError:
        raise UserError("engine onnxruntime-genai", f"{DIST} is not installed (the optional extra `onnxruntime`)",
                        INSTALL_FIX) from None
    if v != PIN:
        raise UserError("engine onnxruntime-genai", f"{DIST} {v} is installed, the harness pins {PIN} (its forms and "
                        "options were verified with that version)", INSTALL_FIX)
    return v


def recipe(form: str) -> dict[str, Any]:
    """What makes a form: the builder, its version and every option passed."""
    precision, extra, _, _ = FORMS[form]
    return {"builder": "python -m onnxruntime_genai.models.builder", "onnxruntime_genai": PIN,
            "precision": precision, "execution_provider": "cpu", "extra_options": list(extra)}


def build(hf_dir: Path, out: Path, form: str) -> dict[str, Any]:
    """Make `form` from the float32 HF folder into `out` (a new folder); its manifest entry."""
    require()
    precision, extra, dtype, what = FORMS[form]
    cache = Path(tempfile.mkdtemp(prefix="ort-builder-"))
    stage = cache / "out"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(stage),
           "-p", precision, "-e", "cpu", "-c", str(cache / "cache"), "--extra_options", *extra]
    # GIT_DIR: the builder stamps `git rev-parse HEAD`, run five folders above its own file, into the graph's
    # producer_version; with a venv inside a checkout that is the checkout's commit, so the form's bytes would
    # depend on which commit of the harness built it. With no repository it stamps the wheel's own commit.
    env = {**os.environ, "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "GIT_DIR": os.devnull}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600, cwd=cache)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UserError(str(hf_dir), f"the ONNX Runtime GenAI builder failed making {form}: {tail[:300]}",
                            f"run `{' '.join(cmd)}` to see its whole output")
        missing = [f for f in ("genai_config.json", "model.onnx") if not (stage / f).is_file()]
        if missing:
            raise UserError(str(hf_dir), f"the ONNX Runtime GenAI builder made no {missing[0]} for {form}",
                            "check the builder's output (a model type it does not support?)")
        out.mkdir(parents=True)
        for f in OUTPUTS:
            if (stage / f).is_file():
                shutil.copy2(stage / f, out / f)
        # the runtime's threads are set per run (the worker's overlay): none is baked into the form
        cfg = json.loads((out / "genai_config.json").read_text())
        opts = cfg.get("model", {}).get("decoder", {}).get("session_options", {})
        stray = sorted(k for k in opts if "thread" in k)
        if stray:
            raise UserError(str(out / "genai_config.json"), f"the builder set {stray[0]} in the form", "report it")
        graph = graph_summary(out / "model.onnx")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {"path": form, "format": "onnx", "dtype": dtype, "from": f"hf-fp32 ({what})", "recipe": recipe(form),
            "graph": graph}


def graph_summary(path: Path) -> dict[str, Any]:
    """What the builder made, read from the graph (not assumed from its options): how many nodes of each matrix
    op type, and the op types of the output head's and the embedding's nodes."""
    import onnx  # the builder's own dependency (the extra `onnxruntime`); only when a form is made

    g = onnx.load(str(path), load_external_data=False).graph
    ops: dict[str, int] = {}
    for n in g.node:
        if n.op_type in ("MatMul", "MatMulNBits", "Gather", "GatherBlockQuantized"):
            ops[n.op_type] = ops.get(n.op_type, 0) + 1

    def types(part: str) -> list[str]:
        return sorted({n.op_type for n in g.node if part in n.name and n.op_type in ops})

    return {"matrix_ops": dict(sorted(ops.items())), "lm_head": types("lm_head"), "embed_tokens": types("embed_tokens")}
