"""Speed benchmarks of the harness's own code (`make bench`): check and report over 10,000 artifacts.

The artifacts are copies of a real committed artifact with a different pass index each
(re-stamped with their own ids) in a temporary store: a workload for the checker and the
report, never published. Run on an idle machine; the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from harness import artifact, check, report
from harness.paths import PROJECT_ROOT
from harness.schedule import run_key
from harness.store import Store, load_path


def make_store(root: Path, n: int, source: Path) -> Path:
    srcs = sorted(source.rglob("*.json"))
    if not srcs:
        raise SystemExit(f"{source}: no artifacts to copy; run `make demo` first")
    st = Store(root)
    # run artifacts only: a fidelity or calibration artifact has no pass to vary
    docs = [d for d in (load_path(p).model_dump(mode="json") for p in srcs) if d["kind"] == "run"]
    for i in range(n):
        d = dict(docs[i % len(docs)])
        g = dict(d["grid"])
        g["name"] = "bench"
        g["pass_index"] = i // len(docs)
        g["run_key"] = run_key(g["cell"], g["arm"], g["pass_index"])  # consistent, as check requires
        d["grid"] = g
        st.write(artifact.finalize(d))
    return root


def timed(fn, repeat: int = 3) -> tuple[float, float, object]:
    """(best of `repeat`, the first: no template or file-system cache warmed by an earlier call, result)."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return min(times), times[0], out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.bench")
    ap.add_argument("-n", type=int, default=10_000)
    ap.add_argument("--source", default=str(PROJECT_ROOT / "artifacts"))
    args = ap.parse_args(argv)
    load = Path("/proc/loadavg").read_text().split()[:3]
    with tempfile.TemporaryDirectory(prefix="edge-bench-") as tmp:
        root = make_store(Path(tmp) / "store", args.n, Path(args.source))
        t_check, first_check, (count, problems) = timed(lambda: check.check([str(root)]))
        t_report, first_report, text = timed(lambda: report.render([str(root)]))
    dirty = sum(1 for p in problems if ": harness.dirty:" in p)
    result = {"artifacts": count, "check_s": round(t_check, 3), "check_first_s": round(first_check, 3),
              "check_target_s": 3.0, "report_s": round(t_report, 3), "report_first_s": round(first_report, 3),
              "report_target_s": 5.0, "problems": len(problems) - dirty,
              "loadavg_before": load, "python": sys.version.split()[0]}
    print(json.dumps(result, indent=1))
    return 0 if t_check <= 3.0 and t_report <= 5.0 else 1


if __name__ == "__main__":
    sys.exit(main())
