"""The test suite's own time (`make suite-bench`): `make test` in a fresh clone of this checkout's HEAD, timed by
phase (the set-up, then pytest), with the machine's CPU time over the run read from /proc/stat.

Cold (the default) is a fresh machine as far as caches go: pip's, the harness's (llama.cpp builds, compiler cache,
models, engine environments), torch inductor's and XDG's cache folders are new empty folders for the run, removed
after it. `--warm` keeps this user's caches (what CI on a used machine sees). After the run: whether the clone's
tree is clean, and which processes of the run outlived it (any process that carries the run's mark in its
environment, EDGE_SUITEBENCH_RUN, or names the clone or the run's caches on its command line; they are killed and
named). `--demo` then runs `make demo` in the same clone and checks the tree again. What is timed is HEAD as
committed: changes not committed are not in the clone.

The targets (#31): `make test` under `--target-min` (20) minutes in all and pytest under `--tests-target-min`
(10). The exit code is 1 when the run fails, a target is missed, the tree is left dirty or a process outlived
it. Run it on an idle machine (the load average before and the idle and steal CPU time over the run are in the
result: a run CPU-bound on all cores has little idle time); it takes as long as a cold `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import lifecycle, provenance
from harness.paths import PROJECT_ROOT

CACHE_VARS = ("EDGE_HARNESS_CACHE", "PIP_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "XDG_CACHE_HOME")
PYTEST_START = re.compile(r"(^|\s)(\S*/)?python3?\S* -m pytest\b")
SUMMARY = re.compile(r"=*\s*(?P<counts>(\d+ \w+(, )?)+) in (?P<secs>[\d.]+)s\b")
COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected|warnings?)")


def cpu_times() -> dict[str, float]:
    """Seconds the machine's CPUs spent busy (user, nice, system, irq, softirq), idle (idle, iowait) and stolen,
    since boot."""
    user, nice, system, idle, iowait, irq, softirq, steal = provenance.machine_cpu_seconds()
    return {"busy": user + nice + system + irq + softirq, "idle": idle + iowait, "steal": steal}


def parse_summary(lines: list[str]) -> dict[str, int | float]:
    """pytest's last summary line (`12 passed, 1 skipped in 3.50s`) among `lines`: its counts and seconds."""
    for line in reversed(lines):
        m = SUMMARY.search(line)
        counts = {k.rstrip("s") if k.startswith(("error", "warning")) else k: int(n)
                  for n, k in COUNT.findall(m.group("counts"))} if m else {}
        if counts:
            return {**counts, "seconds": float(m.group("secs"))}
    return {}


MARK = "EDGE_SUITEBENCH_RUN"


def leftovers(run_id: str, marks: list[str], own: set[int]) -> list[dict]:
    """Live processes (not this one or its ancestors) with `MARK=run_id` in their environment (every descendant of
    the run that kept its environment) or whose command line names one of `marks`."""
    tagged = set(lifecycle.marked(lambda tags: run_id in tags, MARK))
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) in own:
            continue
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and (int(p.name) in tagged or (cmd and any(m in cmd for m in marks))):
            found.append({"pid": int(p.name), "cmd": cmd[:200]})
    return found


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids


