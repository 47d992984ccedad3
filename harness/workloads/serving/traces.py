"""Timed traces replayed on their schedule (docs/serving.md, "Traces"). A trace is a JSONL file, one request a
line, in Mooncake's form: {"timestamp": ms from the trace's start, "input_length": tokens, "output_length": tokens,
"hash_ids": [block ids]}; or a CSV file in BurstGPT's form (a header `Timestamp,Model,Request tokens,Response
tokens,Total tokens,Log Type`, the timestamp in seconds; no shared blocks; a row of 0 response tokens, BurstGPT's
failed request, is skipped, as vLLM's reader does). Request i is sent at its timestamp (x the load's time_scale) whatever is in flight; its
prompt is its blocks' tokens, each block `block_len` seeded token ids of its hash id (the same id, the same tokens:
the trace's shared prefixes), cut or filled (seeded by the line) to its input length; its output is forced to its
output length. The file is untrusted: a malformed line is one error naming the file, the line and the field; its
sha256 is recorded, and a trace changed between plan and run fails the run.

`synth` writes a seeded synthetic trace of the same form (Poisson arrivals, lengths uniform in ranges, each
request opening with one of a few shared prefixes): the tests' and the published series' traces, committed.
"""

from __future__ import annotations

import csv
import io
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import UserError

MAX_BYTES = 64 << 20
MAX_LINES = 100_000
MAX_BLOCKS = 4096  # hash ids of one request
MAX_LEN = 1 << 20  # tokens of one request's input or output
BLOCK_SEED = 2_000_000  # block h's tokens: seed BLOCK_SEED + h; a line's own fill: FILL_SEED + its line
FILL_SEED = 3_000_000
FIELDS = {"timestamp", "input_length", "output_length", "hash_ids"}
FIX = "a JSONL line {\"timestamp\": MS, \"input_length\": N, \"output_length\": M, \"hash_ids\": [...]} (docs/serving.md)"


@dataclass(frozen=True)
class TraceRequest:
    line: int
    t_s: float  # from the trace's first request
    input_len: int
    output_len: int
    blocks: tuple[int, ...]


