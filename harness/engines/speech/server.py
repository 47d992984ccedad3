"""A small OpenAI-style speech server around a speech engine: `python server.py CONFIG.json PORT` (docs/speech.md,
"Served speech"). Started per run by harness/engines/speech/base.py, pinned to the run's CPUs like every engine.

It loads the voice as the worker does (worker.py: load_piper or load_sherpa, the same settings), then serves
POST /v1/audio/speech ({"input": TEXT, "response_format": "pcm"}) with the audio streamed as it is made: each chunk
the engine yields (a sentence) is written as one HTTP chunk of 16-bit little-endian mono PCM, its rate in the
X-Sample-Rate header. Requests are spoken by `workers` threads at once (ONNX Runtime sessions run concurrently;
sherpa-onnx's OfflineTts is called one request at a time). GET /health answers once the voice is loaded.
Standard library, aiohttp, numpy and the engine's library only.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

# started as a script: its folder (harness/engines/speech) must not stand in front of the real packages
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from aiohttp import web  # noqa: E402

from harness.engines.speech.worker import load_piper, load_sherpa, loaded_libraries  # noqa: E402


def main() -> int:
    cfg = json.loads(open(sys.argv[1]).read())
    port = int(sys.argv[2])
    import numpy as np
    speak, sr, readback = (load_sherpa if cfg["engine"] == "sherpa-onnx" else load_piper)(cfg)
    workers = int(cfg.get("workers", 1))
    pool = ThreadPoolExecutor(max_workers=workers)
    one_at_a_time = threading.Lock() if cfg["engine"] == "sherpa-onnx" else None  # one generate() at a time
    info = {"engine": cfg["engine"], "sample_rate": sr, "workers": workers, **readback,
            "cpu_affinity": sorted(os.sched_getaffinity(0)), "libraries": loaded_libraries()}

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", **info})

    async def speech(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
            text = body["input"]
            if not isinstance(text, str) or not text.strip():
                raise ValueError("input: a non-empty string")
            if body.get("response_format", "pcm") != "pcm":
                raise ValueError("response_format: only pcm is served")
        except (ValueError, KeyError, TypeError) as e:
            return web.json_response({"error": str(e)}, status=400)
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()

        def produce() -> None:
            try:
                if one_at_a_time is not None:
                    one_at_a_time.acquire()
                try:
                    def emit(audio) -> None:  # each chunk to the response as the engine makes it
                        pcm = (np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767).astype("<i2").tobytes()
                        loop.call_soon_threadsafe(q.put_nowait, pcm)
                    speak(text, emit)
                finally:
                    if one_at_a_time is not None:
                        one_at_a_time.release()
                loop.call_soon_threadsafe(q.put_nowait, None)
            except Exception as e:  # the stream ends short: the client counts it failed
                loop.call_soon_threadsafe(q.put_nowait, e)

        resp = web.StreamResponse(headers={"Content-Type": "audio/pcm", "X-Sample-Rate": str(sr)})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        loop.run_in_executor(pool, produce)
        while True:
            item = await q.get()
            if item is None or isinstance(item, Exception):
                break
            await resp.write(item)
        if isinstance(item, Exception):
            resp.force_close()
            return resp
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=1 << 20)
    app.router.add_get("/health", health)
    app.router.add_post("/v1/audio/speech", speech)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
