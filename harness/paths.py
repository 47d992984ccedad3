"""Where the heavy caches live: outside the checkout, keyed by content hash.

EDGE_HARNESS_CACHE overrides the root (default ~/.cache/edge-harness).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    env = os.environ.get("EDGE_HARNESS_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "edge-harness"


def downloads_dir() -> Path:
    return cache_root() / "dl"


def models_root() -> Path:
    return cache_root() / "models"


def read_utf8(path: Path, fix_encoding: str) -> str:
    """A user's input file as text; unreadable or non-UTF-8 is a one-line UserError naming it."""
    from harness.errors import UserError
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(str(path), f"unreadable: {e.strerror}", "check the path") from e
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(str(path), f"not UTF-8 at byte {e.start}", fix_encoding) from e


def sha256_file(path: Path, bufsize: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


MAX_NAME_BYTES = 100  # a name that becomes a path component (grid, arm, plot); filesystems allow 255


def name_problem(name: object) -> str | None:
    """Why a name cannot be one path component of the harness's own (a store's grid folder, a plot, a page),
    or None. Refused: not a string, empty, `.`/`..`, a separator, NUL or another control character, a leading
    `-` (read as an option), more than MAX_NAME_BYTES bytes."""
    if not isinstance(name, str) or not name:
        return "empty or not a string"
    if name in (".", ".."):
        return f"{name!r} names a folder, not a file"
    if "/" in name or "\\" in name:
        return "holds a path separator"
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
        return "holds a control character"
    if name.startswith("-"):
        return "starts with '-'"
    if len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        return f"longer than {MAX_NAME_BYTES} bytes"
    return None


def safe_component(name: object, what: str) -> str:
    """`name` when it can be a path component (name_problem), else a one-line UserError naming `what`."""
    from harness.errors import UserError
    why = name_problem(name)
    if why:
        raise UserError(what, f"{str(name)[:60]!r} cannot be a file name: {why}",
                        "use letters, digits, '.', '-' and '_' (at most 100 bytes)")
    return name  # type: ignore[return-value]


def contained(base: Path, *parts: str) -> Path:
    """base/parts..., refused (one-line UserError) when it resolves outside `base`: no name derived from an
    artifact or a grid may place a file elsewhere, through `..` or through a link planted under `base`."""
    from harness.errors import UserError
    path = Path(base).joinpath(*parts)
    root = Path(base).resolve()
    try:
        inside = path.resolve().is_relative_to(root)
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if not inside:
        raise UserError(str(path), f"resolves outside {base}", "names taken from artifacts must stay inside their folder")
    return path


def replace_file(path: Path, data: bytes) -> None:
    """Write `path` whole: a temporary file beside it (mode as a new file would get) renamed over it, so a link
    in its place is replaced, never written through, and a reader never sees half a file."""
    import tempfile
    p = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
