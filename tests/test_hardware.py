"""Hardware classes (#15): profiles, every derivation rule on committed profiles, plan-time refusals, the
emulation record. The real emulation runs are in test_emulation_real.py."""

import math

import pytest

from harness import ceiling, emulate, grid, hardware
from harness.engines.capabilities import Sizing, capability
from harness.errors import UserError

AVX2_4G = "x86-avx2-2c-4g"
BF16_24G = "x86-avx512bf16-2c-24g"
ARM_4P4E = "arm64-i8mm-4p4e-8g"


def prof(name):
    return hardware.current_profile(name)


def test_committed_classes_load_and_name_their_files():
    cls = hardware.classes()
    assert {AVX2_4G, BF16_24G, ARM_4P4E} <= set(cls)
    assert cls[ARM_4P4E].clusters and sum(c.cores for c in cls[ARM_4P4E].clusters) == cls[ARM_4P4E].cores


def test_dtype_by_isa():
    from harness.engines import get_engine
    vllm, llamacpp = get_engine("vllm"), get_engine("llama.cpp")
    assert vllm.derive_dtype(prof(AVX2_4G))[0] == "float32"
    assert vllm.derive_dtype(prof(BF16_24G))[0] == "bfloat16"
    assert vllm.derive_dtype(prof(ARM_4P4E))[0] == "bfloat16"  # i8mm tier implies arm64 bf16
    assert llamacpp.derive_dtype(prof("x86-baseline-2c-8g"))[0] == "f32"
    assert llamacpp.derive_dtype(prof(AVX2_4G))[0] == "bf16"
    assert llamacpp.form_for(prof(AVX2_4G))[0] == llamacpp.check("smollm2-135m", "auto", prof(AVX2_4G)) == "gguf-bf16"
    assert capability(get_engine("command"), Sizing).derive_dtype(prof(AVX2_4G)) is None  # no rule: the default


def test_tier_flags_are_cumulative_and_nothing_above():
    f = hardware.tier_flags("x86_64", "avx2")
    assert f["avx2"] and f["fma"] and f["sse4_2"] and not f["avx512f"] and not f["avx512_bf16"]
    g = hardware.tier_flags("x86_64", "avx512-bf16")
    assert g["avx512_bf16"] and g["avx512f"] and not g["amx_tile"]


def test_threads_on_big_little_use_the_performance_cluster_only():
    n, cpus, rule = hardware.derive_threads(prof(ARM_4P4E))
    assert (n, cpus) == (4, [0, 1, 2, 3]) and "performance" in rule
    assert hardware.derive_threads(prof(AVX2_4G))[:2] == (2, [0, 1])


def test_disjoint_ranges():
    assert hardware.disjoint_ranges([0, 1, 2, 3], 2) == [[0, 1], [2, 3]]
    assert hardware.disjoint_ranges([0], 2) == []


