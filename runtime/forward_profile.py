"""Where a vLLM decode step's time goes op by op: torch.profiler over the decode steps of one request.

Usage: python -m runtime.forward_profile --model smollm2-135m [--threads 2] [--patches all,decode-gemv]
           [--compiled] [--prompt-len 128] [--tokens 64] [--top 25] [--out FILE.json]

The engine is built as runtime/worker.py builds it (same threads, bind list and patches); one request warms
it up, then a second one is profiled from its first decode step to its last (its prefill step is left out).
Per op (self CPU time, the profiler's key averages): milliseconds per decode step and calls per step,
sorted by time. The profiler itself adds a few microseconds per recorded op, so its figures are a
direction for what to patch next, not a measurement: the series the harness stores are the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--patches", default="all")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--compiled", action="store_true", help="eager: false (torch.compile)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out")
    ap.add_argument("--kernel-check", action="store_true",
                    help="also time the decode-gemv kernel alone over the model's own linear weights, in this process")
    ap.add_argument("--inductor", action="append", default=[], metavar="KEY=JSON",
                    help="an inductor setting for the compiled forward (compilation_config.inductor_compile_config)")
    a = ap.parse_args(argv)
    os.environ["EDGE_HARNESS_PATCHES"] = a.patches
    from harness import models
    from runtime import worker
    form = "hf-fp32" if a.dtype == "float32" else "hf-bf16"
    cfg = {"threads": a.threads, "model_dir": str(models.form_path(a.model, form)), "dtype": a.dtype,
           "context_len": a.prompt_len + a.tokens + 64, "eager": not a.compiled}
    worker._bind_env(cfg)
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    extra = {}
    if a.inductor:
        extra["compilation_config"] = {"inductor_compile_config": {k: json.loads(v) for k, v in
                                                                  (i.split("=", 1) for i in a.inductor)}}
    llm = worker._llm(cfg, **extra)
    engine = llm.llm_engine
    params = SamplingParams(max_tokens=a.tokens, min_tokens=a.tokens, ignore_eos=True, temperature=0.0)
    ids = [(17 * i + 3) % 1000 + 100 for i in range(a.prompt_len)]

    def request(rid: str, prof=None) -> tuple[int, float]:
        engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), params)
        engine.step()  # the prefill step
        if prof is not None:
            prof.start()
        n, t0 = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            n += 1
        dt = time.perf_counter() - t0
        if prof is not None:
            prof.stop()
        return n, dt

    request("warm")
    n_plain, t_plain = request("plain")
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    n, t = request("profiled", prof)
    rows = []
    for e in prof.key_averages():
        rows.append({"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / n, "calls_per_step": e.count / n})
    rows.sort(key=lambda r: -r["ms_per_step"])
    total = sum(r["ms_per_step"] for r in rows)
    print(f"{a.model} {a.dtype} {a.threads} threads, patches {a.patches}, {'compiled' if a.compiled else 'eager'}, "
          f"loadavg {os.getloadavg()}")
    print(f"decode step unprofiled {1e3 * t_plain / n_plain:.2f} ms, profiled {1e3 * t / n:.2f} ms, "
          f"sum of ops' self time {total:.2f} ms")
    print(f"{'op':<70}{'ms/step':>9}{'calls':>8}")
    for r in rows[:a.top]:
        print(f"{r['op'][:69]:<70}{r['ms_per_step']:>9.3f}{r['calls_per_step']:>8.1f}")
    if a.kernel_check:
        print(f"decode-gemv kernel alone over every linear weight of the model, in order: {kernel_alone(llm):.2f} ms")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "step_ms_unprofiled": 1e3 * t_plain / n_plain, "step_ms_profiled": 1e3 * t / n,
                       "rows": rows, "loadavg": os.getloadavg()}, f, indent=1)
    return 0


def kernel_alone(llm, rounds: int = 20) -> float:
    """Milliseconds per pass of the decode-gemv kernel over each linear weight of the loaded model at M = 1, in
    module order (a decode step's sequence of weights, without anything between them): median of `rounds`."""
    import statistics
    import torch
    from runtime import gemv
    kern = gemv.load().linear_small_m

    def timed(model):
        ws = [m.weight for m in model.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)
              and m.weight.dim() == 2 and type(m).__name__.endswith("Linear")]
        xs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in ws}
        ts = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for w in ws:
                kern(xs[w.shape[1]], w, None)
            ts.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(ts), len(ws), torch.get_num_threads(), sorted(os.sched_getaffinity(0))
    ms, n, th, aff = llm.apply_model(timed)[0]
    print(f"  ({n} weights, torch threads {th}, CPUs {aff})")
    return ms


if __name__ == "__main__":
    sys.exit(main())
