"""ExecuTorch's model forms: a prepared model's hf-fp32 exported offline to an XNNPACK `.pte` program by the pinned
ExecuTorch's own LLM exporter (export_llama with an LlmConfig: what `python -m
executorch.extension.llm.export.export_llm` runs), on demand: when a grid or fidelity build loads one, the model zoo
(harness/models.py) adds it to the prepared copy, hashed into its manifest like every other file.

- `pte-fp32`: the decoder in float32, every op XNNPACK can take delegated to it; the reference of this engine.
- `pte-8da4w`: torchao's Int8DynamicActivationIntxWeight: int4 weights in groups of 32 (affine, from the weights'
  own min/max: data-free), int8 activations quantized per token at run time, every Linear layer but the output head
  (left float32 by a filter on its name, `output`), the embedding float32 (no embedding_quantize).
- `pte-8da4w-head`: ExecuTorch's own 8da4w default: the output head quantized as well (the exporter's filter takes
  every Linear whose input width the group divides). The planted head trap (docs/quantization.md).

The checkpoint: the HF weights renamed to the Meta layout ExecuTorch's Llama takes (q/k left as they are: the
params say `use_hf_rope`, rotate-half RoPE as transformers computes it), the tied head a copy of the embedding.
The exporter runs in an environment of its own (ExecuTorch 1.5.1 wants torchao 0.18, which the project's vLLM
does not), made on demand under the cache (keyed by its pins), its `pip freeze` hashed into the form's entry.
Which Linear layers the quantizer took is read back from the quantizer's own filter calls and recorded (not
assumed from the options), with the program's metadata (its context length) and method names.
Imports nothing of the harness but errors and envs (harness/models.py imports this module).
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

PIN = "1.5.1"
PINS = (f"executorch=={PIN}", "torch==2.13.0", "torchao==0.18.0", "pytorch-tokenizers==1.5.0", "safetensors==0.8.0",
        "numpy==2.4.6")
ENV = "executorch"
GROUP_SIZE = 32
# the program's bounds, fixed at export: the KV cache holds MAX_CONTEXT tokens, one forward call takes MAX_SEQ
MAX_CONTEXT, MAX_SEQ = 1024, 512
COMMON = {"base.model_class": "smollm2", "model.use_kv_cache": True, "model.use_sdpa_with_kv_cache": True,
          "model.enable_dynamic_shape": True, "model.dtype_override": "fp32", "backend.xnnpack.enabled": True,
          "export.max_seq_length": MAX_SEQ, "export.max_context_length": MAX_CONTEXT}
Q4 = {"quantization.qmode": "8da4w", "quantization.group_size": GROUP_SIZE}
# form -> (exporter options, Linear layers kept float by name, dtype recorded in the manifest, what the form is)
FORMS: dict[str, tuple[dict[str, Any], list[str], str, str]] = {
    "pte-fp32": ({}, [], "float32", "float32 decoder, XNNPACK"),
    "pte-8da4w": (Q4, ["output"], "8da4w",
                  "int4 weights (group 32, affine RTN) with int8 dynamic activations, output head and embedding float32"),
    "pte-8da4w-head": (Q4, [], "8da4w", "ExecuTorch's 8da4w default: the output head quantized too (the head trap)"),
}
OUTPUTS = ("model.pte", "params.json", "export.json")
SCRIPT = r'''
import json, sys
cfg = json.load(open(sys.argv[1]))
import torch
from safetensors.torch import load_file

hf = json.load(open(cfg["hf_dir"] + "/config.json"))
sd = load_file(cfg["hf_dir"] + "/model.safetensors")
names = {"self_attn.q_proj": "attention.wq", "self_attn.k_proj": "attention.wk", "self_attn.v_proj": "attention.wv",
         "self_attn.o_proj": "attention.wo", "mlp.gate_proj": "feed_forward.w1", "mlp.down_proj": "feed_forward.w2",
         "mlp.up_proj": "feed_forward.w3", "input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm"}
meta = {}
for k, v in sd.items():
    if k == "model.embed_tokens.weight":
        meta["tok_embeddings.weight"] = v
    elif k == "model.norm.weight":
        meta["norm.weight"] = v
    elif k == "lm_head.weight":
        meta["output.weight"] = v
    elif k.startswith("model.layers."):
        _, _, i, rest = k.split(".", 3)
        part, leaf = rest.rsplit(".", 1)
        if part not in names:
            raise SystemExit(f"unknown weight {k}")
        meta[f"layers.{i}.{names[part]}.{leaf}"] = v
    else:
        raise SystemExit(f"unknown weight {k}")
meta.setdefault("output.weight", meta["tok_embeddings.weight"])  # tied: the head is the embedding
torch.save(meta, "ckpt.pth")
del sd, meta  # the exporter loads the checkpoint again: at the 1.7B shape a second float32 copy is 6.8 GB
heads = hf["num_attention_heads"]
rope = hf.get("rope_parameters") or {"rope_theta": hf.get("rope_theta"), "rope_type": "default"}
if rope.get("rope_type", "default") != "default" or hf.get("attention_bias") or hf.get("mlp_bias"):
    raise SystemExit(f"not a plain Llama: rope {rope}, biases {hf.get('attention_bias')}/{hf.get('mlp_bias')}")
params = {"dim": hf["hidden_size"], "hidden_dim": hf["intermediate_size"], "n_heads": heads,
          "n_kv_heads": hf.get("num_key_value_heads", heads), "n_layers": hf["num_hidden_layers"],
          "norm_eps": hf["rms_norm_eps"], "rope_theta": rope["rope_theta"], "vocab_size": hf["vocab_size"],
          "head_dim": hf.get("head_dim") or hf["hidden_size"] // heads, "use_hf_rope": True,
          "use_scaled_rope": False, "ffn_dim_multiplier": 1, "multiple_of": 1}
json.dump(params, open(cfg["out"] + "/params.json", "w"), indent=1)

import torchao.quantization as tq
quantize_, taken = tq.quantize_, []
def recorded(model, config, filter_fn=None, **kw):
    def f(m, fqn):
        ok = bool(filter_fn(m, fqn)) if filter_fn else isinstance(m, torch.nn.Linear)
        ok = ok and fqn not in cfg["keep_float"]
        if isinstance(m, torch.nn.Linear):
            taken.append([fqn, ok])
        return ok
    return quantize_(model, config, filter_fn=f, **kw)
tq.quantize_ = recorded

from executorch.examples.models.llama.export_llama_lib import export_llama
from executorch.extension.llm.export.config.llm_config import LlmConfig
from omegaconf import OmegaConf
overrides = {**cfg["options"], "base.checkpoint": "ckpt.pth", "base.params": cfg["out"] + "/params.json",
             "export.output_dir": cfg["out"], "export.output_name": cfg["out"] + "/model.pte"}
conf = OmegaConf.structured(LlmConfig)
for k, v in overrides.items():
    OmegaConf.update(conf, k, v, merge=False)
export_llama(OmegaConf.to_object(conf))

from executorch.runtime import Runtime
prog = Runtime.get().load_program(cfg["out"] + "/model.pte")
methods = sorted(prog.method_names)
metadata = {m: prog.load_method(m).execute([])[0] for m in methods if m.startswith(("get_", "use_", "enable_"))}
json.dump({"linears": taken, "methods": methods, "metadata": metadata}, open(cfg["out"] + "/export.json", "w"),
          indent=1, default=str)
'''


def require() -> str:
    """The pinned version (the engine runs in its own environment, made when a form is first exported)."""
    return PIN


def env_python() -> tuple[Path, str]:
    """The environment's python (made once) and the sha256 of its `pip freeze`."""
    return envs.ensure(ENV, PINS, f"ExecuTorch {PIN}")


