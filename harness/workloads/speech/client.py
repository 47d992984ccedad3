"""The served-speech client (docs/speech.md, "Served speech"): a repetition's requests sent to an OpenAI-style
`/v1/audio/speech` endpoint under the grid's load (a closed loop of `concurrency`, or an open loop at a `rate`:
harness/serving.py Load and arrivals), each response read as it streams. Audio comes as 16-bit mono PCM. From the
harness's own server, in HTTP chunks, one chunk a piece of audio the server made (a sentence): a chunk's arrival is
stamped (time.perf_counter, from the request's send) when its last byte is read. From an endpoint the harness does
not start (openai-speech), each read of the socket is a piece, stamped as it is read. A piece's duration is its
samples / the X-Sample-Rate header (or the rate the arm declares where the server sends none); a sample split across
two pieces counts in the later one. A response is untrusted: its audio and its pieces are bounded."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

MAX_AUDIO_BYTES = 64 << 20  # one response's audio: about 23 minutes at 24 kHz; more is refused (an untrusted server)
MAX_PIECES = 1 << 16  # pieces stamped per response
ERROR_BODY = 200  # bytes of an error response kept (one line)


@dataclass(frozen=True)
class Ask:
    """How a request is put and its audio read: `body` the JSON fields besides the text (`input`); `pieces`
    "http-chunk" (a piece per HTTP chunk: the harness's server writes one per sentence) or "read" (a piece per read
    of the socket: a server whose chunks mean nothing, or that sends a Content-Length); `sample_rate` the PCM's rate
    where the response has no X-Sample-Rate header (None: the header is required); `headers` sent with each."""
    body: dict[str, Any] = field(default_factory=lambda: {"model": "voice", "response_format": "pcm"})
    pieces: str = "http-chunk"
    sample_rate: int | None = None
    headers: dict[str, str] = field(default_factory=dict)


def _rate(header: str | None, default: int | None) -> int:
    """The response's sample rate: its X-Sample-Rate header (a positive integer, else an error), or the default."""
    if header is None:
        if default is None:
            raise ValueError("no X-Sample-Rate header")
        return default
    if not header.strip().isdigit() or not 0 < int(header) <= 384000:
        raise ValueError(f"X-Sample-Rate {header[:40]!r} is not a rate in Hz")
    return int(header)


async def _one(session: Any, url: str, ask: Ask, rid: str, text: str, t0: float, timeout_s: float) -> dict[str, Any]:
    import aiohttp
    send = time.perf_counter()
    rec: dict[str, Any] = {"id": rid, "send_s": send - t0, "arrivals_s": [], "samples": [], "error": None}
    try:
        async with session.post(url, json={**ask.body, "input": text}, headers=ask.headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False) as r:
            if r.status != 200:
                body = (await r.content.read(ERROR_BODY)).decode(errors="replace")
                rec["error"] = f"HTTP {r.status}: {' '.join(body.split())}"[:300]
                return rec
            rec["sample_rate"] = _rate(r.headers.get("X-Sample-Rate"), ask.sample_rate)
            n, total, carry = 0, 0, 0  # bytes of the open piece, of the response, and an odd byte held over

            async for data, end in r.content.iter_chunks():
                total += len(data)
                if total > MAX_AUDIO_BYTES:
                    raise ValueError(f"more than {MAX_AUDIO_BYTES >> 20} MiB of audio in one response")
                n += len(data)
                if (end or ask.pieces == "read") and n:
                    odd = (carry + n) % 2
                    if (carry + n) >= 2:
                        rec["arrivals_s"].append(time.perf_counter() - send)
                        rec["samples"].append((carry + n) // 2)
                    carry, n = odd, 0
                    if len(rec["samples"]) > MAX_PIECES:
                        raise ValueError(f"more than {MAX_PIECES} pieces of audio in one response")
            if (carry + n) >= 2:  # a last piece not closed as a chunk: audio all the same, arrived now
                rec["arrivals_s"].append(time.perf_counter() - send)
                rec["samples"].append((carry + n) // 2)
            if not rec["samples"]:
                rec["error"] = "no audio"
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    finally:
        rec["end_s"] = time.perf_counter() - t0
    return rec


async def _repetition(url: str, ask: Ask, requests: list[tuple[str, str]], concurrency: int | None,
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
                return await _one(session, url, ask, rid, text, t0, timeout_s)
            finally:
                in_flight -= 1
                if sem is not None:
                    sem.release()
        sem = asyncio.Semaphore(concurrency) if concurrency else None
        recs = await asyncio.gather(*(send(i, rid, t, sem) for i, (rid, t) in enumerate(requests)))
    return {"requests": list(recs), "most_in_flight": most}


def run(url: str, warmups: list[tuple[str, str]], repetitions: list[list[tuple[str, str]]], concurrency: int | None,
        schedule: list[float] | None, timeout_s: float, ask: Ask | None = None) -> list[dict[str, Any]]:
    """Per repetition: its requests' records (warm-ups, one at a time, before the first) and the most in flight."""
    ask, out = ask or Ask(), []
    for i, reqs in enumerate(repetitions):
        warm = asyncio.run(_repetition(url, ask, warmups, 1, None, timeout_s)) if i == 0 and warmups else {"requests": []}
        rep = asyncio.run(_repetition(url, ask, reqs, concurrency, schedule, timeout_s))
        rep["warmup_requests"] = warm["requests"]
        out.append(rep)
    return out
