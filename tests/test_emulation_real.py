"""Hardware emulation against the real engines (tiny-llama): every cap applied and read back.

- On a machine with AVX-512: the x86-avx2 class runs llama.cpp without any AVX-512 in its system info, and
  torch reports AVX2 with vLLM on its AVX2 kernels. Elsewhere that test is skipped and says why.
- On any x86 machine with AVX2 or more: the x86-baseline class (SSE4.2 only) runs llama.cpp's baseline build
  variant (no AVX, AVX2, FMA or F16C in its system info) and caps torch to its default kernels; vLLM has no
  kernels below AVX2, and its run records that ISA cap as not emulated rather than pass for it.
Each class is taken with its memory cap just under what the machine has available (a small balloon, the
same caps). The class is part of the host key (emulated runs are their own host), and `harness check` accepts
the runs.
"""

import json
import math

import pytest
import yaml

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


GIB = 1 << 30
ENGINES_NEED_GIB = 3  # tiny-llama on vLLM (its worker and a 2 MB KV cache) and on llama.cpp, with room


def _near_class(base: str, monkeypatch, tmp_path) -> str:
    """The class `base` (its ISA tier and cores), its memory cap just under what this machine has available now:
    the caps under test are applied and read back the same way, with a balloon of about 1 GiB instead of most of
    the machine (on 24 GiB, the 8 GiB class pins a 16 GB balloon per run and waits ~40 s for the hypervisor's
    steal to settle after it is freed: a minute a run). Skips, with the numbers, where too little is available."""
    available = meminfo()["available_bytes"]
    gib = math.floor((available - GIB) / GIB * 4) / 4
    if gib < ENGINES_NEED_GIB:
        pytest.skip(f"{available >> 20} MiB available: a class under it leaves the engines under {ENGINES_NEED_GIB} GiB")
    name = f"{base.rsplit('-', 1)[0]}-test"
    d = tmp_path / "classes"
    d.mkdir()
    doc = hardware.get_class(base).model_dump(exclude_none=True) | {
        "name": name, "memory_gib": gib, "description": f"{base}, its memory cap just under this machine's available"}
    (d / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setattr(hardware, "CLASSES_DIR", d)
    short = hardware.exceeds(hardware.get_class(name), {**NATIVE, "memory_available_bytes": available})
    if short:
        pytest.skip(f"class {name} needs {'; '.join(short)}")
    return name


def _run(tmp_path, monkeypatch, base):
    cls = _near_class(base, monkeypatch, tmp_path)
    g = tmp_path / "emu.yaml"
    g.write_text(_grid(cls))
    s = execute.run_grid(str(g), store_root=tmp_path / "store")
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
def test_avx2_class_on_an_avx512_machine(tmp_path, monkeypatch):
    arts = _run(tmp_path, monkeypatch, "x86-avx2-2c-4g")
    info = arts["llama.cpp"]["execution"]["effective"]["system_info"]
    assert "AVX2 = 1" in info and "AVX512 = 1" not in info
    eff = arts["vllm"]["execution"]["effective"]
    assert eff["torch_cpu_capability"] == "AVX2" and eff["vllm_kernels"] == "_C_AVX2"
    assert all(a["execution"]["emulation"]["caps"]["isa"]["status"] == "emulated" for a in arts.values())


@pytest.mark.skipif(not (X86 and NATIVE["isa"].get("avx2")),
                    reason=f"not an x86 machine with AVX2 (tier {NATIVE['isa_tier']}): nothing above baseline to cap")
def test_baseline_class_caps_llamacpp_and_torch(tmp_path, monkeypatch):
    arts = _run(tmp_path, monkeypatch, "x86-baseline-2c-8g")
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