def test_admission_by_hand():
    # SmolLM2-135M fp32 under vLLM: 4 GiB available, weights 538,060,032 B, overhead 1.3e9 B,
    # KV 46,080 B/token (2 x 30 layers x 3 kv heads x 64 x 4 B), context 1024 in blocks of 128.
    a = hardware.admission(4 * 2**30, 538_060_032, 1_300_000_000, 46_080, 1024, block=128, cap=256)
    per_seq = 46_080 * 128 * 8  # 47,185,920
    free = 4 * 2**30 - 538_060_032 - 1_300_000_000 - 46_080 * 128  # 2,451,009,024
    assert a["kv_bytes_per_sequence"] == per_seq and a["max_num_seqs"] == free // per_seq == 51
    assert a["kv_cache_memory_bytes"] == 46_080 * 128 * (8 * 51 + 1) == 2_412_380_160
    # a 2 GiB box: what is left after weights and overhead holds no sequence at all
    assert hardware.admission(2 * 2**30, 538_060_032, 1_700_000_000, 46_080, 1024, block=128, cap=256)["max_num_seqs"] == 0
    # the cap: vLLM's default max_num_seqs
    assert hardware.admission(64 * 2**30, 1, 1, 10, 16, block=16, cap=256)["max_num_seqs"] == 256
    # llama.cpp: f16 KV (23,040 B/token), context padded to 256
    b = hardware.admission(4 * 2**30, 270_000_000, 64 << 20, 23_040, 1000, block=256, cap=256)
    assert b["kv_bytes_per_sequence"] == 23_040 * 1024
    assert b["max_num_seqs"] == min(256, (4 * 2**30 - 270_000_000 - (64 << 20) - 23_040 * 256) // (23_040 * 1024))


def test_timeout_rule():
    assert hardware.timeout_s(10.0, 0.1, 128) == math.ceil(3 * (10 + 12.8))
    assert hardware.timeout_s(1.0, 0.001, 10) == 60


def test_profile_env_replaces_the_probe(monkeypatch):
    monkeypatch.setenv(hardware.PROFILE_ENV, str(hardware.CLASSES_DIR / f"{BF16_24G}.yaml"))
    p = hardware.current_profile()
    assert p["isa_tier"] == "avx512-bf16" and p["cores"] == 2 and hardware.PROFILE_ENV in p["source"]
    monkeypatch.setenv(hardware.PROFILE_ENV, "/nonexistent.yaml")
    with pytest.raises(UserError, match="EDGE_HARNESS_HW_PROFILE"):
        hardware.current_profile()


def test_bad_class_file_is_one_line_error(tmp_path):
    p = tmp_path / "x86-bad.yaml"
    p.write_text("name: x86-bad\ndescription: d\narch: x86_64\nisa_tier: avx9000\ncores: 2\nmemory_gib: 4\n")
    with pytest.raises(UserError) as e:
        hardware.load_class_file(p)
    assert str(p) in str(e.value) and "avx9000" in str(e.value) and "\n" not in str(e.value)
    q = tmp_path / "x86-other.yaml"
    q.write_text("name: x86-else\ndescription: d\narch: x86_64\nisa_tier: avx2\ncores: 2\nmemory_gib: 4\n")
    with pytest.raises(UserError, match="differs from the file name"):
        hardware.load_class_file(q)


def test_probe_profile_tier_matches_the_probe():
    from harness.probe import probe
    host = probe()
    p = hardware.profile_from_probe(host)
    assert p["cores"] >= 1 and p["isa_tier"] in [t for t, _ in hardware.TIERS.get(p["arch"], (("baseline", ()),))]
    d = ceiling.describe_machine(host)
    assert ARM_4P4E in d["cannot_emulate"] or p["arch"] == "aarch64"


@pytest.fixture
def big_x86_machine(monkeypatch):
    """The plan-time refusals are judged against a fixed machine, not this one's CPU or free memory."""
    prof = {**hardware.profile_from_class(hardware.get_class(AVX2_4G), "test machine"), "cores": 8,
            "cpus": list(range(8)), "memory_total_bytes": 64 << 30, "memory_available_bytes": 60 << 30}
    monkeypatch.setattr(hardware, "profile_from_probe", lambda host: dict(prof))


def _grid(tmp_path, arm: str, axes: str = "", workload: str = "prompt_len: 16\n  context_len: 256\n  gen_len: 8"):
    g = tmp_path / "hw.yaml"
    g.write_text(f"name: hw\nmodel: smollm2-135m\nthreads: 1\nworkload:\n  {workload}\n{axes}arms:\n{arm}")
    return str(g)


@pytest.mark.usefixtures("big_x86_machine")
def test_class_beyond_this_machine_is_refused_at_plan(tmp_path):
    path = _grid(tmp_path, f"  - {{name: a, engine: llama.cpp, hardware: {ARM_4P4E}}}\n")
    with pytest.raises(UserError, match="cannot emulate it.*arch aarch64"):
        grid.load(path)


@pytest.mark.usefixtures("big_x86_machine")
def test_threads_above_the_class_cores_refused(tmp_path):
    path = _grid(tmp_path, "  - {name: a, engine: llama.cpp, hardware: x86-avx2-1c-4g, threads: 2}\n")
    with pytest.raises(UserError, match="threads 2 exceed hardware x86-avx2-1c-4g's 1 cores"):
        grid.load(path)


@pytest.mark.usefixtures("big_x86_machine")
def test_cell_that_cannot_fit_is_refused_with_the_numbers(tmp_path):
    # 32,768 tokens of fp32 KV are 1.5 GB per sequence: 4 sequences cannot fit in 4 GiB beside the weights
    path = _grid(tmp_path, "  - {name: a, engine: vllm, hardware: x86-avx2-1c-4g, options: {max_num_seqs: auto}}\n",
                 workload="prompt_len: 16\n  context_len: 32768\n  gen_len: 8\n  batch: 4")
    with pytest.raises(UserError) as e:
        grid.load(path)
    msg = str(e.value)
    assert "sequence(s) of context 32768 admitted, batch 4 asked" in msg and "weights 538060032 B" in msg


@pytest.mark.usefixtures("big_x86_machine")
def test_hardware_axis_and_native(tmp_path):
    path = _grid(tmp_path, "  - {name: a, engine: command, options: {cmd: 'true'}}\n",
                 axes="axes:\n  hardware: [native, x86-avx2-1c-4g]\n")
    spec = grid.load(path)
    cells = grid.expand(spec)
    assert [grid.hardware_of(spec.arms[0], c.params) for c in cells] == [None, "x86-avx2-1c-4g"]


def test_isa_record_reads_llamacpp_system_info():
    em = emulate.Emulation(cls=hardware.get_class("x86-baseline-2c-8g"),
                           native={"isa_tier": "avx2"}, cpus=[0, 1], isa_variant="baseline")
    good = "CPU : SSE3 = 1 | SSSE3 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
    bad = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
    assert emulate.isa_record(em, "llama.cpp", {"system_info": good})["status"] == "emulated"
    r = emulate.isa_record(em, "llama.cpp", {"system_info": bad})
    assert r["status"].startswith("not emulated") and "AVX2" in r["status"]
    v = emulate.isa_record(em, "vllm", {"torch_cpu_capability": "DEFAULT", "vllm_kernels": "_C_AVX2"})
    assert v["status"].startswith("not emulated") and "no kernels below AVX2" in v["status"]
    em2 = emulate.Emulation(cls=hardware.get_class(AVX2_4G), native={"isa_tier": "avx512-bf16"}, cpus=[0, 1])
    ok = emulate.isa_record(em2, "vllm", {"torch_cpu_capability": "AVX2", "vllm_kernels": "_C_AVX2"})
    assert ok["status"] == "emulated"


def test_a_failed_run_leaves_its_read_back_caps_unverified():
    em = emulate.Emulation(cls=hardware.get_class("x86-baseline-2c-8g"), native={"isa_tier": "avx2"}, cpus=[0])
    rec = emulate.record(em, "vllm", {}, {}, balloon_held=True)
    assert rec["caps"]["cores"]["status"].startswith("unverified")
    assert rec["caps"]["isa"]["status"].startswith("unverified") and rec["emulated"] is False


def test_one_cpu_per_core_drops_smt_siblings(tmp_path):
    # 4 CPUs, 2 cores: siblings (0, 2) and (1, 3), as Linux numbers them on many x86 machines
    for cpu, core in ((0, 0), (1, 1), (2, 0), (3, 1)):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "core_id").write_text(f"{core}\n")
        (d / "physical_package_id").write_text("0\n")
    assert hardware.one_cpu_per_core([0, 1, 2, 3], str(tmp_path)) == [0, 1]
    assert hardware.one_cpu_per_core([2, 3], str(tmp_path)) == [2, 3]
    assert hardware.one_cpu_per_core([0, 9], str(tmp_path)) == [0, 9]  # unreadable topology: all of them


