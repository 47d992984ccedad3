"""A grid's types and limits: the arms, cells and spec a grid file becomes, the fields it may hold, and the
small field readers every part of the grid package shares (each refusal names the file, the field and the fix)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from harness.errors import UserError
# a grid or arm name becomes a path component (store folders, plots): the one rule of harness/paths.py
from harness.paths import MAX_NAME_BYTES, name_problem  # noqa: F401  (re-exported to the grid package)
from harness.rules import cell_id  # noqa: F401  (a cell's id: one definition, shared with `harness check`)

WORKLOAD_FIELDS = ("prompt_len", "context_len", "gen_len")
# replicate: a label only (repeats of one cell, e.g. for A/A calibration); batch: concurrent requests
AXIS_NAMES = ("threads", "prompt_len", "context_len", "gen_len", "batch", "form", "replicate", "hardware", "model",
              "concurrency", "rate", "text")
# hardware: a class of grids/hardware/ to emulate, or native; model: models of the zoo (the grid's `model` is then
# the first, and a run's model is its cell's)
STRING_AXES = ("form", "hardware", "model", "text")
ORDERS = ("interleaved", "sequential", "random")
# how `harness run --executor ray` places passes on a fleet (docs/fleet.md): spread divides the passes among the
# machines of each host class; all runs every pass on every machine (a hardware comparison). One machine: the same.
HOSTS = ("spread", "all")
TOP_FIELDS = {"kind", "name", "description", "model", "arms", "axes", "include", "exclude", "passes", "repetitions",
              "warmups", "order", "seed", "baseline", "timeout_s", "workload", "threads", "primary", "hosts",
              "report", "derived_from"}
PRIMARY_FIELDS = {"metrics", "arms", "cells"}
ARM_FIELDS = {"name", "engine", "form", "options", "env", "patches", "threads", "cpus", "numa", "observe", "observe_only",
              "hardware"}
OBSERVE = ("full", "bare")
NUMERIC_AXES = tuple(a for a in AXIS_NAMES if a not in STRING_AXES)

# What a grid file may be, checked before and while it is read (hostile or broken input is refused, never a hang):
MAX_GRID_BYTES = 1 << 20  # the file itself (the largest committed grid is under 3 KB)
MAX_DEPTH = 32  # nesting of mappings and lists, aliases expanded (a grid needs about 5)
MAX_ALIASES = 100  # *alias uses (the committed grids use none; a few share options between arms)
MAX_NODES = 100_000  # values in the document once aliases are expanded (an alias bomb expands to billions)
# What a grid may ask, checked before it is expanded:
MAX_RUNS = 100_000  # cells x arms x passes; at seconds a run, more is weeks of machine time
MAX_CELLS = 10_000  # the product of the axes (expanding is what takes a plan's time: each cell is a mapping)
MAX_ARMS = 64  # arms of one grid (each pass's order is a Williams design over them, n x n)
MAX_RULES = 200  # entries of include, of exclude and of primary.cells
MAX_RULE_CHECKS = 1_000_000  # rules x cells x arms: each rule is matched against every cell (and arm)
MAX_TIMEOUT_S = 7 * 86400  # a run's timeout_s: a week
# any count or length of a grid (tokens, threads, passes, repetitions): 16.7 million tokens is no context a CPU runs,
# and a twenty-digit prompt_len would be run (and fail hours later) rather than refused
MAX_INTEGER = 1 << 24
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
WHY_NO_DEFAULTS = "each of prompt_len, context_len, gen_len has produced a wrong conclusion when left at a default"


@dataclass(frozen=True)
class Arm:
    name: str
    engine: str
    form: str | None
    options: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    patches: Any = None
    cpus: list[int] | None = None
    numa: int | None = None
    # full: the harness's memory poller runs during the run and residency is scanned around it; bare: neither
    # (to measure what observing costs; the artifact then has no residency or peak memory)
    observe: str = "full"
    # settings recorded as read back but not enforced by `harness check` (names of base.SETTINGS or options.KEY)
    observe_only: tuple[str, ...] = ()
    # a hardware class (grids/hardware/NAME.yaml) this arm runs under, emulated (harness/emulate.py); None: native
    hardware: str | None = None


@dataclass(frozen=True)
class Cell:
    id: str
    params: dict[str, Any]


@dataclass(frozen=True)
class GridSpec:
    path: str
    sha256: str
    name: str
    description: str
    model: str
    arms: tuple[Arm, ...]
    axes: dict[str, list[Any]]
    fixed: dict[str, Any]
    include: tuple[dict, ...]
    exclude: tuple[dict, ...]
    passes: int
    repetitions: int
    warmups: int
    order: str
    seed: int
    baseline: str
    timeout_s: float
    primary: dict[str, Any] | None = None  # the declared primary comparisons: the family given verdicts
    hosts: str = "spread"  # fleet placement of passes (HOSTS)
    # each workload kind's own fields (harness/workloads), by the kind's name: what its `parse` read of `workload:`
    # (serving: the load, less what cells carry, and the latency bounds of goodput); a kind reads its own
    kinds: dict[str, dict[str, Any]] = field(default_factory=dict)
    # passes: {until: verdict, max: N}: the numbers of passes at which the runner looks (harness/sequential.py);
    # empty: a fixed number of passes
    looks: tuple[int, ...] = ()
    until: str = "verdict"  # what the looks wait for (sequential.UNTIL)
    history: tuple[str, ...] = ()  # until: step: the history's versions (report.history), oldest first
    step_alpha: float = 0.05  # until: step: the family level of the history's steps
    looked_m: int = 0  # the comparisons the looks wait on, as a family at 0.05 (until: step: the steps, scaled)
    # a grid the harness made from a committed one (a bisect's probe): {path, sha256, by}; None: its own file
    derived_from: dict[str, str] | None = None

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)


def err(path: str, fld: str, problem: str, fix: str = "") -> UserError:
    return UserError(path, f"{fld}: {problem}", fix)


def short(v: Any, n: int = 60) -> str:
    """repr of a value for a one-line message, cut to n characters."""
    r = repr(v)
    return r if len(r) <= n else r[:n - 3] + "..."


def integer(path: str, fld: str, v: Any, lo: int = 1, hi: int | None = None) -> int:
    """An integer in [lo, hi] (hi: MAX_INTEGER unless given); YAML's true/false (Python bools, an int subclass),
    floats and strings refused."""
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise err(path, fld, f"must be an integer >= {lo}, got {short(v)}")
    top = MAX_INTEGER if hi is None else hi
    if v > top:
        raise err(path, fld, f"{short(v)} is more than {top:,}", f"give at most {top:,}")
    return v


def opt(m: dict, key: str, default: Any) -> Any:
    """m[key], or the default when it is absent or null (a wrong-typed value is returned, to be refused)."""
    v = m.get(key)
    return default if v is None else v


def model_of(spec: GridSpec, params: dict) -> str:
    """The model a cell runs: its model axis value, else the grid's model."""
    return params.get("model") or spec.model


def hardware_of(arm: Arm, params: dict) -> str | None:
    """The hardware class a run emulates: the cell's hardware axis, else the arm's; native is None."""
    hw = params.get("hardware") or arm.hardware
    return None if hw in (None, "native") else hw


def machine_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity): a native run's threads and an arm's cpus must fit."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no sched_getaffinity (macOS)
        return list(range(os.cpu_count() or 1))


def cpu_list(cpus: list[int]) -> str:
    """CPU numbers as ranges: 0-3,8."""
    out: list[str] = []
    for c in sorted(set(cpus)):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        elif out and "-" not in out[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)
