"""The patched runtime: each patch has a detector, a manifest entry, and stock-vs-patched evidence."""

import json
import subprocess
import sys

import pytest

from harness import models
from runtime import patches

SMOL = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}


def test_kv_geometry_hand_computed():
    # 2 x 30 layers x 3 kv heads x 64 head_dim x 4 bytes
    assert patches.kv_bytes_per_token(SMOL, 4) == 46080
    # context 256 -> 2 blocks of 128, plus vLLM's null block: 384 tokens
    assert patches.kv_budget(SMOL, 4, 256, 1) == 46080 * 384
    assert patches.kv_budget(SMOL, 2, 300, 2) == 23040 * (3 * 2 + 1) * 128


def test_compile_cache_key_follows_the_runtime_source(tmp_path):
    # a graph compiled with one version of a patch's operators is never loaded by another version
    import shutil
    from harness.engines.vllm import runtime_sources_sha256
    from harness.paths import PROJECT_ROOT
    shutil.copytree(PROJECT_ROOT / "runtime", tmp_path / "runtime", ignore=shutil.ignore_patterns("__pycache__"))
    before = runtime_sources_sha256(tmp_path / "runtime")
    assert before == runtime_sources_sha256()
    gemv = tmp_path / "runtime" / "gemv.py"
    gemv.write_text(gemv.read_text().replace("MAX_M = 4", "MAX_M = 8"))
    assert runtime_sources_sha256(tmp_path / "runtime") != before


def test_selection():
    assert patches.selected({}) == patches.FIXES  # "all": every fix, never an instrument
    assert "step-attribution" in patches.NAMES and "step-attribution" not in patches.FIXES
    assert patches.selected({"EDGE_HARNESS_PATCHES": "all,step-attribution"}) == patches.FIXES + ("step-attribution",)
    assert patches.selected({"EDGE_HARNESS_PATCHES": "step-attribution"}) == ("step-attribution",)
    assert patches.selected({"EDGE_HARNESS_PATCHES": "none"}) == ()
    assert patches.selected({"EDGE_HARNESS_PATCHES": "threads-follow-bind"}) == ("threads-follow-bind",)
    with pytest.raises(ValueError, match="known"):
        patches.selected({"EDGE_HARNESS_PATCHES": "turbo"})


def test_every_patch_has_detector_and_manifest_entry():
    code = "import json; from runtime import patches; print(json.dumps(patches.manifest()))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    man = json.loads(r.stdout.strip().splitlines()[-1])
    assert [m["name"] for m in man] == list(patches.NAMES)
    for m in man:
        assert m["detector"]["defective"] in (True, False) and m["detector"]["evidence"]
        assert len(m["source_sha256"]) == 64 and m["extension_point"].startswith("vllm.")


def _worker(tmp_path, mode, extra_env=None, **cfg):
    model_dir = models.form_path("tiny-llama", "hf-fp32")
    c = {"model_dir": str(model_dir), "threads": 2, "prompt_len": 16, "gen_len": 4, "context_len": 64,
         "repetitions": 1, "warmups": 0, **cfg}
    from harness.metrics import request_prompts
    c["prompts"] = request_prompts("tiny-llama", c["prompt_len"], 1, c["warmups"] + c["repetitions"])
    (tmp_path / f"{mode}.json").write_text(json.dumps(c))
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_NUM_THREADS"}
    env.update({"EDGE_HARNESS_PATCHES": mode, **(extra_env or {})})
    r = subprocess.run([sys.executable, "-m", "runtime.worker", str(tmp_path / f"{mode}.json"),
                        str(tmp_path / f"{mode}-out.json")], env=env, capture_output=True, timeout=600)
    out = tmp_path / f"{mode}-out.json"
    if not out.exists():  # stock at default settings can be killed for memory before it reports
        return {"status": "failed", "error": f"worker exited {r.returncode} without a result "
                f"({'killed: out of memory?' if r.returncode in (-9, 137) else r.stderr[-300:]!r})"}
    res = json.loads(out.read_text())
    out.unlink()
    return res


@pytest.mark.engines
def test_default_settings_stock_vs_patched(tmp_path):
    """Stock sizes KV as a fraction of a NUMA node (or refuses to start); patched sizes it exactly."""
    stock = _worker(tmp_path, "none")
    patched = _worker(tmp_path, "all")
    assert patched["status"] == "ok"
    assert patched["effective"]["platform"] == "EdgeCpuPlatform"
    assert patched["effective"]["kv_tokens"] == 256  # ceil(64/128)=1 block + the null block, 128 tokens each
    assert patched["overrides"]["kv-budget-from-geometry"]["effective"] == 1024 * 256
    if stock["status"] == "ok":
        assert stock["effective"]["platform"] == "CpuPlatform"
        assert stock["effective"]["kv_tokens"] > 100 * patched["effective"]["kv_tokens"]
    else:
        assert "memory" in stock["error"].lower()


