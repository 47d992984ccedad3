"""The same load sent by a tool no one here wrote: vLLM's serving benchmark (`vllm bench serve`), the serving
cross-check's client (an arm's `options.client: vllm-bench`). Runs in the serving worker's process (worker.py),
under the harness's environment, where the installed vLLM is."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from harness.serving import Endpoint, Load

VLLM_BENCH = ("vllm bench serve (vllm.benchmarks.serve.main_async, the installed vLLM's), its dataset the harness's "
              "prompts, one connection per request (its aiohttp connector with force_close, as the harness's client)")


# the serving metrics whose medians vLLM's report prints, and its key for each (milliseconds)
PRINTED = {"ttft_p50_s": "median_ttft_ms", "itl_all_p50_s": "median_itl_ms", "tpot_p50_s": "median_tpot_ms"}


def printed_medians(reports: list, medians: tuple[str, ...]) -> dict[str, float]:
    """Of one run's reports (one per repetition, as printed), each metric's median over them, in seconds."""
    out = {}
    for m in medians:
        key = PRINTED.get(m)
        reps = [r[key] / 1000.0 for r in reports if key and isinstance(r, dict) and isinstance(r.get(key), (int, float))
                and not isinstance(r.get(key), bool) and math.isfinite(r[key])]
        if reps:
            out[m] = statistics.median(reps)
    return out


def _one_request_per_connection(connector: type) -> type:
    class OneRequestPerConnection(connector):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            kw.pop("keepalive_timeout", None)  # aiohttp refuses a keep-alive timeout beside force_close
            super().__init__(*a, **{**kw, "force_close": True})
    return OneRequestPerConnection


def run(ep: Endpoint, load: Load, prompts: list[list[int]], warmup_prompts: list[list[int]],
                   gen_len: int, tokenizer: str | None) -> dict[str, Any]:
    """One repetition of the load sent by vLLM's serving benchmark instead of this module's client: the same
    prompts (its dataset is the harness's token ids, sent as ids), length, concurrency cap, rate, burstiness and
    seed. Its per-request results (start time, TTFT, each inter-token gap, latency, its output count) become
    records of run_load's shape, so the serving metrics are computed by the same definitions; its own printed
    medians are kept beside them (`tool_report`)."""
    import argparse
    from vllm.benchmarks import serve as vb
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    if load.arrival == "constant":
        raise ValueError("vllm bench serve has no constant arrivals (use poisson or gamma)")
    parser = FlexibleArgumentParser()
    vb.add_cli_args(parser)
    argv = ["--backend", "openai", "--base-url", ep.base_url, "--endpoint", "/v1/completions", "--model", ep.model,
            "--dataset-name", "custom", "--dataset-path", "harness-prompts", "--num-prompts", str(len(prompts)),
            "--ignore-eos", "--temperature", "0", "--seed", str(load.seed), "--save-detailed", "--disable-tqdm",
            "--num-warmups", str(len(warmup_prompts)), "--request-rate", str(load.rate or "inf"),
            "--burstiness", str(load.burstiness if load.arrival == "gamma" else 1.0),
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"]
    if load.concurrency:
        argv += ["--max-concurrency", str(load.concurrency)]
    if ep.extra:
        argv += ["--extra-body", json.dumps(ep.extra)]
    argv += ["--tokenizer", tokenizer] if tokenizer else ["--skip-tokenizer-init"]
    args: argparse.Namespace = parser.parse_args(argv)
    samples = [SampleRequest(prompt=ids, prompt_len=len(ids), expected_output_len=gen_len) for ids in prompts]
    real, connector = vb.get_samples, vb.aiohttp.TCPConnector
    vb.get_samples = lambda *_a, **_k: list(samples)  # its dataset: the harness's prompts; all else is vLLM's
    # but its connections: vLLM pools keep-alive connections, and a server that closes one it holds idle
    # (llama-server does) fails the request sent on it ("Server disconnected", "Can not write request body": 1 of
    # 16 requests in the first cross-check series, 1 of 6 in a test); one connection per request, as this module's
    vb.aiohttp.TCPConnector = _one_request_per_connection(connector)
    try:
        res = vb.main(args)
    finally:
        vb.get_samples, vb.aiohttp.TCPConnector = real, connector
    starts = res.get("start_times") or []
    t0 = min(starts, default=0.0)
    recs = []
    for i, ids in enumerate(prompts):
        err = (res.get("errors") or [""] * len(prompts))[i] or None
        sent = starts[i] - t0 if i < len(starts) else 0.0
        ttft, itl = res["ttfts"][i], list(res["itls"][i] or [])
        chunks = [] if err else [sent + ttft]
        for gap in ([] if err else itl):
            chunks.append(chunks[-1] + gap)
        n_out = res["output_lens"][i]
        recs.append({"i": i, "warmup": False, "scheduled_s": None, "prompt_tokens": len(ids), "sent_s": sent, "asked": gen_len,
                     "chunks_s": chunks, "chunk_tokens": [1] * len(chunks), "error": err,
                     "usage": {"prompt_tokens": res["input_lens"][i], "completion_tokens": n_out,
                               "counted_by": "vllm bench serve"},
                     "end_s": sent + (res["latencies"][i] or 0.0)})
    report = {k: v for k, v in res.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
    # in flight from the records' own send and end times (vLLM's max_concurrent_requests also counts requests
    # waiting on its concurrency cap)
    edges = sorted([(r["sent_s"], 1) for r in recs] + [(r["end_s"], -1) for r in recs], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return {"warmup_requests": [], "requests": recs, "most_in_flight": most,
            "tool_report": report, "warmups_sent_by_tool": len(warmup_prompts)}
