"""The grid file: parse and validate the YAML, and expand it (purely) into cells x arms x passes.

Every error names the file, the field and what is allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.errors import UserError
from harness import views
from harness.engines import engine_class, get_engine

WORKLOAD_FIELDS = ("prompt_len", "context_len", "gen_len")
# replicate: a label only (repeats of one cell, e.g. for A/A calibration); batch: concurrent requests
AXIS_NAMES = ("threads", "prompt_len", "context_len", "gen_len", "batch", "form", "replicate", "hardware", "model",
              "concurrency", "rate")
# hardware: a class of grids/hardware/ to emulate, or native; model: models of the zoo (the grid's `model` is then
# the first, and a run's model is its cell's)
STRING_AXES = ("form", "hardware", "model")
ORDERS = ("interleaved", "sequential", "random")
# how `harness run --executor ray` places passes on a fleet (docs/fleet.md): spread divides the passes among the
# machines of each host class; all runs every pass on every machine (a hardware comparison). One machine: the same.
HOSTS = ("spread", "all")
TOP_FIELDS = {"kind", "name", "description", "model", "arms", "axes", "include", "exclude", "passes", "repetitions",
              "warmups", "order", "seed", "baseline", "timeout_s", "workload", "threads", "primary", "hosts",
              "report"}
PRIMARY_FIELDS = {"metrics", "arms", "cells"}
ARM_FIELDS = {"name", "engine", "form", "options", "env", "patches", "threads", "cpus", "numa", "observe", "observe_only",
              "hardware"}
OBSERVE = ("full", "bare")
NUMERIC_AXES = tuple(a for a in AXIS_NAMES if a not in STRING_AXES)
# A server engine's load (harness/serving.py, docs/serving.md): workload.load and workload.slo; concurrency and
# rate are cell parameters (fixed there, or axes), the rest of the load is the grid's
LOAD_FIELDS = {"concurrency", "rate", "arrival", "burstiness", "requests", "seed", "errors_allowed", "points"}
LOAD_AXES = ("concurrency", "rate")
SLO_FIELDS = ("ttft_s", "tpot_s", "e2e_s")  # bounds in seconds; `share` (a sweep's capacity rule) is apart
MAX_LOAD_REQUESTS = 100_000
MAX_RATE = 10_000.0

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
# a grid or arm name becomes a path component (store folders, plots): the one rule of harness/paths.py
from harness.paths import MAX_NAME_BYTES, name_problem  # noqa: E402
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
    load: dict[str, Any] | None = None  # a server grid's load, less what cells carry (LOAD_AXES); None: no load
    slo: dict[str, float] | None = None  # latency bounds of goodput (SLO_FIELDS)

    def load_of(self, params: dict, resolved: dict | None = None) -> Any:
        """The load of a cell (harness/serving.py Load). A rate sweep's point (harness/sweep.py) takes its rate
        from `resolved` (sweep.resolve, at the run's start); its probes are closed loops of 1 and of every request."""
        from harness import sweep
        from harness.serving import Load
        d = self.load or {}
        conc, rate, point = params.get("concurrency"), params.get("rate"), None
        if sweep.is_point(rate):
            point = {"point": rate}
            if rate in (sweep.SYNC, sweep.MAX):
                conc = 1 if rate == sweep.SYNC else d["requests"]
                rate = None
            else:
                point = resolved or {"point": rate, "error": "not resolved: the run was not started by the grid's "
                                     "execution loop, which resolves a sweep's rates (harness/sweep.py)"}
                rate = point.get("rate_req_s")
        return Load(requests=d["requests"], concurrency=conc, rate=rate, arrival=d.get("arrival", "poisson"),
                    burstiness=d.get("burstiness", 1.0), seed=d.get("seed", 0), sweep=point)

    @property
    def load_errors_allowed(self) -> float:
        """The share of a run's requests that may fail (error, timeout) before the run does."""
        return float((self.load or {}).get("errors_allowed", 0.0))

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)


def _err(path: str, fld: str, problem: str, fix: str = "") -> UserError:
    return UserError(path, f"{fld}: {problem}", fix)


def _short(v: Any, n: int = 60) -> str:
    """repr of a value for a one-line message, cut to n characters."""
    r = repr(v)
    return r if len(r) <= n else r[:n - 3] + "..."


def _int(path: str, fld: str, v: Any, lo: int = 1) -> int:
    """An integer >= lo; YAML's true/false (Python bools, an int subclass), floats and strings refused."""
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise _err(path, fld, f"must be an integer >= {lo}, got {_short(v)}")
    return v


class _Refused(Exception):
    """Raised by the grid loader: a document the harness will not read (line, problem, fix)."""

    def __init__(self, mark: Any, problem: str, fix: str) -> None:
        self.line = mark.line + 1 if mark is not None else None
        self.problem, self.fix = problem, fix
        super().__init__(problem)


