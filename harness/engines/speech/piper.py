"""The `piper` engine: Piper (piper-tts) speaking a voice on the ONNX Runtime wheel (harness/engines/speech/base.py).

The worker makes the session itself (CPU provider, intra-op threads as asked, inter-op 1, sequential execution) with
the voice's config, and hands each text to PiperVoice.synthesize, which yields one chunk per sentence."""

from __future__ import annotations

import re

from harness.engines.speech.base import SpeechEngine


class Piper(SpeechEngine):
    name = "piper"
    DIST, PIN = "piper-tts", "1.8.0"  # pyproject.toml's extra `speech`
    DISTS = ("piper-tts", "onnxruntime")
    LIBRARY = re.compile(r"(libonnxruntime(_providers_shared)?\.so(\.[\d.]+)?|onnxruntime_pybind11_state\.[\w-]+\.so|"
                         r"espeakbridge\.so)$")
    THREADS_KEY = "intra_op_num_threads"
    timestamps = ("time.perf_counter() in the worker as PiperVoice.synthesize yields each chunk (one per sentence), "
                  "relative to the call with the request's text (phonemization included)")
