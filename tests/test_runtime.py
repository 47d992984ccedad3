"""The patched runtime: each patch has a detector, a manifest entry, and stock-vs-patched evidence."""

import os

import pytest

from runtime import patches
from runtime_worker import worker as _worker

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


def test_every_patch_has_detector_and_manifest_entry(vllm_process):
    man = vllm_process["manifest"]
    assert [m["name"] for m in man] == list(patches.NAMES)
    for m in man:
        assert m["detector"]["defective"] in (True, False) and m["detector"]["evidence"]
        assert len(m["source_sha256"]) == 64 and m["extension_point"].startswith("vllm.")


EXPLICIT_KV = 2000000  # test_engines_real's vllm-decode arm: the same settings, patched


@pytest.fixture(scope="module")
def legacy_env_one_cpu(tmp_path_factory):
    """Stock vLLM with two settings it loses: an explicit kv_cache_memory_bytes beside the legacy
    VLLM_CPU_KVCACHE_SPACE, and one thread bound to CPU 0 (an explicit KV budget also keeps stock off its default
    node fraction: that is test_runtime_memory). The patched runtime keeps
    each in a run that starts vLLM for other checks (the patches are independent of each other): the explicit KV
    in test_engines_real's vllm-decode arm, the bound thread in test_runtime_memory's patched run."""
    d = tmp_path_factory.mktemp("legacy-env-one-cpu")
    return _worker(d, "none", {"VLLM_CPU_KVCACHE_SPACE": "1"}, threads=1, cpus=[0], kv_cache_memory_bytes=EXPLICIT_KV)


@pytest.mark.engines
def test_stock_lets_the_legacy_env_overwrite_an_explicit_kv(legacy_env_one_cpu):
    """Stock lets VLLM_CPU_KVCACHE_SPACE overwrite an explicit kv_cache_memory_bytes (patched keeps it:
    test_engines_real's test_explicit_kv_kept_beside_the_legacy_env)."""
    stock = legacy_env_one_cpu
    assert stock["status"] == "ok", stock.get("error")
    assert stock["effective"]["kv_cache_memory_bytes"] == 1 << 30  # the setting silently lost


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
def test_stock_ignores_a_one_cpu_bind_list(legacy_env_one_cpu):
    """In-process, stock vLLM ignores the bind list: as many torch threads as CPUs for a 1-CPU list (patched
    follows it: test_runtime_memory.test_patched_at_defaults_sizes_kv_from_the_geometry_and_follows_the_bind_list)."""
    stock = legacy_env_one_cpu
    assert stock["status"] == "ok", stock.get("error")
    if (os.cpu_count() or 1) < 2:
        pytest.skip(f"stock's torch threads equal the CPU count ({os.cpu_count()}), which is the 1 requested here: "
                    "the defect needs 2 or more CPUs to show")
    assert stock["effective"]["torch_threads"] == os.cpu_count()


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


def test_attribution_times_each_part_exclusively(monkeypatch):
    """Nested timed calls count once, in their own part; the step's rest is its wall time less the parts.
    On a fake clock that each call advances by what it "spends": exact, however loaded the machine."""
    from runtime import attribution as at

    now = [0.0]
    monkeypatch.setattr(at, "_clock", lambda: now[0])

    def spend(s):
        now[0] += s

    class Engine:
        def inner(self):
            spend(0.02)

        def outer(self):
            spend(0.01)
            self.inner()

        def step(self):
            self.outer()
            spend(0.005)

    Engine.inner = at.timed(Engine.inner, "forward")
    Engine.outer = at.timed(Engine.outer, "prepare")
    Engine.step = at.timed_step(Engine.step)
    at.take()
    Engine().outer()  # outside a step: not recorded
    assert at.take() == []
    Engine().step()
    (rec,) = at.take()
    assert rec["forward"] == pytest.approx(0.02) and rec["prepare"] == pytest.approx(0.01)  # prepare excludes forward
    assert rec["step"] == pytest.approx(0.035) and rec["rest"] == pytest.approx(0.005)
    assert abs(rec["rest"] + rec["prepare"] + rec["forward"] - rec["step"]) < 1e-9
    assert rec["schedule"] == 0.0


def test_attribution_installs_on_this_vllm(vllm_process):
    """Every part's target exists in the installed vLLM (a rename there would leave a part silently at zero)."""
    got = vllm_process["attribution"]
    assert got["missing"] == {}, got["missing"]
    assert set(got["wrapped"].values()) == set(attribution_parts()) | {"step"}


def attribution_parts():
    from runtime.attribution import PARTS
    return PARTS
