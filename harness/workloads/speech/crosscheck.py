"""The speech metrics cross-checked another way (docs/speech.md, "Cross-check"):
`python -m harness.workloads.speech.crosscheck [--store artifacts] [--grid speech] [--threads 2] [--text long]`.

The harness's time to first audio and real-time factor of piper-fp32 (the newest series of the grid on this host,
per text: the median over every request that spoke it) beside the same texts spoken by Piper's own command line
(`python -m piper --output-raw`, streaming raw PCM to a pipe as each sentence is made), pinned to the same CPUs,
read by this script: a text is written to its stdin and stamped, the first bytes' arrival is its time to first
audio, and the arrival of its last byte (the text's length in samples as the harness recorded it: synthesis is
deterministic) over the audio's duration its real-time factor. A warm-up text first (it also tells the voice is
loaded). Prints JSON: per text and overall medians, and their ratios. A measurement: run it on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ARM = "piper-fp32"


def harness_figures(store: str, grid: str, host: str, threads: int, text: str) -> dict[str, dict]:
    """Per text id: the harness's ttfa_s and rtf samples, its samples count, from the newest series on `host`."""
    from harness.analysis import newest_series
    from harness.report.inputs import collect
    runs = [a for a in collect([store]).runs.get(grid, []) if a.host.key == host]
    out: dict[str, dict] = {}
    for a in newest_series(runs):
        p = a.grid.cell_params
        if a.status != "ok" or a.grid.arm != ARM or p.get("threads") != threads or p.get("text") != text:
            continue
        eff = a.execution.effective
        warm = a.workload.warmups
        for k, tid in enumerate(eff["texts"][warm:]):
            row = out.setdefault(tid, {"ttfa_s": [], "rtf": [], "samples": sum(eff["chunk_samples"][warm + k]),
                                       "sample_rate": eff["sample_rate"], "voice": a.model.name})
            row["ttfa_s"].append(a.metrics["ttfa_s"].samples[k])
            row["rtf"].append(a.metrics["rtf"].samples[k])
    return out


class _Reader(threading.Thread):
    """Reads the CLI's stdout, counting bytes and stamping each read."""

    def __init__(self, f) -> None:
        super().__init__(daemon=True)
        self.f, self.total, self.stamps, self.lock = f, 0, [], threading.Lock()

    def run(self) -> None:
        while True:
            data = os.read(self.f.fileno(), 1 << 16)
            if not data:
                return
            now = time.perf_counter()
            with self.lock:
                self.total += len(data)
                self.stamps.append((now, self.total))

    def stamp_of(self, n: int, timeout: float) -> float:
        """The stamp of the read at which at least `n` bytes had arrived (waited for)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                if self.total >= n:
                    return next(t for t, total in self.stamps if total >= n)
            time.sleep(0.0005)
        raise TimeoutError(f"the CLI wrote {self.total} bytes, {n} expected")


def cli_figures(texts: dict[str, str], h: dict[str, dict], threads: int, repeats: int) -> dict[str, dict]:
    """Per text: Piper's CLI's time to first audio and real-time factor (`h`: the harness's figures, for each text's
    length in samples, its sample rate and the voice)."""
    from harness import voices
    d = voices.ensure(next(iter(h.values()))["voice"], "voice-fp32")
    cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:threads])
    cmd = ["taskset", "-c", cpus, sys.executable, "-m", "piper", "-m", str(d / voices.ONNX_NAME), "-c",
           str(d / voices.CONFIG_NAME), "--output-raw", "--noise-scale", "0", "--noise-w-scale", "0", "--no-normalize"]
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    reader = _Reader(p.stdout)
    reader.start()
    out: dict[str, dict] = {}
    try:
        p.stdin.write(b"Ready.\n")  # the warm-up: its audio says the voice is loaded
        p.stdin.flush()
        reader.stamp_of(1, 120)
        time.sleep(0.5)
        for _ in range(repeats):
            for tid, text in texts.items():
                with reader.lock:
                    start_bytes = reader.total
                t0 = time.perf_counter()
                p.stdin.write(text.replace("\n", " ").encode() + b"\n")
                p.stdin.flush()
                first = reader.stamp_of(start_bytes + 1, 120)
                last = reader.stamp_of(start_bytes + 2 * h[tid]["samples"], 300)
                row = out.setdefault(tid, {"ttfa_s": [], "rtf": []})
                row["ttfa_s"].append(first - t0)
                row["rtf"].append((last - t0) / (h[tid]["samples"] / h[tid]["sample_rate"]))
                time.sleep(0.2)
    finally:
        p.stdin.close()
        p.wait(30)
    return out


def main(argv: list[str] | None = None) -> int:
    from harness.probe import probe
    from harness.workloads.speech import texts as T
    ap = argparse.ArgumentParser(prog="python -m harness.workloads.speech.crosscheck")
    ap.add_argument("--store", default="artifacts")
    ap.add_argument("--grid", default="speech")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", default="long", choices=T.names())
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    host = probe()["key"]
    h = harness_figures(args.store, args.grid, host, args.threads, args.text)
    if not h:
        raise SystemExit(f"no {ARM} runs of grid {args.grid} at threads {args.threads}, text {args.text} on host {host}")
    texts = {tid: T.TEXTS[args.text][int(tid.split("[")[1][:-1])] for tid in sorted(h)}
    c = cli_figures(texts, h, args.threads, args.repeats)
    med = statistics.median
    rows = {tid: {"harness_ttfa_s": med(h[tid]["ttfa_s"]), "cli_ttfa_s": med(c[tid]["ttfa_s"]),
                  "harness_rtf": med(h[tid]["rtf"]), "cli_rtf": med(c[tid]["rtf"]), "harness_n": len(h[tid]["rtf"]),
                  "cli_n": len(c[tid]["rtf"])} for tid in sorted(h)}
    overall = {k: med(r[k] for r in rows.values()) for k in ("harness_ttfa_s", "cli_ttfa_s", "harness_rtf", "cli_rtf")}
    overall |= {"ttfa_cli_over_harness": overall["cli_ttfa_s"] / overall["harness_ttfa_s"],
                "rtf_cli_over_harness": overall["cli_rtf"] / overall["harness_rtf"]}
    print(json.dumps({"host": host, "grid": args.grid, "arm": ARM, "threads": args.threads, "text": args.text,
                      "loadavg_before": Path("/proc/loadavg").read_text().split()[:3], "texts": rows,
                      "medians": overall}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
