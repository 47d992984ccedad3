"""The artifact store: artifacts/<grid-name>/<artifact-id>.json, written atomically, never overwritten.

A store is untrusted input (a CI check reads artifacts from a pull request): this module is the one
layer that reads and writes it. Reading opens only regular files inside the store (never a link, a FIFO,
a device), reads at most MAX_ARTIFACT_BYTES and JSON nested at most MAX_DEPTH deep, and turns every OS
error into one line; writing builds every path from validated names (paths.safe_component), refuses a
path that resolves outside the store, and never follows a link planted in it. Reading is strict: a file
that does not parse or validate is reported, never repaired.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from harness.artifact import RunArtifact, dumps, parse
from harness.errors import UserError
from harness.paths import contained, safe_component

MAX_ARTIFACT_BYTES = 16 << 20  # the largest published artifact (a fidelity reference) is under 1 MiB
MAX_DEPTH = 64  # published artifacts nest 7 deep

_O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_bytes(path: Path, limit: int = MAX_ARTIFACT_BYTES, fix: str = "remove it from the store") -> bytes:
    """A store file's bytes: a regular file (not a link, FIFO or device), at most `limit` bytes; anything else
    is a one-line UserError naming the file. Opened without following a link and without blocking on a FIFO."""
    try:
        fd = os.open(path, _O_READ)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UserError(str(path), "is a symlink; a store holds plain files only", fix) from None
        raise UserError(str(path), f"unreadable: {e.strerror}", "check the path and its permissions") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(str(path), "not a regular file (a FIFO, device or socket in a store)", fix)
        if st.st_size > limit:
            raise UserError(str(path), f"{st.st_size} bytes, more than the {limit} an artifact may have", fix)
        chunks, n = [], 0
        while True:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
            if n > limit:  # grew while read
                raise UserError(str(path), f"more than the {limit} bytes an artifact may have", fix)
        return b"".join(chunks)
    except OSError as e:
        raise UserError(str(path), f"unreadable: {e.strerror}", "check the path and its permissions") from None
    finally:
        os.close(fd)


_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")


def stamp(st: os.stat_result) -> list[int]:
    """What a verification cache keys a file by: size, mtime, ctime (which its owner cannot set), inode, device."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def read_if_unchanged(path: Path, want: list[int]) -> bytes | None:
    """A store file's bytes, if its stamp is `want` on the open file before and after it is read: the bytes a
    verification cache entry of that stamp vouches for. None otherwise, on any error, or for what read_bytes
    refuses (a link, a FIFO, more than MAX_ARTIFACT_BYTES)."""
    try:
        fd = os.open(path, _O_READ)
    except OSError:
        return None
    try:
        if stamp(os.fstat(fd)) != want or not 0 <= want[0] <= MAX_ARTIFACT_BYTES:
            return None
        chunks, n = [], 0
        while n <= want[0]:
            b = os.read(fd, min(1 << 20, want[0] + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
        return b"".join(chunks) if n == want[0] and stamp(os.fstat(fd)) == want else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _outside_strings(raw: bytes) -> bytes:
    """JSON text with its strings cut out: the text between quotes, where no quote is escaped, every other
    piece; otherwise a quote inside a string after an odd run of backslashes is escaped and does not close it."""
    parts = raw.split(b'"')
    if b'\\"' not in raw:
        return b"".join(parts[0::2])
    out, in_str = [], False
    for part in parts:  # the text up to the next quote
        if not in_str:
            out.append(part)
            in_str = True  # the quote after it opens a string
        elif (len(part) - len(part.rstrip(b"\\"))) % 2 == 0:
            in_str = False  # an unescaped quote closes it
    return b"".join(out)


def too_deep(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether JSON text nests deeper than `limit` (brackets outside strings counted; no parse). The strings are
    cut out by bytes operations first: a scan byte by byte in Python was 60% of `harness check`."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    depth = 0
    for c in _outside_strings(raw).translate(None, _NOT_BRACKET):
        if c in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def walk(root: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The artifact files (*.json, not temporaries) under a store folder, sorted, and the entries that are not
    plain files or folders (links, FIFOs, devices), each with why it is left out. Links are never followed."""
    names, odd = walk_names(root)
    return [Path(n) for n in names], odd


def walk_names(root: Path | str) -> tuple[list[str], list[tuple[Path, str]]]:
    """walk, the files as strings (str of the Path walk gives: 100,000 Path objects cost a second). Each entry's
    type comes from its directory listing (os.scandir: no stat per file where the file system gives it there)."""
    files: list[str] = []
    odd: list[tuple[Path, str]] = []

    def visit(base: str) -> None:
        try:
            with os.scandir(base) as it:
                entries = list(it)
        except OSError as e:
            odd.append((Path(e.filename or base), f"unreadable: {e.strerror}"))
            return
        dirs, names = [], []
        for e in entries:
            try:
                (dirs if e.is_dir() else names).append(e)
            except OSError:
                names.append(e)
        for e in dirs:
            if e.is_symlink():
                odd.append((Path(base, e.name), "is a symlink; a store holds plain files only"))
        for e in names:
            if not e.name.endswith(".json") or e.name.startswith(".tmp-"):
                continue
            try:
                link, regular = e.is_symlink(), e.is_file(follow_symlinks=False)
            except OSError as err:
                odd.append((Path(base, e.name), f"unreadable: {err.strerror}"))
                continue
            if link:
                odd.append((Path(base, e.name), "is a symlink; artifacts are plain files"))
            elif not regular:
                odd.append((Path(base, e.name), "not a regular file (a FIFO, device or socket in a store)"))
            else:
                files.append(join(base, e.name))
        for name in sorted(e.name for e in dirs if not e.is_symlink()):
            visit(join(base, name))

    def join(base: str, name: str) -> str:
        return name if base == "." else os.path.join(base, name)

    visit(str(Path(root)))  # Path's spelling: "store/" and "./store" are "store", as the Paths of walk say
    files.sort()
    return files, odd


@dataclass
class Store:
    root: Path
    # entries iter_paths left out (links, FIFOs, unreadable folders), one `path: reason` line each
    left_out: list[str] = field(default_factory=list)

    def grid_dir(self, grid_name: str) -> Path:
        return contained(self.root, safe_component(grid_name, "grid.name"))

    def path_for(self, a: RunArtifact) -> Path:
        return contained(self.root, safe_component(a.grid.name, "grid.name"), f"{safe_component(a.id, 'id')}.json")

    def write(self, a: RunArtifact) -> Path:
        """Atomic: temporary file, fsync, link. An existing artifact is never overwritten, a link planted in the
        store is never followed, and an OS error (full disk, read-only store, a name too long) is one line."""
        dest = self.path_for(a)
        try:
            return self._write(a, dest)
        except OSError as e:
            raise UserError(str(dest), f"cannot write the artifact: {e.strerror}",
                            "free disk space or make the store writable, then run again to resume") from None

    def _write(self, a: RunArtifact, dest: Path) -> Path:
        self._mkdir(dest.parent)
        if os.path.lexists(dest):
            if not stat.S_ISREG(os.lstat(dest).st_mode):
                raise UserError(str(dest), "is not a regular file (a link or device where an artifact belongs)",
                                "remove it from the store")
            return dest  # same id means same content: nothing to do
        data = dumps(a).encode()
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=dest.parent)  # O_EXCL: never a link
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, dest)  # fails rather than overwrite if another writer got there first
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        dfd = os.open(dest.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return dest

    def _mkdir(self, d: Path) -> None:
        """Create a grid folder in the store; a link (or file) in its place is refused, never followed."""
        self.root.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(d) and not stat.S_ISDIR(os.lstat(d).st_mode):
            raise UserError(str(d), "is not a folder (a link or file where a grid's folder belongs)",
                            "remove it from the store")
        d.mkdir(exist_ok=True)

    def iter_paths(self, grid_name: str | None = None) -> Iterator[Path]:
        base = self.grid_dir(grid_name) if grid_name else self.root
        if not os.path.lexists(base):
            return
        if os.path.islink(base):
            self.left_out.append(f"{base}: is a symlink; a store holds plain files only")
            return
        files, odd = walk(base)
        self.left_out += [f"{p}: {why}" for p, why in odd]
        yield from files

    def load_grid(self, grid_name: str) -> list[RunArtifact]:
        with gc_paused():
            return [load_path(p) for p in self.iter_paths(grid_name)]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while many artifacts are read. Parsed artifacts are trees
    (no reference cycles), but each allocates hundreds of containers, and every 700 allocations the
    collector rescans the young objects: over 10,000 artifacts that was 60% of the reading time (make bench).
    Reference counting still frees everything; the collector resumes, as it was, on exit."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _non_finite(name: str):
    raise ValueError(f"{name} is not a number an artifact may hold (ids are computed without NaN or infinity)")


def load_path(path: Path, verify_id: bool = False, shared: dict | None = None) -> RunArtifact:
    """One artifact, read through read_bytes (regular file, bounded) and parsed strictly; any problem is one line.
    `verify_id`: also refuse a document that does not hash to its id (an edited artifact). `shared`: as for
    artifact.parse."""
    import pydantic_core
    raw = read_bytes(path, fix="restore the artifact from git")
    if too_deep(raw):
        raise UserError(str(path), f"JSON nested more than {MAX_DEPTH} deep", "restore the artifact from git")
    try:  # the fast parser; anything it refuses is read again below, for the standard library's error
        doc = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError:
        try:
            doc = json.loads(raw.decode("utf-8"), parse_constant=_non_finite)
        except UnicodeDecodeError as e:
            raise UserError(str(path), f"not UTF-8 at byte {e.start}", "restore the artifact from git") from None
        except (ValueError, RecursionError) as e:
            raise UserError(str(path), f"invalid JSON: {e}", "restore the artifact from git (truncated?)") from None
    if verify_id:
        from harness.artifact import id_matches
        try:
            good = isinstance(doc, dict) and id_matches(doc, finite=True)
        except (ValueError, TypeError):
            good = False
        if not good:
            raise UserError(str(path), "id: does not match the content", "restore the artifact from git")
    from pydantic import ValidationError
    try:
        return parse(doc, str(path), shared)
    except ValidationError as e:
        err = e.errors()[0]
        fld = ".".join(str(x) for x in err["loc"])
        raise UserError(str(path), f"{fld}: {err['msg']}", "restore the artifact from git") from None
