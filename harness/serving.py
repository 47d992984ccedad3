"""Serving under load: the load a grid asks of a server, the client that sends it, and what it read back.

A load is a workload field (`workload.load`, axes `concurrency` and `rate`; docs/serving.md):
- `concurrency: N`: a closed loop: N clients, each sending its next request when its last one ended;
- `rate: R` (requests/s) with `arrival: poisson | constant | gamma` (`burstiness: B`, gamma's shape: 1 is
  Poisson, below 1 burstier): an open loop, request i sent at its scheduled time whatever is in flight
  (at most `concurrency` in flight where both are given);
- `requests`: how many measured requests a repetition sends; `seed`: the arrivals' seed.

The client (`run_load`, asyncio + aiohttp, in the serving worker's process) streams each completion and
stamps every chunk when it arrives (time.perf_counter, seconds from the repetition's start). Prompts are the
harness's token ids, sent as ids; the output length is forced (max_tokens with ignore_eos, and min_tokens
where the server takes it), and the server's own count of its output (usage) is kept beside the client's.

`figures` turns the per-request records into the serving metrics (one definition each, harness/metrics.py);
`schedule_check` says whether the client kept the schedule (a late send is the client's fault, not the
server's, and flags the run).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

ARRIVALS = ("poisson", "constant", "gamma")
# a send later than this after its scheduled time is the client falling behind (it is not the server's delay)
LATE_S = 0.010
# the share of late sends above which a run is flagged: the achieved rate is then the client's, not the load's
LATE_SHARE = 0.05


@dataclass(frozen=True)
class Load:
    """One cell's load (validated by harness/grid/serving.py)."""
    requests: int
    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0
    sweep: dict[str, Any] | None = None  # a point of a rate sweep (harness/sweep.py): which, and its rate's origin
    shared_prefix: int = 0  # the first tokens of every request's prompt, the same for all (a system prompt)
    # conversations (turns > 1): `requests` is conversations x turns; each later turn resends the history (the
    # prompts so far and the replies as the server gave them) with `user_len` new tokens, `think_s` after a reply
    turns: int = 1
    user_len: int = 0
    think_s: float = 0.0
    # a trace replayed (harness/workloads/serving/traces.py): the file as the grid names it, its sha256 at plan, where
    # it is on this machine (not recorded), its block length and the factor on its timestamps
    trace: str | None = None
    trace_sha256: str | None = None
    trace_path: str | None = None
    block_len: int = 512
    time_scale: float = 1.0
    # prompts from a dataset file (harness/workloads/serving/datasets.py): as the grid names it, its sha256 at plan,
    # where it is here (not recorded)
    dataset: str | None = None
    dataset_sha256: str | None = None
    dataset_path: str | None = None

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": self.requests}
        if self.concurrency is not None:
            out["concurrency"] = self.concurrency
        if self.rate is not None:
            out |= {"rate": self.rate, "arrival": self.arrival, "burstiness": self.burstiness, "seed": self.seed}
        if self.sweep is not None:
            out["sweep"] = self.sweep
        if self.shared_prefix:
            out["shared_prefix"] = self.shared_prefix
        if self.turns > 1:
            out |= {"turns": self.turns, "user_len": self.user_len, "think_s": self.think_s}
        if self.dataset is not None:
            out |= {"dataset": self.dataset, "dataset_sha256": self.dataset_sha256}
        if self.trace is not None:
            out |= {"trace": self.trace, "trace_sha256": self.trace_sha256, "block_len": self.block_len,
                    "time_scale": self.time_scale, "arrival": "trace"}
        return out

    @property
    def conversations(self) -> int:
        return self.requests // self.turns

    @property
    def unresolved(self) -> str | None:
        """Why a sweep point has no rate (a probe of its pass failed or has not run); None otherwise."""
        return (self.sweep or {}).get("error")

    @property
    def server_slots(self) -> int | None:
        """The requests a server should hold at once: the load's concurrency; in a sweep every point's server is
        the same, sized for its max probe (every request at once)."""
        return self.requests if self.sweep is not None else self.concurrency


def arrivals(load: Load) -> list[float] | None:
    """Scheduled send times (s from the repetition's start) of an open-loop load; None for a closed loop.
    Request 0 is sent at 0; the gaps are 1/R (constant), exponential with mean 1/R (poisson), or gamma with
    shape B and mean 1/R (gamma), drawn from random.Random(seed)."""
    if load.rate is None:
        return None
    rng = random.Random(load.seed)
    out, t = [], 0.0
    for i in range(load.requests):
        out.append(t)
        if load.arrival == "constant":
            gap = 1.0 / load.rate
        elif load.arrival == "poisson":
            gap = rng.expovariate(load.rate)
        else:
            gap = rng.gammavariate(load.burstiness, 1.0 / (load.rate * load.burstiness))
        t += gap
    return out


