"""`make bench` (harness/bench.py) at a small size: the store it builds checks clean, cold and warm (the
verification caches in use from the first artifact), the JSON carries the figures and the targets, and the
verdict (the exit code and `met`) follows the targets given. The 100,000-artifact timings are `make bench`'s
job on an idle machine, not a test's."""

import json

from harness import bench, check
from harness.paths import PROJECT_ROOT

FIELDS = {"artifacts", "check_cold_s", "check_warm_s", "check_target_s", "report_cold_s", "report_warm_s",
          "report_target_s", "report_one_new_s", "problems", "met", "loadavg_before", "cpus", "python"}


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
    assert rc == 1 and out["met"] is False and out["report_cold_s"] > 0


def test_bench_judges_the_first_calls_and_the_report_after_one_new_artifact(capsys, monkeypatch):
    """The targets are where a user waits: a check target the first check misses fails, however fast the warm one."""
    source = str(PROJECT_ROOT / "artifacts" / "quickstart")
    rc, out = _run(capsys, monkeypatch, "-n", "30", "--source", source, "--check-target", "600",
                   "--report-target", "600")
    assert out["report_one_new_s"] > 0 and rc == 0
    # each figure scripted, in the bench's order: first check, warm check, first report, warm report, one new
    for times, met in (((5, 1, 1, 1, 1), False), ((1, 5, 1, 5, 1), True), ((1, 1, 1, 1, 5), False)):
        left = list(times)
        monkeypatch.setattr(bench, "timed", lambda fn: (left.pop(0), fn()))
        rc, out = _run(capsys, monkeypatch, "-n", "30", "--source", source, "--check-target", "2",
                       "--report-target", "2")
        assert out["met"] is met and rc == (0 if met else 1), (times, out)
