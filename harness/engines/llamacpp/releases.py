"""llama-cpp-python's sdists, each of which vendors one llama.cpp commit: the pinned one (`make`'s build) and any
release a grid names (`build: {sdist: llama-cpp-python, versions: [...]}`, a history over releases).

An sdist is fetched as a plain file, its link and sha256 read from the package index's JSON simple page (PEP 691;
pip download would build its metadata first, most of a minute), pip only where the index does not answer so. The
pinned sdist is checked against the sha256 in build.py; a release against the sha256 the index gave when it was
first fetched (kept beside it in the download cache), so a truncated or altered file is refused either way.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UserError
from harness.paths import downloads_dir, sha256_file

PACKAGE = "llama-cpp-python"
VERSION = re.compile(r"\d{1,4}(\.\d{1,4}){1,3}")  # a release as PyPI names llama-cpp-python's: 0.3.20
# Every release from here on is an sdist with llama.cpp vendored under vendor/llama.cpp and its commit in the
# submodule's HEAD; older ones are not.
OLDEST = (0, 2, 0)


@dataclass(frozen=True)
class Sdist:
    version: str
    sha256: str | None  # None: a release not fetched yet (the index's answer fills it in)

    @property
    def file(self) -> str:
        return f"llama_cpp_python-{self.version}.tar.gz"


def check_version(where: str, v: object) -> str:
    """A release's version string, or a one-line refusal."""
    if not isinstance(v, str) or not VERSION.fullmatch(v) or tuple(int(x) for x in v.split(".")) < OLDEST:
        raise UserError(where, f"{str(v)[:40]!r} is not a {PACKAGE} release this harness builds",
                        f"give a version such as 0.3.20 (quoted), at least {'.'.join(map(str, OLDEST))}")
    return v


def index_url() -> str:
    """The package index pip uses here (PIP_INDEX_URL, else PyPI's)."""
    return (os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple").rstrip("/")


def _index_entry(file: str) -> tuple[str, str | None] | None:
    """(the file's link, its sha256 as the index states it) from the index's JSON simple page; None where the index
    does not answer so."""
    page_url = f"{index_url()}/{PACKAGE}/"
    try:
        req = urllib.request.Request(page_url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            page = json.load(r)
        f = next(f for f in page["files"] if f["filename"] == file)
        digest = (f.get("hashes") or {}).get("sha256")
        return urllib.parse.urljoin(page_url, f["url"]), digest if isinstance(digest, str) else None
    except (OSError, ValueError, KeyError, TypeError, StopIteration, AttributeError):
        return None


MAX_SDIST_BYTES = 1 << 30  # the largest llama-cpp-python sdist is under 80 MB


def _fetch(link: str, to: Path) -> bool:
    """The file at link, at most MAX_SDIST_BYTES; False (nothing left behind) where it cannot be had."""
    try:
        with urllib.request.urlopen(link, timeout=180) as r, open(to, "wb") as out:
            got = 0
            while chunk := r.read(1 << 20):
                got += len(chunk)
                if got > MAX_SDIST_BYTES:
                    raise ValueError("larger than any sdist")
                out.write(chunk)
        return True
    except (OSError, ValueError, http.client.HTTPException):
        to.unlink(missing_ok=True)
        return False


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def expected_sha256(sd: Sdist) -> str | None:
    """The sha256 a cached sdist must have: the pinned one, or what the index said when the release was fetched."""
    if sd.sha256:
        return sd.sha256
    side = _sidecar(downloads_dir() / sd.file)
    try:
        got = side.read_text().strip()
    except OSError:
        return None
    return got if re.fullmatch(r"[0-9a-f]{64}", got) else None


def ensure(sd: Sdist) -> Path:
    """The sdist in the download cache, fetched if absent, verified by sha256."""
    dl = downloads_dir()
    dl.mkdir(parents=True, exist_ok=True)
    path = dl / sd.file
    want = expected_sha256(sd)
    if path.exists():
        if want is None:  # a release placed here by hand (or fetched by pip): checked against the index's hash
            entry = _index_entry(sd.file)
            want = entry[1] if entry else None
            if want is None:
                raise UserError(str(path), f"no sha256 to check it against: the index states none for {sd.file}",
                                "delete it and run again where the package index answers")
        digest = sha256_file(path)
        if digest != want:
            raise UserError(str(path), f"sha256 {digest[:12]}... does not match the {'pinned' if sd.sha256 else 'index'}"
                            f"'s {want[:12]}... (truncated or corrupted download)", f"delete {path} and run `make` again")
        if not sd.sha256 and not _sidecar(path).exists():
            _sidecar(path).write_text(want + "\n")
        return path
    print(f"[llama.cpp] downloading {PACKAGE}=={sd.version} sdist", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=dl) as tmp:
        got = Path(tmp) / sd.file
        entry = _index_entry(sd.file)
        stated = entry[1] if entry else None
        if (entry is None or not _fetch(entry[0], got)) and not sd.sha256:
            # a release's only hash is the one the index states: without its JSON page there is none to check
            raise UserError(f"{index_url()}/{PACKAGE}/", f"{sd.file}: the index gave no JSON page with it (PEP 691) or "
                            "the download failed", "check the network to PyPI, and run again")
        if entry is None or not got.exists():
            # pip: it prepares the sdist's metadata in an isolated build env (scikit-build-core) first
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                                f"{PACKAGE}=={sd.version}", "-d", tmp], capture_output=True, text=True)
            if r.returncode != 0 and not got.exists():
                last = (r.stderr.strip().splitlines() or ["no output"])[-1]
                raise UserError(f"pip download {PACKAGE}=={sd.version}", f"failed: {last}",
                                "check the network to PyPI, or place the sdist in " + str(dl))
        digest = sha256_file(got)
        want = sd.sha256 or stated
        if want is None:
            raise UserError(f"{index_url()}/{PACKAGE}/", f"states no sha256 for {sd.file}",
                            "use an index that states the files' hashes (PyPI does)")
        if digest != want:
            raise UserError(str(got), f"downloaded sdist sha256 {digest[:12]}... is not the "
                            f"{'pinned' if sd.sha256 else 'index'}'s {want[:12]}...", "retry `make`")
        if not sd.sha256:
            _sidecar(path).write_text(want + "\n")
        os.replace(got, path)
    return path


