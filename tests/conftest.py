"""Shared fixtures: grid files written to tmp, and the CLI called in-process."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

# The engines the suite starts (llama.cpp, torch under vLLM and ExecuTorch: OpenMP) wait at a barrier by sleeping,
# not spinning: `make test` runs a worker more than the CPUs, and a thread spinning for a partner the scheduler has
# put off the CPU burned whole time slices (a llama.cpp fidelity run of tiny-llama took many times the CPU time it
# takes alone). Set before any engine library loads; the suite's artifacts record it (OMP_* is in every artifact's
# environment). The harness itself never sets it: a measurement runs with the engine's own default or with what its
# user set.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from harness.cli import main  # noqa: E402


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
def vllm_process(tmp_path_factory):
    """Once per test run, not once per worker: `make test`'s workers share the folder above their own temp roots,
    and the first to ask computes it under a lock while the other waits for its answer."""
    import fcntl
    import json
    import subprocess
    import sys
    shared = tmp_path_factory.getbasetemp().parent if os.environ.get("PYTEST_XDIST_WORKER") else \
        tmp_path_factory.getbasetemp()
    answer = shared / "vllm-process.json"
    with open(shared / "vllm-process.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not answer.exists():
            r = subprocess.run([sys.executable, "-c", VLLM_PROCESS], capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stderr[-2000:]
            answer.write_text(r.stdout.strip().splitlines()[-1])
    return json.loads(answer.read_text())


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


@pytest.fixture(autouse=True)
def _models_of_this_test_only(tmp_path_factory, monkeypatch):
    """Every test starts with the zoo alone: a model a grid's `model:` mapping registered in this process
    (models.MODELS, models.USER) is forgotten after the test that registered it, and `harness models add` writes
    to a registry of the test's own, never to this machine's (a user's registered models are not the suite's).
    Without it, which models `harness models list` shows depended on which tests ran before, in this process."""
    from harness import models, usermodels
    registry = tmp_path_factory.mktemp("registry") / "user-models.json"
    monkeypatch.setattr(usermodels, "registry_path", lambda: registry)
    saved, user = dict(models.MODELS), dict(models.USER)
    yield
    models.MODELS.clear()
    models.MODELS.update(saved)
    models.USER.clear()
    models.USER.update(user)


# Modules whose tests set the memory this machine has available (a held block, an emulated class's balloon): one
# at a time, so that neither sees the other's (`make test` runs them in one group of its workers).
MEMORY_GROUP = ("test_emulation_real", "test_runtime_memory")


def pytest_xdist_make_scheduler(config, log):
    """`make test` runs the suite on pytest-xdist workers, a group of tests on one worker: a module is a group (its
    module fixtures, such as one engine run shared by its tests, run once), the MEMORY_GROUP modules one. (A
    scheduler of its own: xdist's loadgroup renames tests to group them, which pytest 9's node ids ignore.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "memory" if Path(path).stem in MEMORY_GROUP else path
    return ModuleGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """The modules that run real engines come first (the suite's long runs: the short tests fill in at the end
    instead of waiting behind them)."""
    engines = {it.module.__name__ for it in items if it.get_closest_marker("engines") and hasattr(it, "module")}
    items.sort(key=lambda it: getattr(it, "module", None) is None or it.module.__name__ not in engines)
