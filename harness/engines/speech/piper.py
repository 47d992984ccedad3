"""The `piper` engine: Piper (piper-tts) speaking a voice on the ONNX Runtime wheel (harness/engines/speech/base.py).

The worker makes the session itself (CPU provider, intra-op threads as asked, inter-op 1, sequential execution) with
the voice's config, and hands each text to PiperVoice.synthesize, which yields one chunk per sentence. With
`options: {client: cli}` Piper's own command line is the measured process instead, read by a plain client
(cli.py: the cross-check of the harness's speech figures)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from harness.engines.speech.base import SpeechEngine, SpeechOptions
from harness.errors import UserError


class PiperOptions(SpeechOptions):
    client: Literal["worker", "cli"] = Field(
        "worker", description="worker: the harness's worker speaks and stamps in process (the default); cli: Piper's "
                              "own command line speaks, its stdout stamped by the harness (a cross-check)")


class Piper(SpeechEngine):
    name = "piper"
    DIST, PIN = "piper-tts", "1.8.0"  # pyproject.toml's extra `speech`
    DISTS = ("piper-tts", "onnxruntime")
    LIBRARY = re.compile(r"(libonnxruntime(_providers_shared)?\.so(\.[\d.]+)?|onnxruntime_pybind11_state\.[\w-]+\.so|"
                         r"espeakbridge\.so)$")
    THREADS_KEY = "intra_op_num_threads"
    Options = PiperOptions
    timestamps = ("time.perf_counter() in the worker as PiperVoice.synthesize yields each chunk (one per sentence), "
                  "relative to the call with the request's text (phonemization included)")

    def validate_options(self, path: str, arm: Any, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        super().validate_options(path, arm, opts, workload)
        if opts.client == "cli":
            if opts.workers is not None:
                raise UserError(path, f"arms[{arm.name}].options.workers: only a served run has workers",
                                "drop workers")
            from harness.engines.speech.cli import read_syscall
            read_syscall()

    def refuse_load(self, path: str, arm: Any, load: dict[str, Any]) -> None:
        if self.options(arm).client == "cli":
            raise UserError(path, f"arms[{arm.name}].options.client: cli speaks one text at a time from its stdin; a "
                            "served grid (workload.load) sends many", "drop client: cli, or the load")
