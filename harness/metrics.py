"""One definition per metric name, for every engine that serves requests: computed here, from per-token
timestamps, never by an engine adapter.

Each engine that implements the request contract returns, per repetition, the output-token timestamps of
each of its `batch` concurrent requests (seconds since the requests were submitted together). The same
prompt token ids go to every engine (`request_prompts`). From those timestamps alone:

- per request: TTFT, prefill rate, decode rate, inter-token latency p50/p90/p99/max, end-to-end time;
- per repetition: aggregate output tokens per second over the batch.

The definition texts below are written into every artifact's metrics, the same text for every engine.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from functools import lru_cache
from pathlib import Path

# name -> (unit, higher_is_better, definition)
REQUEST_METRICS: dict[str, tuple[str, bool, str]] = {
    "ttft_s": ("s", False, "time to first token: from submitting the request (all requests of a batch together) to "
                           "its first output token, sampled and detokenized; per request"),
    "prefill_tok_s": ("tok/s", True, "prompt tokens of the request / its TTFT; per request"),
    "decode_tok_s": ("tok/s", True, "(output tokens - 1) / (time of the last output token - time of the first); "
                                    "greedy, ignore_eos; per request"),
    "itl_p50_s": ("s", False, "median gap between consecutive output tokens of the request; per request"),
    "itl_p90_s": ("s", False, "90th percentile (linear interpolation) of the gaps between consecutive output tokens "
                              "of the request; per request"),
    "itl_p99_s": ("s", False, "99th percentile (linear interpolation) of the gaps between consecutive output tokens "
                              "of the request; per request"),
    "itl_max_s": ("s", False, "longest gap between consecutive output tokens of the request (the worst stall); "
                              "per request"),
    "e2e_s": ("s", False, "end-to-end latency: from submitting the request to its last output token; per request"),
    "output_tok_s": ("tok/s", True, "aggregate throughput: output tokens of all requests of the batch / time from "
                                    "submission to the last output token of any of them; per repetition"),
}
NAMES = tuple(REQUEST_METRICS)
DEFINITIONS_VERSION = "request-timestamps/1"


def percentile(xs: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    s = sorted(xs)
    if len(s) == 1:
        return s[0]
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def request_figures(times: list[float], prompt_len: int) -> dict[str, float]:
    """The per-request figures of one request's output-token timestamps (seconds since submission)."""
    if not times:
        raise ValueError("a request with no output token")
    gaps = [b - a for a, b in zip(times, times[1:])]
    out = {"ttft_s": times[0], "prefill_tok_s": prompt_len / times[0] if times[0] > 0 else float("inf"),
           "e2e_s": times[-1]}
    if gaps:
        span = times[-1] - times[0]
        out |= {"decode_tok_s": len(gaps) / span if span > 0 else float("inf"), "itl_p50_s": percentile(gaps, 50),
                "itl_p90_s": percentile(gaps, 90), "itl_p99_s": percentile(gaps, 99), "itl_max_s": max(gaps)}
    return out


def from_timestamps(samples: list[dict], prompt_len: int) -> dict[str, dict]:
    """Metrics (artifact form: unit, samples, warmup_samples, definition) from the engine's repetitions:
    `samples` = [{"warmup": bool, "requests": [{"token_times_s": [...]}, ...]}, ...]."""
    vals: dict[str, list[float]] = {n: [] for n in NAMES}
    warm: dict[str, list[float]] = {n: [] for n in NAMES}
    for s in samples:
        into = warm if s["warmup"] else vals
        for r in s["requests"]:
            for k, v in request_figures(r["token_times_s"], prompt_len).items():
                into[k].append(v)
        last = max(r["token_times_s"][-1] for r in s["requests"])
        into["output_tok_s"].append(sum(len(r["token_times_s"]) for r in s["requests"]) / last)
    out = {}
    for name, (unit, hib, definition) in REQUEST_METRICS.items():
        if not vals[name]:
            continue
        out[name] = {"unit": unit, "samples": vals[name], "warmup_samples": warm[name], "definition": definition}
        if not hib:
            out[name]["higher_is_better"] = False
    return out


# ---- serving under load (server engines, harness/serving.py) ---------------------------------------------------

# Over the measured requests of one repetition of a load (warm-up requests apart); each figure is one sample per
# repetition. A request's clock: `sent` when the client sends it, each output chunk stamped when it arrives.
_OVER = "over the repetition's measured requests that completed"
SERVING_STATS = {"p50": "median", "p90": "90th percentile (linear interpolation)",
                 "p99": "99th percentile (linear interpolation)", "max": "largest"}
