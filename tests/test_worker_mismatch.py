"""The request and token-count checks every worker engine (OpenVINO, ONNX Runtime GenAI, ExecuTorch) shares:
a worker that read back another count than was asked makes the run fail, named in the engine's own words."""
import pytest

from harness.engines import get_engine

ENGINES = {"openvino": "the library counted", "onnxruntime-genai": "the generator held",
           "executorch": "the program was fed"}


def _eff(prompt=(16, 16), output=(8, 8)) -> dict:
    return {"prompt_tokens": list(prompt), "output_tokens": list(output)}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_counts_checked_before_the_build(name, monkeypatch):
    eng = get_engine(name)
    assert eng.prompt_counted == ENGINES[name]
    seen = []
    monkeypatch.setattr(eng, "build_mismatch", lambda info, eff, threads: seen.append(threads) or "build")
    assert eng.mismatch({}, _eff(), 16, 8, 1, 2, 2) == "the worker ran 1 requests, 2 were asked"
    assert eng.mismatch({}, _eff(prompt=(16, 15)), 16, 8, 2, 2, 2) == \
        f"{ENGINES[name]} [16, 15] prompt tokens, prompt_len is 16"
    assert eng.mismatch({}, _eff(output=(8, 7)), 16, 8, 2, 2, 2) == \
        "the requests returned [8, 7] tokens, gen_len is 8"
    assert seen == []  # a count mismatch is reported before the build is looked at
    assert eng.mismatch({}, _eff(), 16, 8, 2, 2, 3) == "build"
    assert seen == [3]


STARVED = r"""
import hashlib, json, os, sys, threading
from harness.engines import workerlib
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # both pool threads on one CPU
stop, buf, ready = threading.Event(), bytes(1 << 20), threading.Barrier(3)
def work(nice):
    if nice:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # the scheduler keeps it off the CPU
    ready.wait()
    while not stop.is_set():
        hashlib.sha256(buf).digest()  # releases the GIL: both threads runnable at once
def asleep():
    ready.wait()
    stop.wait()
ts = [threading.Thread(target=work, args=(0,)), threading.Thread(target=work, args=(1,)),
      threading.Thread(target=asleep)]
[t.start() for t in ts]
before = workerlib.thread_times_ns()
stop.wait(1.0)
after = workerlib.thread_times_ns()
stop.set()
[t.join() for t in ts]
busy = {}
workerlib.add_busy(busy, before, after)
print(json.dumps({"running": workerlib.running_threads(busy), "busy": list(busy.values())}))
"""


def test_a_pool_thread_kept_off_the_cpu_still_counts_and_a_sleeping_one_does_not():
    """Two threads with the model's work on one CPU, the second at nice 19 (as a loaded machine would starve it):
    its CPU time is about 1.5% of the first's, its time runnable and waiting makes up the rest, so the read-back
    counts both; a thread asleep the whole time counts for nothing. A CPU-time share alone counted one (the run
    the executorch test stored under a cold suite's load: threads requested 2, effective 1)."""
    import json
    import subprocess
    import sys

    from harness.paths import PROJECT_ROOT
    r = subprocess.run([sys.executable, "-c", STARVED], capture_output=True, text=True, timeout=60, cwd=PROJECT_ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout)
    assert len(out["running"]) == 2, out
    run = sorted(out["running"])
    assert run[0] < 0.10 * run[1], out  # the starved one: by CPU time alone it would not have counted