def timed_make(target: str, clone: Path, env: dict, log) -> dict:
    """`make <target>` in the clone, its output copied to the log with a time stamp per line: wall seconds in
    all, until pytest's command line appeared (the set-up) and after it, its exit code, pytest's summary (from the
    lines after its command line) and the last lines. What make leaves running is for `leftovers` to find."""
    t0 = time.monotonic()
    started, first = None, 0
    lines: list[str] = []
    proc = subprocess.Popen(["make", target], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", start_new_session=True)
    try:
        for line in proc.stdout:
            now = time.monotonic()
            if started is None and PYTEST_START.search(line):
                started, first = now, len(lines)
            lines.append(line.rstrip("\n"))
            log.write(f"{now - t0:8.1f} {line}")
            log.flush()
        rc = proc.wait()
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    wall = round(time.monotonic() - t0, 1)
    setup = round(started - t0, 1) if started is not None else None
    return {"rc": rc, "wall_s": wall, "setup_s": setup, "pytest_s": round(wall - setup, 1) if setup is not None
            else None, "tests": parse_summary(lines[first:]) if started is not None else {}, "tail": lines[-5:]}


def _tree(clone: Path) -> list[str]:
    r = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def _kill(procs: list[dict]) -> None:
    for p in procs:
        try:
            os.kill(p["pid"], signal.SIGKILL)
        except OSError:
            pass


def clean_env(repo: Path) -> dict[str, str]:
    """The environment of the clone's make: as a fresh shell has it. No outer make's flags (variables given to the
    outer make on its command line still reach it, as make exports them), no bytecode switch (the Makefile
    unexports it too), no virtual environment of the checkout's on PATH (the clone makes its own .venv from the
    system's python3)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "MAKEFLAGS", "MAKELEVEL",
                                                            "MFLAGS", "VIRTUAL_ENV")}
    venv = Path(repo).resolve() / ".venv"
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p and not Path(p).resolve().is_relative_to(venv))
    return env


def run_suite(repo: Path, cold: bool, demo: bool, log_path: Path, keep: bool) -> dict:
    """`make test` (then `make demo`) in a fresh clone of `repo`'s HEAD: the result's fields but the verdict."""
    from harness import probe
    host = probe.probe()
    work = Path(tempfile.mkdtemp(prefix="edge-suitebench-"))
    clone = work / "clone"
    own = _ancestors()
    env = {**clean_env(repo), MARK: str(work)}
    marks = [str(clone)]
    result: dict = {}
    try:
        subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True,
                                check=True).stdout.strip()
        if cold:
            for var in CACHE_VARS:
                d = work / "caches" / var.lower()
                d.mkdir(parents=True)
                env[var] = str(d)
            marks.append(str(work / "caches"))
        result = {"commit": commit, "cold": cold, "host": probe.host_key(host), "cpu": probe.describe(host),
                  "cpus": len(os.sched_getaffinity(0)), "loadavg_before": Path("/proc/loadavg").read_text().split()[:3],
                  "log": str(log_path)}
        with open(log_path, "w") as log:
            log.write(f"# make test in {clone} at {commit}, cold={cold}\n")
            c0 = cpu_times()
            t = timed_make("test", clone, env, log)
            c1 = cpu_times()
            left = leftovers(str(work), marks, own)
            _kill(left)
            result.update({k: v for k, v in t.items() if k != "tail" or t["rc"] != 0})
            result["cpu_s"] = {k: round(c1[k] - c0[k], 1) for k in c0}
            result["tree_after"] = _tree(clone)
            result["left_running"] = left
            if demo:
                d = timed_make("demo", clone, env, log)
                left = leftovers(str(work), marks, own)
                _kill(left)
                result["demo"] = {"rc": d["rc"], "wall_s": d["wall_s"], "tree_after": _tree(clone),
                                  "left_running": left, "last_line": next((x for x in reversed(d["tail"]) if x.strip()), "")}
    finally:
        _kill(leftovers(str(work), marks, own))
        if keep:
            result["kept"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return result


def verdict(result: dict, target_min: float, tests_target_min: float) -> dict:
    """Whether the run met the targets and left nothing behind."""
    checks = {"passed": result["rc"] == 0,
              "total_under_target": result["wall_s"] < target_min * 60,
              "tests_under_target": result["pytest_s"] is not None and result["pytest_s"] < tests_target_min * 60,
              "tree_clean": result["tree_after"] == [], "nothing_left_running": result["left_running"] == []}
    if "demo" in result:
        d = result["demo"]
        checks["demo_passed"] = d["rc"] == 0
        checks["demo_tree_clean"] = d["tree_after"] == [] and d["left_running"] == []
    return {"target_s": target_min * 60, "tests_target_s": tests_target_min * 60, "checks": checks,
            "met": all(checks.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.suitebench", description=__doc__.splitlines()[0])
    ap.add_argument("--warm", action="store_true", help="keep this user's caches (default: new empty ones)")
    ap.add_argument("--demo", action="store_true", help="then `make demo` in the same clone")
    ap.add_argument("--repo", default=str(PROJECT_ROOT), help="the checkout whose HEAD is cloned")
    ap.add_argument("--target-min", type=float, default=20.0)
    ap.add_argument("--tests-target-min", type=float, default=10.0)
    ap.add_argument("--log", help="the run's output, time-stamped (default: a file in the temporary folder)")
    ap.add_argument("--out", help="also write the result's JSON here")
    ap.add_argument("--keep", action="store_true", help="keep the clone and its caches (named in the result)")
    args = ap.parse_args(argv)
    if shutil.which("make") is None or shutil.which("git") is None:
        print("harness.suitebench: make and git are needed (fix: apt-get install make git)", file=sys.stderr)
        return 2
    top = subprocess.run(["git", "-C", args.repo, "rev-parse", "--verify", "--show-toplevel", "HEAD"],
                         capture_output=True, text=True)
    if top.returncode != 0:
        print(f"harness.suitebench: {args.repo}: --repo is not a git checkout with a commit "
              f"({(top.stderr.strip().splitlines() or ['no HEAD'])[-1]}) (fix: name the project's checkout)",
              file=sys.stderr)
        return 2
    for flag, value in (("--log", args.log), ("--out", args.out)):
        if value and not Path(value).resolve().parent.is_dir():
            print(f"harness.suitebench: {value}: {flag} names a file in a folder that does not exist "
                  f"(fix: make {Path(value).resolve().parent} or name another file)", file=sys.stderr)
            return 2
    log = Path(args.log) if args.log else Path(tempfile.gettempdir()) / f"edge-suitebench-{int(time.time())}.log"
    try:
        result = run_suite(Path(top.stdout.splitlines()[0]), not args.warm, args.demo, log, args.keep)
    except KeyboardInterrupt:
        print(f"harness.suitebench: interrupted; the run's output so far is in {log}", file=sys.stderr)
        return 130
    result.update(verdict(result, args.target_min, args.tests_target_min))
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