@dataclass
class Endpoint:
    """Where the completions go and what each request carries beyond the prompt (the server's own fields)."""
    base_url: str
    model: str
    extra: dict[str, Any]
    api_key: str | None = None
    timeout_s: float = 300.0


def _body(ep: Endpoint, ids: list[int], gen_len: int) -> dict[str, Any]:
    return {"model": ep.model, "prompt": ids, "max_tokens": gen_len, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, **ep.extra}


def _tokens_of(choice: dict[str, Any]) -> int:
    """Output tokens a streamed chunk carries: its token ids where the server sends them, else one per chunk
    with text (a server that sends several tokens in one text chunk is caught by the usage comparison)."""
    for k in ("token_ids", "tokens"):
        v = choice.get(k)
        if isinstance(v, list):
            return len(v)
    return 1 if choice.get("text") else 0


async def _one(session, ep: Endpoint, i: int, ids: list[int], gen_len: int, t0: float, scheduled: float | None,
               warmup: bool, reply: dict[str, Any] | None = None) -> dict[str, Any]:
    """One request's record; `reply`, where given, gets the reply's text and its token ids where the server sends
    them (a conversation's next turn resends it)."""
    import aiohttp
    rec: dict[str, Any] = {"i": i, "warmup": warmup, "scheduled_s": scheduled, "prompt_tokens": len(ids),
                           "chunks_s": [], "chunk_tokens": [], "usage": None, "error": None, "asked": gen_len}
    ended = False  # the stream's end marker (data: [DONE]) arrived
    headers = {"Authorization": f"Bearer {ep.api_key}"} if ep.api_key else {}
    rec["sent_s"] = time.perf_counter() - t0
    try:
        async with session.post(f"{ep.base_url}/v1/completions", json=_body(ep, ids, gen_len), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=ep.timeout_s), allow_redirects=False) as resp:
            rec["http_status"] = resp.status
            if resp.status != 200:
                rec["error"] = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return rec
            buf = b""
            async for piece in resp.content.iter_any():
                now = time.perf_counter() - t0
                buf += piece
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        ended = True
                        continue
                    msg = json.loads(data)
                    if msg.get("usage"):
                        rec["usage"] = {k: msg["usage"].get(k) for k in ("prompt_tokens", "completion_tokens")}
                        cached = cached_tokens(msg)
                        if cached is not None:
                            rec["usage"]["cached_tokens"] = cached
                    for ch in msg.get("choices") or []:
                        if reply is not None:
                            reply["text"] = reply.get("text", "") + str(ch.get("text") or "")
                            if isinstance(ch.get("token_ids"), list):
                                reply.setdefault("ids", []).extend(ch["token_ids"])
                        n = _tokens_of(ch)
                        if n:
                            rec["chunks_s"].append(now)
                            rec["chunk_tokens"].append(n)
    except asyncio.TimeoutError:
        rec["error"] = f"timed out after {ep.timeout_s:.0f} s"
    except Exception as e:  # a refused connection, a reset, a malformed chunk: counted against the run
        rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    rec["end_s"] = time.perf_counter() - t0
    if not rec["error"]:
        rec["error"] = incomplete(rec, ended)
    return rec


def cached_tokens(msg: dict[str, Any]) -> int | None:
    """The prompt tokens the server says it took from its prefix cache for this request: the OpenAI usage field
    (`usage.prompt_tokens_details.cached_tokens`: vLLM with --enable-prompt-tokens-details, llama-server), else
    llama-server's own `timings.cache_n`; None where the server says nothing (not the same as 0)."""
    details = (msg.get("usage") or {}).get("prompt_tokens_details")
    v = details.get("cached_tokens") if isinstance(details, dict) else None
    if v is None and isinstance(msg.get("timings"), dict):
        v = msg["timings"].get("cache_n")
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def incomplete(rec: dict[str, Any], ended: bool) -> str | None:
    """Why a request that streamed without an error did not get what was asked (a failed request), or None. The
    client's count of what it received decides: a stream that stops short of the asked tokens fails unless the
    server's own count (usage) says exactly what was asked (several tokens in one text chunk); more tokens than
    asked, or a stream cut before its end marker (a reset, a server gone), fail."""
    got, asked = sum(rec["chunk_tokens"]), rec["asked"]
    server = (rec.get("usage") or {}).get("completion_tokens")
    if not rec["chunks_s"]:
        return "no output token in the stream"
    if not ended:
        return f"the stream ended before its end marker (data: [DONE]), after {got} of {asked} output tokens"
    if got > asked:
        return f"{got} output tokens received, {asked} asked"
    if got < asked and server != asked:
        return f"a short stream: {got} of {asked} output tokens received (the server counted {server})"
    return None


