"""The zoo's 4-bit HF forms (for vLLM), made offline from a prepared model's hf-fp32 by a real quantizer in its own environment.

- `hf-w4a16`: compressed-tensors W4A16 (pack-quantized int4 weights, symmetric, groups of 64, round-to-nearest from
  the weights' own min/max: data-free), every Linear layer but the output head (`ignore: [lm_head]`; the zoo's
  models tie it to the embedding, which is not a Linear and stays as it is). Made by llm-compressor's `oneshot`
  with a QuantizationModifier. vLLM runs it through CPUWNA16LinearKernel (ops.cpu_gemm_wna16), which only its
  AVX-512 kernel libraries have (vllm FOUR_BIT_OPS, refused at plan elsewhere).
- `hf-w4a16-head`: the same with the output head quantized too (no ignore list; llm-compressor unties the head
  from the embedding to do so): the planted head trap of vLLM's path.
- `hf-gptq-w4`: the GPTQ-packed layout (qweight/qzeros/scales, `quant_method: gptq`), symmetric int4 in groups
  of 64, made by auto-round (llm-compressor's own dependency, in the same environment) with iters 0 and no
  optimized RTN: plain round-to-nearest, no calibration data. vLLM runs it through AutoGPTQLinearMethod, whose CPU
  kernel is the same CPUWNA16LinearKernel: two 4-bit layouts, one kernel, each read back in the artifact.

What each build holds is read back from its output (its quantization_config, the modules whose weights are packed,
the head among them or not) and a build whose head is not what its form says is refused.

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
W4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP_SIZE}
FORMS: dict[str, dict[str, Any]] = {
    "hf-w4a16": {"tool": "llmcompressor", "scheme": {"targets": ["Linear"], "weights": W4}, "ignore": ["lm_head"],
                 "what": "compressed-tensors W4A16, group 64, symmetric RTN, head unquantized"},
    # the head named as a target too: vLLM matches the class name "Linear" against its linear layers only, and
    # would load a packed head as a plain one (and fail) unless the config names it
    "hf-w4a16-head": {"tool": "llmcompressor", "scheme": {"targets": ["Linear", "lm_head"], "weights": W4}, "ignore": [],
                      "what": "compressed-tensors W4A16, group 64, symmetric RTN, the output head quantized too "
                              "(the planted head trap)"},
    "hf-gptq-w4": {"tool": "auto-round", "bits": 4, "group_size": GROUP_SIZE, "sym": True, "iters": 0,
                   "format": "auto_gptq",
                   "what": "GPTQ-packed int4 (auto_gptq layout), group 64, symmetric RTN by auto-round (iters 0), "
                           "head unquantized"},
}
SCRIPTS = {"llmcompressor": '''
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
''', "auto-round": '''
import json, sys
cfg = json.load(open(sys.argv[1]))
from transformers import AutoModelForCausalLM, AutoTokenizer
from auto_round import AutoRound
model = AutoModelForCausalLM.from_pretrained(cfg["hf_dir"], dtype="float32")
tok = AutoTokenizer.from_pretrained(cfg["hf_dir"])
# iters 0 and no optimized RTN: plain round-to-nearest from the weights' own range, no calibration data
ar = AutoRound(model, tokenizer=tok, bits=cfg["bits"], group_size=cfg["group_size"], sym=cfg["sym"],
               iters=cfg["iters"], disable_opt_rtn=True, device_map="cpu")
import pathlib, shutil
ar.quantize_and_save(cfg["out"] + ".ar", format=cfg["format"])
made = [p.parent for p in pathlib.Path(cfg["out"] + ".ar").rglob("config.json")]  # it saves into a subfolder
assert len(made) == 1, made
shutil.move(str(made[0]), cfg["out"])
'''}


def env_key() -> str:
    return envs.key(PINS)


def ensure_env() -> tuple[Path, str]:
    """The quantizer's python (its environment made once, under a lock) and the sha256 of its `pip freeze`."""
    return envs.ensure("llmcompressor", PINS, "the quantizer (llm-compressor)")


