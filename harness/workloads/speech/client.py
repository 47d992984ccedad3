"""The served-speech client (docs/speech.md, "Served speech"): a repetition's requests sent to an OpenAI-style
`/v1/audio/speech` endpoint under the grid's load (a closed loop of `concurrency`, or an open loop at a `rate`:
harness/serving.py Load and arrivals), each response read as it streams. Audio comes as 16-bit mono PCM in HTTP
chunks, one chunk a piece of audio the server made (a sentence): a chunk's arrival is stamped (time.perf_counter,
from the request's send) when its last byte is read, its duration is its samples / the X-Sample-Rate header."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def _one(session: Any, url: str, rid: str, text: str, t0: float, timeout_s: float) -> dict[str, Any]:
    import aiohttp
    send = time.perf_counter()
    rec: dict[str, Any] = {"id": rid, "send_s": send - t0, "arrivals_s": [], "samples": [], "error": None}
    try:
        async with session.post(url, json={"model": "voice", "input": text, "response_format": "pcm"},
                                timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False) as r:
            if r.status != 200:
                rec["error"] = f"HTTP {r.status}: {(await r.text())[:200]}"
                return rec
            rec["sample_rate"] = int(r.headers.get("X-Sample-Rate", "0"))
            if rec["sample_rate"] <= 0:
                rec["error"] = "no X-Sample-Rate header"
                return rec
            n = 0
            async for data, end in r.content.iter_chunks():
                n += len(data)
                if end and n:
                    rec["arrivals_s"].append(time.perf_counter() - send)
                    rec["samples"].append(n // 2)
                    n = 0
            if n:  # a last piece not closed as a chunk: audio all the same, arrived now
                rec["arrivals_s"].append(time.perf_counter() - send)
                rec["samples"].append(n // 2)
            if not rec["samples"]:
                rec["error"] = "no audio"
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    rec["end_s"] = time.perf_counter() - t0
    return rec


async def _repetition(url: str, requests: list[tuple[str, str]], concurrency: int | None,
                      schedule: list[float] | None, timeout_s: float) -> dict[str, Any]:
    import aiohttp
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        in_flight, most = 0, 0

        async def send(i: int, rid: str, text: str, sem: asyncio.Semaphore | None) -> dict[str, Any]:
            nonlocal in_flight, most
            if schedule is not None:
                await asyncio.sleep(max(0.0, schedule[i] - (time.perf_counter() - t0)))
            if sem is not None:
                await sem.acquire()
            in_flight += 1
            most = max(most, in_flight)
            try:
                return await _one(session, url, rid, text, t0, timeout_s)
            finally:
                in_flight -= 1
                if sem is not None:
                    sem.release()
        sem = asyncio.Semaphore(concurrency) if concurrency else None
        recs = await asyncio.gather(*(send(i, rid, t, sem) for i, (rid, t) in enumerate(requests)))
    return {"requests": list(recs), "most_in_flight": most}


def run(url: str, warmups: list[tuple[str, str]], repetitions: list[list[tuple[str, str]]], concurrency: int | None,
        schedule: list[float] | None, timeout_s: float) -> list[dict[str, Any]]:
    """Per repetition: its requests' records (warm-ups, one at a time, before the first) and the most in flight."""
    out = []
    for i, reqs in enumerate(repetitions):
        warm = asyncio.run(_repetition(url, warmups, 1, None, timeout_s)) if i == 0 and warmups else {"requests": []}
        rep = asyncio.run(_repetition(url, reqs, concurrency, schedule, timeout_s))
        rep["warmup_requests"] = warm["requests"]
        out.append(rep)
    return out
