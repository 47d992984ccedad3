"""What the engines' fresh-process workers share (harness/engines/openvino, onnxruntime and executorch worker.py).

Standard library at import (numpy inside the functions that need it): a worker imports this and its own engine's
library, nothing else of the harness. The result file is written atomically; the threads that ran the model are
read from the kernel; the fidelity helpers give the rows of edge-fidelity.cpp's result format.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import traceback
from typing import Any, Callable

# a thread counts as running the model when its time on a CPU and waiting for one (runnable, not sleeping) is at least
# this share of the busiest thread's: a pool thread that a loaded machine kept off the CPUs still had the model's work
BUSY_SHARE = 0.10
RUNNING_THREADS = ("threads of the worker process whose time on a CPU or runnable waiting for one was at least 10% of "
                   "the busiest one's (/proc/self/task/*/schedstat) over the measured requests")


def thread_times_ns(pid: int | str = "self") -> dict[int, tuple[int, int]]:
    """Each thread of this process (or of process `pid`): its time on a CPU and its time runnable, waiting for one
    (ns; the first two fields of /proc/PID/task/*/schedstat). A thread asleep, waiting for work, accrues neither."""
    out = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # gone
        return out
    for t in tasks:
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                run, wait = f.read().split()[:2]
            out[int(t)] = (int(run), int(wait))
        except (OSError, ValueError):
            pass
    return out


def add_busy(busy_ns: dict[int, tuple[int, int]], before: dict[int, tuple[int, int]],
             after: dict[int, tuple[int, int]]) -> None:
    """Add each thread's times between two thread_times_ns readings to busy_ns."""
    for tid, (run, wait) in after.items():
        r0, w0 = before.get(tid, (0, 0))
        r, w = busy_ns.get(tid, (0, 0))
        busy_ns[tid] = (r + run - r0, w + wait - w0)


def running_threads(busy_ns: dict[int, tuple[int, int]]) -> list[int]:
    """The CPU times (ns, busiest first) of the threads that had the model's work: on a CPU or waiting for one for
    at least BUSY_SHARE of the busiest thread's time."""
    top = max((r + w for r, w in busy_ns.values()), default=0)
    return sorted((r for r, w in busy_ns.values() if top and r + w >= BUSY_SHARE * top), reverse=True)


def write_result(out_path: str, compute: Callable[[], dict[str, Any]], one_line: Callable[[str], str] = str) -> int:
    """Run compute() and write its result (or the exception, as a failed result) to out_path atomically: the
    harness stores a failure as a failed run. The exit code: 0 when the result's status is ok."""
    try:
        res = compute()
        code = 0 if res["status"] == "ok" else 1
    except Exception as e:
        traceback.print_exc()
        res = {"status": "failed", "error": f"{type(e).__name__}: {one_line(str(e))}"[:600],
               "traceback": traceback.format_exc()[-4000:]}
        code = 1
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, out_path)
    return code


def main(measure: Callable[[dict], dict[str, Any]], fidelity: Callable[[dict], dict[str, Any]]) -> int:
    """A worker's command line, `REQUEST.json RESULT.json` or `--fidelity CONFIG.json RESULT.json`: the exit code."""
    args = sys.argv[1:]
    mode = "fidelity" if args[:1] == ["--fidelity"] else "measure"
    args = args[1:] if mode == "fidelity" else args
    if len(args) != 2:
        print("usage: worker.py REQUEST.json RESULT.json | worker.py --fidelity CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    doc = json.loads(open(args[0]).read())
    return write_result(args[1], lambda: fidelity(doc) if mode == "fidelity" else measure(doc))


def log_softmax(logits):
    """Log-softmax of each row (float64)."""
    import numpy as np

    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))


def top_k(row, k: int) -> list:
    """The k most likely [id, logprob] of one position, ties to the lowest id (as edge-fidelity)."""
    import numpy as np

    k = min(k, row.size)
    kth = np.partition(row, row.size - k)[row.size - k]
    cand = np.nonzero(row >= kth)[0]
    order = cand[np.lexsort((cand, -row[cand]))][:k]
    return [[int(i), float(row[i])] for i in order]


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def scored_prompts(req: dict, greedy: Callable[[list[int]], list[int]], forced_logprobs: Callable, n_vocab: int
                   ) -> tuple[list[dict], str | None]:
    """Per prompt of a fidelity request: greedy ids (greedy(ids)) with their teacher-forced log-probabilities and
    top-k, and where asked the forced continuation's argmax, log-probabilities, candidates and top-k
    (forced_logprobs(ids, cont) -> [len(cont), n_vocab] log-probabilities). Returns (rows, error)."""
    n, k = int(req["n_predict"]), int(req["top_k"])
    out = []
    for p in req["prompts"]:
        ids = [int(i) for i in p["ids"]]
        if not ids or n < 1:
            return [], f"an empty prompt or n_predict {n}"
        g_ids = [int(i) for i in greedy(ids)]
        if len(g_ids) != n:
            return [], f"the engine returned {len(g_ids)} greedy tokens, n_predict is {n}"
        g_lp = forced_logprobs(ids, g_ids)
        rows = range(len(g_ids))
        res: dict[str, Any] = {"greedy": {"ids": g_ids, "logprobs": [float(g_lp[j, t]) for j, t in zip(rows, g_ids)],
                                          "top": [top_k(g_lp[j], k) for j in rows]}}
        if "forced" in p or p.get("self_forced"):
            forced = [int(i) for i in p["forced"]] if "forced" in p else g_ids
            if not forced:
                return [], "an empty forced continuation"
            lp = g_lp if forced == g_ids else forced_logprobs(ids, forced)
            cands = p.get("candidates") or []
            f_c = []
            for j in range(len(forced)):
                c = [int(v) for v in (cands[j] if j < len(cands) else [])]
                bad = [v for v in c if not 0 <= v < n_vocab]
                if bad:
                    return [], f"candidate id {bad[0]} out of range (vocabulary {n_vocab})"
                f_c.append([float(lp[j, v]) for v in c])
            res["forced"] = {"argmax": [int(a) for a in lp.argmax(axis=1)],
                             "logprobs": [float(lp[j, t]) for j, t in enumerate(forced)], "candidates": f_c,
                             "top": [top_k(lp[j], k) for j in range(len(forced))]}
        out.append(res)
    return out, None