def test_big_little_clusters_from_cpu_capacity(tmp_path):
    for cpu, cap in ((0, 512), (1, 512), (2, 1024), (3, 1024)):
        d = tmp_path / f"cpu{cpu}"
        d.mkdir()
        (d / "cpu_capacity").write_text(f"{cap}\n")
    cl = hardware.clusters_from_sysfs([0, 1, 2, 3], str(tmp_path))
    assert [(c["cores"], c["performance"], c["cpus"]) for c in cl] == [(2, True, [2, 3]), (2, False, [0, 1])]
    p = {"clusters": cl, "cores": 4, "cpus": [0, 1, 2, 3]}
    assert hardware.derive_threads(p)[:2] == (2, [2, 3])
    assert hardware.clusters_from_sysfs([0, 1], str(tmp_path)) is None  # all alike


def test_settle_waits_out_the_steal_bursts_after_a_balloon():
    """Bursts of steal a few windows apart (as after deflating a balloon on this VM) keep it waiting; it returns
    only after quiet_for_s of quiet windows, and says so; a host that never quiets is reported, not hidden."""
    import time
    seen = iter([0.0, 0.5, 0.0, 0.02, 0.4] + [0.02] * 50)

    def probe(window_s):
        time.sleep(window_s)
        return next(seen)

    got = emulate.settle(quiet_cores=0.1, window_s=0.01, quiet_for_s=0.08, max_s=5, probe=probe)
    assert got["settled"] and got["max_steal_cores"] == 0.5
    assert got["windows"] >= 6 and got["waited_s"] >= 0.05  # past the last burst (5th), then quiet for 0.08 s
    loud = emulate.settle(quiet_cores=0.1, window_s=0.01, quiet_for_s=0.05, max_s=0.1,
                          probe=lambda w: (time.sleep(w), 0.3)[1])
    assert not loud["settled"] and loud["max_steal_cores"] == 0.3


def test_steal_probe_reads_proc_stat():
    """The real probe spins every CPU for the window and returns cores of steal (0 on bare metal, >= 0 always)."""
    assert 0.0 <= emulate._steal_probe(0.05) <= len(__import__("os").sched_getaffinity(0))
