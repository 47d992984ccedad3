"""Decode-sized matmuls (M = 1 token) per weight shape of a model, each candidate kernel against the read
bandwidth: which kernel streams a weight matrix fastest at batch 1? The evidence a GEMV patch needs before
it is written (#17: the first look put ~69% of vLLM's decode forward in oneDNN matmul calls).

Usage: python -m runtime.gemv_bench --model smollm2-135m [--threads 2] [--dtype float32] [--out FILE.json]

Candidates, each on the same weight (N x K, vLLM's layout) and the same input row:
- onednn_mm: what vLLM's CPU linear uses (vllm._custom_ops.create_onednn_mm / onednn_mm, as
  dispatch_cpu_unquantized_gemm sets it up);
- torch_linear: torch.nn.functional.linear (ATen: MKL/oneDNN as torch dispatches it);
- torch_mv: torch.mv(W, x), ATen's matrix-vector product;
- edge_gemv: runtime/gemv.py's kernel (patch decode-gemv), where the CPU has AVX2.
Per shape: the median of `--iters` calls after warm-up, weight bytes / time (GB/s), and that as a share of
the read bandwidth measured in the same process (a sum over a 1 GiB tensor, as `harness probe --bandwidth`).
Each call reads a different copy of the weight, round robin over copies of at least 256 MiB in all, so that
no call finds its weight in the caches (as in a decode step, where each layer's weights are read once).
A candidate that cannot run a shape (oneDNN without a bf16 matmul on an AVX2 CPU) records its error.
Run it on an idle machine; it prints the load average beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def shapes(cfg: dict) -> dict[str, tuple[int, int]]:
    """(N, K) of each linear layer of one decoder layer, as vLLM fuses them, and the LM head."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    hd = cfg.get("head_dim") or h // heads
    inter = cfg["intermediate_size"]
    return {"qkv_proj": ((heads + 2 * kv) * hd, h), "o_proj": (h, heads * hd), "gate_up_proj": (2 * inter, h),
            "down_proj": (h, inter), "lm_head": (cfg["vocab_size"], h)}


def _time(fn, iters: int) -> float:
    for _ in range(max(3, iters // 10)):
        fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def bandwidth(torch) -> float:
    x = torch.ones(1 << 28, dtype=torch.float32)
    x.sum()
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out")
    a = ap.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, range(a.threads))))
    import torch
    torch.set_num_threads(a.threads)
    from vllm import _custom_ops as ops
    from harness import models
    from runtime import gemv
    kern = gemv.load().linear_small_m if gemv.unavailable() is None else None
    cfg = json.loads((models.form_path(a.model, "hf-fp32") / "config.json").read_text())
    dt = getattr(torch, a.dtype)
    bw = bandwidth(torch)
    torch.manual_seed(0)
    rows = []
    for name, (n, k) in shapes(cfg).items():
        nbytes = n * k * torch.empty((), dtype=dt).element_size()
        copies = max(1, -(-(256 << 20) // nbytes))
        ws = [torch.randn(n, k, dtype=dt) * 0.02 for _ in range(copies)]
        x = torch.randn(1, k, dtype=dt)
        ref = torch.nn.functional.linear(x.float(), ws[0].float())
        row = {"layer": name, "n": n, "k": k, "weight_bytes": nbytes, "copies": copies}
        try:
            handlers = [ops.create_onednn_mm(w.t(), 32) for w in ws]
        except RuntimeError as e:
            handlers, row["onednn_mm"] = None, {"error": str(e).splitlines()[0]}
        it = {"i": 0}

        def nxt() -> int:
            it["i"] = (it["i"] + 1) % copies
            return it["i"]
        cands = {"torch_linear": lambda: torch.nn.functional.linear(x, ws[nxt()]),
                 "torch_mv": lambda: torch.mv(ws[nxt()], x[0])}
        if handlers:
            cands = {"onednn_mm": lambda: ops.onednn_mm(handlers[nxt()], x, None), **cands}
        if kern is not None:
            cands["edge_gemv"] = lambda: kern(x, ws[nxt()], None)
        for cname, fn in cands.items():
            it["i"] = copies - 1  # the first call reads copy 0, whose output ref is
            err = (fn().float().reshape(1, -1) - ref).abs().max().item()
            s = _time(fn, a.iters)
            row[cname] = {"us": s * 1e6, "gb_s": nbytes / s / 1e9, "bw_share": nbytes / s / 1e9 / bw, "max_abs_err": err}
        rows.append(row)
        del ws, handlers
    out = {"model": a.model, "threads": a.threads, "dtype": a.dtype, "read_bandwidth_gb_s": bw,
           "torch": torch.__version__, "loadavg": os.getloadavg(), "rows": rows, "iters": a.iters}
    COLS = ("onednn_mm", "torch_linear", "torch_mv", "edge_gemv")
    print(f"{a.model} {a.dtype} {a.threads} threads, read bandwidth {bw:.1f} GB/s, loadavg {out['loadavg']}")
    print(f"{'layer':<14}{'N x K':>14}" + "".join(f"{c:>26}" for c in COLS))
    for r in rows:
        cells = "".join(f"{r[c]['us']:>9.1f} us {100 * r[c]['bw_share']:>5.0f}% bw    " if "us" in r.get(c, {}) else
                        f"{'unavailable':>26}" for c in COLS)
        print(f"{r['layer']:<14}{r['n']:>7} x {r['k']:<6}{cells}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