SERVING_BASE: dict[str, tuple[str, str]] = {
    "ttft": ("s", "time to first token: from sending the request to the arrival of its first output chunk"),
    "tpot": ("s", "time per output token: (arrival of the last output chunk - of the first) / (output tokens - 1), "
                  "output tokens as the server counts them (usage) where that is what was asked, else as the client "
                  "received them"),
    "itl_all": ("s", "gaps between consecutive output chunks of a request, all requests' gaps pooled"),
    "e2e": ("s", "end-to-end latency: from sending the request to the arrival of its last output chunk"),
}
SERVING_METRICS: dict[str, tuple[str, bool, str]] = {
    f"{base}_{stat}_s": (unit, False, f"{SERVING_STATS[stat]} {_OVER} of the {text}")
    for base, (unit, text) in SERVING_BASE.items() for stat in SERVING_STATS}
SERVING_METRICS |= {
    "request_throughput_req_s": ("req/s", True, "measured requests that completed / (the last one's end - the first "
                                                "send); per repetition"),
    "serve_output_tok_s": ("tok/s", True, "output tokens of the measured requests that completed (the server's "
                                          "count where that is what was asked, else the client's) / (the last one's "
                                          "end - the first send); per repetition"),
    "goodput_share": ("share", True, "measured requests that completed within every bound of the grid's slo "
                                     "(ttft_s: TTFT, tpot_s: TPOT, e2e_s: e2e) / measured requests sent; per "
                                     "repetition"),
    "goodput_req_s": ("req/s", True, "measured requests that completed within every bound of the grid's slo / "
                                     "(the last one's end - the first send); per repetition"),
    "ttft_first_turn_p50_s": ("s", False, "the median over a repetition's conversations of their first turn's time "
                                          "to first token (the send to the first output chunk); conversations; per "
                                          "repetition"),
    "ttft_later_turns_p50_s": ("s", False, "the median over the later turns of a repetition's conversations (each "
                                           "resending the history) of the time to first token; conversations; per "
                                           "repetition"),
    "cache_hit_share": ("share", True, "prompt tokens the server says it took from its prefix cache / prompt tokens "
                                       "(its usage: prompt_tokens_details.cached_tokens, or llama-server's "
                                       "timings.cache_n), over the measured requests that completed, where every "
                                       "one reported it; per repetition"),
}
SERVING_DEFINITIONS_VERSION = "serving-chunks/2"  # 2: a server's count is taken only where it is what was asked


def request_latencies(r: dict) -> dict[str, float | list[float]]:
    """One completed request's TTFT, TPOT, chunk gaps and e2e (seconds), from its record (harness/serving.py)."""
    ch = r["chunks_s"]
    server, client = (r.get("usage") or {}).get("completion_tokens"), sum(r["chunk_tokens"])
    # the server's count where it is what was asked (the client may see several tokens in one text chunk), else
    # the client's: a server's word alone never makes a figure (records before `asked` was kept: as counted then)
    n = (server if server == r["asked"] else client) if "asked" in r else (server or client)
    out: dict[str, float | list[float]] = {"ttft": ch[0] - r["sent_s"], "e2e": ch[-1] - r["sent_s"],
                                           "itl_all": [b - a for a, b in zip(ch, ch[1:])], "tokens": float(n)}
    if n > 1:
        out["tpot"] = (ch[-1] - ch[0]) / (n - 1)
    return out


def meets(lat: dict, slo: dict[str, float]) -> bool:
    """Whether a request is within every latency bound of the slo (its `share`, a sweep's rule, is no bound)."""
    return all(lat.get(k[:-2], math.inf) <= v for k, v in slo.items() if k != "share")


def serving_figures(recs: list[dict], slo: dict[str, float] | None) -> dict[str, float]:
    """The serving metrics of one repetition's measured request records."""
    done = [r for r in recs if not r.get("error")]
    if not done:
        return {}
    lats = [request_latencies(r) for r in done]
    out: dict[str, float] = {}
    for base in SERVING_BASE:
        xs = [x for lat in lats for x in (lat[base] if isinstance(lat.get(base), list) else
                                          [lat[base]] if base in lat else [])]
        if xs:
            for stat in SERVING_STATS:
                out[f"{base}_{stat}_s"] = max(xs) if stat == "max" else percentile(xs, float(stat[1:]))
    span = max(r["end_s"] for r in done) - min(r["sent_s"] for r in recs)
    if span > 0:
        out["request_throughput_req_s"] = len(done) / span
        out["serve_output_tok_s"] = sum(lat["tokens"] for lat in lats) / span
    if any("turn" in r for r in done):  # conversations: the first turn apart from the later ones (the history)
        for name, pick in (("ttft_first_turn_p50_s", lambda t: t == 0), ("ttft_later_turns_p50_s", lambda t: t > 0)):
            xs = [lat["ttft"] for r, lat in zip(done, lats) if pick(r.get("turn", 0))]
            if xs:
                out[name] = percentile(xs, 50.0)
    said = [(r.get("usage") or {}).get("cached_tokens") for r in done]
    total = sum((r.get("usage") or {}).get("prompt_tokens") or 0 for r in done)
    if all(isinstance(x, int) for x in said) and total > 0:
        out["cache_hit_share"] = sum(said) / total
    if slo:
        good = sum(1 for lat in lats if meets(lat, slo))
        out["goodput_share"] = good / len(recs)
        if span > 0:
            out["goodput_req_s"] = good / span
    return out