async def _run(ep: Endpoint, load: Load, prompts: list[list[int]], warmup_prompts: list[list[int]],
               gen_len: int, gen_lens: list[int] | None = None, schedule: list[float] | None = None) -> dict[str, Any]:
    import aiohttp
    # a fresh connection per request: a server that closes an idle keep-alive connection (llama-server does) cannot
    # fail the next request sent on it; the connect (loopback, well under a millisecond) is inside its TTFT
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn) as session:
        warm = []
        for j, ids in enumerate(warmup_prompts):  # one at a time, before the load; kept and flagged
            t0 = time.perf_counter()
            warm.append(await _one(session, ep, j, ids, gen_len, t0, None, True))
        sched = schedule if schedule is not None else arrivals(load)
        cap = asyncio.Semaphore(load.concurrency) if load.concurrency else None
        in_flight = [0, 0]  # now, most
        t0 = time.perf_counter()

        async def send(i: int) -> dict[str, Any]:
            if sched is not None:
                delay = sched[i] - (time.perf_counter() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
            if cap is not None:
                await cap.acquire()
            in_flight[0] += 1
            in_flight[1] = max(in_flight[1], in_flight[0])
            try:
                return await _one(session, ep, i, prompts[i], gen_lens[i] if gen_lens else gen_len, t0,
                                  None if sched is None else sched[i], False)
            finally:
                in_flight[0] -= 1
                if cap is not None:
                    cap.release()

        if sched is None:  # closed loop: `concurrency` clients, each taking the next request when its last ended
            queue = list(range(len(prompts)))[::-1]
            recs: list[dict[str, Any]] = []

            async def client() -> None:
                while queue:
                    recs.append(await send(queue.pop()))
            await asyncio.gather(*(client() for _ in range(load.concurrency or 1)))
            recs.sort(key=lambda r: r["i"])
        else:
            recs = list(await asyncio.gather(*(send(i) for i in range(len(prompts)))))
        return {"warmup_requests": warm, "requests": recs, "most_in_flight": in_flight[1]}


async def _conversations(ep: Endpoint, load: Load, firsts: list[list[int]], users: list[list[list[int]]],
                         warmup_prompts: list[list[int]], gen_len: int, tokenize: Any) -> dict[str, Any]:
    """Conversations in a closed loop: `concurrency` users, each holding one conversation through its turns (think
    time included) and taking the next when it ends. Turn t's prompt is turn t-1's prompt, its reply (the token ids
    the server sent, else its text tokenized with the model's tokenizer, as a chat client resends text) and the
    turn's `user_len` new tokens. A turn that fails ends its conversation: its later turns are recorded unsent."""
    import aiohttp
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn) as session:
        warm = []
        for j, ids in enumerate(warmup_prompts):
            t0 = time.perf_counter()
            warm.append(await _one(session, ep, j, ids, gen_len, t0, None, True))
        in_flight = [0, 0]
        t0 = time.perf_counter()
        recs: list[dict[str, Any]] = []
        queue = list(range(len(firsts)))[::-1]

        async def talk(c: int) -> None:
            history = list(firsts[c])
            for t in range(load.turns):
                i = c * load.turns + t
                reply: dict[str, Any] = {}
                rec = await _one(session, ep, i, history, gen_len, t0, None, False, reply)
                rec |= {"conversation": c, "turn": t}
                recs.append(rec)
                if rec["error"]:
                    recs.extend({"i": c * load.turns + u, "warmup": False, "scheduled_s": None, "prompt_tokens": 0,
                                 "chunks_s": [], "chunk_tokens": [], "usage": None, "asked": gen_len,
                                 "conversation": c, "turn": u, "sent_s": rec["end_s"], "end_s": rec["end_s"],
                                 "error": f"not sent: turn {t} of its conversation failed"}
                                for u in range(t + 1, load.turns))
                    return
                if t + 1 < load.turns:
                    said = reply.get("ids") or tokenize(reply.get("text", ""))
                    history = history + list(said) + users[c][t]
                    if load.think_s:
                        await asyncio.sleep(load.think_s)

        async def user() -> None:
            while queue:
                c = queue.pop()
                in_flight[0] += 1
                in_flight[1] = max(in_flight[1], in_flight[0])
                try:
                    await talk(c)
                finally:
                    in_flight[0] -= 1
        await asyncio.gather(*(user() for _ in range(load.concurrency or 1)))
        recs.sort(key=lambda r: r["i"])
        return {"warmup_requests": warm, "requests": recs, "most_in_flight": in_flight[1]}