class GridLoader(yaml.SafeLoader):
    """yaml.SafeLoader (no object tags) that also refuses a duplicate key in any mapping (YAML keeps the
    last silently), more than MAX_ALIASES alias uses and nesting deeper than MAX_DEPTH."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(self.peek_event().start_mark, f"more than {MAX_ALIASES} aliases (*name)",
                               "write the values out; a grid needs few aliases")
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels",
                               "a grid needs a few levels of mappings and lists")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                # merge keys (<<: *base) are YAML's explicit way to override, not duplicates
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line
                try:
                    first = seen.get(key)
                    seen.setdefault(key, line)
                except TypeError:
                    continue  # unhashable: SafeConstructor refuses it
                if first is not None:
                    raise _Refused(key_node.start_mark, f"duplicate key {_short(key)} (lines {first + 1} and "
                                   f"{line + 1}; YAML would keep the last silently)", "keep one of them")
        return super().construct_mapping(node, deep=deep)


def _read_grid_text(p: Path) -> tuple[str, bytes]:
    """The file's text and bytes: a regular file of at most MAX_GRID_BYTES, UTF-8. Opened without blocking
    (a FIFO) and read with a bound (a device such as /dev/zero never ends)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserError(str(p), f"unreadable: {e.strerror}", "check the path") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(str(p), "is not a regular file", "give the path of a grid file (YAML)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_GRID_BYTES + 1)
    except OSError as e:
        raise UserError(str(p), f"unreadable: {e.strerror}", "check the path") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_GRID_BYTES:
        raise UserError(str(p), f"larger than {MAX_GRID_BYTES} bytes ({MAX_GRID_BYTES >> 20} MiB): not a grid file",
                        "a grid is a few kilobytes of YAML; split it or check the path")
    try:
        return raw.decode("utf-8"), raw
    except UnicodeDecodeError as e:
        raise UserError(str(p), f"not UTF-8 at byte {e.start}", "save the grid as UTF-8") from None


_PLAIN = (str, int, float, bool, type(None))


def _check_tree(path: str, doc: Any) -> None:
    """Every value of the document, aliases expanded, walked once without recursion: at most MAX_NODES
    values and MAX_DEPTH levels (an alias bomb or a recursive alias is refused here, before any code walks
    it), string keys, finite numbers, no NUL, and only the types YAML's plain mappings, lists and scalars make."""
    stack: list[tuple[Any, tuple, int]] = [(doc, (), 1)]
    count = 0

    def where(trail: tuple) -> str:
        out = ""
        for t in trail:
            out += f"[{t}]" if isinstance(t, int) else (f".{t}" if out else str(t))
        return out or "(top level)"

    while stack:
        v, trail, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise _err(path, "(document)", f"more than {MAX_NODES:,} values once its aliases are expanded",
                       "a grid is small: write it without aliases that multiply")
        if depth > MAX_DEPTH:
            raise _err(path, where(trail), f"nested deeper than {MAX_DEPTH} levels (a recursive alias?)",
                       "a grid needs a few levels of mappings and lists")
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise _err(path, where(trail), f"key {_short(k)} is not a string",
                               "quote it: YAML reads unquoted yes/no/on/off/numbers/null as other types")
                if "\0" in k:
                    raise _err(path, where(trail), f"key {_short(k)} holds a NUL character", "remove it")
                stack.append((x, (*trail, k), depth + 1))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                stack.append((x, (*trail, i), depth + 1))
        elif isinstance(v, float) and not math.isfinite(v):
            raise _err(path, where(trail), f"{v} is not a finite number", "give a finite number")
        elif isinstance(v, str) and "\0" in v:
            raise _err(path, where(trail), "holds a NUL character", "remove it")
        elif not isinstance(v, _PLAIN):
            raise _err(path, where(trail), f"a {type(v).__name__} ({_short(v)}) has no meaning in a grid",
                       "quote it to make it a string, or give a number")


def read_yaml(path: str | Path) -> tuple[Any, str]:
    """A grid file's document and the sha256 of its bytes (speed and fidelity grids alike). Refused, one
    line each: a file that is not a regular file or exceeds MAX_GRID_BYTES, invalid YAML, object tags, a
    duplicate key, more than MAX_ALIASES aliases, nesting deeper than MAX_DEPTH, a document of more than
    MAX_NODES values, a non-string key, a non-finite number, a NUL."""
    p = Path(path)
    text, raw = _read_grid_text(p)
    try:
        doc = yaml.load(text, Loader=GridLoader)  # noqa: S506 (a SafeLoader)
    except _Refused as e:
        where = f"line {e.line}: " if e.line else ""
        raise UserError(str(p), f"{where}{e.problem}", e.fix) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise UserError(str(p), f"invalid YAML{where}: {problem}", "fix the YAML syntax") from None
    except (ValueError, OverflowError, RecursionError) as e:  # e.g. an integer of more digits than Python reads
        raise UserError(str(p), f"invalid YAML value: {_short(' '.join(str(e).split()), 120)}",
                        "fix the value (quote it to make it a string)") from None
    _check_tree(str(p), doc)
    return doc, hashlib.sha256(raw).hexdigest()


def only_fields(path: str, prefix: str, mapping: dict, allowed: set[str]) -> None:
    """Refuse the first unknown field of a mapping, naming the ones allowed."""
    bad = set(mapping) - allowed
    if bad:
        first = sorted(bad, key=lambda k: (not isinstance(k, str), str(k)))[0]
        if not isinstance(first, str):
            first = repr(first)
        fld = f"{prefix}.{first}" if prefix else first
        raise _err(path, fld, "unknown field", f"allowed: {', '.join(sorted(allowed))}")


def entries(path: str, fld: str, raw: Any, allowed: set[str], hint: str) -> list[tuple[str, dict]]:
    """A non-empty list of mappings with known fields, as (field path, mapping) pairs."""
    if not isinstance(raw, list) or not raw:
        raise _err(path, fld, "must be a non-empty list", hint)
    out = []
    for i, item in enumerate(raw):
        f = f"{fld}[{i}]"
        if not isinstance(item, dict):
            raise _err(path, f, "must be a mapping", hint)
        only_fields(path, f, item, allowed)
        out.append((f, item))
    return out


def grid_name(path: str, name: Any) -> str:
    """The grid's name: the store's folder artifacts/<name>/ and the stem of its plots."""
    why = name_problem(name)
    if why or not name.replace("-", "").replace("_", "").isalnum():
        raise _err(path, "name", f"{why or 'must be letters, digits, - and _'}, got {_short(name)}",
                   f"a name of letters, digits, - and _ (at most {MAX_NAME_BYTES} bytes, not starting with -)")
    return name


def load(path: str | Path) -> GridSpec:
    """A grid file as `harness plan` and `harness run` read it: its document's rules (from_dict), and what this
    machine can run: an arm's cpus among the CPUs this process may use, a native run's threads within them."""
    doc, sha = read_yaml(path)
    return from_dict(doc, str(path), sha, cpus=machine_cpus())


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


def _opt(m: dict, key: str, default: Any) -> Any:
    """m[key], or the default when it is absent or null (a wrong-typed value is returned, to be refused)."""
    v = m.get(key)
    return default if v is None else v


def model_name(path: str, fld: str, v: Any) -> str:
    """A zoo model's name, a registered model's (harness models add), or your model given by path (a mapping:
    harness/usermodels.py), which is then known by its name."""
    from harness import models, usermodels
    if isinstance(v, dict):
        return models.register(usermodels.from_mapping(path, fld, v))
    if not models.known(v):
        raise _err(path, fld, f"unknown model {_short(v)}", f"known: {', '.join(models.known_names())}, or "
                   "{name: NAME, gguf: PATH} for your own")
    return v


def _rule_values(path: str, fld: str, rule: dict, allow_arm: bool) -> None:
    """The values of an include/exclude/primary.cells rule, typed as their axis is (a rule `{threads: true}`
    would match threads 1, since True == 1 in Python)."""
    for k, v in rule.items():
        if k == "arm" and allow_arm:
            continue
        if k not in AXIS_NAMES:
            raise _err(path, f"{fld}.{k}", "unknown axis", f"known: {', '.join(AXIS_NAMES)}{', arm' if allow_arm else ''}")
        if k == "rate" and isinstance(v, str):
            from harness import sweep
            if not sweep.is_point(v):
                raise _err(path, f"{fld}.{k}", f"{_short(v)} is no point of a rate sweep",
                           "sync, max or sweep-KofM (the cells of `harness plan`), or a number")
        elif k in NUMERIC_AXES:
            _int(path, f"{fld}.{k}", v)
        elif not isinstance(v, str) or not v:
            raise _err(path, f"{fld}.{k}", f"must be a name, got {_short(v)}")


def _arm(path: str, f: str, ra: dict, engines: Any, avail: list[int] | None) -> Arm:
    eng = ra.get("engine")
    if not isinstance(eng, str) or eng not in engines:
        raise _err(path, f"{f}.engine", f"unknown engine {_short(eng)}", f"known: {', '.join(sorted(engines))}")
    an = ra.get("name", eng)
    why = name_problem(an) or ("holds '|', the separator of run keys (cell|arm|pass)" if "|" in an else None)
    if why:
        raise _err(path, f"{f}.name", f"{why}, got {_short(an)} (an arm's name is part of file names and run keys)",
                   f"letters, digits, '.', '-' and '_', at most {MAX_NAME_BYTES} bytes")
    form = ra.get("form")
    if form is not None and (not isinstance(form, str) or not form):
        raise _err(path, f"{f}.form", f"must be a form name, got {_short(form)}", "e.g. gguf-f32 or hf-fp32")
    opts = _opt(ra, "options", {})
    if not isinstance(opts, dict):
        raise _err(path, f"{f}.options", f"must be a mapping, got {_short(opts)}")
    env = _opt(ra, "env", {})
    if not isinstance(env, dict):
        raise _err(path, f"{f}.env", f"must be a mapping of names to strings, got {_short(env)}")
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME.fullmatch(k):
            raise _err(path, f"{f}.env", f"{_short(k)} is not an environment variable name",
                       "letters, digits and _, not starting with a digit")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise _err(path, f"{f}.env.{k}", f"must be a string, got {_short(v)}",
                       "quote it (YAML reads unquoted yes/no/true/false as booleans)")
        if isinstance(v, float) and not math.isfinite(v) or isinstance(v, str) and "\0" in v:
            raise _err(path, f"{f}.env.{k}", f"{_short(v)} cannot be an environment value", "give a plain string")
    cpus = ra.get("cpus")
    if cpus is not None:
        if not isinstance(cpus, list) or not cpus or any(isinstance(c, bool) or not isinstance(c, int) for c in cpus):
            raise _err(path, f"{f}.cpus", f"must be a non-empty list of CPU numbers, got {_short(cpus)}",
                       "e.g. [0, 1]")
        seen: set[int] = set()
        dup = sorted({c for c in cpus if c in seen or seen.add(c)})  # type: ignore[func-returns-value]
        if dup:
            raise _err(path, f"{f}.cpus", f"CPU {dup[0]} is listed twice", "list each CPU once")
        if min(cpus) < 0:
            raise _err(path, f"{f}.cpus", f"CPU {min(cpus)} is negative", "CPU numbers start at 0")
        missing = sorted(seen - set(avail)) if avail is not None else []
        if missing:
            raise _err(path, f"{f}.cpus", f"CPU {cpu_list(missing)} not among the CPUs this process may run on "
                       f"({cpu_list(avail)}, os.sched_getaffinity)",
                       "list CPUs of this machine, or plan and run the grid on the machine that has them")
    pat = ra.get("patches")
    if pat is not None:
        get_engine(eng).validate_patches(path, f"{f}.patches", pat)
    if "threads" in opts:
        _int(path, f"{f}.options.threads", opts["threads"])
    if "threads" in ra:
        if "threads" in opts:
            raise _err(path, f"{f}.threads", "is given both here and in options", "give it once")
        opts = {**opts, "threads": _int(path, f"{f}.threads", ra["threads"])}
    numa = ra.get("numa")
    if numa is not None:
        _int(path, f"{f}.numa", numa, lo=0)
    observe = ra.get("observe", "full")
    if observe not in OBSERVE:
        raise _err(path, f"{f}.observe", f"unknown value {_short(observe)}", f"allowed: {', '.join(OBSERVE)}")
    oo = _opt(ra, "observe_only", [])
    from harness.engines.base import SETTINGS
    if not isinstance(oo, list) or not all(isinstance(x, str) and (x in SETTINGS or x.startswith("options."))
                                           for x in oo):
        raise _err(path, f"{f}.observe_only", f"must be a list of settings, got {_short(oo)}",
                   f"settings: {', '.join(SETTINGS)}, or options.KEY")
    hw = ra.get("hardware")
    if hw is not None and (not isinstance(hw, str) or not hw):
        raise _err(path, f"{f}.hardware", f"must be a class name, got {_short(hw)}", "see grids/hardware/")
    return Arm(name=an, engine=eng, form=form, options=opts, env={k: str(v) for k, v in env.items()}, patches=pat,
               cpus=cpus, numa=numa, observe=observe, observe_only=tuple(oo), hardware=None if hw == "native" else hw)


def from_dict(doc: Any, path: str, sha256: str, cpus: list[int] | None = None) -> GridSpec:
    """A grid document, validated: every rule of the document itself, the engines' and the emulated hardware
    classes' rules; and, given `cpus` (the CPUs of the machine that will run it, as load() passes), the arms'
    cpus and the native runs' threads against them."""
    from harness.engines import ENGINES
    if not isinstance(doc, dict):
        raise _err(path, "(top level)", "must be a mapping of grid fields", "see docs/harness.md")
    kind = doc.get("kind", "speed")
    if kind != "speed":
        raise _err(path, "kind", f"{_short(kind)} grids are not run by `harness run`",
                   "run a kind: fidelity grid with `harness fidelity`" if kind == "fidelity"
                   else "kind is speed (the default) or fidelity")
    only_fields(path, "", doc, TOP_FIELDS)
    name = grid_name(path, doc.get("name"))
    description = _opt(doc, "description", "")
    if not isinstance(description, str):
        raise _err(path, "description", f"must be a string (free text), got {_short(description)}", "quote it")
    from harness.models import MODELS
    axes_doc = doc.get("axes")
    axis_models = axes_doc.get("model") if isinstance(axes_doc, dict) else None
    if axis_models is not None:
        if "model" in doc:
            raise _err(path, "model", "is given both as the grid's model and as an axis", "keep one of them")
        vals = axis_models if isinstance(axis_models, list) else [axis_models]
        if not vals:
            raise _err(path, "axes.model", "must list at least one model", f"known: {', '.join(sorted(MODELS))}")
        # a model given by path is registered, and the axis names it from then on
        names_ = [model_name(path, f"axes.model[{i}]", m) for i, m in enumerate(vals)]
        if len(set(names_)) != len(names_):
            raise _err(path, "axes.model", f"names a model twice: {_short(names_, 200)}", "give each model once")
        axes_doc = {**axes_doc, "model": names_}
        doc = {**doc, "axes": axes_doc}
        model = names_[0]
    else:
        model = doc.get("model", "none")
        if model != "none":
            model = model_name(path, "model", model)

    avail = cpus
    raw_arms = entries(path, "arms", doc.get("arms"), ARM_FIELDS, "each arm: {name, engine, ...}")
    if len(raw_arms) > MAX_ARMS:
        raise _err(path, "arms", f"{len(raw_arms):,} arms, more than the {MAX_ARMS} a grid may compare",
                   "split the comparison into several grids")
    arms = [_arm(path, f, ra, ENGINES, avail) for f, ra in raw_arms]
    if model == "none" and any(engine_class(a.engine).needs_model for a in arms):
        raise _err(path, "model", "is required when an arm runs a model engine", f"known: {', '.join(sorted(MODELS))}")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise _err(path, "arms", f"arm names must be unique, got {_short(names, 200)}")

    axes_raw = _opt(doc, "axes", {})
    if not isinstance(axes_raw, dict):
        raise _err(path, "axes", "must be a mapping of axis name to a list of values")
    axes: dict[str, list] = {}
    for k, v in axes_raw.items():
        if k not in AXIS_NAMES:
            raise _err(path, f"axes.{k}", "unknown axis", f"known axes: {', '.join(AXIS_NAMES)}")
        vals = v if isinstance(v, list) else [v]
        if not vals:
            raise _err(path, f"axes.{k}", "must list at least one value")
        if k == "rate":
            for x in vals:
                _rate(path, "axes.rate", x)
        elif k not in STRING_AXES:
            for x in vals:
                _int(path, f"axes.{k}", x)
        elif not all(isinstance(x, str) and x for x in vals):
            raise _err(path, f"axes.{k}", f"must list names, got {_short(vals)}")
        seen: set = set()
        dup = [x for x in vals if x in seen or seen.add(x)]  # type: ignore[func-returns-value]
        if dup:  # two cells of one id would share their runs' keys
            raise _err(path, f"axes.{k}", f"{_short(dup[0])} is listed twice", "list each value once")
        axes[k] = vals

    workload = _opt(doc, "workload", {})
    if not isinstance(workload, dict):
        raise _err(path, "workload", f"must be a mapping, got {_short(workload)}")
    workload = dict(workload)
    load, load_cells = _load(path, workload.pop("load", None), axes)
    if load is not None and "points" in load:  # a rate sweep: its points are the rate axis (harness/sweep.py)
        from harness import sweep
        axes["rate"] = sweep.points(load["points"])
    slo = _slo(path, workload.pop("slo", None), load)
    for k in LOAD_AXES:
        if k in workload:
            raise _err(path, f"workload.{k}", "is a field of workload.load", f"write workload.load.{k}")
    for k in workload:
        if k not in NUMERIC_AXES:
            where = {"form": "set form on each arm, or as axes.form", "hardware": "set hardware on an arm, or as "
                     "axes.hardware", "model": "set the grid's model, or axes.model"}
            raise _err(path, f"workload.{k}", "unknown field", where.get(k, f"allowed: {', '.join(NUMERIC_AXES)}"))
    fixed = {k: _int(path, f"workload.{k}", v) for k, v in workload.items()}
    if "threads" in doc:
        fixed.setdefault("threads", _int(path, "threads", doc["threads"]))
    fixed.setdefault("batch", 1)
    fixed |= load_cells
    for w in WORKLOAD_FIELDS:
        if w not in fixed and w not in axes:
            raise _err(path, f"workload.{w}", "is required and has no default", f"set it; {WHY_NO_DEFAULTS}")
    if "threads" not in fixed and "threads" not in axes and not all("threads" in a.options for a in arms):
        raise _err(path, "threads", "is required (top level, workload, an axis, or every arm)",
                   "set the thread count you mean to measure")
    for k in axes:
        fixed.pop(k, None)

    passes = _int(path, "passes", doc.get("passes", 1))
    repetitions = _int(path, "repetitions", doc.get("repetitions", 3))
    warmups = _int(path, "warmups", doc.get("warmups", 1), lo=0)
    # the size before anything is expanded (include/exclude only remove from it)
    n_cells = math.prod(len(v) for v in axes.values())
    n_runs = n_cells * len(arms) * passes
    shape = " x ".join(f"{len(axes[k])} {k}" for k in sorted(axes)) or "no axes"
    if n_runs > MAX_RUNS:
        raise _err(path, "passes x arms x axes", f"{n_cells:,} cells ({shape}) x {len(arms)} arms x {passes:,} passes "
                   f"= {n_runs:,} runs, more than the {MAX_RUNS:,} a grid may hold",
                   f"split it into grids of at most {MAX_RUNS:,} runs (fewer passes, arms or axis values)")
    if n_cells > MAX_CELLS:
        raise _err(path, "axes", f"{shape} = {n_cells:,} cells, more than the {MAX_CELLS:,} a grid may hold",
                   f"split it into grids of at most {MAX_CELLS:,} cells (fewer axis values)")

    order = doc.get("order", "interleaved")
    if order not in ORDERS:
        raise _err(path, "order", f"unknown order {_short(order)}", f"allowed: {', '.join(ORDERS)}")
    if load is not None and "points" in load and order != "interleaved":
        raise _err(path, "order", f"a rate sweep runs interleaved (each pass measures its probes before the rates "
                   f"derived from them), not {order}", "drop order, or set order: interleaved")
    baseline = doc.get("baseline", names[0])
    if baseline not in names:
        raise _err(path, "baseline", f"unknown arm {_short(baseline)}", f"arms: {', '.join(names)}")
    inc, exc = _opt(doc, "include", []), _opt(doc, "exclude", [])
    for fname, rules in (("include", inc), ("exclude", exc)):
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise _err(path, fname, "must be a list of mappings {axis: value}")
        if len(rules) > MAX_RULES:
            raise _err(path, fname, f"{len(rules):,} rules, more than {MAX_RULES}", "use axes and fewer rules")
        for j, r in enumerate(rules):
            _rule_values(path, f"{fname}[{j}]", r, allow_arm=True)
            if "arm" in r and r["arm"] not in names:
                raise _err(path, f"{fname}[{j}].arm", f"unknown arm {_short(r['arm'])}", f"arms: {', '.join(names)}")
    primary = _primary(path, doc.get("primary"), arms, baseline)
    n_rules = len(inc) + len(exc) + len((primary or {}).get("cells", ()))
    if n_cells * len(arms) * n_rules > MAX_RULE_CHECKS:  # each rule is matched against every cell and arm
        raise _err(path, "include/exclude", f"{n_rules} rules (include, exclude, primary.cells) x {n_cells:,} cells x "
                   f"{len(arms)} arms = {n_cells * len(arms) * n_rules:,} rule checks, more than {MAX_RULE_CHECKS:,}",
                   "narrow the axes instead of filtering a large product, or split the grid")
    timeout = doc.get("timeout_s", 900)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or not 0 < timeout <= MAX_TIMEOUT_S:
        raise _err(path, "timeout_s", f"must be a positive number of seconds up to {MAX_TIMEOUT_S:,} (a week), "
                   f"got {_short(timeout)}")
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _err(path, "seed", f"must be an integer, got {_short(seed)}")
    hosts = doc.get("hosts", "spread")
    if hosts not in HOSTS:
        raise _err(path, "hosts", f"unknown value {_short(hosts)}", f"allowed: {', '.join(HOSTS)} (docs/fleet.md)")
    views.parse(path, doc.get("report"), tuple(names))  # what the report shows: refused here, read by the report
    spec = GridSpec(hosts=hosts, path=path, sha256=sha256, name=name, description=description, model=model,
                    arms=tuple(arms), axes=axes, fixed=fixed, include=tuple(inc), exclude=tuple(exc), primary=primary,
                    passes=passes, repetitions=repetitions, warmups=warmups,
                    order=order, seed=seed, baseline=baseline, timeout_s=float(timeout), load=load, slo=slo)
    _validate_load(spec)
    _validate_engines(spec, avail)
    _validate_user_forms(spec)
    return spec


def _rate(path: str, fld: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= MAX_RATE:
        raise _err(path, fld, f"must be a number of requests per second in (0, {MAX_RATE:g}], got {_short(v)}")
    return v


def _load(path: str, raw: Any, axes: dict[str, list]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """workload.load: (the grid's load fields, the cell parameters it fixes: concurrency and rate off the axes)."""
    on_axes = [k for k in LOAD_AXES if k in axes]
    if raw is None:
        if on_axes:
            raise _err(path, f"axes.{on_axes[0]}", "a load axis needs workload.load",
                       "add workload.load: {requests: N} (docs/serving.md)")
        return None, {}
    if not isinstance(raw, dict):
        raise _err(path, "workload.load", f"must be a mapping, got {_short(raw)}",
                   "e.g. {concurrency: 2, requests: 16} or {rate: 4, arrival: poisson, requests: 32}")
    for k in raw:
        if k not in LOAD_FIELDS:
            raise _err(path, f"workload.load.{k}", "unknown field", f"allowed: {', '.join(sorted(LOAD_FIELDS))}")
    if "requests" not in raw:
        raise _err(path, "workload.load.requests", "is required", "set how many measured requests a repetition sends")
    out: dict[str, Any] = {"requests": _int(path, "workload.load.requests", raw["requests"])}
    if out["requests"] > MAX_LOAD_REQUESTS:
        raise _err(path, "workload.load.requests", f"{out['requests']:,} is more than {MAX_LOAD_REQUESTS:,}")
    cells: dict[str, Any] = {}
    if "concurrency" in raw:
        cells["concurrency"] = _int(path, "workload.load.concurrency", raw["concurrency"])
    if raw.get("rate") == "sweep":
        from harness import sweep
        clash = (["workload.load.concurrency"] if "concurrency" in raw else []) + [f"axes.{k}" for k in on_axes]
        if clash:
            raise _err(path, clash[0], "cannot be set beside rate: sweep (its points are one request at a time, "
                       "every request at once, and rates between)", "drop it, or list rates as axes.rate instead")
        n = raw.get("points", sweep.DEFAULT_POINTS)
        if isinstance(n, bool) or not isinstance(n, int) or not sweep.MIN_POINTS <= n <= sweep.MAX_POINTS:
            raise _err(path, "workload.load.points", f"must be an integer in [{sweep.MIN_POINTS}, {sweep.MAX_POINTS}], "
                       f"got {_short(n)}", "the sweep's points: sync, max and the rates between them")
        out["points"] = n
        on_axes = ["rate"]
    elif "points" in raw:
        raise _err(path, "workload.load.points", "applies to rate: sweep", "set rate: sweep, or drop points")
    elif "rate" in raw:
        cells["rate"] = _rate(path, "workload.load.rate", raw["rate"])
    for k in on_axes:
        if k in cells:
            raise _err(path, f"workload.load.{k}", "is also an axis", f"set {k} in one place")
    if not cells and not on_axes:
        raise _err(path, "workload.load", "names neither concurrency nor rate",
                   "add concurrency: N (a closed loop) or rate: R (requests/s, an open loop)")
    arrival = raw.get("arrival", "poisson")
    from harness.serving import ARRIVALS
    if arrival not in ARRIVALS:
        raise _err(path, "workload.load.arrival", f"unknown arrival {_short(arrival)}", f"allowed: {', '.join(ARRIVALS)}")
    b = raw.get("burstiness", 1.0)
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) or not 0 < b <= 100:
        raise _err(path, "workload.load.burstiness", f"must be a number in (0, 100], got {_short(b)}")
    if b != 1.0 and arrival != "gamma":
        raise _err(path, "workload.load.burstiness", f"applies to arrival: gamma, not {arrival}", "set arrival: gamma")
    if "rate" not in cells and "rate" not in on_axes and ("arrival" in raw or "seed" in raw):
        raise _err(path, "workload.load.arrival" if "arrival" in raw else "workload.load.seed",
                   "applies to a rate (an open loop)", "add rate: R, or drop it")
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _err(path, "workload.load.seed", f"must be an integer, got {_short(seed)}")
    e = raw.get("errors_allowed", 0.0)
    if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0 <= e < 1:
        raise _err(path, "workload.load.errors_allowed", f"must be a share in [0, 1), got {_short(e)}")
    out |= {"arrival": arrival, "burstiness": float(b), "seed": seed, "errors_allowed": float(e)}
    return out, cells


def _slo(path: str, raw: Any, load: dict | None) -> dict[str, float] | None:
    if raw is None:
        return None
    if load is None:
        raise _err(path, "workload.slo", "applies to a load", "add workload.load (docs/serving.md)")
    if not isinstance(raw, dict) or not raw:
        raise _err(path, "workload.slo", f"must be a mapping of bounds, got {_short(raw)}",
                   f"e.g. {{ttft_s: 1.0, tpot_s: 0.1}} (fields: {', '.join(SLO_FIELDS)})")
    for k, v in raw.items():
        if k == "share":
            if "points" not in load:
                raise _err(path, "workload.slo.share", "applies to a rate sweep (the share of a run's requests "
                           "within every bound for the run to meet the slo)", "set workload.load.rate: sweep, or drop it")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise _err(path, "workload.slo.share", f"must be a share in (0, 1], got {_short(v)}")
            continue
        if k not in SLO_FIELDS:
            raise _err(path, f"workload.slo.{k}", "unknown field", f"allowed: {', '.join(SLO_FIELDS)}, share")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise _err(path, f"workload.slo.{k}", f"must be a positive number of seconds, got {_short(v)}")
    if not any(k in SLO_FIELDS for k in raw):
        raise _err(path, "workload.slo", "gives a share and no bound", f"add a bound ({', '.join(SLO_FIELDS)})")
    return {k: float(v) for k, v in raw.items()}


def _validate_load(spec: GridSpec) -> None:
    """A load needs server engines and server engines need a load; a server is sent requests, not batches."""
    serves = {a.name: getattr(engine_class(a.engine), "serves", False) for a in spec.arms}
    if spec.load is not None:
        other = [n for n, s in serves.items() if not s]
        if other:
            raise _err(spec.path, f"arms[{other[0]}].engine", f"{spec.arm(other[0]).engine} runs no load "
                       "(workload.load is for server engines)", "use llama-server or openai, or drop workload.load")
        bench = [a.name for a in spec.arms if a.options.get("client") == "vllm-bench"]
        if bench and spec.load["arrival"] == "constant":
            raise _err(spec.path, "workload.load.arrival", f"constant arrivals cannot be sent by vllm bench serve "
                       f"(arm {bench[0]!r}'s options.client)", "use arrival: poisson or gamma, or client: harness")
        conc = spec.axes.get("concurrency") or [spec.fixed.get("concurrency", 1)]
        if max(conc) > spec.load["requests"]:
            raise _err(spec.path, "workload.load.requests", f"{spec.load['requests']} requests cannot keep "
                       f"{max(conc)} in flight", f"send at least {max(conc)} requests a repetition")
        if "batch" in spec.axes or spec.fixed.get("batch", 1) != 1:
            raise _err(spec.path, "workload.batch", "a server engine takes a load, not a batch",
                       "drop batch; set workload.load.concurrency")
    else:
        srv = [n for n, s in serves.items() if s]
        if srv:
            raise _err(spec.path, "workload.load", f"is required: arm {srv[0]!r} runs a server engine",
                       "add workload.load: {concurrency: N, requests: M} (docs/serving.md)")


def _validate_user_forms(spec: GridSpec) -> None:
    """Each form an arm loads of a user's model is one the model can have (models.user_forms): a GGUF whose
    architecture transformers cannot dequantize has no hf-* form, so an engine that loads hf-* cannot run it."""
    from harness import models
    from harness.engines import ENGINES, engine_class
    for name, forms in model_forms(spec).items():
        um = models.USER.get(name)
        if um is None or um.kind == "synthetic" or not forms:
            continue
        have = models.user_forms(um)
        for form in forms:
            if form in have:
                continue
            arms = [a.name for a in spec.arms if (a.form or engine_class(a.engine).default_form) == form] or ["?"]
            can = [e for e in ENGINES if any(f.startswith(engine_class(e).form_prefix) for f in have)
                   and engine_class(e).needs_model]
            raise _err(spec.path, f"arms[{arms[0]}].form", f"model {name} ({um.kind} {um.path}) has no form {form}: "
                       f"its forms are {', '.join(have)}", f"load one of those (engines that can run it: "
                       f"{', '.join(can) or 'none'})")


# what _validate_hardware reads of a cell: cells alike in these are checked once
_HARDWARE_KEYS = ("hardware", "threads", "model", "batch", "context_len", "form")


def _validate_engines(spec: GridSpec, avail: list[int] | None = None) -> None:
    """Each arm's options, and the workload of every cell it runs in, as its engine can honour them, and as
    the machine can run them (native threads within `avail`, when given; an emulated class's own rules):
    refused here (at load, so at `harness plan`), before anything runs."""
    from harness.engines import engine_class
    cells = expand(spec)
    runs_in = [(c, {a.name for a in arms_for(spec, c)}) for c in cells]
    checked: set[tuple] = set()
    for a in spec.arms:
        mine = [c for c, names in runs_in if a.name in names]
        values = {k: (f"axes.{k}" if k in spec.axes else f"workload.{k}", {c.params[k] for c in mine})
                  for k in ("batch", "context_len", "prompt_len", "gen_len", "form") if mine and k in mine[0].params}
        engine_class(a.engine)().validate(spec.path, a, values, spec.warmups)
        _validate_threads(spec, a, mine, avail)
        for c in mine:
            key = (a.name, *(c.params.get(k) for k in _HARDWARE_KEYS))
            if key not in checked:
                checked.add(key)
                _validate_hardware(spec, a, c)


def _validate_threads(spec: GridSpec, arm: Arm, cells: list[Cell], avail: list[int] | None) -> None:
    """A native run's threads within the arm's own cpus (one thread per CPU: `harness check` refuses a run whose
    threads exceed its affinity) and, given `avail`, within the CPUs this process may run on (emulated runs:
    emulate.plan's rule, the class's cores, which this machine must have)."""
    native = [c for c in cells if hardware_of(arm, c.params) is None]
    if not native:
        return
    threads = max(int(arm.options.get("threads") or c.params.get("threads") or 1) for c in native)
    src = f"arms[{arm.name}].threads" if "threads" in arm.options else \
        "axes.threads" if "threads" in spec.axes else "threads"
    if arm.cpus and threads > len(arm.cpus):
        raise _err(spec.path, src, f"{threads} threads asked of arm {arm.name!r}, but its cpus are "
                   f"{cpu_list(arm.cpus)} ({len(arm.cpus)} CPU(s))", f"list at least {threads} cpus, or use fewer threads")
    if avail is not None and threads > len(avail):
        raise _err(spec.path, src, f"{threads} threads asked of arm {arm.name!r}, but this process may run on "
                   f"{len(avail)} CPU(s) ({cpu_list(avail)}, os.sched_getaffinity)",
                   f"use at most {len(avail)} threads, or plan and run the grid on a machine with more CPUs")


def model_of(spec: GridSpec, params: dict) -> str:
    """The model a cell runs: its model axis value, else the grid's model."""
    return params.get("model") or spec.model


def hardware_of(arm: Arm, params: dict) -> str | None:
    """The hardware class a run emulates: the cell's hardware axis, else the arm's; native is None."""
    hw = params.get("hardware") or arm.hardware
    return None if hw in (None, "native") else hw


def _validate_hardware(spec: GridSpec, arm: Arm, cell: Cell) -> None:
    """A run under a hardware class: this machine can emulate it at the run's threads, and (for model engines)
    the class's memory admits the cell's sequences (the admission rule, with its numbers)."""
    name = hardware_of(arm, cell.params)
    eng = get_engine(arm.engine)
    auto = eng.sizes_by_admission(arm.options)
    where = f"{spec.path}: arms[{arm.name}] cell {cell.id}"
    form = cell.params.get("form") or arm.form or eng.default_form
    if eng.isa_bound(form):  # a form whose kernels only some ISA tiers have: refused here on a tier without them
        from harness import hardware
        why = eng.isa_refusal(form, arm.options, hardware.current_profile(name) if name else hardware.current_profile())
        if why:
            raise UserError(where, why, "run this arm on a host (or hardware class) whose ISA tier has the kernel, or "
                                        "drop it (docs/quantization.md)")
    if name is None and not auto:
        return
    from harness import emulate, hardware
    threads = int(arm.options.get("threads") or cell.params.get("threads") or 1)
    prof = hardware.current_profile(name) if name else hardware.current_profile()
    if name:
        emulate.plan(name, threads, arm.cpus, where)
    model = model_of(spec, cell.params)
    if model == "none":
        return
    batch, ctxlen = int(cell.params.get("batch", 1)), int(cell.params["context_len"])
    adm = get_engine(arm.engine).admission(model, prof, cell.params.get("form") or arm.form, arm.options, ctxlen)
    if adm is None:  # the engine has no memory rule
        return
    if adm["max_num_seqs"] < batch:
        raise UserError(where, f"does not fit {prof['source']}: {adm['max_num_seqs']} sequence(s) of context "
                               f"{ctxlen} admitted, batch {batch} asked (available {adm['available_bytes']} B - weights "
                               f"{adm['weights_bytes']} B - overhead {adm['overhead_bytes']} B, "
                               f"{adm['kv_bytes_per_sequence']} B of KV per sequence)",
                        "lower the batch or context_len, or choose a class with more memory")


def _primary(path: str, raw: Any, arms: list[Arm], baseline: str) -> dict | None:
    """`primary: {metrics: [...], arms: [...], cells: [{axis: value}, ...]}`: the comparisons that get verdicts
    (the family); the others are exploratory estimates. Every field optional; names checked."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise _err(path, "primary", "must be a mapping with any of metrics, arms, cells", "see docs/harness.md")
    only_fields(path, "primary", raw, PRIMARY_FIELDS)
    from harness.engines import engine_metrics
    known = sorted({m for a in arms for m in engine_metrics(a.engine)})
    out: dict[str, Any] = {}
    for key, allowed in (("metrics", known), ("arms", [a.name for a in arms if a.name != baseline])):
        if key in raw:
            vals = raw[key]
            if not isinstance(vals, list) or not vals or not all(isinstance(v, str) for v in vals):
                raise _err(path, f"primary.{key}", "must be a non-empty list of names", f"known: {', '.join(allowed)}")
            bad = [v for v in vals if v not in allowed]
            if bad:
                raise _err(path, f"primary.{key}", f"unknown {key[:-1]} {_short(bad[0])}", f"known: {', '.join(allowed)}")
            out[key] = list(vals)
    if "cells" in raw:
        rules = raw["cells"]
        if not isinstance(rules, list) or not rules or not all(isinstance(r, dict) for r in rules):
            raise _err(path, "primary.cells", "must be a list of mappings {axis: value}")
        if len(rules) > MAX_RULES:
            raise _err(path, "primary.cells", f"{len(rules):,} rules, more than {MAX_RULES}", "declare fewer cells")
        for j, r in enumerate(rules):
            _rule_values(path, f"primary.cells[{j}]", r, allow_arm=False)
        out["cells"] = [dict(r) for r in rules]
    return out


def in_family(primary: dict | None, metric: str, arm: str, params: dict) -> bool:
    """Whether a comparison is one of the grid's primaries (every comparison, when none are declared)."""
    if not primary:
        return True
    if "metrics" in primary and metric not in primary["metrics"]:
        return False
    if "arms" in primary and arm not in primary["arms"]:
        return False
    return "cells" not in primary or any(_matches(r, params) for r in primary["cells"])


def family(spec: GridSpec) -> list[tuple[str, str, str]]:
    """The comparisons a grid gives verdicts to, before anything runs: (cell, arm, metric) for each cell,
    each non-baseline arm that runs there beside the baseline, each metric both engines emit, filtered by
    the declared primaries."""
    from harness.engines import engine_metrics
    out = []
    base = spec.arm(spec.baseline)
    for cell in expand(spec):
        arms = arms_for(spec, cell)
        if base not in arms:
            continue
        for a in arms:
            if a.name == spec.baseline:
                continue
            for m in engine_metrics(a.engine):
                if m in engine_metrics(base.engine) and in_family(spec.primary, m, a.name, cell.params):
                    out.append((cell.id, a.name, m))
    return out


def _matches(rule: dict, params: dict, arm: str | None = None) -> bool:
    for k, v in rule.items():
        if k == "arm":
            if arm is not None and arm != v:
                return False
        elif params.get(k) != v:
            return False
    return True


def cell_id(params: dict) -> str:
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def expand(spec: GridSpec) -> list[Cell]:
    """Cartesian product of the axes, plus the fixed workload, filtered by include/exclude. Pure."""
    keys = sorted(spec.axes)
    id_keys = sorted({*spec.fixed, *keys})  # every cell has the same keys: cell_id's order, sorted once
    drop = [r for r in spec.exclude if "arm" not in r]  # a rule naming an arm drops that arm only (arms_for)
    cells = []
    for combo in itertools.product(*(spec.axes[k] for k in keys)):
        params = {**spec.fixed, **dict(zip(keys, combo))}
        if spec.include and not any(_matches(r, params) for r in spec.include):
            continue
        if drop and any(_matches(r, params) for r in drop):
            continue
        cells.append(Cell(id=",".join([f"{k}={params[k]}" for k in id_keys]), params=params))
    return cells


def model_forms(spec: GridSpec) -> dict[str, list[str] | None]:
    """Each model a grid runs, with the forms its arms load there (None: one is chosen per run, `auto`)."""
    from harness.engines import get_engine
    out: dict[str, set[str] | None] = {}
    for c in expand(spec):
        name = model_of(spec, c.params)
        if name == "none":
            continue
        for a in arms_for(spec, c):
            form = c.params.get("form") or a.form or get_engine(a.engine).default_form
            if form in (None, "auto") or out.get(name, set()) is None:
                out[name] = None
            elif form != "none":
                out.setdefault(name, set()).add(form)  # type: ignore[union-attr]
    return {n: None if f is None else sorted(f) for n, f in sorted(out.items())}


def arms_for(spec: GridSpec, cell: Cell) -> list[Arm]:
    """Arms that run in a cell: exclude rules that name an arm remove it from matching cells."""
    rules = [r for r in spec.exclude if "arm" in r]
    if not rules:
        return list(spec.arms)
    return [a for a in spec.arms if not any(_matches(r, cell.params, a.name) for r in rules)]
