"""Shared fixtures: grid files written to tmp, and the CLI called in-process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.cli import main


@pytest.fixture
def write_grid(tmp_path: Path):
    def _write(text: str, name: str = "grid.yaml") -> Path:
        p = tmp_path / name
        p.write_text(textwrap.dedent(text))
        return p
    return _write


@pytest.fixture
def cli(capsys):
    def _run(*argv: str) -> tuple[int, str, str]:
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err
    return _run


COMMAND_GRID = """
name: cmd
arms:
  - {name: a, engine: command, options: {cmd: "true"}}
  - {name: b, engine: command, options: {cmd: "true"}}
workload: {prompt_len: 1, context_len: 1, gen_len: 1}
threads: 1
passes: 4
repetitions: 2
warmups: 1
"""


# One fresh process that imports vLLM (seconds on 2 cores) and reports what several tests ask of it: the pinned
# environment (vLLM and a transformers model beside the CPU torch), the runtime's patch manifest (every detector's
# verdict on the installed vLLM, computed before anything is installed) and what step attribution wraps in it.
VLLM_PROCESS = """
import json, torch, vllm
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaForCausalLM
LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=1,
                             vocab_size=32))
from runtime import attribution, patches
manifest = patches.manifest()
print(json.dumps({"vllm": vllm.__version__, "torch": torch.__version__, "manifest": manifest,
                  "attribution": attribution.install()}))
"""


@pytest.fixture(scope="session")
def vllm_process():
    import json
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-c", VLLM_PROCESS], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


CACHED_SOURCES = ("artifacts/fidelity", "artifacts/quickstart", "artifacts/decode-compiled", "baselines/quality",
                  "baselines/calibration")


@pytest.fixture
def cached_store(tmp_path, monkeypatch):
    """A store of published artifacts of every kind (fidelity with their references), a cache folder of its own,
    and caching from the first artifact. Files are cached at once (RACY_NS 0) unless a test says otherwise."""
    import shutil

    from harness import check, hashcache
    from harness.paths import PROJECT_ROOT
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(check, "CACHE_FROM", 0)
    monkeypatch.setattr(hashcache, "RACY_NS", 0)
    root = tmp_path / "store"
    for src in CACHED_SOURCES:
        shutil.copytree(PROJECT_ROOT / src, root / Path(src).name)
    return root
