"""Artifacts grouped into series: per host (machine key), per grid and host the newest series; the identities
runs are grouped by (build, model, weight files), kept per object for one render (`forget` drops them);
and the fidelity gates a speed verdict waits on."""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from typing import Any

from harness.engines import weight_files


def machine_key(a) -> str:
    """The physical machine of an artifact: its host key, or for a run emulating a hardware class the key of
    the machine it ran on (host.machine_key). A grid's arms on one machine, emulated or not, are one series
    and pair by pass; an arm's runs all share its class, so emulated and native runs are never pooled."""
    h = a.host
    extra = getattr(h, "__pydantic_extra__", None)  # host.get("machine_key") without pydantic's __getattr__
    mk = extra.get("machine_key") if isinstance(extra, dict) else h.get("machine_key")
    return mk or h.key


def _by_identity(table: dict, obj: Any, fn: Any) -> Any:
    """fn(obj), computed once per object while `table` holds it (the object is kept beside its value, so its id
    is not reused): artifacts share their engine and model records (harness.artifact.parse, shared)."""
    hit = table.get(id(obj))
    if hit is not None and hit[0] is obj:
        return hit[1]
    v = fn(obj)
    table[id(obj)] = (obj, v)
    return v


_BUILD_IDS: dict[int, tuple] = {}


_MODEL_IDS: dict[int, tuple] = {}


_WEIGHT_SHAS: dict[int, tuple] = {}


def forget() -> None:
    """Drop the per-object values computed since (a report calls it when done)."""
    _BUILD_IDS.clear()
    _MODEL_IDS.clear()
    _WEIGHT_SHAS.clear()


def by_host(arts: list) -> dict[str, list]:
    """Artifacts grouped by the machine that measured them (machine_key), machines in order of their first run."""
    groups: dict[str, list] = defaultdict(list)
    for a in sorted(arts, key=lambda a: (a.timing.start, a.id)):
        groups[machine_key(a)].append(a)
    return dict(groups)


def by_key(arts: list) -> dict[str, list]:
    """Artifacts grouped by their exact host key (an emulated class apart from its machine)."""
    groups: dict[str, list] = defaultdict(list)
    for a in sorted(arts, key=lambda a: (a.timing.start, a.id)):
        groups[a.host.key].append(a)
    return dict(groups)


def newest_series(arts: list) -> list:
    """The newest series of one host's artifacts of a grid: those stamped with the grid sha256 of its latest
    run. Callers pass one host's artifacts only."""
    assert len({machine_key(a) for a in arts}) == 1, "a series is measured by one host"
    latest = max(arts, key=lambda a: a.timing.end)
    sha = latest.grid.sha256
    return [a for a in arts if a.grid.sha256 == sha]


def all_series(arts: list) -> list[list]:
    """Every series of one host's artifacts of a grid, oldest first."""
    groups: dict[str, list] = defaultdict(list)
    for a in arts:
        groups[a.grid.sha256].append(a)
    return sorted(groups.values(), key=lambda s: min(a.timing.start for a in s))


Newest = dict[tuple[str, str], list]  # (grid name, host key) -> the newest series


def newest_by_grid_and_host(runs: dict[str, list]) -> Newest:
    return {(name, key): newest_series(host_arts) for name, arts in runs.items()
            for key, host_arts in by_host(arts).items()}


def build_id(engine: Any) -> str:
    """The engine build a run used: its binary's sha256 prefix (llama.cpp), else a hash of every sha256 the
    engine recorded (wheel RECORDs, shell)."""
    return _by_identity(_BUILD_IDS, engine, _build_id)


def _build_id(engine: Any) -> str:
    b = engine.build
    if isinstance(b.get("binary_sha256"), str):
        return b["binary_sha256"][:12]
    shas = {k: v for k, v in sorted(b.items()) if k.endswith("sha256")}
    return hashlib.sha256(json.dumps(shas or b, sort_keys=True).encode()).hexdigest()[:12]


def weight_shas(a: Any) -> tuple[str, ...]:
    return _by_identity(_WEIGHT_SHAS, a.model, _weight_shas)


def _weight_shas(model: Any) -> tuple[str, ...]:
    return tuple(sorted(f.sha256 for f in weight_files(model) or []))


def model_id(a: Any) -> str:
    """The weights a run used: a hash of its model files' sha256s."""
    return _by_identity(_MODEL_IDS, a.model, _model_id)


def _model_id(model: Any) -> str:
    return hashlib.sha256("".join(sorted(f.sha256 for f in model.files)).encode()).hexdigest()[:12]


def mixed_builds(arts: list) -> list[str]:
    """Within one series, each arm whose runs used more than one engine build or model file set (pyperf
    refuses to merge such runs; the report says so and names them)."""
    out = []
    arms: dict[str, list] = defaultdict(list)
    for a in arts:
        arms[a.grid.arm].append(a)
    for arm, runs in sorted(arms.items()):
        builds = sorted({build_id(a.engine) for a in runs})
        # figures pool per cell: a model or form axis gives each cell its own files, which is no mixing
        cells: dict[str, set[str]] = defaultdict(set)
        for a in runs:
            if a.model.files:
                cells[a.grid.cell].add(model_id(a))
        weights = sorted(set().union(*(w for w in cells.values() if len(w) > 1)))
        if len(builds) > 1:
            out.append(f"arm {arm}: its runs used {len(builds)} different engine builds (sha256 "
                       f"{', '.join(builds)}): figures of different binaries are pooled in this series")
        if len(weights) > 1:
            out.append(f"arm {arm}: its runs used {len(weights)} different model file sets ({', '.join(weights)}): "
                       "figures of different weights are pooled in this series")
    return out


def fidelity_key(a: Any) -> tuple:
    """What a fidelity result vouches for: the machine, the engine, its build commit and ISA variant (a capped
    llama.cpp build computes with other kernels; None: the native build), the ISA a run was capped to (torch's kernels change with it), the
    model form and its weight files. A run emulating a class without an ISA cap (cores, memory) computes what
    the machine computes: its machine's fidelity vouches for it."""
    return (machine_key(a), a.engine.name, a.engine.build_commit, a.engine.build.get("isa_variant"), isa_cap(a),
            a.model.name, a.model.form, weight_shas(a))


def isa_cap(a: Any) -> str | None:
    """The ISA tier a run was capped to, or None (native, or emulated without an ISA cap)."""
    emu = getattr(a.execution, "emulation", None) if hasattr(a, "execution") else None
    if not emu:
        return None
    isa = emu.get("caps", {}).get("isa", {})
    return None if str(isa.get("applied", "")).startswith("none") else isa.get("requested")


def fidelity_gates(fidelity_arts: list) -> dict[tuple, Any]:
    """The newest same-engine (gated) fidelity artifact for each fidelity_key."""
    out: dict[tuple, Any] = {}
    for a in sorted(fidelity_arts, key=lambda a: a.timing.end):
        if not a.cross_engine:
            out[fidelity_key(a)] = a
    return out


def gate(a: Any, gates: dict[tuple, Any]) -> str:
    """`pass`, `fail` (failed or errored), `unchecked` (no fidelity artifact for this build on this host),
    `n/a` (no model: the command engine), or `synthetic weights` (outputs mean nothing: speed only; the
    verdict stands, marked)."""
    if not a.model.files:
        return "n/a"
    if a.model.source.get("synthetic"):
        return "synthetic weights"
    f = gates.get(fidelity_key(a))
    if f is None:
        return "unchecked"
    return "pass" if f.status == "ok" and f.verdict == "pass" else "fail"
