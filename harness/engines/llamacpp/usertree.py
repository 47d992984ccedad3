"""A user's llama.cpp (an arm's options.build): a source tree to build with extra flags, or a folder of prebuilt
binaries; the tree's content hash (what is built is what was hashed) and its git state."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, model_validator

from harness.errors import UserError


@dataclass(frozen=True)
class UserBuild:
    """A user's llama.cpp: a source tree to build (with extra cmake flags), a folder of prebuilt binaries, or a
    llama-cpp-python release whose vendored llama.cpp is built (releases.py)."""
    source: Path | None = None
    bin: Path | None = None
    flags: tuple[str, ...] = ()
    release: str | None = None  # a llama-cpp-python version

    @property
    def label(self) -> str:
        if self.release:
            return f"llama-cpp-python=={self.release}"
        return f"source {self.source}" + (f" flags {' '.join(self.flags)}" if self.flags else "") if self.source \
            else f"bin {self.bin}"


PINNED = "pinned"  # `source: pinned`: the pinned build's own tree, so that a grid can vary its flags alone


class BuildOption(BaseModel):
    """An arm's `options.build`: exactly one of source (a llama.cpp tree, or `pinned`), bin (prebuilt binaries)
    or sdist (`llama-cpp-python` with its `version`: the release's vendored llama.cpp; a grid's `versions: [...]`
    becomes one arm per version, harness/grid/versions.py); paths relative to the grid file's folder, `~`
    expanded; flags: extra cmake flags for a build from source."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str | None = None
    bin: str | None = None
    sdist: str | None = None
    version: str | None = None
    flags: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one(self) -> "BuildOption":
        if sum(x is not None for x in (self.source, self.bin, self.sdist)) != 1:
            raise ValueError("give exactly one of source: DIR, bin: DIR and sdist: llama-cpp-python")
        if self.sdist is not None and self.sdist != "llama-cpp-python":
            raise ValueError("sdist: the releases built are llama-cpp-python's (each vendors one llama.cpp commit)")
        if (self.sdist is None) != (self.version is None):
            raise ValueError("version goes with sdist: give both (or versions: [...], one arm each)")
        if self.version is not None:
            from harness.engines.llamacpp.releases import check_version
            from harness.errors import UserError
            try:
                check_version("version", self.version)
            except UserError as e:
                raise ValueError(str(e)) from None
        if self.bin is not None and self.flags:
            raise ValueError("flags apply to a source build only")
        if any(not f.startswith("-D") for f in self.flags):
            raise ValueError("each flag is a cmake -DNAME=VALUE")
        return self


SKIP_IN_TREE = {".git", "__pycache__"}  # what a tree's hash and the build's copy leave out (and build* folders)


def _tree_files(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):  # links to folders are not followed
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_IN_TREE and not d.startswith("build"))
        out += [Path(dirpath) / f for f in sorted(filenames) if f not in SKIP_IN_TREE]
    return out


@lru_cache(maxsize=8)
def _tree_sha256(root: str, _stamp: tuple) -> str:
    from harness.hashcache import HashCache
    cache = HashCache.default()
    h = hashlib.sha256()
    for p in _tree_files(Path(root)):
        rel = str(p.relative_to(root))
        digest = ("link:" + os.readlink(p)) if p.is_symlink() else cache.sha256(p)
        h.update(f"{rel}\0{digest}\n".encode())
    cache.save()
    return h.hexdigest()


def tree_sha256(root: Path) -> str:
    """The content of a source tree: every file's path and sha256 (a link's target, not followed), without
    .git and build folders. Memoised per process by the files' (path, size, mtime) list."""
    files = _tree_files(root)
    stamp = tuple((str(p), p.lstat().st_size, p.lstat().st_mtime_ns) for p in files)
    return _tree_sha256(str(root), stamp)


def git_state(root: Path) -> dict:
    """The tree's git commit and dirty state, if it is a git repository."""
    git = shutil.which("git")
    dotgit = root / ".git"
    if dotgit.is_file():  # a submodule's link (`gitdir: ...`): a repository only where the folder it names is
        target = dotgit.read_text(errors="replace").partition("gitdir:")[2].strip()
        if not target or not (root / target).is_dir():
            return {"git": "not a git repository (its .git links to a folder that is not here)"}
    if not git or not dotgit.exists():
        return {"git": "not a git repository"}
    head = subprocess.run([git, "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    status = subprocess.run([git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                            capture_output=True, text=True)
    if head.returncode != 0:
        return {"git": f"unreadable: {(head.stderr.strip().splitlines() or ['?'])[-1]}"}
    return {"git_commit": head.stdout.strip(), "git_dirty": bool(status.stdout.strip())}


def check_user_build(ub: UserBuild, where: str) -> None:
    """A user build's folder is what it says: refused in one line otherwise."""
    if ub.release is not None:  # a release: its sdist is fetched and checked when it is built
        return
    if ub.source is not None:
        if not ub.source.is_dir():
            raise UserError(where, f"build.source: {ub.source} is not a directory", "give a llama.cpp source tree")
        if not (ub.source / "CMakeLists.txt").is_file() or not (ub.source / "ggml").is_dir():
            raise UserError(where, f"build.source: {ub.source} is not a llama.cpp source tree (no CMakeLists.txt "
                            "and ggml/)", "give the root of a llama.cpp checkout")
        return
    if not ub.bin.is_dir():
        raise UserError(where, f"build.bin: {ub.bin} is not a directory", "give the folder of llama-bench")
    if not os.access(ub.bin / "llama-bench", os.X_OK):
        raise UserError(where, f"build.bin: {ub.bin} has no executable llama-bench",
                        "give the folder that holds llama.cpp's binaries (build/bin)")