def _int(where: str, fld: str, v: object, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise UserError(where, f"{fld}: must be an integer in [{lo}, {hi}], got {str(v)[:40]!r}", FIX)
    return v


def read(path: str | Path) -> tuple[list[TraceRequest], str]:
    """The trace's requests, oldest first, and its file's sha256; refused in one line where it is malformed."""
    from harness.untrusted import read_text
    p = Path(path)
    text, sha = read_text(p, str(p), FIX, MAX_BYTES)
    if text.lstrip().startswith(BURSTGPT_HEADER[0] + ","):
        out = _burstgpt(p, text)
        if not out:
            raise UserError(str(p), "no requests (every row has 0 response tokens)", BURSTGPT_FIX)
        return out, sha
    out: list[TraceRequest] = []
    t0, last = None, -math.inf
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{p}:{n}"
        if len(out) >= MAX_LINES:
            raise UserError(where, f"more than {MAX_LINES:,} requests", "cut the trace")
        try:
            d = json.loads(raw)
        except ValueError as e:
            raise UserError(where, f"not JSON ({str(e)[:60]})", FIX) from None
        if not isinstance(d, dict):
            raise UserError(where, "not a JSON object", FIX)
        extra = sorted(set(map(str, d)) - FIELDS)
        if extra:
            raise UserError(where, f"{extra[0][:40]}: unknown field", f"fields: {', '.join(sorted(FIELDS))}")
        ts = d.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise UserError(where, f"timestamp: must be milliseconds >= 0, got {str(ts)[:40]!r}", FIX)
        if ts < last:
            raise UserError(where, f"timestamp: {ts} is before the line above's {last}", "sort the trace by time")
        last = ts
        t0 = ts if t0 is None else t0
        blocks = d.get("hash_ids", [])
        if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
            raise UserError(where, f"hash_ids: must be a list of at most {MAX_BLOCKS} block ids", FIX)
        ids = tuple(_int(where, f"hash_ids[{i}]", h, 0, 1 << 62) for i, h in enumerate(blocks))
        out.append(TraceRequest(line=n, t_s=(ts - t0) / 1000.0,
                                input_len=_int(where, "input_length", d.get("input_length"), 1, MAX_LEN),
                                output_len=_int(where, "output_length", d.get("output_length"), 1, MAX_LEN),
                                blocks=ids))
    if not out:
        raise UserError(str(p), "no requests", FIX)
    return out, sha


BURSTGPT_HEADER = ("Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type")
BURSTGPT_FIX = "BurstGPT's CSV: a header " + ",".join(BURSTGPT_HEADER) + ", a request a row (docs/serving.md)"


def _burstgpt(p: Path, text: str) -> list[TraceRequest]:
    """A BurstGPT CSV's requests (its rows of 0 response tokens skipped); refused in one line where malformed."""
    rows = csv.reader(io.StringIO(text))
    out: list[TraceRequest] = []
    t0, last = None, -math.inf
    header: list[str] | None = None
    for n, row in enumerate(rows, 1):
        where = f"{p}:{n}"
        if not row or not any(c.strip() for c in row):
            continue
        if header is None:
            header = [c.strip() for c in row]
            missing = [c for c in BURSTGPT_HEADER if c not in header]
            if missing or len(header) != len(BURSTGPT_HEADER):
                raise UserError(where, f"header: {(missing or header)[0][:40]!r} "
                                f"{'missing' if missing else 'is not one of the columns'}", BURSTGPT_FIX)
            continue
        if len(out) >= MAX_LINES:
            raise UserError(where, f"more than {MAX_LINES:,} requests", "cut the trace")
        if len(row) != len(header):
            raise UserError(where, f"{len(row)} columns, the header has {len(header)}", BURSTGPT_FIX)
        d = dict(zip(header, (c.strip() for c in row)))
        try:
            ts = float(d["Timestamp"])
        except ValueError:
            ts = math.nan
        if not math.isfinite(ts) or ts < 0:
            raise UserError(where, f"Timestamp: must be seconds >= 0, got {d['Timestamp'][:40]!r}", BURSTGPT_FIX)
        if ts < last:
            raise UserError(where, f"Timestamp: {ts} is before the row above's {last}", "sort the trace by time")
        last = ts
        lens = {}
        for fld in ("Request tokens", "Response tokens"):
            v = d[fld]
            if not v.isdigit() or int(v) > MAX_LEN:
                raise UserError(where, f"{fld}: must be an integer in [0, {MAX_LEN}], got {v[:40]!r}", BURSTGPT_FIX)
            lens[fld] = int(v)
        if lens["Response tokens"] == 0:
            continue  # a failed request in BurstGPT: nothing to replay
        if lens["Request tokens"] == 0:
            raise UserError(where, "Request tokens: 0 with a response", BURSTGPT_FIX)
        t0 = ts if t0 is None else t0
        out.append(TraceRequest(line=n, t_s=ts - t0, input_len=lens["Request tokens"],
                                output_len=lens["Response tokens"], blocks=()))
    return out


def prompts(reqs: list[TraceRequest], block_len: int, vocab: int, special: set[int]) -> list[list[int]]:
    """Each request's prompt: its blocks' tokens (block h: block_len ids of seed BLOCK_SEED + h), cut to its input
    length, or filled from its own line's seed."""
    from harness.metrics import prompt_ids
    cache: dict[int, list[int]] = {}
    out = []
    for r in reqs:
        ids: list[int] = []
        for h in r.blocks:
            if len(ids) >= r.input_len:
                break
            if h not in cache:
                cache[h] = prompt_ids(BLOCK_SEED + h, block_len, vocab, special)
            ids += cache[h]
        if len(ids) < r.input_len:
            ids += prompt_ids(FILL_SEED + r.line, r.input_len - len(ids), vocab, special)
        out.append(ids[:r.input_len])
    return out


def synth(requests: int, rate: float, seed: int, input_len: tuple[int, int], output_len: tuple[int, int],
          block_len: int, prefixes: int, prefix_blocks: int) -> list[dict]:
    """A seeded synthetic trace: Poisson arrivals at `rate` requests/s, lengths uniform in the ranges, each
    request's first `prefix_blocks` blocks one of `prefixes` shared prefixes (ids 0..), the rest its own."""
    rng = random.Random(seed)
    t, out, own = 0.0, [], 1_000_000
    for _ in range(requests):
        n_in, n_out = rng.randint(*input_len), rng.randint(*output_len)
        k = -(-n_in // block_len)
        p = rng.randrange(prefixes) if prefixes else None
        shared = [p * prefix_blocks + j for j in range(prefix_blocks)] if p is not None else []
        blocks = shared[:k] + list(range(own, own + max(0, k - len(shared))))
        own += max(0, k - len(shared))
        out.append({"timestamp": round(t * 1000.0, 3), "input_length": n_in, "output_length": n_out,
                    "hash_ids": blocks})
        t += rng.expovariate(rate)
    return out


def burstgpt_csv(lines: list[dict]) -> str:
    """Synthetic requests (synth's) as BurstGPT's CSV: seconds, the lengths, no shared blocks."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(BURSTGPT_HEADER)
    for d in lines:
        n_in, n_out = d["input_length"], d["output_length"]
        w.writerow([f"{d['timestamp'] / 1000.0:.3f}", "synthetic", n_in, n_out, n_in + n_out, "Conversation log"])
    return buf.getvalue()


def synth_command(args: Any) -> int:
    """`harness trace synth OUT ...`: the synthetic trace written, one JSON object a line."""

    def span(v: str, fld: str) -> tuple[int, int]:
        lo, _, hi = v.partition(":")
        try:
            a, b = int(lo), int(hi or lo)
        except ValueError:
            raise UserError("harness trace synth", f"{fld}: {v!r} is not MIN:MAX tokens", f"{fld} 64:256") from None
        if not 1 <= a <= b <= MAX_LEN:
            raise UserError("harness trace synth", f"{fld}: {v!r} is not 1 <= MIN <= MAX", f"{fld} 64:256")
        return a, b
    if not 1 <= args.requests <= MAX_LINES or not 0 < args.rate <= 1e4 or args.block_len < 1 or \
            args.prefixes < 0 or args.prefix_blocks < 0:
        raise UserError("harness trace synth", "--requests in [1, 100000], --rate in (0, 10000], --block-len >= 1, "
                        "--prefixes and --prefix-blocks >= 0", "see harness trace synth --help")
    lines = synth(args.requests, args.rate, args.seed, span(args.input_len, "--input-len"),
                  span(args.output_len, "--output-len"), args.block_len, args.prefixes, args.prefix_blocks)
    if getattr(args, "format", "mooncake") == "burstgpt":
        Path(args.out).write_text(burstgpt_csv(lines))
    else:
        Path(args.out).write_text("".join(json.dumps(d) + "\n" for d in lines))
    print(f"wrote {len(lines)} requests to {args.out}")
    return 0
