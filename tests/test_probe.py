"""harness probe: the real host profile, and the parsers on known inputs."""

import json
import os

from harness import probe


def test_probe_reads_this_machine(cli):
    rc, out, _ = cli("probe")
    assert rc == 0
    prof = json.loads(out)
    assert prof["cpu"]["logical_cores"] == os.cpu_count()
    assert prof["cpu"]["model"] != ""
    assert prof["memory"]["total_bytes"] > 1 << 30
    assert prof["kernel"] == os.uname().release
    assert isinstance(prof["cpu"]["isa"], dict) and prof["cpu"]["isa"]


def test_cpulist_parser():
    assert probe._parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_cpuinfo_parser_x86():
    text = "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_bf16\n"
    info = probe.cpu_info(text)
    assert info["model"] == "Test CPU 9000"
    assert info["isa"]["avx2"] and info["isa"]["avx512_bf16"] and not info["isa"]["amx_tile"]
    assert info["bf16_compute"] is True


def test_missing_sources_say_unknown(tmp_path):
    assert probe.cpu_info("") == {"model": "unknown", "flags": "unknown", "isa": {}}
    assert probe.numa_nodes(str(tmp_path / "nope")) == "unknown"
    assert probe.meminfo("")["total_bytes"] == "unknown"


def test_bandwidth_probe_refuses_bad_counts_and_writes_nothing(cli, tmp_path):
    import os
    n = len(os.sched_getaffinity(0))
    for args in (["--max-threads", str(n + 1)], ["--max-threads", "0"], ["--repetitions", "0"]):
        rc, _, err = cli("probe", "--bandwidth", *args, "--store", tmp_path / "s")
        assert rc == 2 and len(err.strip().splitlines()) == 1 and args[0] in err
    assert not (tmp_path / "s").exists()
