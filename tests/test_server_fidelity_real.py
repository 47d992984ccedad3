"""The server engines' fidelity mode against the real servers on tiny-llama: llama-server through `harness
fidelity` (its reference, its build, the served build against the in-process llama.cpp engine's reference), and
vLLM's server answering a fidelity request through its API in one start (harness/engines/server/fidelity.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines
ROOT = Path(__file__).resolve().parents[1]


FIDELITY = """
kind: fidelity
name: sfid
model: tiny-llama
prompts: {prompts}
gen_len: 8
top_k: 5
threads: 2
references: {{llama-server: gguf-f32, llama.cpp: gguf-f32}}
thresholds: {{min_top1_agreement: 0.9, max_mean_kl: 0.05}}
builds:
  - {{name: served-f32, engine: llama-server, form: gguf-f32}}
cross_engine:
  - {{build: served-f32, against: llama.cpp}}
"""


def test_a_llama_server_build_scores_against_its_own_reference_through_its_api(tmp_path, cli):
    """harness fidelity on llama-server: its reference and its build each a fresh server, greedy with n_probs and
    teacher-forced one position a request; the same build scores top-1 1 and KL 0 against itself, and the served
    build is scored against the in-process llama.cpp engine's reference (cross-engine, not gated)."""
    g = tmp_path / "sfid.yaml"
    g.write_text(FIDELITY.format(prompts=ROOT / "grids" / "prompts" / "fidelity-v1.json"))
    store, refs = tmp_path / "store", tmp_path / "refs"
    rc, out, err = cli("fidelity", g, "--store", store, "--references", refs)
    assert rc == 0, err
    arts = {(d["grid"]["build"], d["cross_engine"]): d
            for d in (json.loads(p.read_text()) for p in (store / "sfid").glob("*.json"))}
    own = arts[("served-f32", False)]
    assert own["verdict"] == "pass" and own["engine"]["name"] == "llama-server", own.get("error")
    s = own["summary"]
    assert s["exact_match_rate"] == 1.0 and s["top1_agreement"] == 1.0 and s["mean_kl"] < 1e-4, s
    assert own["engine"]["build"]["fidelity_api"].startswith("v2: POST /completion")
    assert own["execution"]["effective"]["threads"] == 2
    cross = arts[("served-f32", True)]
    assert cross["verdict"] == "not gated" and cross["reference"]["engine"] == "llama.cpp" and cross["summary"]
    _, out, _ = cli("check", store, refs)
    assert [x for x in out.splitlines() if ": harness.dirty:" not in x and "artifact(s) OK" not in x] == [], out


def test_vllm_servers_fidelity_answers_greedy_and_forced_through_its_api(tmp_path):
    """One vLLM server start: a self-forced prompt (the reference's request) and a forced one (a build's), through
    /v1/completions with logprobs and prompt_logprobs, in the fidelity result format."""
    from harness.engines.base import run_worker
    from harness.engines.server import VllmServer
    from harness import models
    ids = [1, 450, 4996, 17354, 1701, 29916]
    req = {"n_predict": 6, "top_k": 4, "n_ctx": 64,
           "prompts": [{"ids": ids, "self_forced": True},
                       {"ids": ids[:4], "forced": [29871, 13, 13], "candidates": [[13, 29871], [13], [13, 5]]}]}
    rp, out = tmp_path / "req.json", tmp_path / "out.json"
    rp.write_text(json.dumps(req))
    eng = VllmServer()
    cmd, env = eng.fidelity_command(models.form_path("tiny-llama", "hf-fp32"), 2, [0, 1], "float32", rp, out, tmp_path)
    w = run_worker(cmd, {**os.environ, **env}, 300, out, "vllm-server fidelity")
    assert w.result is not None, w.error
    first, second = w.result["prompts"]
    g, f = first["greedy"], first["forced"]
    assert len(g["ids"]) == 6 == len(g["logprobs"]) == len(f["argmax"]) == len(f["top"])
    assert sum(a == t for a, t in zip(f["argmax"], g["ids"])) >= 5  # its own tokens, teacher-forced
    assert all(len(pos) == 4 and pos[0][1] >= pos[-1][1] >= fl for pos, fl in zip(f["top"], f["floor"]))
    sf = second["forced"]
    assert len(sf["argmax"]) == 3 and [len(c) for c in sf["candidates"]] == [2, 1, 2]
    assert all(c is None or c >= fl for cs, fl in zip(sf["candidates"], sf["floor"]) for c in cs)
    assert w.result["effective"]["threads"] == 2 and w.result["effective"]["dtype"] == "float32"
    applied = eng.fidelity_result_block({"build": {}}, w.result)["patches"]
    assert applied and all(p["pids"] for p in applied)  # the runtime's own record of each process
