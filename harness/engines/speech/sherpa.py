"""The `sherpa-onnx` engine: sherpa-onnx's OfflineTts speaking the same voice file as Piper (harness/engines/speech/
base.py), on the ONNX Runtime its own wheel ships.

sherpa-onnx reads a Piper voice once the ONNX file carries its metadata (model_type vits, comment piper, the espeak
voice, the sample rate) and a tokens file lists the voice's phoneme ids: both are derived here from the form's files
(the graph and its weights unchanged), cached beside the form by the source's sha256, and their sha256s recorded in
the run. Its phonemizer reads Piper's espeak-ng data (piper-tts ships it; sherpa-onnx's wheel does not). The worker
asks one sentence per chunk (max_num_sentences 1) and stamps each chunk the generation callback hands it."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from harness.engines.speech.base import INSTALL_FIX, SpeechEngine
from harness.errors import UserError

DERIVED = 1  # bump when the derived files change


class SherpaOnnx(SpeechEngine):
    name = "sherpa-onnx"
    DIST, PIN = "sherpa-onnx", "1.13.8"  # pyproject.toml's extra `speech`
    DISTS = ("sherpa-onnx", "sherpa-onnx-core")
    LIBRARY = re.compile(r"(libonnxruntime\.so(\.[\d.]+)?|_sherpa_onnx\.[\w-]+\.so|libsherpa-onnx-c(xx)?-api\.so)$")
    THREADS_KEY = "num_threads"
    MAX_WORKERS = 1  # OfflineTts.generate is called one request at a time
    timestamps = ("time.perf_counter() in the worker at each call of OfflineTts.generate's callback (one per sentence: "
                  "max_num_sentences 1), relative to the call with the request's text (phonemization included)")

    def voice_files(self, voice_dir: Path, form: str) -> dict[str, Any]:
        """The form's ONNX file with sherpa-onnx's metadata added and the voice's tokens file, made once per form."""
        from harness import voices
        src, cfg_path = voice_dir / voices.ONNX_NAME, voice_dir / voices.CONFIG_NAME
        src_sha = voices.sha256(src)
        out = voice_dir.parent / f"sherpa-{form}" / hashlib.sha256(f"{src_sha}|{DERIVED}".encode()).hexdigest()[:16]
        model, tokens = out / "model.onnx", out / "tokens.txt"
        if not (model.is_file() and tokens.is_file()):
            _derive(src, cfg_path, out)
        try:
            import piper
        except ImportError:
            raise UserError(f"engine {self.name}", "piper-tts is not installed: sherpa-onnx reads its espeak-ng data",
                            INSTALL_FIX) from None
        data = Path(piper.__file__).parent / "espeak-ng-data"
        return {"onnx": str(model), "tokens": str(tokens), "config": str(cfg_path), "espeak_data": str(data),
                "derived": {"model_sha256": voices.sha256(model), "tokens_sha256": voices.sha256(tokens),
                            "from_sha256": src_sha}}


def _derive(src: Path, cfg_path: Path, out: Path) -> None:
    import os
    import tempfile

    import onnx
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    m = onnx.load(str(src))
    meta = {"model_type": "vits", "comment": "piper", "language": cfg.get("language", {}).get("name_english", ""),
            "voice": cfg["espeak"]["voice"], "has_espeak": "1", "n_speakers": str(cfg["num_speakers"]),
            "sample_rate": str(cfg["audio"]["sample_rate"])}
    for k, v in meta.items():
        e = m.metadata_props.add()
        e.key, e.value = k, v
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=out.parent))
    onnx.save(m, str(tmp / "model.onnx"))
    (tmp / "tokens.txt").write_text("".join(f"{s} {ids[0]}\n" for s, ids in cfg["phoneme_id_map"].items()),
                                    encoding="utf-8")
    try:
        os.replace(tmp, out)
    except OSError:  # made meanwhile by another run
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
