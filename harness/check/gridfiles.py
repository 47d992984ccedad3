"""An artifact's grid against the git history: its `grid.sha256` is the hash of the grid file at `grid.path` in
the tree of the commit that ran it (`harness.commit`: a clean tree, so the file it read is that commit's).

What can be verified is: a 40-hex commit this checkout's history holds, and a relative path that commit tracks.
A grid file outside the checkout (a user's, given by absolute path), one the commit did not track, a commit this
history lacks (`harness check` flags an unknown commit on its own) or a checkout without git: nothing to verify
against, and nothing is said. Distinct (commit, path) pairs are read once, by one `git cat-file --batch`.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess

from harness.paths import PROJECT_ROOT

_COMMIT = re.compile(r"[0-9a-f]{40}")
_PATH = re.compile(r"[A-Za-z0-9._/-]{1,300}")


def grid_record(a) -> list[str] | None:
    """What the grid check needs of one artifact: [commit, path, sha256], or None where nothing can be verified."""
    commit, path = a.harness.commit, a.grid.path
    return [commit, path, a.grid.sha256] if _verifiable(commit, path) else None


def derived_record(a) -> list[str] | None:
    """The same of the committed grid a made grid came from (grid.derived_from: a bisect's template), with the
    field it answers for: [commit, path, sha256, "grid.derived_from.sha256"], or None."""
    d, commit = getattr(a.grid, "derived_from", None), a.harness.commit
    if d is None or not _verifiable(commit, d.path):
        return None
    return [commit, d.path, d.sha256, "grid.derived_from.sha256"]


def _verifiable(commit, path) -> bool:
    """A 40-hex commit and a relative path inside the checkout: what git can be asked for."""
    return (isinstance(commit, str) and bool(_COMMIT.fullmatch(commit)) and isinstance(path, str)
            and bool(_PATH.fullmatch(path)) and not path.startswith("/") and ".." not in path.split("/"))


def grid_problems(recs: list[tuple[str, list[str]]]) -> list[str]:
    """`where: grid.sha256: ...` for each artifact whose grid file, at its commit, hashes to something else."""
    pairs = sorted({(r[0], r[1]) for _, r in recs})
    blobs = _blobs(pairs)
    out = []
    for where, (c, p, sha, *field) in recs:
        got = blobs.get((c, p))
        if got is not None and got != sha:
            out.append(f"{where}: {field[0] if field else 'grid.sha256'}: {sha}, but {p} at commit {c[:12]} (the tree "
                       f"that ran it) hashes to {got}")
    return out


def _blobs(pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """sha256 of each (commit, path)'s file, for those the history holds."""
    git = shutil.which("git")
    if not pairs or git is None or not (PROJECT_ROOT / ".git").exists():
        return {}
    query = "".join(f"{c}:{p}\n" for c, p in pairs).encode()
    try:
        r = subprocess.run([git, "-C", str(PROJECT_ROOT), "cat-file", "--batch"], input=query, capture_output=True,
                           timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out, buf, i = {}, r.stdout, 0
    for pair in pairs:
        nl = buf.find(b"\n", i)
        if nl < 0:
            break
        head = buf[i:nl].split()
        i = nl + 1
        if len(head) == 3 and head[1] == b"blob":
            size = int(head[2])
            out[pair] = hashlib.sha256(buf[i:i + size]).hexdigest()
            i += size + 1  # the content, then a newline
        elif len(head) == 3:  # a tree or another object at that path: skipped whole
            i += int(head[2]) + 1
    return out
