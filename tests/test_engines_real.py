"""The engine adapters against the real engines, on tiny-llama (seconds, not minutes).

One grid (a module fixture) runs each engine setting the tests need once, and every test asserts on its
artifacts: a vLLM start costs tens of seconds on 2 cores, so no two vLLM runs do the same job. Plain vLLM runs
at batch 2 only (its read-back holds at any batch). vllm-decode runs at batch 1 with every patched setting the
tests read, each patch independent of the others: the decode candidates and step attribution, one thread bound
to CPU 0, an explicit KV budget beside the legacy VLLM_CPU_KVCACHE_SPACE (test_runtime starts stock vLLM with
the same settings, and shows stock losing the last two)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness import execute, models
from harness.engines.llamacpp import build as llamacpp_build
from harness.check import check_doc
from harness.store import Store

pytestmark = pytest.mark.engines

TINY_GRID = """
name: tiny
model: tiny-llama
arms:
  - {name: llama.cpp, engine: llama.cpp, form: gguf-f32}
  - {name: vllm, engine: vllm, form: hf-fp32}
  - {name: llama-bench, engine: llama-bench, form: gguf-f32}
  - {name: llama.cpp-cpu0, engine: llama.cpp, form: gguf-f32, threads: 1, cpus: [0]}
  - {name: llama.cpp-steps, engine: llama.cpp, form: gguf-f32, options: {attribution: true}}
  - {name: vllm-decode, engine: vllm, form: hf-fp32, patches: [all, decode-gemv, cpu-norm-kernels, step-attribution],
     threads: 1, cpus: [0], options: {kv_cache_memory_bytes: 2000000}, env: {VLLM_CPU_KVCACHE_SPACE: "1"}}
workload: {prompt_len: 32, context_len: 256, gen_len: 8}
axes: {batch: [1, 2]}
exclude:
  - {arm: vllm, batch: 1}
  - {arm: llama.cpp-steps, batch: 2}
  - {arm: vllm-decode, batch: 2}
  - {arm: llama-bench, batch: 2}
  - {arm: llama.cpp-cpu0, batch: 2}