def tokenizer_of(hf_dir: str | None) -> Any:
    """text -> token ids with the model's own tokenizer (its tokenizer.json), no special tokens added: how a server
    tokenizes resent text; None where the model has none here."""
    if not hf_dir:
        return None
    from pathlib import Path

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(Path(hf_dir) / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


def run_load(ep: Endpoint, load: Load, prompts: list[list[int]], warmup_prompts: list[list[int]],
             gen_len: int, users: list[list[list[int]]] | None = None, tokenize: Any = None,
             gen_lens: list[int] | None = None, schedule: list[float] | None = None) -> dict[str, Any]:
    """One repetition of the load: warm-up requests one at a time, then `load.requests` requests as the load
    schedules them (conversations: `prompts` their first turns, `users` each later turn's new tokens). Returns
    the per-request records (raw samples) and the most requests seen in flight (conversations: in progress)."""
    if load.turns > 1:
        if tokenize is None:
            raise ValueError("conversations need the model's tokenizer (to resend a reply given as text)")
        return asyncio.run(_conversations(ep, load, prompts, users or [], warmup_prompts, gen_len, tokenize))
    return asyncio.run(_run(ep, load, prompts, warmup_prompts, gen_len, gen_lens, schedule))


# ---- what the records say -----------------------------------------------------------------------------------

def schedule_check(load: Load, recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the client sent each open-loop request on time (a send more than LATE_S after its schedule is
    late); a run with more than LATE_SHARE of its sends late is flagged `client_behind`."""
    if load.rate is None and load.trace is None:
        return {"open_loop": False, "client_behind": False}
    lags = [r["sent_s"] - r["scheduled_s"] for r in recs if r.get("scheduled_s") is not None]
    late = sum(1 for x in lags if x > LATE_S)
    return {"open_loop": True, "late_sends": late, "max_lag_s": max(lags, default=0.0),
            "client_behind": bool(lags) and late / len(lags) > LATE_SHARE,
            "rule": f"a send more than {LATE_S * 1e3:.0f} ms after its scheduled time is late; more than "
                    f"{LATE_SHARE:.0%} late flags the run"}


def achieved(recs: list[dict[str, Any]]) -> dict[str, float | None]:
    """The rate and concurrency the measured requests actually had, from their own timestamps: rate = (sends - 1)
    / (last send - first send); concurrency = the requests' summed e2e / (last end - first send)."""
    if not recs:
        return {"rate_req_s": None, "concurrency": None}
    sent = sorted(r["sent_s"] for r in recs)
    span = max(r["end_s"] for r in recs) - sent[0]
    rate = (len(sent) - 1) / (sent[-1] - sent[0]) if len(sent) > 1 and sent[-1] > sent[0] else None
    busy = sum(r["end_s"] - r["sent_s"] for r in recs)
    return {"rate_req_s": rate, "concurrency": busy / span if span > 0 else None}


def cache_check(recs: list[dict[str, Any]], shared_prefix: int, prefix_cache: bool | None) -> dict[str, Any]:
    """Whether this run's requests could be served from a prefix cache, and what the server said it did (the
    harness's prompts are distinct seeded sequences: only a shared prefix repeats, and only with the cache on can
    it be hit; `prefix_cache` None: not known, an endpoint the harness does not start). Cached tokens reported where none was possible are flagged: a benchmark that reuses a prompt by
    accident hits the cache silently."""
    said = [r["usage"]["cached_tokens"] for r in recs if isinstance((r.get("usage") or {}).get("cached_tokens"), int)]
    out = {"prefix_cache": prefix_cache, "shared_prefix": shared_prefix,
           "possible": bool(shared_prefix) and prefix_cache is not False,
           "requests": len(recs), "requests_reporting": len(said), "cached_tokens": sum(said),
           "prompt_tokens": sum((r.get("usage") or {}).get("prompt_tokens") or 0 for r in recs)}
    if prefix_cache is False and sum(said):
        out["flag"] = f"the server reports {sum(said)} cached prompt tokens with its prefix cache off"
    return out


def usage_check(recs: list[dict[str, Any]], gen_len: int) -> dict[str, Any]:
    """The client's token count against the server's usage and the forced length: each request whose counts
    differ is listed (recorded and flagged, never hidden)."""
    bad = []
    for r in recs:
        client, asked = sum(r["chunk_tokens"]), r.get("asked", gen_len)  # a trace's requests ask their own lengths
        server = (r.get("usage") or {}).get("completion_tokens")
        if server is None or client != server or server != asked:
            bad.append({"i": r["i"], "client_tokens": client, "server_tokens": server, "asked": asked})
    return {"mismatches": bad[:20], "n_mismatched": len(bad), "ok": not bad}
