"""`make bench` (harness/bench.py) at a small size: the store it builds checks clean, cold and warm (the
verification caches in use from the first artifact), the JSON carries the figures and the targets, and the
verdict (the exit code and `met`) follows the targets given. The 100,000-artifact timings are `make bench`'s
job on an idle machine, not a test's."""

import json

from harness import bench, check
from harness.paths import PROJECT_ROOT

FIELDS = {"artifacts", "check_cold_s", "check_warm_s", "check_target_s", "report_cold_s", "report_warm_s",
          "report_target_s", "problems", "met", "loadavg_before", "cpus", "python"}


def _run(capsys, monkeypatch, *argv: str) -> tuple[int, dict]:
    monkeypatch.setattr(check, "CACHE_FROM", 0)  # the warm figures come from the caches, as at 100,000
    rc = bench.main(list(argv))
    return rc, json.loads(capsys.readouterr().out)


def test_bench_builds_a_clean_store_and_meets_generous_targets(capsys, monkeypatch):
    rc, out = _run(capsys, monkeypatch, "-n", "150", "--check-target", "600", "--report-target", "600")
    assert set(out) == FIELDS
    assert out["artifacts"] == 150 and out["problems"] == 0  # every copy's id and run key are consistent
    assert out["check_target_s"] == 600 and out["report_target_s"] == 600
    assert rc == 0 and out["met"] is True


def test_bench_fails_a_target_it_misses(capsys, monkeypatch):
    source = str(PROJECT_ROOT / "artifacts" / "quickstart")
    rc, out = _run(capsys, monkeypatch, "-n", "30", "--source", source, "--check-target", "600",
                   "--report-target", "0")
    assert out["artifacts"] == 30 and out["problems"] == 0
    assert rc == 1 and out["met"] is False and out["report_warm_s"] > 0


def test_bench_times_a_report_after_one_new_artifact(capsys, monkeypatch):
    source = str(PROJECT_ROOT / "artifacts" / "quickstart")
    rc, out = _run(capsys, monkeypatch, "-n", "30", "--source", source, "--check-target", "600",
                   "--report-target", "600", "--one-new")
    assert set(out) == FIELDS | {"report_one_new_s"} and out["report_one_new_s"] > 0 and rc == 0
