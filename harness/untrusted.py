"""The user's files, read as untrusted input: a model's GGUF and HF folder, a config.json, the user-model registry
(docs/formats.md, the threat model).

One reader for each shape, each with bounds (size, nesting, counts) and one-line errors naming the file, what is
wrong and the fix (harness.errors.UserError, exit 2): a path must be a regular file or a folder (a FIFO would hang
the reader, a device never ends, a link loop is an OSError), JSON is bounded in bytes and nesting, a folder's links
must stay inside it, and a write that the OS refuses (read-only, full, name too long) is one line, never a traceback,
and never half a file (harness.paths.replace_file).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from harness.errors import UserError

MAX_JSON_BYTES = 16 << 20  # a config.json or a registry is kilobytes; tokenizer files are not read here
MAX_DEPTH = 64  # nesting of JSON a config or registry can have (real ones: under 6)
MAX_FOLDER_FILES = 10_000  # files of a model folder (real ones: tens)

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _stat(path: Path, where: str, fix: str) -> os.stat_result:
    try:
        return os.stat(path)
    except OSError as e:  # missing, unreadable, a link loop (ELOOP), a name too long
        raise UserError(where, f"{path}: {e.strerror or type(e).__name__}", fix) from None


def regular_file(path: Path, where: str, fix: str) -> os.stat_result:
    """`path` (links followed) is a regular file: not a FIFO, device, socket or folder, not a link loop."""
    st = _stat(path, where, fix)
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        raise UserError(where, f"{path} is {kind}, not a regular file", fix)
    return st


def folder(path: Path, where: str, fix: str) -> list[Path]:
    """`path` is a folder whose entries are regular files and folders, none a link leading out of it or a loop, at
    most MAX_FOLDER_FILES of them: its files, sorted."""
    st = _stat(path, where, fix)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(where, f"{path} is not a folder", fix)
    root = Path(os.path.realpath(path))
    files: list[Path] = []
    for d, dirs, names in os.walk(path, followlinks=False):
        for p in (Path(d) / n for n in dirs + names):
            if p.is_symlink() and not Path(os.path.realpath(p)).is_relative_to(root):
                raise UserError(where, f"{p} links out of the folder (to {os.path.realpath(p)})",
                                "copy the file into the folder instead of linking it")
        for p in (Path(d) / n for n in names):
            regular_file(p, where, "remove it from the folder, or replace it with the file itself")
            files.append(p)
        if len(files) > MAX_FOLDER_FILES:
            raise UserError(where, f"{path} holds more than {MAX_FOLDER_FILES:,} files", "give the model's own folder")
    return sorted(files)


def _read_bounded(path: Path, where: str, fix: str, max_bytes: int) -> bytes:
    """A regular file's bytes, at most max_bytes + 1 of them (refused beforehand where its size is over)."""
    st = regular_file(path, where, fix)
    if st.st_size > max_bytes:
        raise UserError(where, f"{path}: {st.st_size:,} bytes, more than {max_bytes:,}", fix)
    try:
        with open(path, "rb") as f:
            return f.read(max_bytes + 1)
    except OSError as e:
        raise UserError(where, f"{path}: {e.strerror or type(e).__name__}", fix) from None


def read_json(path: Path, where: str, fix: str, max_bytes: int = MAX_JSON_BYTES, want: type | None = dict) -> Any:
    """A JSON file, bounded: a regular file of at most max_bytes, valid UTF-8 JSON nesting at most MAX_DEPTH
    levels (store.too_deep, on the bytes, before parsing), of type `want` (None: any)."""
    from harness.store import too_deep
    raw = _read_bounded(path, where, fix, max_bytes)
    if too_deep(raw, MAX_DEPTH):
        raise UserError(where, f"{path}: nests deeper than {MAX_DEPTH} levels", fix)
    try:
        doc = json.loads(raw)
    except ValueError as e:  # not UTF-8, not JSON
        raise UserError(where, f"{path}: not JSON ({str(e)[:80]})", fix) from None
    if want is not None and not isinstance(doc, want):
        raise UserError(where, f"{path}: a JSON {type(doc).__name__}, not an {'object' if want is dict else want.__name__}",
                        fix)
    return doc


def read_text(path: Path, where: str, fix: str, max_bytes: int) -> tuple[str, str]:
    """A text file, bounded: a regular file of at most max_bytes, valid UTF-8; (its text, its bytes' sha256)."""
    import hashlib
    raw = _read_bounded(path, where, fix, max_bytes)
    if len(raw) > max_bytes:  # grew since the stat
        raise UserError(where, f"{path}: more than {max_bytes:,} bytes", fix)
    try:
        return raw.decode("utf-8"), hashlib.sha256(raw).hexdigest()
    except UnicodeDecodeError:
        raise UserError(where, f"{path}: not UTF-8 text", fix) from None


def write_file(path: Path, data: bytes, where: str, fix: str = "") -> None:
    """Write `path` whole (harness.paths.replace_file: never half a file, a link in its place replaced); an OS
    error (read-only, full, missing folder, name too long) is one line naming the file."""
    from harness.paths import replace_file
    try:
        replace_file(path, data)
    except OSError as e:
        raise UserError(where, f"cannot write {path}: {e.strerror or type(e).__name__}",
                        fix or "write to a folder you can write to, with space left") from None


def make_folder(path: Path, where: str, fix: str = "") -> None:
    """mkdir -p, an OS error as one line."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(where, f"cannot make the folder {path}: {e.strerror or type(e).__name__}",
                        fix or "give a folder you can write to") from None
