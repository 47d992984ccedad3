"""harness.suitebench, the suite's own timer, on a small repository whose Makefile stands in for the project's
(the timer's own logic: the clone, the empty caches, the phase split, pytest's summary, the tree and processes
left behind). The real measurement is `make suite-bench`."""

import json
import os
import subprocess
from pathlib import Path

from harness import suitebench

MAKEFILE = """\
test:
\t@echo "setting up"
\t@echo "caches=$$EDGE_HARNESS_CACHE,$$PIP_CACHE_DIR bytecode=$${PYTHONDONTWRITEBYTECODE-unset}"
\t@echo "level=$$MAKELEVEL venv=$${VIRTUAL_ENV-unset} path=$$PATH"
\t@echo ".venv/bin/python -m pytest -q -n 3 tests"
\t@echo "=== 3 passed, 1 skipped, 2 warnings in 0.25s ==="
\t@touch stray.txt
\t@f=$$(mktemp -u) && mkfifo $$f && (python3 -c "$$UP" left-behind $$f > /dev/null 2>&1 &) && read up < $$f && rm $$f
demo:
\t@echo "[demo] a verdict line"
"""
# the process left behind (its command line names neither the clone nor the caches: found by the run's mark in
# its environment) says it is up through a FIFO before make goes on
UP = "import sys, time; open(sys.argv[2], 'w').write('up\\n'); time.sleep(120)"
FAILING = "test:\n\t@echo 'cmake: not found'; exit 2\n"


def _repo(path: Path, makefile: str) -> Path:
    path.mkdir()
    (path / "Makefile").write_text(makefile)
    for cmd in (["git", "init", "-q"], ["git", "add", "Makefile"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "m"]):
        subprocess.run(cmd, cwd=path, check=True)
    return path


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_cold_run_times_its_phases_and_names_what_it_left(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("UP", UP)
    monkeypatch.setenv("EDGE_HARNESS_CACHE", str(tmp_path / "users-cache"))
    repo = _repo(tmp_path / "repo", MAKEFILE)
    # as if started from the checkout's own venv under an outer make: none of it reaches the clone's make
    monkeypatch.setenv("MAKELEVEL", "5")
    monkeypatch.setenv("MAKEFLAGS", "-j7")
    monkeypatch.setenv("VIRTUAL_ENV", str(repo / ".venv"))
    monkeypatch.setenv("PATH", f"{repo / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    r = suitebench.run_suite(repo, cold=True, demo=True, log_path=tmp_path / "log", keep=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert r["commit"] == head and r["rc"] == 0 and r["cold"] is True
    assert r["tests"] == {"passed": 3, "skipped": 1, "warning": 2, "seconds": 0.25}
    assert 0 <= r["setup_s"] <= r["wall_s"] and r["pytest_s"] == round(r["wall_s"] - r["setup_s"], 1)
    log = (tmp_path / "log").read_text()
    caches = log.split("caches=")[1].split()[0].split(",")
    # new empty caches of the run's own (removed after it), not the user's; and no bytecode switch
    assert all("edge-suitebench-" in c and not Path(c).exists() for c in caches) and "bytecode=unset" in log
    assert "level=1 venv=unset" in log and ".venv" not in log.split("path=")[1].split("\n")[0]
    assert r["tree_after"] == ["?? stray.txt"]
    (left,) = r["left_running"]
    assert "left-behind" in left["cmd"] and "edge-suitebench-" not in left["cmd"] and not _alive(left["pid"])
    assert r["demo"]["rc"] == 0 and r["demo"]["last_line"] == "[demo] a verdict line" and "tail" not in r
    assert set(r["cpu_s"]) == {"busy", "idle", "steal"} and r["cpu_s"]["busy"] >= 0
    v = suitebench.verdict(r, 20, 10)
    assert v["met"] is False and v["checks"]["passed"] and v["checks"]["total_under_target"]
    assert not v["checks"]["tree_clean"] and not v["checks"]["nothing_left_running"]
    assert suitebench.verdict({**r, "wall_s": 1201.0}, 20, 10)["checks"]["total_under_target"] is False


def test_a_failed_run_is_not_met_and_keeps_its_last_lines(tmp_path):
    repo = _repo(tmp_path / "repo", FAILING)
    r = suitebench.run_suite(repo, cold=False, demo=False, log_path=tmp_path / "log", keep=True)
    try:
        assert r["rc"] == 2 and r["setup_s"] is None and r["pytest_s"] is None and r["tests"] == {}
        assert r["tail"][0] == "cmake: not found" and "Error 2" in r["tail"][-1]
        assert r["tree_after"] == [] and r["left_running"] == []
        v = suitebench.verdict(r, 20, 10)
        assert v["met"] is False and v["checks"]["passed"] is False and v["checks"]["tests_under_target"] is False
        assert Path(r["kept"], "clone", "Makefile").read_text() == FAILING
    finally:
        subprocess.run(["rm", "-rf", r["kept"]], check=True)


def test_pytest_summaries_are_read():
    assert suitebench.parse_summary(["x", "12 passed in 3.50s (0:00:03)", "real 1m"]) == {
        "passed": 12, "seconds": 3.5}
    assert suitebench.parse_summary(["== 2 failed, 9 passed, 1 error in 61.25s (0:01:01) =="]) == {
        "failed": 2, "passed": 9, "error": 1, "seconds": 61.25}
    assert suitebench.parse_summary(["no summary here", "built 3 wheels in 2.1s"]) == {}


def test_the_cli_prints_the_result_and_exits_1_when_a_target_is_missed(tmp_path, capsys):
    repo = _repo(tmp_path / "repo", "\n".join(x for x in MAKEFILE.splitlines() if "stray" not in x and "UP" not in x))
    out = tmp_path / "r.json"
    assert suitebench.main(["--repo", str(repo), "--warm", "--out", str(out), "--log", str(tmp_path / "l")]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(out.read_text())
    assert suitebench.main(["--repo", str(repo), "--warm", "--target-min", "0", "--log", str(tmp_path / "l")]) == 1
    assert os.path.getsize(tmp_path / "l") > 0


def test_a_folder_that_is_no_checkout_or_an_out_file_nowhere_is_one_line_and_exit_2(tmp_path, capsys):
    assert suitebench.main(["--repo", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path) in err[0] and "--repo" in err[0] and "fix:" in err[0]
    repo = _repo(tmp_path / "repo", FAILING)
    assert suitebench.main(["--repo", str(repo), "--out", str(tmp_path / "no" / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "fix:" in err[0]
