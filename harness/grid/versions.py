"""Versions as an axis: an arm whose `options.build` lists `versions: [...]` becomes one arm per version, in the
order given (oldest first), each named `<arm>-<version>` with `build: {..., version: V}`; a history over them
(docs/harness.md, "Histories").

The grid's `baseline`, `primary.arms` and `report.history` may name the arm as written: the baseline becomes its
first version, primary.arms its versions after the baseline, and a grid with one such arm and no report.history
gets the versions as its history. Runs across versions are interleaved and paired by pass like any arms.
"""

from __future__ import annotations

from typing import Any

from harness.grid.spec import MAX_ARMS, err, short

MIN_VERSIONS = 2


def _versions(path: str, f: str, raw: Any) -> list[str] | None:
    build = raw.get("options", {}).get("build") if isinstance(raw, dict) and isinstance(raw.get("options"), dict) \
        else None
    if not isinstance(build, dict) or "versions" not in build:
        return None
    vs = build["versions"]
    if not isinstance(vs, list) or len(vs) < MIN_VERSIONS or len(vs) > MAX_ARMS:
        raise err(path, f"{f}.options.build.versions", f"must list {MIN_VERSIONS} to {MAX_ARMS} versions, oldest first, "
                  f"got {short(vs)}", "quote each version: ['0.3.20', '0.3.36']")
    if not all(isinstance(v, str) for v in vs) or len(set(vs)) != len(vs):
        raise err(path, f"{f}.options.build.versions", f"must be distinct quoted strings, got {short(vs, 200)}",
                  "quote each version: ['0.3.20', '0.3.36'] (YAML reads 0.3 as a number)")
    if "version" in build:
        raise err(path, f"{f}.options.build", "gives both version and versions", "keep one of them")
    return vs


def expand(path: str, doc: dict) -> dict:
    """The document with each versioned arm replaced by its versions (unchanged where there is none)."""
    arms = doc.get("arms")
    if not isinstance(arms, list):
        return doc
    out: list = []
    groups: dict[str, list[str]] = {}
    for i, ra in enumerate(arms):
        vs = _versions(path, f"arms[{i}]", ra)
        if vs is None:
            out.append(ra)
            continue
        if not isinstance(ra.get("name"), str):
            raise err(path, f"arms[{i}].name", "a versioned arm needs a name (each version is <name>-<version>)")
        names = [f"{ra['name']}-{v}" for v in vs]
        groups[ra["name"]] = names
        for name, v in zip(names, vs):
            build = {k: x for k, x in ra["options"]["build"].items() if k != "versions"} | {"version": v}
            out.append({**ra, "name": name, "options": {**ra["options"], "build": build}})
    if not groups:
        return doc
    doc = {**doc, "arms": out}
    base = doc.get("baseline")
    if isinstance(base, str) and base in groups:
        doc["baseline"] = groups[base][0]
    baseline = doc.get("baseline", out[0].get("name") if isinstance(out[0], dict) else None)
    primary = doc.get("primary")
    if isinstance(primary, dict) and isinstance(primary.get("arms"), list):
        doc["primary"] = {**primary, "arms": [n for a in primary["arms"]
                                              for n in (groups.get(a, [a]) if isinstance(a, str) else [a])
                                              if n != baseline]}
    report = doc.get("report")
    if report is None and len(groups) == 1:
        doc["report"] = {"history": next(iter(groups.values()))}
    elif isinstance(report, dict) and "history" not in report and len(groups) == 1:
        doc["report"] = {**report, "history": next(iter(groups.values()))}
    elif isinstance(report, dict) and isinstance(report.get("history"), list):
        doc["report"] = {**report, "history": [n for a in report["history"]
                                               for n in (groups.get(a, [a]) if isinstance(a, str) else [a])]}
    return doc