def extract(sd: Sdist, sdist: Path, stage: Path, expected_commit: str | None = None) -> tuple[str, str, Path]:
    """The llama.cpp vendored in the sdist, under stage/src: (commit, full commit, source dir); where a commit is
    expected (the pinned sdist), checked to be it."""
    top_name = f"llama_cpp_python-{sd.version}"
    head_name = f"{top_name}/.git/modules/vendor/llama.cpp/HEAD"
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith(f"{top_name}/vendor/llama.cpp/")
                   or m.name == head_name]
        if not any(m.name == head_name for m in members):
            raise UserError(str(sdist), "holds no vendored llama.cpp commit (.git/modules/vendor/llama.cpp/HEAD)",
                            f"give a {PACKAGE} release that vendors llama.cpp (0.2.0 or later)")
        tf.extractall(stage / "x", members=members, filter="data")
    top = stage / "x" / top_name
    commit_full = (top / ".git/modules/vendor/llama.cpp/HEAD").read_text().strip()
    if not re.fullmatch(r"[0-9a-f]{40}", commit_full):
        raise UserError(str(sdist), f"vendored llama.cpp HEAD {commit_full[:50]!r} is not a commit",
                        f"give a {PACKAGE} release that vendors llama.cpp at a commit")
    commit = commit_full[:7]
    if expected_commit is not None and commit != expected_commit:
        raise UserError(str(sdist), f"vendored llama.cpp commit {commit} is not the pinned {expected_commit}",
                        "check SDIST_SHA256 in harness/engines/llamacpp/build.py")
    if not (top / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        raise UserError(str(sdist), "its vendor/llama.cpp has no CMakeLists.txt", f"give a {PACKAGE} release sdist")
    src = stage / "src"
    os.replace(top / "vendor" / "llama.cpp", src)
    shutil.rmtree(stage / "x")
    return commit, commit_full, src


# ---- what changed between two releases: their vendored llama.cpp trees, compared file by file ------------------

CPU_BACKEND = "ggml/src/ggml-cpu"  # where a CPU step's cause is looked for first


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the llama.cpp tree
    added: int | None  # lines; None for a binary file
    deleted: int | None
    status: str  # "changed", "new" or "gone"


@dataclass(frozen=True)
class Changes:
    old: str  # release
    new: str
    old_commit: str  # the vendored llama.cpp commit, full
    new_commit: str
    files: tuple[FileChange, ...]


def tree_changes(old: tuple[str, Path], new: tuple[str, Path]) -> Changes:
    """The vendored llama.cpp trees of two sdists ((version, sdist file) each), compared by `git diff --no-index
    --numstat` (no rename detection: a moved file is one gone and one new). The sdists' own history is not in them:
    this is what differs between the two trees, not the commits between them."""
    with tempfile.TemporaryDirectory(prefix="edge-changes-") as tmp:
        t = Path(tmp)
        commits = []
        for side, (v, path) in (("old", old), ("new", new)):
            _, full, src = extract(Sdist(v, None), path, t / f"stage-{side}")
            os.replace(src, t / side)
            commits.append(full)
        r = subprocess.run(["git", "-c", "core.quotePath=false", "diff", "--no-index", "--no-renames", "--numstat",
                            "old", "new"], cwd=t, capture_output=True, text=True, errors="replace")
    if r.returncode not in (0, 1):  # 1: the trees differ
        raise UserError("git diff --no-index", f"failed: {(r.stderr.strip().splitlines() or ['no output'])[-1]}",
                        "check that git is installed")
    return Changes(old[0], new[0], commits[0], commits[1], tuple(_numstat(line) for line in r.stdout.splitlines()
                                                                 if line.strip()))


def _numstat(line: str) -> FileChange:
    """One line of `git diff --no-index --numstat old new`: `A<TAB>D<TAB>{old => new}/path`, `old/path => /dev/null`
    (gone) or `/dev/null => new/path` (new); `-` counts for a binary file."""
    added, deleted, name = line.split("\t", 2)
    if name.startswith("{old => new}/"):
        path, status = name[len("{old => new}/"):], "changed"
    elif name.startswith("/dev/null => new/"):
        path, status = name[len("/dev/null => new/"):], "new"
    elif name.startswith("old/") and name.endswith(" => /dev/null"):
        path, status = name[len("old/"):-len(" => /dev/null")], "gone"
    else:
        path, status = name, "changed"
    return FileChange(path, None if added == "-" else int(added), None if deleted == "-" else int(deleted), status)


def changes(old: str, new: str) -> Changes:
    """What differs between the llama.cpp two llama-cpp-python releases vendor (each sdist fetched and verified
    as for a build)."""
    return tree_changes(*((v, ensure(Sdist(check_version("--versions", v), None))) for v in (old, new)))


# Folders of the CPU backend that hold kernels of one architecture (arch/<name>/ besides): another machine's code
OTHER_ISA_DIRS = {"kleidiai": "arm", "spacemit": "riscv", "amx": "x86"}


def machine_arch() -> str:
    """The arch/ folder name of this machine's kernels in ggml-cpu."""
    import platform
    m = platform.machine().lower()
    return {"x86_64": "x86", "amd64": "x86", "i686": "x86", "aarch64": "arm", "arm64": "arm"}.get(m, m)


def _arch_of(rel: str) -> str | None:
    """The architecture a file under the CPU backend is for (arch/<a>/..., or a folder of one architecture's
    kernels); None for code every architecture runs."""
    head, _, rest = rel.partition("/")
    if head == "arch" and rest:
        return rest.split("/")[0]
    return OTHER_ISA_DIRS.get(head) if rest else None


def _folder(path: str) -> str:
    """The folder a file is counted under: a backend of ggml/src (ggml/src/ggml-cuda), else its top folder."""
    parts = path.split("/")
    if parts[:2] == ["ggml", "src"] and len(parts) > 3:
        return "/".join(parts[:3])
    return parts[0] if len(parts) > 1 else "(top)"


def describe(ch: Changes, focus: str = CPU_BACKEND, top: int = 8, arch: str | None = None,
             folders: int = 8) -> list[str]:
    """The lines `harness changes` and a release bisect print: the two commits, the count of files and lines, the
    files of `focus` (the CPU backend) that this machine's architecture (`arch`, default this machine's) runs,
    most changed first, the other architectures' kernels there counted, and the other folders counted, most
    files first."""
    def lines(fs: list[FileChange]) -> str:
        a, d = sum(f.added or 0 for f in fs), sum(f.deleted or 0 for f in fs)
        return f"{len(fs)} file{'s' * (len(fs) != 1)}, +{a} -{d} lines"
    arch = arch or machine_arch()
    out = [f"llama.cpp {ch.old_commit[:10]} ({PACKAGE} {ch.old}) -> {ch.new_commit[:10]} ({ch.new}): "
           + (lines(list(ch.files)) if ch.files else "the same tree")]
    if not ch.files:
        return out
    mine, theirs = [], {}  # files of the code this arch runs; other architectures' files by architecture
    for f in ch.files:
        if f.path.startswith(focus + "/"):
            a = _arch_of(f.path[len(focus) + 1:])
            if a in (None, arch):
                mine.append(f)
            else:
                theirs.setdefault(a, []).append(f)
    mine.sort(key=lambda f: (-((f.added or 0) + (f.deleted or 0)), f.path))
    out.append(f"  {focus}, the code {arch} runs: " + (lines(mine) if mine else "unchanged"))
    for f in mine[:top]:
        size = "binary" if f.added is None else f"+{f.added} -{f.deleted}"
        out.append(f"    {f.path[len(focus) + 1:]} {size}" + ("" if f.status == "changed" else f" ({f.status})"))
    if len(mine) > top:
        out.append(f"    ... {len(mine) - top} more")
    if theirs:
        out.append(f"  {focus}, other architectures' kernels ({', '.join(sorted(theirs))}): "
                   + lines([f for fs in theirs.values() for f in fs]))
    rest: dict[str, list[FileChange]] = {}
    for f in ch.files:
        if not f.path.startswith(focus + "/"):
            rest.setdefault(_folder(f.path), []).append(f)
    ranked = sorted(rest.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    out += [f"  {folder}: {lines(fs)}" for folder, fs in ranked[:folders]]
    if len(ranked) > folders:
        out.append(f"  ... {len(ranked) - folders} more folders: {lines([f for _, fs in ranked[folders:] for f in fs])}")
    return out
