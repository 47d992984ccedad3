"""Hardware emulation against the real engines (tiny-llama): every cap applied and read back.

- On a machine with AVX-512: the x86-avx2 class runs llama.cpp without any AVX-512 in its system info, and
  torch reports AVX2 with vLLM on its AVX2 kernels. Elsewhere that test is skipped and says why.
- On any x86 machine with AVX2 or more: the x86-baseline class (SSE4.2 only) runs llama.cpp's baseline build
  variant (no AVX, AVX2, FMA or F16C in its system info) and caps torch to its default kernels; vLLM has no
  kernels below AVX2, and its run records that ISA cap as not emulated rather than pass for it.
The class is part of the host key (emulated runs are their own host), and `harness check` accepts the runs.
"""

import json

import pytest

from harness import check, execute, hardware
from harness.probe import meminfo, probe
from harness.store import Store

pytestmark = pytest.mark.engines

NATIVE = hardware.profile_from_probe(probe())
X86 = NATIVE["arch"] == "x86_64"


def _grid(cls: str) -> str:
    return f"""
name: emu
model: tiny-llama
arms:
  - {{name: llama.cpp, engine: llama.cpp, form: gguf-f32, hardware: {cls}}}
  - {{name: vllm, engine: vllm, form: hf-fp32, hardware: {cls}, options: {{kv_cache_memory_bytes: 2000000}}}}
workload: {{prompt_len: 16, context_len: 256, gen_len: 4}}
threads: 1
passes: 1
repetitions: 1
warmups: 0
timeout_s: 600
"""


def _fits(cls: str) -> None:
    """Skip, with the numbers, where this machine cannot give the class what it caps to (the memory available
    now, from /proc/meminfo's MemAvailable, or cores): the run would be refused, not fail."""
    short = hardware.exceeds(hardware.get_class(cls), {**NATIVE, "memory_available_bytes": meminfo()["available_bytes"]})
    if short:
        pytest.skip(f"class {cls} needs {'; '.join(short)}")


def _run(tmp_path, cls):
    _fits(cls)
    g = tmp_path / "emu.yaml"
    g.write_text(_grid(cls))
    s = execute.run(str(g), store_root=tmp_path / "store")
    arts = {json.loads(p.read_text())["grid"]["arm"]: json.loads(p.read_text())
            for p in Store(tmp_path / "store").iter_paths("emu")}
    assert s.failed == 0, {k: a.get("error") for k, a in arts.items()}
    n, problems = check.check([str(tmp_path / "store")], verify_models=False, allow_unknown_commit=True)
    assert n == 2 and [p for p in problems if ": harness.dirty:" not in p] == []
    for a in arts.values():
        assert a["host"]["emulation"] == cls and a["host"]["key"] != a["host"]["machine_key"]
        caps = a["execution"]["emulation"]["caps"]
        assert caps["cores"]["status"] == "emulated" and caps["cores"]["effective"] == [0]
        assert caps["memory"]["status"] == "emulated", caps["memory"]
    return arts


@pytest.mark.skipif(not (X86 and NATIVE["isa"].get("avx512f")),
                    reason=f"this machine's ISA tier is {NATIVE['isa_tier']}: without AVX-512 the x86-avx2 class has "
                           "nothing to cap here (run on an AVX-512 machine)")
def test_avx2_class_on_an_avx512_machine(tmp_path):
    arts = _run(tmp_path, "x86-avx2-2c-4g")
    info = arts["llama.cpp"]["execution"]["effective"]["system_info"]
    assert "AVX2 = 1" in info and "AVX512 = 1" not in info
    eff = arts["vllm"]["execution"]["effective"]
    assert eff["torch_cpu_capability"] == "AVX2" and eff["vllm_kernels"] == "_C_AVX2"
    assert all(a["execution"]["emulation"]["caps"]["isa"]["status"] == "emulated" for a in arts.values())


@pytest.mark.skipif(not (X86 and NATIVE["isa"].get("avx2")),
                    reason=f"not an x86 machine with AVX2 (tier {NATIVE['isa_tier']}): nothing above baseline to cap")
def test_baseline_class_caps_llamacpp_and_torch(tmp_path):
    arts = _run(tmp_path, "x86-baseline-2c-8g")
    lc = arts["llama.cpp"]
    info = lc["execution"]["effective"]["system_info"]
    assert all(f"{f} = 1" not in info for f in ("AVX", "AVX2", "FMA", "F16C")), info
    assert lc["engine"]["build"]["isa_variant"] == "baseline"
    assert lc["execution"]["emulation"]["caps"]["isa"]["status"] == "emulated"
    v = arts["vllm"]
    assert v["execution"]["effective"]["torch_cpu_capability"] == "DEFAULT"
    assert v["execution"]["env"]["ATEN_CPU_CAPABILITY"] == "default"
    isa = v["execution"]["emulation"]["caps"]["isa"]
    assert isa["status"].startswith("not emulated") and "no kernels below AVX2" in isa["status"]
    assert v["execution"]["emulation"]["emulated"] is False