threads: 2
passes: 1
repetitions: 2
warmups: 1
timeout_s: 300
"""
SHARED = ("ttft_s", "prefill_tok_s", "decode_tok_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s", "e2e_s",
          "output_tok_s")


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    g = d / "tiny.yaml"
    g.write_text(TINY_GRID)
    s = execute.run_grid(str(g), store_root=d / "store")
    return s, d / "store"


def _arts(store, batch=1):
    st = Store(store)
    docs = [json.loads(p.read_text()) for p in st.iter_paths("tiny")]
    return {a["grid"]["arm"]: a for a in docs if a["grid"]["cell_params"]["batch"] == batch}


def test_engines_ran_for_real_and_pass_check(tiny_store):
    s, store = tiny_store
    arts = _arts(store) | {f"{k}@2": v for k, v in _arts(store, 2).items()}
    assert s.failed == 0, [a.get("error") for a in arts.values()]
    assert sorted(arts) == ["llama-bench", "llama.cpp", "llama.cpp-cpu0", "llama.cpp-steps", "llama.cpp@2",
                            "vllm-decode", "vllm@2"]
    for arm, a in arts.items():
        assert a["status"] == "ok"
        # the wait policy the suite's engines ran with (tests/conftest.py) is in what they record
        assert a["execution"]["env"]["OMP_WAIT_POLICY"] == os.environ["OMP_WAIT_POLICY"], arm
        problems = [p for p in check_doc(a, f"{a['id']}.json") if ": harness.dirty:" not in p]
        assert problems == []
        # every enforced setting was read back from the engine and equals the request
        for name, row in a["execution"]["settings"].items():
            if row["rule"] == "enforced":
                assert row["effective"] == row["requested"], (arm, name, row)


def test_vllm_arms_keep_their_compile_caches_and_share_what_vllm_learned_of_the_model_class(tiny_store):
    """Each vLLM arm runs on a cache root of its own; its modelinfos/ is the one shared folder, where these runs
    left LlamaForCausalLM's entry (else every new arm's first start imported vLLM again in a subprocess to learn
    it)."""
    from harness.paths import cache_root
    arts = [*_arts(tiny_store[1]).values(), *_arts(tiny_store[1], 2).values()]
    roots = {Path(a["execution"]["env"]["VLLM_CACHE_ROOT"]) for a in arts if a["engine"]["name"] == "vllm"}
    assert len(roots) == 2  # vllm and vllm-decode
    shared = (cache_root() / "vllm-modelinfos").resolve()
    for root in roots:
        assert (root / "modelinfos").is_symlink() and (root / "modelinfos").resolve() == shared
    assert any("LlamaForCausalLM" in p.name for p in shared.iterdir()), sorted(shared.iterdir())


def test_same_metric_definitions_for_every_request_engine(tiny_store):
    """llama.cpp and vLLM: the same metric names with the same definition text, from the same prompt ids."""
    arts = _arts(tiny_store[1])
    cpp, vl = _arts(tiny_store[1], 2)["llama.cpp"], _arts(tiny_store[1], 2)["vllm"]  # the same prompts, batch 2
    for m in SHARED:
        assert cpp["metrics"][m]["definition"] == vl["metrics"][m]["definition"]
        assert all(x > 0 for x in cpp["metrics"][m]["samples"] + vl["metrics"][m]["samples"])
    # one per request per repetition: 1 x 2 at batch 1, 2 x 2 at batch 2
    assert len(arts["llama.cpp"]["metrics"]["decode_tok_s"]["samples"]) == 2
    assert len(cpp["metrics"]["decode_tok_s"]["samples"]) == len(vl["metrics"]["decode_tok_s"]["samples"]) == 4
    assert cpp["workload"]["prompt_token_hash"] == vl["workload"]["prompt_token_hash"]
    # llama-bench keeps its own names: never mistaken for the request metrics
    assert set(arts["llama-bench"]["metrics"]) == {"bench_pp_tok_s", "bench_tg_tok_s", "bench_pp_s"}
    assert isinstance(arts["llama-bench"]["execution"]["command"][0], list)  # two commands, each runnable


def test_batch_2_reads_back_2_concurrent_requests(tiny_store):
    arts = _arts(tiny_store[1], 2)
    assert set(arts) == {"llama.cpp", "vllm"}
    for arm, a in arts.items():
        row = a["execution"]["settings"]["batch"]
        assert row["requested"] == 2 and row["effective"] == 2, (arm, row)
        assert len(a["metrics"]["ttft_s"]["samples"]) == 4  # 2 requests x 2 repetitions
        assert len(a["metrics"]["output_tok_s"]["samples"]) == 2  # one aggregate per repetition


def test_cpus_read_back_from_the_engine_process(tiny_store):
    arts = _arts(tiny_store[1])
    for arm in ("llama.cpp-cpu0", "vllm-decode"):
        a = arts[arm]
        assert a["execution"]["settings"]["cpus"]["requested"] == [0]
        assert a["execution"]["settings"]["cpus"]["effective"] == [0]
        assert a["execution"]["settings"]["threads"]["effective"] == 1
        assert a["execution"]["command"][:3] == ["taskset", "-c", "0"]


def test_llamacpp_effective_config_read_back(tiny_store):
    arts = _arts(tiny_store[1])
    eff = arts["llama.cpp"]["execution"]["effective"]
    assert eff["n_threads"] == 2 and eff["n_ctx_per_seq"] == 256 and eff["n_seq_max"] == 1
    assert eff["cpu_affinity"] == [0, 1] and "CPU" in eff["system_info"]
    assert arts["llama.cpp"]["engine"]["build"]["binary"] == "edge-bench"
    bench = arts["llama-bench"]["execution"]["effective"]
    assert bench["n_threads"] == 2 and bench["build_commit"] == "0c1e570"
    assert bench["n_prompt"] == 32 and bench["decode_test"]["n_gen"] == 8 and bench["decode_test"]["n_depth"] == 32
    assert arts["llama-bench"]["engine"]["build"]["binary_sha256"] == \
        llamacpp_build.load_manifest()["binaries"]["llama-bench"]["sha256"]


def test_vllm_effective_config_read_back(tiny_store):
    a = _arts(tiny_store[1], 2)["vllm"]
    eff = a["execution"]["effective"]
    assert eff["dtype"] == "float32" and eff["torch_threads"] == 2 and eff["max_model_len"] == 256
    assert eff["enforce_eager"] is True and eff["runtime_plugin_loaded"] is True
    # the linear method of every layer, read from the loaded model: tiny-llama's fp32 weights are unquantized
    assert set(eff["linear_methods"]) == {"UnquantizedLinearMethod", "UnquantizedEmbeddingMethod"}
    assert eff["linear_methods"]["UnquantizedLinearMethod"] > 0
    # default settings: the runtime sized the KV cache from the geometry, and that is what was allocated
    assert a["execution"]["requested"]["kv_cache_memory_bytes"] is None
    assert eff["kv_cache_memory_bytes"] == a["engine"]["overrides"]["kv-budget-from-geometry"]["effective"]
    assert eff["kv_tokens"] >= 256
    assert {p["name"] for p in a["engine"]["patches"]} >= {"kv-budget-from-geometry", "explicit-kv-wins"}
    assert a["metrics"]["decode_tok_s"]["warmup_samples"]  # warm-ups flagged, not dropped
    assert a["residency"]["after_load"]["status"] == "ok"
    assert a["execution"]["compile_cache"]["key"]


def test_residency_recorded(tiny_store):
    for a in [*_arts(tiny_store[1]).values(), *_arts(tiny_store[1], 2).values()]:
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
    from harness.engines.llamacpp.engine import greedy_text
    a = greedy_text("tiny-llama", "gguf-f32", "The capital of France is", 8)
    b = greedy_text("tiny-llama", "gguf-f32", "The capital of France is", 8)
    # on a failure, what each run wrote: its stdout's size and the tail of its stderr (one empty continuation
    # was seen once under a loaded make test)
    why = [{k: r[k] for k in ("text", "stdout_bytes", "stderr_tail")} for r in (a, b)]
    assert a["text"] and a["text"] == b["text"] and not a["text"].startswith("The capital"), why


def test_quantize_and_perplexity_binaries_run():
    for name in ("llama-quantize", "llama-perplexity", "llama-bench"):
        r = subprocess.run([str(llamacpp_build.binary(name)), "--help"], capture_output=True, text=True, timeout=60)
        assert "usage" in (r.stdout + r.stderr).lower()


def test_check_fails_a_run_whose_engine_used_other_threads(tiny_store):
    """Only the read-back rule can catch it: the id is recomputed after the edit, every field stays valid."""
    a = _arts(tiny_store[1])["llama.cpp"]
    assert check_doc(a, f"{a['id']}.json", verify_models=False) == [] or all(
        ": harness.dirty:" in p for p in check_doc(a, f"{a['id']}.json", verify_models=False))
    edited = json.loads(json.dumps(a))
    edited["execution"]["settings"]["threads"]["effective"] = 1
    # the liar makes the raw read-back agree (a settings row alone that contradicts it is refused on its own)
    for key in ("threads", "n_threads", "torch_threads"):
        if key in edited["execution"]["effective"]:
            edited["execution"]["effective"][key] = 1
    edited.pop("id")
    from harness.artifact import compute_id
    edited["id"] = compute_id(edited)
    problems = [p for p in check_doc(edited, f"{edited['id']}.json", verify_models=False) if ": harness.dirty:" not in p]
    assert problems == [f"{edited['id']}.json: execution.settings.threads: requested 2, engine used 1"]
    # an arm that declared threads observe-only is not failed for it
    edited["execution"]["settings"]["threads"]["rule"] = "observe only (arm)"
    edited["id"] = compute_id({k: v for k, v in edited.items() if k != "id"})
    assert [p for p in check_doc(edited, f"{edited['id']}.json", verify_models=False) if "settings" in p] == []


def test_step_attribution_accounts_for_the_measured_latency(tiny_store):
    """Both engines time each decode step's parts; their sum accounts for the inter-token latency measured
    from the token timestamps within 10%, and an arm that did not ask for it carries no attribution."""
    arts = _arts(tiny_store[1])
    plain = _arts(tiny_store[1], 2)["vllm"]
    for arm, must in (("vllm-decode", {"schedule", "prepare", "forward", "sample", "update", "detokenize", "output"}),
                      ("llama.cpp-steps", {"prepare", "forward", "sample", "detokenize"})):
        at = arts[arm]["attribution"]
        assert at is not None, arm
        assert must <= set(at["parts"]), (arm, at["parts"])
        assert at["steps"] == 2 * 7  # 2 measured repetitions x (8 tokens - the first)
        assert 0.9 <= at["accounted"] <= 1.1, (arm, at["accounted"], at["parts"], at["itl_mean_ms"])
        assert 0 < at["model_share"] < 1
        assert all(v["mean_ms"] >= 0 for k, v in at["parts"].items() if k != "rest")
    assert arts["llama.cpp-steps"]["attribution"]["engine_forward_mean_ms"] > 0
    assert arts["llama.cpp-steps"]["execution"]["settings"]["options.attribution"]["effective"] is True
    man = {p["name"]: p for p in arts["vllm-decode"]["engine"]["patches"]}
    assert man["step-attribution"]["applied"] and man["step-attribution"]["instrument"]
    assert man["kv-budget-from-geometry"]["applied"]  # "all" still means every fix
    assert not {p["name"]: p for p in plain["engine"]["patches"]}["step-attribution"]["selected"]
    assert plain.get("attribution") is None and arts["llama.cpp"].get("attribution") is None


def test_decode_patches_applied_and_read_back(tiny_store):
    """The candidates named after `all` run for real: every linear layer, the embedding and the LM head routed to the
    decode kernel (none left to vLLM's dispatch), the norms' provider first in the CPU priority; the arm
    without them has neither applied."""
    arts = _arts(tiny_store[1])
    a = arts["vllm-decode"]
    assert a["status"] == "ok"
    man = {p["name"]: p for p in a["engine"]["patches"]}
    g, n = man["decode-gemv"], man["cpu-norm-kernels"]
    assert g["candidate"] and n["applied"], (g["effect"], n["effect"])
    from runtime.gemv import unavailable
    at = a["attribution"]
    if unavailable() is not None:  # a CPU without AVX2: the kernel declines, and says why
        assert not g["applied"] and g["effect"]["declined"] == unavailable()
        assert not at.get("inside_forward")
    else:
        # the kernel's own clock, read per step by the instrument: inside the forward, never more than it
        kern, fwd = at["inside_forward"]["linear_kernel"]["mean_ms"], at["parts"]["forward"]["mean_ms"]
        assert 0 < kern < fwd, (kern, fwd)
        assert 0.9 <= at["accounted"] <= 1.1  # the kernel is not added to the parts' sum
        assert g["applied"], g["effect"]
        cfg = json.loads((models.form_path("tiny-llama", "hf-fp32") / "config.json").read_text())
        # qkv, o, gate_up and down in every layer, and the token embedding and LM head (vLLM dispatches both, tied)
        assert g["effect"]["layers"] == 4 * cfg["num_hidden_layers"] + 2 and g["effect"]["passed_to_vllm"] == 0
        assert g["effect"]["shapes"][f"{cfg['vocab_size']}x{cfg['hidden_size']} float32"] == 2
    assert n["effect"]["priority"]["rms_norm"][0] == "edge_cpu_c"
    assert n["effect"]["max_abs_diff_vs_native"]["float32"] < 1e-4
    assert man["kv-budget-from-geometry"]["applied"]
    plain = {p["name"]: p for p in _arts(tiny_store[1], 2)["vllm"]["engine"]["patches"]}
    assert not plain["decode-gemv"]["applied"] and not plain["cpu-norm-kernels"]["applied"]
    assert a["metrics"]["decode_tok_s"]["samples"] and min(a["metrics"]["decode_tok_s"]["samples"]) > 0


def test_explicit_kv_kept_beside_the_legacy_env(tiny_store):
    """The patched half of test_runtime's legacy_env_one_cpu: an explicit kv_cache_memory_bytes survives
    VLLM_CPU_KVCACHE_SPACE (stock lets the env overwrite it with 1 GiB, which the override records)."""
    a = _arts(tiny_store[1])["vllm-decode"]
    assert a["execution"]["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert a["execution"]["effective"]["kv_cache_memory_bytes"] == 2000000
    assert a["engine"]["overrides"]["explicit-kv-wins"]["overwritten_by_stock"] == 1 << 30
