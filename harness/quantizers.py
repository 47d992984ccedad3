"""The zoo's 4-bit HF forms (for vLLM), made offline from a prepared model's hf-fp32 by a real quantizer in its own environment.

- `hf-w4a16`: compressed-tensors W4A16 (pack-quantized int4 weights, symmetric, groups of 64, round-to-nearest from
  the weights' own min/max: data-free), every Linear layer but the output head (`ignore: [lm_head]`; the zoo's
  models tie it to the embedding, which is not a Linear and stays as it is). Made by llm-compressor's `oneshot`
  with a QuantizationModifier. vLLM runs it through CPUWNA16LinearKernel (ops.cpu_gemm_wna16), which only its
  AVX-512 kernel libraries have (vllm FOUR_BIT_OPS, refused at plan elsewhere).

llm-compressor 0.14.0 pins transformers <= 5.17 (the harness's vLLM needs 5.19), so it runs in an environment of
its own, made on demand under the cache (keyed by its pins, the local torch wheel's version included), never in the
project's venv. The environment's `pip freeze` is hashed into the form's recipe, so the exact quantizer is recorded.
Group 64, not 128: SmolLM2-135M's hidden size 576 is not a multiple of 128, and vLLM refuses such a group size.
The zoo's layer: imports nothing of the harness but errors and paths (harness/models.py imports this module); the
vLLM engine knows which kernel the form needs (harness/engines/vllm FOUR_BIT_OPS).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from harness import envs
from harness.errors import UserError

# the quantizer's environment: its own pins (llm-compressor's ranges, resolved once and fixed here)
PINS = ("llmcompressor==0.14.0", "compressed-tensors==0.19.0", "transformers==5.17.0", "torch==2.13.0",
        "accelerate==1.15.0", "numpy==2.3.5")
GROUP_SIZE = 64
FORMS: dict[str, dict[str, Any]] = {
    "hf-w4a16": {"scheme": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                                 "strategy": "group", "group_size": GROUP_SIZE}},
                 "ignore": ["lm_head"], "what": "compressed-tensors W4A16, group 64, symmetric RTN, head unquantized"},
}
SCRIPT = '''
import json, sys
cfg = json.load(open(sys.argv[1]))
from transformers import AutoModelForCausalLM, AutoTokenizer
from llmcompressor import oneshot
from llmcompressor.modifiers.quantization import QuantizationModifier
model = AutoModelForCausalLM.from_pretrained(cfg["hf_dir"], dtype="float32")
tok = AutoTokenizer.from_pretrained(cfg["hf_dir"])
recipe = QuantizationModifier(config_groups={"group_0": cfg["scheme"]}, ignore=cfg["ignore"])
oneshot(model=model, recipe=recipe)  # weight-only: no calibration data, scales from the weights' min/max
model.save_pretrained(cfg["out"], save_compressed=True)
tok.save_pretrained(cfg["out"])
'''


def env_key() -> str:
    return envs.key(PINS)


def ensure_env() -> tuple[Path, str]:
    """The quantizer's python (its environment made once, under a lock) and the sha256 of its `pip freeze`."""
    return envs.ensure("llmcompressor", PINS, "the quantizer (llm-compressor)")


def recipe(form: str) -> dict[str, Any]:
    f = FORMS[form]
    return {"quantizer": "llmcompressor.oneshot + QuantizationModifier (data-free)", "pins": list(PINS),
            "scheme": f["scheme"], "ignore": f["ignore"], "environment": f"llmcompressor-{env_key()}"}


def build(hf_dir: Path, out: Path, form: str) -> dict[str, Any]:
    """Make `form` from the float32 HF folder into `out` (a new folder); its manifest entry."""
    py, freeze_sha = ensure_env()
    f = FORMS[form]
    work = Path(tempfile.mkdtemp(prefix="quantize-"))
    try:
        cfg = {"hf_dir": str(hf_dir), "out": str(work / "out"), "scheme": f["scheme"], "ignore": f["ignore"]}
        (work / "cfg.json").write_text(json.dumps(cfg))
        (work / "quantize.py").write_text(SCRIPT)
        env = {**os.environ, "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "PYTHONPATH": ""}
        r = subprocess.run([str(py), str(work / "quantize.py"), str(work / "cfg.json")], capture_output=True,
                           text=True, env=env, cwd=work, timeout=3600)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UserError(str(hf_dir), f"llm-compressor failed making {form}: {tail[:300]}",
                            f"run {py} {work / 'quantize.py'} to see its whole output")
        qc = json.loads((work / "out" / "config.json").read_text()).get("quantization_config") or {}
        if qc.get("quant_method") != "compressed-tensors":
            raise UserError(str(work / "out" / "config.json"), f"{form}: no compressed-tensors quantization_config",
                            "check the quantizer's output")
        shutil.copytree(work / "out", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"path": form, "format": "safetensors", "dtype": "w4a16", "from": f"hf-fp32 ({f['what']})",
            "recipe": recipe(form), "quantizer_freeze_sha256": freeze_sha,
            "quantization_config": {k: qc.get(k) for k in ("quant_method", "format", "ignore", "config_groups")}}