def from_serving(samples: list[dict], slo: dict[str, float] | None) -> dict[str, dict]:
    """Metrics (artifact form) from a server engine's repetitions: samples = [{"requests": [...]}, ...]."""
    vals: dict[str, list[float]] = {n: [] for n in SERVING_METRICS}
    for s in samples:
        for k, v in serving_figures(s["requests"], slo).items():
            vals[k].append(v)
    out = {}
    for name, (unit, hib, definition) in SERVING_METRICS.items():
        if vals[name]:
            out[name] = {"unit": unit, "samples": vals[name], "warmup_samples": [], "definition": definition}
            if not hib:
                out[name]["higher_is_better"] = False
    return out


# ---- where a decode step's time goes (engines that time their parts: vLLM with the step-attribution patch,
# llama.cpp through edge-bench) ------------------------------------------------------------------------------

# part -> what it covers in every engine; each engine that times its steps says what the part is in it
# (StepParts.step_parts, StepParts.inside_forward), and a part's definition names them all (step_parts())
STEP_PART_NAMES: dict[str, str] = {
    "schedule": "choosing what runs this step",
    "prepare": "building the step's inputs",
    "forward": "the model's forward pass for the step, LM head included",
    "sample": "choosing the token from the logits, greedy",
    "update": "bookkeeping after the forward",
    "detokenize": "turning the token into text",
    "output": "building the request's output",
    "rest": "the step's own wall time less every part above: Python or C++ around the calls, queues",
}
MODEL_PARTS = ("forward",)
# timed inside the forward by the code that runs there: already in `forward`, never added to the parts' sum
INSIDE_FORWARD_NAMES: dict[str, str] = {
    "linear_kernel": "the linear layers' matrix-vector kernel alone, LM head included",
}


def _with_engines(names: dict[str, str], attr: str) -> dict[str, str]:
    """Each part's definition: what it covers, then what it is in each engine that times it."""
    from harness.engines import ENGINES, engine_class
    from harness.engines.capabilities import StepParts, has
    timed = sorted((c for c in map(engine_class, ENGINES) if has(c, StepParts) and getattr(c, attr)),
                   key=lambda c: c.step_parts_order)
    out = {}
    for part, text in names.items():
        notes = [getattr(c, attr)[part] for c in timed if part in getattr(c, attr)]
        out[part] = f"{text} ({'; '.join(notes)})" if notes else text
    return out


@lru_cache(maxsize=1)
def step_parts() -> dict[str, str]:
    """part -> its definition (recorded in every attribution block as part_definitions)."""
    return _with_engines(STEP_PART_NAMES, "step_parts")


@lru_cache(maxsize=1)
def inside_forward() -> dict[str, str]:
    return _with_engines(INSIDE_FORWARD_NAMES, "inside_forward")


ATTRIBUTION_DEFINITION = (
    "per decode step (after each request's first token, measured repetitions only), each part's wall time as "
    "the engine timed it inside the step (exclusive: a timed call inside another counts once); itl: the gap "
    "between the step's token timestamp and the previous one, the clock decode_tok_s is computed from; "
    "accounted = sum of the parts' means / mean itl (what is left is the loop outside the step); model_share = "
    "mean forward / mean itl")