@pytest.mark.engines
def test_explicit_kv_survives_legacy_env(tmp_path):
    """Stock lets VLLM_CPU_KVCACHE_SPACE overwrite an explicit kv_cache_memory_bytes; patched keeps it."""
    explicit = 1024 * 384
    legacy = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    stock = _worker(tmp_path, "none", legacy, kv_cache_memory_bytes=explicit)
    patched = _worker(tmp_path, "all", legacy, kv_cache_memory_bytes=explicit)
    assert stock["status"] == patched["status"] == "ok"
    assert stock["effective"]["kv_cache_memory_bytes"] == 1 << 30  # the setting silently lost
    assert patched["effective"]["kv_cache_memory_bytes"] == explicit
    assert patched["overrides"]["explicit-kv-wins"]["overwritten_by_stock"] == 1 << 30


def test_dtype_auto_follows_isa():
    """One bf16 rule for the run (`dtype: auto`), plan-time admission and `harness adapt`: on an arm64 class with
    bf16 the two used to disagree (the run picked float32, admission bfloat16)."""
    from harness import hardware
    from harness.engines.vllm import Vllm, derive_dtype
    avx2 = {"arch": "x86_64", "isa": {"avx2": True, "avx512_bf16": False, "amx_bf16": False}}
    assert derive_dtype(avx2)[0] == "float32"
    assert derive_dtype({"arch": "x86_64", "isa": {"avx512_bf16": True}})[0] == "bfloat16"
    assert derive_dtype({"arch": "x86_64", "isa": {"amx_bf16": True}})[0] == "bfloat16"
    arm = hardware.current_profile("arm64-i8mm-4p4e-8g")
    assert Vllm().run_dtype("hf-fp32", {"dtype": "auto"}, arm) == Vllm().derive_dtype(arm)[0] == "bfloat16"
    assert Vllm().run_dtype("hf-bf16", {}, arm) == "bfloat16" and Vllm().run_dtype(None, {}, arm) == "float32"


@pytest.mark.engines
def test_one_thread_requested_one_thread_used(tmp_path):
    """In-process, stock vLLM ignores the bind list (2 torch threads for a 1-CPU list); patched follows it.
    Both with an explicit small KV budget: stock's default wants ~0.9 of the machine's memory, which is
    not what this test is about (test_default_settings_stock_vs_patched is)."""
    small_kv = 1024 * 384
    stock = _worker(tmp_path, "none", threads=1, cpus=[0], kv_cache_memory_bytes=small_kv)
    patched = _worker(tmp_path, "all", threads=1, cpus=[0], kv_cache_memory_bytes=small_kv)
    assert stock["status"] == patched["status"] == "ok"
    import os
    if os.cpu_count() > 1:
        assert stock["effective"]["torch_threads"] == os.cpu_count()
    assert patched["effective"]["torch_threads"] == 1
    assert patched["effective"]["cpu_affinity"] == [0]
    assert patched["overrides"]["threads-follow-bind"]["effective"]["torch_threads"] == 1


def test_aot_load_makes_a_plain_loaded_function_whole(monkeypatch):
    """The wrapper gives a loaded compiled_fn without finalize_loading a no-op one, counts it, leaves one
    that has its own alone, and installs once (the harness's own logic, on a stand-in for torch's loader)."""
    import types

    import torch.compiler

    from runtime import aotload

    def plain(*a):
        return a

    class Own:
        def finalize_loading(self, cfg):
            return "own"

    loaded = iter([plain, Own()])
    monkeypatch.setattr(torch.compiler, "load_compiled_function",
                        lambda f, f_globals=None: types.SimpleNamespace(_artifacts=types.SimpleNamespace(
                            compiled_fn=next(loaded))))
    effect = aotload.install()
    assert aotload.install() is effect  # idempotent: one wrapper, one effect
    first = torch.compiler.load_compiled_function(None)
    first._artifacts.compiled_fn.finalize_loading(object())  # what vLLM's loader calls: no longer raises
    second = torch.compiler.load_compiled_function(None)
    assert second._artifacts.compiled_fn.finalize_loading(None) == "own"
    assert effect["loads"] == 2 and effect["made_whole"] == 1