def recipe(form: str) -> dict[str, Any]:
    f = FORMS[form]
    opts = {k: v for k, v in f.items() if k not in ("tool", "what")}
    if f["tool"] == "auto-round":
        return {"quantizer": "auto_round.AutoRound (iters 0: RTN) + quantize_and_save", "pins": list(PINS), **opts,
                "environment": f"llmcompressor-{env_key()}"}
    return {"quantizer": "llmcompressor.oneshot + QuantizationModifier (data-free)", "pins": list(PINS),
            **opts, "environment": f"llmcompressor-{env_key()}"}


def tensor_names(folder: Path) -> list[str]:
    """The tensor names of every safetensors file in a folder, read from their headers."""
    names: list[str] = []
    for p in sorted(folder.glob("*.safetensors")):
        with open(p, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            names += [k for k in json.loads(fh.read(n)) if k != "__metadata__"]
    return sorted(names)


def quantized_modules(folder: Path) -> list[str]:
    """The modules whose weights the file holds packed (compressed-tensors `weight_packed`, GPTQ `qweight`)."""
    return sorted({n.rsplit(".", 1)[0] for n in tensor_names(folder)
                   if n.endswith((".weight_packed", ".qweight"))})


QUANT_METHOD = {"llmcompressor": "compressed-tensors", "auto-round": "gptq"}


def build(hf_dir: Path, out: Path, form: str) -> dict[str, Any]:
    """Make `form` from the float32 HF folder into `out` (a new folder); its manifest entry. What the quantizer made
    is read back from its output, not assumed: the config's quantization_config and the modules whose weights the
    files hold packed (the head among them only in the head trap)."""
    py, freeze_sha = ensure_env()
    f = FORMS[form]
    work = Path(tempfile.mkdtemp(prefix="quantize-"))
    try:
        cfg = {"hf_dir": str(hf_dir), "out": str(work / "out"), **{k: v for k, v in f.items() if k != "what"}}
        (work / "cfg.json").write_text(json.dumps(cfg))
        (work / "quantize.py").write_text(SCRIPTS[f["tool"]])
        env = {**os.environ, "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": ""}
        r = subprocess.run([str(py), str(work / "quantize.py"), str(work / "cfg.json")], capture_output=True,
                           text=True, env=env, cwd=work, timeout=3600)
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UserError(str(hf_dir), f"{f['tool']} failed making {form}: {tail[:300]}",
                            f"run {py} {work / 'quantize.py'} {work / 'cfg.json'} to see its whole output")
        config = json.loads((work / "out" / "config.json").read_text())
        qc = config.get("quantization_config") or {}
        if qc.get("quant_method") != QUANT_METHOD[f["tool"]]:
            raise UserError(str(work / "out" / "config.json"), f"{form}: quant_method {qc.get('quant_method')!r}, "
                            f"not {QUANT_METHOD[f['tool']]!r}", "check the quantizer's output")
        packed = quantized_modules(work / "out")
        head = "lm_head" in packed
        if head != (f.get("ignore") == []):
            raise UserError(str(work / "out"), f"{form}: the output head is {'' if head else 'not '}quantized",
                            "check the quantizer's ignore list")
        shutil.copytree(work / "out", out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    keep = ("quant_method", "format", "ignore", "config_groups", "bits", "group_size", "sym", "desc_act",
            "checkpoint_format", "packing_format", "lm_head", "provider", "autoround_version")
    return {"path": form, "format": "safetensors", "dtype": "gptq-w4" if f["tool"] == "auto-round" else "w4a16",
            "from": f"hf-fp32 ({f['what']})", "recipe": recipe(form), "quantizer_freeze_sha256": freeze_sha,
            "quantization_config": {k: qc.get(k) for k in keep if k in qc},
            "quantized_modules": {"count": len(packed), "head": head},
            "tie_word_embeddings": config.get("tie_word_embeddings")}
