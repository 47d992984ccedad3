"""What a grid's report shows besides its tables, declared in the grid file's `report:` field (never by grid
name in the report's code):

    report:
      views: [scale, context, steps]  # the extra views (default: each one the series' data allow)
      ceiling: true                   # the series feeds the machine's ceiling table and the speed beside fidelity
      blocks: [runtime]               # the docs' generated blocks that show the series
      targets:                        # an issue's target, checked from the store by an interval
        - {issue: "#17", metric: decode_tok_s, against: llama.cpp-f32, at_least: 0.6, arms: [vllm-fp32]}
      history: [v0_3_20, v0_3_28, v0_3_36]  # arms that are versions, oldest first: a history (its steps found)

`harness plan` and `harness run` refuse a malformed field (parse). The report reads the field from the grid
file its series names (of_series), now: a presentation choice, not part of what was measured. A file that is
gone, unreadable or of another grid gives the defaults (a bisect probe's: its history, probe_history); a malformed
field gives the defaults and a warning.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable

from harness.errors import UserError

VIEWS = ("scale", "context", "steps")
BLOCKS = ("runtime", "definitions", "hardware", "evidence")  # the docs' blocks of grid sections (report.BLOCKS)
FIELDS = {"views", "ceiling", "blocks", "targets", "history"}
TARGET_FIELDS = {"issue", "metric", "against", "at_least", "arms"}


@dataclass(frozen=True)
class Target:
    issue: str
    metric: str
    against: str
    at_least: float
    arms: tuple[str, ...]


@dataclass(frozen=True)
class ReportSpec:
    views: tuple[str, ...] | None = None  # None: every view the data allow
    ceiling: bool = False
    blocks: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()
    history: tuple[str, ...] = ()  # arms that are versions of one engine, oldest first (analysis/history.py)

    def shows(self, view: str) -> bool:
        return self.views is None or view in self.views


DEFAULT = ReportSpec()


def _err(path: str, fld: str, problem: str, fix: str) -> UserError:
    return UserError(path, f"{fld}: {problem}", fix)


def _names(path: str, fld: str, v: Any, allowed: tuple[str, ...] | None, fix: str) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
        raise _err(path, fld, f"must be a list of names, got {type(v).__name__}", fix)
    bad = [x for x in v if allowed is not None and x not in allowed]
    if bad:
        raise _err(path, fld, f"unknown {bad[0]!r}", f"known: {', '.join(allowed or ())}")
    if len(set(v)) != len(v):
        raise _err(path, fld, "names one twice", "give each once")
    return tuple(v)


def parse(path: str, raw: Any, arms: tuple[str, ...] | None = None) -> ReportSpec:
    """A grid's `report:` field, validated (arms: the grid's arm names, which targets must name)."""
    if raw is None:
        return DEFAULT
    if not isinstance(raw, dict):
        raise _err(path, "report", f"must be a mapping, got {type(raw).__name__}",
                   f"fields: {', '.join(sorted(FIELDS))} (docs/harness.md)")
    bad = sorted(str(k) for k in set(raw) - FIELDS)
    if bad:
        raise _err(path, f"report.{bad[0]}", "unknown field", f"allowed: {', '.join(sorted(FIELDS))}")
    views = None if raw.get("views") is None else _names(path, "report.views", raw["views"], VIEWS,
                                                            f"a list of {', '.join(VIEWS)}")
    ceiling = raw.get("ceiling", False)
    if not isinstance(ceiling, bool):
        raise _err(path, "report.ceiling", f"must be true or false, got {ceiling!r}", "write true or false")
    blocks = _names(path, "report.blocks", raw.get("blocks", []), BLOCKS, f"a list of {', '.join(BLOCKS)}")
    targets = raw.get("targets", [])
    if not isinstance(targets, list):
        raise _err(path, "report.targets", f"must be a list, got {type(targets).__name__}",
                   f"a list of mappings with {', '.join(sorted(TARGET_FIELDS))}")
    out = []
    for i, t in enumerate(targets):
        fld = f"report.targets[{i}]"
        if not isinstance(t, dict):
            raise _err(path, fld, f"must be a mapping, got {type(t).__name__}",
                       f"fields: {', '.join(sorted(TARGET_FIELDS))}")
        missing = sorted(TARGET_FIELDS - set(t))
        extra = sorted(str(k) for k in set(t) - TARGET_FIELDS)
        if missing or extra:
            raise _err(path, f"{fld}.{(missing or extra)[0]}", "missing" if missing else "unknown field",
                       f"fields: {', '.join(sorted(TARGET_FIELDS))}")
        for k in ("issue", "metric", "against"):
            if not isinstance(t[k], str) or not t[k]:
                raise _err(path, f"{fld}.{k}", f"must be a non-empty string, got {t[k]!r}", "quote it")
        at = t["at_least"]
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at <= 0:
            raise _err(path, f"{fld}.at_least", f"must be a positive ratio, got {at!r}", "e.g. 0.6")
        names = _names(path, f"{fld}.arms", t["arms"], None, "the arms the target is for")
        if arms is not None:
            for k, v in [("against", t["against"])] + [("arms", a) for a in names]:
                if v not in arms:
                    raise _err(path, f"{fld}.{k}", f"names no arm of this grid: {v!r}", f"arms: {', '.join(arms)}")
        out.append(Target(issue=t["issue"], metric=t["metric"], against=t["against"], at_least=float(at), arms=names))
    history = _names(path, "report.history", raw.get("history", []), arms, "the arms that are versions, oldest first")
    if len(history) == 1:
        raise _err(path, "report.history", "names one arm: a history has at least two versions",
                   "list the arms that are versions, oldest first")
    return ReportSpec(views=views, ceiling=ceiling, blocks=blocks, targets=tuple(out), history=history)


# The grid files read by this process's reports: path -> ((device, inode, size, mtime_ns) or None, the sha256 of its
# bytes or None, (spec, warning or "")). The report's memo keeps what it read (reads) and is valid while each file
# still has that sha256 (still_valid).
MAX_READ = 1 << 20  # a grid file is refused above this (grid.MAX_GRID_BYTES); a longer one changed anyway
_READ: dict[str, tuple[tuple | None, str | None, tuple[ReportSpec, str]]] = {}


def _stat(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def of_series(name: str, grid_path: str, read_yaml: Callable[[str], tuple[Any, str]]) -> tuple[ReportSpec, str]:
    """(the report spec of the grid file at grid_path, a warning or ""): the defaults where the file is gone,
    unreadable, not a grid file or names another grid. read_yaml: grid.read_yaml (the grid module imports this
    one)."""
    st = _stat(grid_path)
    hit = _READ.get(grid_path)
    if hit is not None and hit[0] == st and st is not None:
        return hit[2]
    sha: str | None = None
    out: tuple[ReportSpec, str] = (DEFAULT, "")
    if st is not None:
        try:
            doc, sha = read_yaml(grid_path)
        except UserError:
            doc = None
        stem = os.path.splitext(os.path.basename(grid_path))[0]
        if isinstance(doc, dict) and doc.get("name", stem) == name and doc.get("report") is not None:
            arms = doc.get("arms")
            arm_names = tuple(a["name"] for a in arms if isinstance(a, dict) and isinstance(a.get("name"), str)) \
                if isinstance(arms, list) else None
            try:
                out = (parse(grid_path, doc["report"], arm_names), "")
            except UserError as e:
                out = (DEFAULT, f"{e}; its views are the defaults")
    _READ[grid_path] = (st, sha, out)
    return out


PROBE = re.compile(r"-bisect-\d+$")  # harness bisect's probe grids (harness/bisect.py)
PROBE_ARM = re.compile(r"^[rc](\d+)-[\w.]+$")  # its arms: r<i>-<version> (releases), c<i>-<sha7> (commits)


def probe_history(name: str, arms: list[str]) -> ReportSpec | None:
    """A bisect probe's history where its grid file is gone: the probe's grid lives in the cache of the user who
    ran it (harness bisect writes it there, outside the checkout it measures), and its history is its arms in the
    order of the index harness bisect names them by (r<i>-..., c<i>-...). None: not a probe's series."""
    idx = [PROBE_ARM.match(a) for a in arms]
    if not PROBE.search(name) or len(arms) < 2 or not all(idx):
        return None
    order = sorted(zip((int(m.group(1)) for m in idx if m), arms))
    if len({i for i, _ in order}) != len(order):
        return None
    return ReportSpec(history=tuple(a for _, a in order))


def reads() -> list[tuple[str, str | None]]:
    """The grid files the reports of this process read, with the sha256 each had (None: none there)."""
    return sorted((p, sha) for p, (_, sha, _) in _READ.items())


def still_valid(read: Any) -> bool:
    """Whether every grid file a memoized report read still has the bytes it had (reads' list)."""
    import hashlib
    if not isinstance(read, list):
        return False
    for item in read:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            return False
        path, sha = item
        try:
            with open(path, "rb") as f:
                now = hashlib.sha256(f.read(MAX_READ + 1)).hexdigest() if os.path.isfile(path) else None
        except OSError:
            now = None
        if now != sha:
            return False
    return True


def forget() -> None:
    _READ.clear()