def attribution(samples: list[dict], source: str) -> dict | None:
    """The attribution block of a run from its repetitions' per-step records
    (`steps`: [{part: seconds, ..., "step": s, "emitted": n, "first_tokens": n, "end_s": s}]), or None."""
    parts: dict[str, list[float]] = {}
    inside: dict[str, list[float]] = {}
    engine_forward: list[float] = []
    walls: list[float] = []
    gaps: list[float] = []
    for s in samples:
        if s.get("warmup") or not s.get("steps"):
            continue
        prev = None
        for st in s["steps"]:
            if not st.get("emitted"):
                continue
            if st.get("first_tokens", 0) == 0 and prev is not None:
                for k in STEP_PART_NAMES:
                    if k in st:
                        parts.setdefault(k, []).append(float(st[k]))
                for k in INSIDE_FORWARD_NAMES:
                    if k in st:
                        inside.setdefault(k, []).append(float(st[k]))
                walls.append(float(st["step"]))
                if "engine_forward" in st:
                    engine_forward.append(float(st["engine_forward"]))
                gaps.append(float(st["end_s"]) - prev)
            prev = float(st["end_s"])
    if not gaps:
        return None
    n = len(gaps)
    mean = {k: sum(v) / len(v) for k, v in parts.items()}
    itl = sum(gaps) / n
    out = {"source": source, "definition": ATTRIBUTION_DEFINITION, "steps": n,
           "parts": {k: _part(v) for k, v in parts.items()},
           "part_definitions": {k: step_parts()[k] for k in parts},
           "step_mean_ms": 1e3 * sum(walls) / n, "itl_mean_ms": 1e3 * itl, "itl_median_ms": 1e3 * percentile(gaps, 50),
           "accounted": sum(mean.values()) / itl if itl > 0 else None,
           "model_share": sum(mean.get(k, 0.0) for k in MODEL_PARTS) / itl if itl > 0 else None,
           "engine_forward_mean_ms": 1e3 * sum(engine_forward) / len(engine_forward) if engine_forward else None}
    if inside:
        out["inside_forward"] = {k: _part(v) for k, v in inside.items()}
        out["inside_forward_definitions"] = {k: inside_forward()[k] for k in inside}
    return out


def _part(v: list[float]) -> dict:
    return {"mean_ms": 1e3 * sum(v) / len(v), "median_ms": 1e3 * percentile(v, 50), "p90_ms": 1e3 * percentile(v, 90)}


# ---- the prompts every engine receives ------------------------------------------------------------------

def prompt_ids(seed: int, n: int, vocab: int, special: set[int]) -> list[int]:
    """n token ids drawn uniformly from [100, vocab), skipping special tokens: reproducible from the seed."""
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < n:
        t = rng.randrange(100, vocab)
        if t not in special:
            ids.append(t)
    return ids


@lru_cache(maxsize=None)
def vocabulary(model: str) -> tuple[int, frozenset[int]]:
    """The model's vocabulary size and special token ids, from its HF config and tokenizer files; `model` an
    absolute path: a tokenizer.json alone (an endpoint's arm `tokenizer`, where no model is prepared here), its
    vocabulary the tokenizer's, added tokens included."""
    if model.startswith("/"):
        from tokenizers import Tokenizer
        tok = json.loads(Path(model).read_text())
        vocab = Tokenizer.from_file(model).get_vocab_size(with_added_tokens=True)
        return vocab, frozenset(int(t["id"]) for t in tok.get("added_tokens", []) if t.get("special"))
    from harness import models
    d = models.form_path(model, "hf-fp32")
    vocab = int(json.loads((d / "config.json").read_text())["vocab_size"])
    tok = json.loads((d / "tokenizer.json").read_text())
    special = frozenset(int(t["id"]) for t in tok.get("added_tokens", []) if t.get("special"))
    return vocab, special


def request_prompts(model: str, prompt_len: int, batch: int, repetitions: int) -> list[list[list[int]]]:
    """Per repetition (warm-ups first), the prompts of its `batch` requests: request j of repetition i is drawn
    with seed 1000 + i * batch + j (at batch 1: 1000 + i, the seeds of earlier series)."""
    vocab, special = vocabulary(model)
    return [[prompt_ids(1000 + i * batch + j, prompt_len, vocab, set(special)) for j in range(batch)]
            for i in range(repetitions)]


SHARED_PREFIX_SEED = 999  # the shared prefix's seed (the requests' own: 1000 and up)


def with_shared_prefix(model: str, pools: list[list[list[int]]], n: int) -> list[list[list[int]]]:
    """The same prompts with their first n tokens replaced by one seeded sequence shared by all (a system prompt):
    each keeps its length and its own tokens after the prefix."""
    vocab, special = vocabulary(model)
    prefix = prompt_ids(SHARED_PREFIX_SEED, n, vocab, set(special))
    return [[prefix + ids[n:] for ids in pool] for pool in pools]


def user_turns(model: str, n: int, conversations: int, turns: int, repetition: int) -> list[list[list[int]]]:
    """A repetition's conversations' later turns: per conversation, per turn, n new token ids, seeded apart from
    the first turns' (seed 1_000_000 + ...)."""
    vocab, special = vocabulary(model)
    base = 1_000_000 + repetition * conversations * turns
    return [[prompt_ids(base + c * turns + t, n, vocab, set(special)) for t in range(turns)]
            for c in range(conversations)]


def prompts_hash(prompts: list[list[list[int]]]) -> str:
    h = hashlib.sha256()
    for rep in prompts:
        for ids in rep:
            h.update(json.dumps(ids).encode())
    return h.hexdigest()

