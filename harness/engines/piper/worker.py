"""One Piper measurement in a fresh process: `python worker.py REQUEST.json RESULT.json`.

Run by harness/engines/piper/__init__.py (under taskset, like every engine process); the only module here that
imports piper. It loads the voice's ONNX file into an ONNX Runtime session of its own (CPU provider, intra-op
threads as asked, inter-op 1, sequential execution) with the voice's config, then per request (warm-ups first)
hands the text to PiperVoice.synthesize (noise scales 0: deterministic) and stamps each audio chunk it yields
(one per sentence) with time.perf_counter() from the call; each chunk's duration is its samples / the config's
sample rate. Read back: the threads that ran the voice (from the kernel), the session's thread settings, the CPU
affinity, the ONNX Runtime libraries mapped, the versions, and each stream's audio sha256 (int16 PCM).
Standard library, piper, onnxruntime, numpy and harness/engines/workerlib.py only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

# started as a script: its folder (harness/engines/piper) must not stand in front of the real packages
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from harness.engines.workerlib import add_busy, main, running_threads, thread_times_ns  # noqa: E402


def loaded_libraries() -> list[str]:
    """The ONNX Runtime and espeak shared libraries mapped into this process (their real paths)."""
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            name = os.path.basename(parts[-1]) if len(parts) >= 6 else ""
            if (name.startswith(("libonnxruntime", "onnxruntime_pybind11_state")) or "espeakbridge" in name) \
                    and ".so" in name:
                out.add(os.path.realpath(parts[-1]))
    return sorted(out)


def load(req: dict):
    import onnxruntime as ort
    from piper.config import PiperConfig
    from piper.voice import PiperVoice
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(req["threads"])
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    sess = ort.InferenceSession(req["onnx"], sess_options=so, providers=["CPUExecutionProvider"])
    with open(req["config"], encoding="utf-8") as f:
        config = PiperConfig.from_dict(json.load(f))
    voice = PiperVoice(session=sess, config=config)
    voice.phonemize("Ready.")  # the phonemizer's first call initializes espeak-ng: start-up, not the first request
    return voice, sess, so


def measure(req: dict) -> dict:
    import numpy as np
    import onnxruntime as ort
    from importlib import metadata
    from piper.config import SynthesisConfig
    t = time.perf_counter()
    voice, sess, so = load(req)
    load_s = time.perf_counter() - t
    ready_unix = time.time()
    syn = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
    sr = int(voice.config.sample_rate)
    streams, busy_ns = [], {}
    for r in req["requests"]:
        before = thread_times_ns()
        arrivals, durations, digest = [], [], hashlib.sha256()
        t0 = time.perf_counter()
        for chunk in voice.synthesize(r["text"], syn):
            arrivals.append(time.perf_counter() - t0)
            audio = chunk.audio_float_array
            durations.append(len(audio) / sr)
            if chunk.sample_rate != sr:
                return {"status": "failed", "error": f"a chunk at {chunk.sample_rate} Hz, the voice's rate is {sr}"}
            digest.update((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes())
        after = thread_times_ns()
        if not r["warmup"]:
            add_busy(busy_ns, before, after)
        if not arrivals:
            return {"status": "failed", "error": f"no audio for text {r['id']!r}"}
        streams.append({"warmup": bool(r["warmup"]), "id": r["id"], "arrivals_s": arrivals, "durations_s": durations,
                        "samples": [round(d * sr) for d in durations], "audio_sha256": digest.hexdigest()})
    running = running_threads(busy_ns)
    opts = sess.get_session_options()
    return {"status": "ok", "streams": streams, "load_s": load_s, "ready_unix": ready_unix,
            "effective": {"threads": len(running), "thread_cpu_s": [round(ns / 1e9, 6) for ns in running],
                          "cpu_affinity": sorted(os.sched_getaffinity(0)),
                          "intra_op_num_threads": opts.intra_op_num_threads,
                          "inter_op_num_threads": opts.inter_op_num_threads, "providers": sess.get_providers(),
                          "sample_rate": sr, "noise_scale": syn.noise_scale, "noise_w_scale": syn.noise_w_scale,
                          "length_scale": voice.config.length_scale, "normalize_audio": syn.normalize_audio,
                          "piper_version": metadata.version("piper-tts"), "onnxruntime_version": ort.__version__,
                          "libraries": loaded_libraries(), "chunks": [len(s["arrivals_s"]) for s in streams]}}


def fidelity(req: dict) -> dict:
    return {"status": "failed", "error": "piper has no token fidelity mode"}


if __name__ == "__main__":
    sys.exit(main(measure, fidelity))