@pytest.mark.engines
def test_compiled_worker_loads_the_cache_it_saved(tmp_path):
    """eager: false, twice on one compile cache: the first worker compiles and saves, the second loads it
    (vLLM's own counters, read back as effective.compilation). Without aot-cache-load the second compiles
    again: vLLM's loader fails on the inductor backend's plain function."""
    cache = {"VLLM_CACHE_ROOT": str(tmp_path / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    first = _worker(tmp_path, "all", cache, eager=False)
    second = _worker(tmp_path, "all", cache, eager=False)
    assert first["status"] == second["status"] == "ok", (first.get("error"), second.get("error"))
    assert first["effective"]["compilation_mode"] == "DYNAMO_TRACE_ONCE"
    assert first["effective"]["compilation"]["aot_compiles"] == 1
    assert first["effective"]["compilation"]["aot_artifacts_saved"] == 1
    got = second["effective"]["compilation"]
    assert got["aot_compiles"] == 0 and got["aot_artifacts_loaded"] == 1, got
    assert second["overrides"]["aot-cache-load"]["made_whole"] == 1
    man = {m["name"]: m for m in second["patches"]}
    assert man["aot-cache-load"]["applied"] and man["aot-cache-load"]["detector"]["defective"] is True


_NODE_INFO = ("import json; from vllm.utils.cpu_resource_utils import get_memory_node_info as g; m = g(0); "
              "print(json.dumps([m.total_memory, m.available_memory]))")
_HOLD = ("import sys, time; n = int(sys.argv[1]); b = bytearray(n); b[::4096] = b'\\x01' * len(range(0, n, 4096)); "
         "print('ready', flush=True); time.sleep(900)")


@pytest.mark.engines
def test_stock_refuses_to_start_when_others_use_memory_patched_starts(tmp_path):
    """Stock at default settings wants 0.92 x the node's memory free; with another process holding
    memory (any real machine) it refuses to start. The patched runtime asks for the KV it needs."""
    r = subprocess.run([sys.executable, "-c", _NODE_INFO], capture_output=True, text=True, timeout=300, check=True)
    total, available = json.loads(r.stdout.strip().splitlines()[-1])
    hold = max(0, available - int(0.85 * total)) + (256 << 20)  # leaves 0.85 x total available at most
    if hold > available - (3 << 30):
        pytest.skip(f"holding {hold >> 20} MiB would leave under 3 GiB for the engine")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(hold)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        stock = _worker(tmp_path, "none")
        patched = _worker(tmp_path, "all")
    finally:
        holder.kill()
        holder.wait()
    assert stock["status"] == "failed" and "less than desired CPU memory utilization" in stock["error"]
    assert patched["status"] == "ok" and patched["effective"]["kv_tokens"] == 256


def test_auto_core_and_eager_take_the_least_measured_cost():
    from harness.engines.vllm import choose_core_and_eager
    costs = {"grid_sha256": "x", "configs": {
        ("inprocess", True): {"startup_s": 5.0, "s_per_token": 0.044},
        ("inprocess", False): {"startup_s": 70.0, "s_per_token": 0.040},
        ("multiprocess", True): {"startup_s": 21.0, "s_per_token": 0.070}}}
    assert choose_core_and_eager("auto", "auto", 256, costs)[:2] == ("inprocess", True)
    # compiling pays off only past (70-5)/(0.044-0.040) = 16,250 decoded tokens per process
    assert choose_core_and_eager("auto", "auto", 20000, costs)[:2] == ("inprocess", False)
    assert choose_core_and_eager("multiprocess", "auto", 256, costs)[:2] == ("multiprocess", True)
    core, eager, why = choose_core_and_eager("auto", "auto", 256, None)
    assert (core, eager) == ("inprocess", True) and "no runtime-startup measurement" in why["rule"]


def test_measured_costs_come_from_the_published_runtime_startup_series():
    from harness.engines.vllm import measured_costs
    from harness.paths import PROJECT_ROOT
    from harness.store import load_path
    published = load_path(next((PROJECT_ROOT / "artifacts" / "runtime-startup").glob("*.json"))).host.key
    costs = measured_costs(host_key=published)  # the host that measured the published series
    assert costs is not None, "artifacts/runtime-startup/ is part of the published store"
    assert costs["host"] == published
    c = costs["configs"]
    assert {("inprocess", True), ("inprocess", False), ("multiprocess", True)} <= set(c)
    # what the runtime's defaults rest on: in-process eager starts fastest
    assert c[("inprocess", True)]["startup_s"] < min(c[("multiprocess", True)]["startup_s"],
                                                     c[("inprocess", False)]["startup_s"])


def test_attribution_times_each_part_exclusively():
    """Nested timed calls count once, in their own part; the step's rest is its wall time less the parts."""
    import time
    from runtime import attribution as at

    class Engine:
        def inner(self):
            time.sleep(0.02)

        def outer(self):
            time.sleep(0.01)
            self.inner()

        def step(self):
            self.outer()
            time.sleep(0.005)

    Engine.inner = at.timed(Engine.inner, "forward")
    Engine.outer = at.timed(Engine.outer, "prepare")
    Engine.step = at.timed_step(Engine.step)
    at.take()
    Engine().outer()  # outside a step: not recorded
    assert at.take() == []
    Engine().step()
    (rec,) = at.take()
    assert 0.019 < rec["forward"] < 0.05 and 0.009 < rec["prepare"] < 0.05  # exclusive: prepare excludes forward
    assert abs(rec["rest"] + rec["prepare"] + rec["forward"] - rec["step"]) < 1e-9
    assert rec["rest"] >= 0.004 and rec["schedule"] == 0.0


def test_attribution_installs_on_this_vllm():
    """Every part's target exists in the installed vLLM (a rename there would leave a part silently at zero)."""
    code = ("import json; from runtime import attribution; print(json.dumps(attribution.install()))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["missing"] == {}, got["missing"]
    assert set(got["wrapped"].values()) == set(attribution_parts()) | {"step"}


def attribution_parts():
    from runtime.attribution import PARTS
    return PARTS