def recipe(form: str) -> dict[str, Any]:
    """What makes a form: the exporter, its pins and every option passed."""
    options, keep, _, _ = FORMS[form]
    return {"exporter": "executorch.examples.models.llama.export_llama_lib.export_llama (LlmConfig)",
            "pins": list(PINS), "options": {**COMMON, **options}, "keep_float": list(keep),
            "checkpoint": "HF names -> Meta names, q/k unpermuted (use_hf_rope), head = embedding when tied",
            "environment": f"{ENV}-{envs.key(PINS)}"}


def build(hf_dir: Path, out: Path, form: str) -> dict[str, Any]:
    """Export `form` from the float32 HF folder into `out` (a new folder); its manifest entry."""
    py, freeze_sha = env_python()
    options, keep, dtype, what = FORMS[form]
    work = Path(tempfile.mkdtemp(prefix="executorch-export-"))
    try:
        (work / "out").mkdir()
        cfg = {"hf_dir": str(hf_dir), "out": str(work / "out"), "options": {**COMMON, **options}, "keep_float": keep}
        (work / "cfg.json").write_text(json.dumps(cfg))
        (work / "export.py").write_text(SCRIPT)
        env = {**os.environ, "PYTHONNOUSERSITE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "PYTHONPATH": ""}
        r = subprocess.run([str(py), str(work / "export.py"), str(work / "cfg.json")], capture_output=True, text=True,
                           env=env, cwd=work, timeout=3600)
        if r.returncode != 0 or not (work / "out" / "model.pte").is_file():
            tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise UserError(str(hf_dir), f"ExecuTorch's exporter failed making {form}: {tail[:300]}",
                            f"run {py} {work / 'export.py'} {work / 'cfg.json'} to see its whole output")
        info = json.loads((work / "out" / "export.json").read_text())
        out.mkdir(parents=True)
        for f in OUTPUTS:
            shutil.copy2(work / "out" / f, out / f)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    linears = info["linears"]
    return {"path": form, "format": "pte", "dtype": dtype, "from": f"hf-fp32 ({what})", "recipe": recipe(form),
            "exporter_freeze_sha256": freeze_sha,
            "program": {"methods": info["methods"], "metadata": info["metadata"],
                        "linears_quantized": sum(1 for _, ok in linears if ok),
                        "linears_float": sorted(n for n, ok in linears if not ok) if options else "all (no quantizer)"}}
