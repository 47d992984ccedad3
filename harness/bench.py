"""Speed benchmarks of the harness's own code (`make bench`): check and report over 100,000 artifacts.

The artifacts are copies of the real committed run artifacts with a different pass index each (re-stamped
with their own ids) in a temporary store: a workload for the checker and the report, never published. Each is
timed cold (its first call: the new store's verification caches under the user's cache folder are empty, as
for a store never checked on this machine; they are removed after) and warm (the store unchanged since: what
`harness check` and `harness report` cost in CI or on a second call), and the report once more after one more
artifact is added to the store (the files' parsed objects read back from their cache, the rest rendered again).
The targets are judged where a user waits: the first check, the first report and the report after one new
artifact; the exit code is 1 when one is missed. Run on an idle machine; the load average is printed.

A warm report reads the verification cache only: every file's verdict is there under its stamp, and the report
rendered from the same inputs is read back (report._Output).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from harness import artifact, check, hashcache, report
from harness.paths import PROJECT_ROOT, cache_root
from harness.store import load_path

CHECK_TARGET_S = REPORT_TARGET_S = 10.0


def make_store(root: Path, n: int, source: Path) -> Path:
    """n run artifacts under root/bench/, each the JSON form Store.write gives it. Written directly (no fsync,
    no re-validation): the copies differ from a validated artifact only in their grid's name, pass index and
    run key, and `harness check` over the store (the bench's `problems`) verifies every id."""
    srcs = sorted(source.rglob("*.json"))
    # run artifacts only: a fidelity or calibration artifact has no pass to vary; and none of a rate sweep's points,
    # which name their probes by id (a copy's re-stamped probes would leave them naming nothing: check says so)
    docs = [d for d in (load_path(p).model_dump(mode="json") for p in srcs)
            if d["kind"] == "run" and "sweep" not in ((d.get("workload") or {}).get("load") or {})]
    if not docs:
        raise SystemExit(f"{source}: no run artifacts to copy; run `make demo` first")
    (root / "bench").mkdir(parents=True)
    for i in range(n):
        d = dict(docs[i % len(docs)])
        g = d["grid"] = dict(d["grid"], name="bench", pass_index=i // len(docs))
        g["run_key"] = check.run_key(g["cell"], g["arm"], g["pass_index"])  # consistent, as check requires
        d["id"] = artifact.compute_id(d)
        (root / "bench" / f"{d['id']}.json").write_text(json.dumps(d, sort_keys=True, indent=1, ensure_ascii=False)
                                                        + "\n")
    return root


def add_one(root: Path, source: Path) -> Path:
    """One more run artifact in the bench's store (a copy of the first with a pass index no other has)."""
    doc = next(d for d in (load_path(p).model_dump(mode="json") for p in sorted(source.rglob("*.json")))
               if d["kind"] == "run")
    g = doc["grid"] = dict(doc["grid"], name="bench", pass_index=10**6)
    g["run_key"] = check.run_key(g["cell"], g["arm"], g["pass_index"])
    doc["id"] = artifact.compute_id(doc)
    path = root / "bench" / f"{doc['id']}.json"
    path.write_text(json.dumps(doc, sort_keys=True, indent=1, ensure_ascii=False) + "\n")
    return path


def store_caches(root: Path) -> list[Path]:
    """Every cache file under the user's cache folder that belongs to the store at root (its head names it)."""
    real, out = str(root.resolve()), []
    for p in (cache_root() / "verified").glob("*.cache"):
        try:
            with open(p, "rb") as f:
                if json.loads(f.readline(1 << 16)).get("store") == real:
                    out.append(p)
        except (OSError, ValueError, AttributeError):
            continue
    return out


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench")
    ap.add_argument("-n", type=int, default=100_000)
    ap.add_argument("--source", default=str(PROJECT_ROOT / "artifacts"))
    ap.add_argument("--check-target", type=float, default=CHECK_TARGET_S, help="seconds, the first check")
    ap.add_argument("--report-target", type=float, default=REPORT_TARGET_S,
                    help="seconds, the first report and the report after one new artifact")
    ap.add_argument("--one-new", action="store_true", help="(always: kept for old command lines)")
    args = ap.parse_args(argv)
    load = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as tmp:
        root = make_store(Path(tmp) / "store", args.n, Path(args.source))
        time.sleep(hashcache.RACY_NS / 1e9)  # a store at rest: none of its files changed just before it is read
        for p in store_caches(root):  # a new store: its caches are empty, the first calls cold
            p.unlink()
        try:
            check_cold, (_, cold_problems) = timed(lambda: check.check([str(root)]))
            check_warm, (count, problems) = timed(lambda: check.check([str(root)]))
            report_cold, cold_text = timed(lambda: report.render([str(root)]))
            report_warm, text = timed(lambda: report.render([str(root)]))
            add_one(root, Path(args.source))
            one_new, new_text = timed(lambda: report.render([str(root)]))
            if new_text == text:
                raise SystemExit("harness.bench: the report did not change when an artifact was added")
        finally:
            for p in store_caches(root):
                p.unlink(missing_ok=True)
    if text != cold_text or problems != cold_problems:
        raise SystemExit("harness.bench: the warm check or report differs from the cold one (a cache bug)")
    dirty = sum(1 for p in problems if ": harness.dirty:" in p)
    ok = check_cold <= args.check_target and report_cold <= args.report_target and one_new <= args.report_target
    result = {"artifacts": count, "check_cold_s": round(check_cold, 3), "check_warm_s": round(check_warm, 3),
              "check_target_s": args.check_target, "report_cold_s": round(report_cold, 3),
              "report_warm_s": round(report_warm, 3), "report_target_s": args.report_target,
              "report_one_new_s": round(one_new, 3),
              "problems": len(problems) - dirty, "met": ok, "loadavg_before": load,
              "cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}
    print(json.dumps(result, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
