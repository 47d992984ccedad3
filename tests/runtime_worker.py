"""One run of the runtime's worker (runtime.worker) on tiny-llama, outside the harness: the runtime tests' way to
start stock or patched vLLM with settings of their own (test_runtime, test_runtime_memory). As under the harness, the
worker's vLLM root is a folder of the test's own (or the one a test gives) whose modelinfos/ is the harness's shared
one: what vLLM learned of the model class is not learned again, each time in a process that imports vLLM."""

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import models
from harness.engines.vllm import shared_model_infos


def worker(tmp_path, mode, extra_env=None, **cfg):
    model_dir = models.form_path("tiny-llama", "hf-fp32")
    c = {"model_dir": str(model_dir), "threads": 2, "prompt_len": 16, "gen_len": 4, "context_len": 64,
         "repetitions": 1, "warmups": 0, **cfg}
    from harness.metrics import request_prompts
    c["prompts"] = request_prompts("tiny-llama", c["prompt_len"], 1, c["warmups"] + c["repetitions"])
    (tmp_path / f"{mode}.json").write_text(json.dumps(c))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update({"EDGE_HARNESS_PATCHES": mode, "VLLM_CACHE_ROOT": str(tmp_path / "vllm"), **(extra_env or {})})
    shared_model_infos(Path(env["VLLM_CACHE_ROOT"]))
    r = subprocess.run([sys.executable, "-m", "runtime.worker", str(tmp_path / f"{mode}.json"),
                        str(tmp_path / f"{mode}-out.json")], env=env, capture_output=True, timeout=600)
    out = tmp_path / f"{mode}-out.json"
    if not out.exists():  # stock at default settings can be killed for memory before it reports
        return {"status": "failed", "error": f"worker exited {r.returncode} without a result "
                f"({'killed: out of memory?' if r.returncode in (-9, 137) else r.stderr[-300:]!r})"}
    res = json.loads(out.read_text())
    out.unlink()
    return res
