"""The engine adapters against the real engines, on tiny-llama (seconds, not minutes)."""

import json
import subprocess

import pytest

from harness import llamacpp_build, models, runner
from harness.check import check_doc
from harness.store import Store

pytestmark = pytest.mark.engines

TINY_GRID = """
name: tiny
model: tiny-llama
arms:
  - {name: llama.cpp, engine: llama.cpp, form: gguf-f32}
  - {name: vllm, engine: vllm, form: hf-fp32}
workload: {prompt_len: 32, context_len: 256, gen_len: 8}
threads: 2
passes: 1
repetitions: 2
warmups: 1
timeout_s: 300
"""


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    g = d / "tiny.yaml"
    g.write_text(TINY_GRID)
    s = runner.run(str(g), store_root=d / "store")
    return s, d / "store"


def _arts(store):
    st = Store(store)
    return {json.loads(p.read_text())["grid"]["arm"]: json.loads(p.read_text()) for p in st.iter_paths("tiny")}


def test_both_engines_ran_for_real(tiny_store):
    s, store = tiny_store
    arts = _arts(store)
    assert s.failed == 0, [a.get("error") for a in arts.values()]
    for arm, a in arts.items():
        assert a["status"] == "ok"
        for m in ("prefill_tok_s", "decode_tok_s"):
            assert len(a["metrics"][m]["samples"]) == 2 and all(x > 0 for x in a["metrics"][m]["samples"])
        problems = [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p]
        assert problems == []


def test_llamacpp_effective_config_read_back(tiny_store):
    a = _arts(tiny_store[1])["llama.cpp"]
    eff = a["execution"]["effective"]
    assert eff["n_threads"] == 2 and eff["build_commit"] == "0c1e570"
    assert eff["n_prompt"] == 32 and eff["decode_test"]["n_gen"] == 8 and eff["decode_test"]["n_depth"] == 32
    assert a["engine"]["build"]["binary_sha256"] == llamacpp_build.load_manifest()["binaries"]["llama-bench"]["sha256"]


def test_vllm_effective_config_read_back(tiny_store):
    a = _arts(tiny_store[1])["vllm"]
    eff = a["execution"]["effective"]
    assert eff["dtype"] == "float32" and eff["torch_threads"] == 2 and eff["max_model_len"] == 64
    assert eff["enforce_eager"] is True and eff["runtime_plugin_loaded"] is True
    # default settings: the runtime sized the KV cache from the geometry, and that is what was allocated
    assert a["execution"]["requested"]["kv_cache_memory_bytes"] is None
    assert eff["kv_cache_memory_bytes"] == a["engine"]["overrides"]["kv-budget-from-geometry"]["effective"]
    assert eff["kv_tokens"] >= 64
    assert {p["name"] for p in a["engine"]["patches"]} >= {"kv-budget-from-geometry", "explicit-kv-wins"}
    assert a["metrics"]["decode_tok_s"]["warmup_samples"]  # warm-ups flagged, not dropped
    assert a["residency"]["after_load"]["status"] == "ok"
    assert a["execution"]["compile_cache"]["key"]


def test_residency_recorded(tiny_store):
    for a in _arts(tiny_store[1]).values():
        r = a["residency"]
        assert r["before"] and r["after_run"] and r["peak_memory"]["rss_bytes"] > 0
        for v in r["after_run"].values():
            assert 0 <= v["resident_bytes"] <= v["total_bytes"]


def test_llama_completion_greedy_text():
    gguf = models.form_path("tiny-llama", "gguf-f32")
    exe = llamacpp_build.binary("llama-completion")
    r = subprocess.run([str(exe), "-m", str(gguf), "-p", "Hello", "-n", "8", "--temp", "0", "-t", "2", "-no-cnv",
                        "--no-warmup"], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-1000:]
    assert r.stdout.startswith("Hello") and len(r.stdout) > len("Hello")


def test_greedy_text_is_deterministic():
    from harness.engines.llamacpp import greedy_text
    a = greedy_text("tiny-llama", "gguf-f32", "The capital of France is", 8)
    b = greedy_text("tiny-llama", "gguf-f32", "The capital of France is", 8)
    assert a["text"] and a["text"] == b["text"] and not a["text"].startswith("The capital")


def test_quantize_and_perplexity_binaries_run():
    for name in ("llama-quantize", "llama-perplexity", "llama-bench"):
        r = subprocess.run([str(llamacpp_build.binary(name)), "--help"], capture_output=True, text=True, timeout=60)
        assert "usage" in (r.stdout + r.stderr).lower()
