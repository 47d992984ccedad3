"""The grid file: parse and validate the YAML, and expand it (purely) into cells x arms x passes.

Every error names the file, the field and what is allowed.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.errors import UserError
from harness.paths import read_utf8

WORKLOAD_FIELDS = ("prompt_len", "context_len", "gen_len")
# replicate: a label only (repeats of one cell, e.g. for A/A calibration); batch: concurrent requests
AXIS_NAMES = ("threads", "prompt_len", "context_len", "gen_len", "batch", "form", "replicate", "hardware", "model")
# hardware: a class of grids/hardware/ to emulate, or native; model: models of the zoo (the grid's `model` is then
# the first, and a run's model is its cell's)
STRING_AXES = ("form", "hardware", "model")
ORDERS = ("interleaved", "sequential", "random")
# how `harness run --executor ray` places passes on a fleet (docs/fleet.md): spread divides the passes among the
# machines of each host class; all runs every pass on every machine (a hardware comparison). One machine: the same.
HOSTS = ("spread", "all")
TOP_FIELDS = {"kind", "name", "description", "model", "arms", "axes", "include", "exclude", "passes", "repetitions",
              "warmups", "order", "seed", "baseline", "timeout_s", "workload", "threads", "primary", "hosts"}
PRIMARY_FIELDS = {"metrics", "arms", "cells"}
ARM_FIELDS = {"name", "engine", "form", "options", "env", "patches", "threads", "cpus", "numa", "observe", "observe_only",
              "hardware"}
OBSERVE = ("full", "bare")
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

    def arm(self, name: str) -> Arm:
        for a in self.arms:
            if a.name == name:
                return a
        raise KeyError(name)


def _err(path: str, fld: str, problem: str, fix: str = "") -> UserError:
    return UserError(path, f"{fld}: {problem}", fix)


def _int(path: str, fld: str, v: Any, lo: int = 1) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise _err(path, fld, f"must be an integer >= {lo}, got {v!r}")
    return v


def read_yaml(path: str | Path) -> tuple[Any, str]:
    """A grid file's document and the sha256 of its bytes (speed and fidelity grids alike)."""
    p = Path(path)
    text = read_utf8(p, "save the grid as UTF-8")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UserError(str(p), f"invalid YAML{where}: {getattr(e, 'problem', e)}", "fix the YAML syntax") from e
    return doc, hashlib.sha256(text.encode("utf-8")).hexdigest()


def only_fields(path: str, prefix: str, mapping: dict, allowed: set[str]) -> None:
    """Refuse the first unknown field of a mapping, naming the ones allowed."""
    bad = set(mapping) - allowed
    if bad:
        fld = f"{prefix}.{sorted(bad)[0]}" if prefix else sorted(bad)[0]
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
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise _err(path, "name", f"must be a name of letters, digits, - and _, got {name!r}")
    return name


def load(path: str | Path) -> GridSpec:
    doc, sha = read_yaml(path)
    return from_dict(doc, str(path), sha)


def from_dict(doc: Any, path: str, sha256: str) -> GridSpec:
    from harness.engines import ENGINES
    if not isinstance(doc, dict):
        raise _err(path, "(top level)", "must be a mapping of grid fields", "see docs/harness.md")
    if doc.get("kind", "speed") != "speed":
        raise _err(path, "kind", f"{doc.get('kind')!r} grids are not run by `harness run`",
                   "run a kind: fidelity grid with `harness fidelity`" if doc.get("kind") == "fidelity"
                   else "kind is speed (the default) or fidelity")
    only_fields(path, "", doc, TOP_FIELDS)
    name = grid_name(path, doc.get("name"))
    from harness.models import MODELS
    axis_models = (doc.get("axes") or {}).get("model") if isinstance(doc.get("axes"), dict) else None
    if axis_models is not None:
        if "model" in doc:
            raise _err(path, "model", "is given both as the grid's model and as an axis", "keep one of them")
        vals = axis_models if isinstance(axis_models, list) else [axis_models]
        bad = [m for m in vals if m not in MODELS]
        if bad or not vals:
            raise _err(path, "axes.model", f"unknown model {bad[0] if bad else None!r}", f"known: {', '.join(sorted(MODELS))}")
        model = vals[0]
    else:
        model = doc.get("model", "none")
    if model not in MODELS and model != "none":
        raise _err(path, "model", f"unknown model {model!r}", f"known: {', '.join(sorted(MODELS))}")

    arms = []
    for f, ra in entries(path, "arms", doc.get("arms"), ARM_FIELDS, "each arm: {name, engine, ...}"):
        if ra.get("engine") not in ENGINES:
            raise _err(path, f"{f}.engine", f"unknown engine {ra.get('engine')!r}", f"known: {', '.join(sorted(ENGINES))}")
        an = ra.get("name", ra["engine"])
        if not isinstance(an, str) or not an:
            raise _err(path, f"{f}.name", "must be a non-empty string")
        opts = ra.get("options") or {}
        env = ra.get("env") or {}
        if not isinstance(opts, dict):
            raise _err(path, f"{f}.options", "must be a mapping")
        if not isinstance(env, dict) or not all(isinstance(v, (str, int, float)) for v in env.values()):
            raise _err(path, f"{f}.env", "must be a mapping of names to strings")
        cpus = ra.get("cpus")
        if cpus is not None and (not isinstance(cpus, list) or not all(isinstance(c, int) and c >= 0 for c in cpus)):
            raise _err(path, f"{f}.cpus", f"must be a list of CPU numbers, got {cpus!r}")
        pat = ra.get("patches")
        if pat is not None:
            if ra["engine"] != "vllm":
                raise _err(path, f"{f}.patches", "only the vllm engine has runtime patches")
            from runtime.patches import NAMES
            names = [pat] if isinstance(pat, str) else pat
            if not isinstance(names, list) or any(n not in (*NAMES, "all", "none") for n in names):
                raise _err(path, f"{f}.patches", f"unknown patch selection {pat!r}",
                           f"none, all, or a list of: {', '.join(NAMES)}")
        if "threads" in ra:
            opts = {**opts, "threads": _int(path, f"{f}.threads", ra["threads"])}
        observe = ra.get("observe", "full")
        if observe not in OBSERVE:
            raise _err(path, f"{f}.observe", f"unknown value {observe!r}", f"allowed: {', '.join(OBSERVE)}")
        oo = ra.get("observe_only") or []
        from harness.engines.base import SETTINGS
        if not isinstance(oo, list) or not all(isinstance(x, str) and (x in SETTINGS or x.startswith("options."))
                                               for x in oo):
            raise _err(path, f"{f}.observe_only", f"must be a list of settings, got {oo!r}",
                       f"settings: {', '.join(SETTINGS)}, or options.KEY")
        hw = ra.get("hardware")
        if hw is not None and not isinstance(hw, str):
            raise _err(path, f"{f}.hardware", f"must be a class name, got {hw!r}", "see grids/hardware/")
        arms.append(Arm(name=an, engine=ra["engine"], form=ra.get("form"), options=opts,
                        env={k: str(v) for k, v in env.items()}, patches=ra.get("patches"), cpus=cpus,
                        numa=ra.get("numa"), observe=observe, observe_only=tuple(oo),
                        hardware=None if hw == "native" else hw))
    if model == "none" and any(a.engine != "command" for a in arms):
        raise _err(path, "model", "is required when an arm runs a model engine", f"known: {', '.join(sorted(MODELS))}")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise _err(path, "arms", f"arm names must be unique, got {names}")

    axes_raw = doc.get("axes") or {}
    if not isinstance(axes_raw, dict):
        raise _err(path, "axes", "must be a mapping of axis name to a list of values")
    axes: dict[str, list] = {}
    for k, v in axes_raw.items():
        if k not in AXIS_NAMES:
            raise _err(path, f"axes.{k}", "unknown axis", f"known axes: {', '.join(AXIS_NAMES)}")
        vals = v if isinstance(v, list) else [v]
        if not vals:
            raise _err(path, f"axes.{k}", "must list at least one value")
        if k not in STRING_AXES:
            for x in vals:
                _int(path, f"axes.{k}", x)
        elif not all(isinstance(x, str) and x for x in vals):
            raise _err(path, f"axes.{k}", f"must list names, got {vals!r}")
        axes[k] = vals

    workload = doc.get("workload") or {}
    if not isinstance(workload, dict):
        raise _err(path, "workload", "must be a mapping")
    bad = set(workload) - set(AXIS_NAMES)
    if bad:
        raise _err(path, f"workload.{sorted(bad)[0]}", "unknown field", f"allowed: {', '.join(AXIS_NAMES)}")
    fixed = {k: _int(path, f"workload.{k}", v) for k, v in workload.items() if k != "form"}
    if "threads" in doc:
        fixed.setdefault("threads", _int(path, "threads", doc["threads"]))
    fixed.setdefault("batch", 1)
    for w in WORKLOAD_FIELDS:
        if w not in fixed and w not in axes:
            raise _err(path, f"workload.{w}", "is required and has no default", f"set it; {WHY_NO_DEFAULTS}")
    if "threads" not in fixed and "threads" not in axes and not all("threads" in a.options for a in arms):
        raise _err(path, "threads", "is required (top level, workload, an axis, or every arm)",
                   "set the thread count you mean to measure")
    for k in axes:
        fixed.pop(k, None)

    warmups = _int(path, "warmups", doc.get("warmups", 1), lo=0)

    order = doc.get("order", "interleaved")
    if order not in ORDERS:
        raise _err(path, "order", f"unknown order {order!r}", f"allowed: {', '.join(ORDERS)}")
    baseline = doc.get("baseline", names[0])
    if baseline not in names:
        raise _err(path, "baseline", f"unknown arm {baseline!r}", f"arms: {', '.join(names)}")
    inc, exc = doc.get("include") or [], doc.get("exclude") or []
    for fname, rules in (("include", inc), ("exclude", exc)):
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise _err(path, fname, "must be a list of mappings {axis: value}")
        for j, r in enumerate(rules):
            for k in r:
                if k not in AXIS_NAMES and k != "arm":
                    raise _err(path, f"{fname}[{j}].{k}", "unknown axis", f"known: {', '.join(AXIS_NAMES)}, arm")
            if "arm" in r and r["arm"] not in names:
                raise _err(path, f"{fname}[{j}].arm", f"unknown arm {r['arm']!r}", f"arms: {', '.join(names)}")
    timeout = doc.get("timeout_s", 900)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise _err(path, "timeout_s", f"must be a positive number of seconds, got {timeout!r}")
    seed = doc.get("seed", 0)
    if not isinstance(seed, int):
        raise _err(path, "seed", f"must be an integer, got {seed!r}")
    primary = _primary(path, doc.get("primary"), arms, baseline)
    hosts = doc.get("hosts", "spread")
    if hosts not in HOSTS:
        raise _err(path, "hosts", f"unknown value {hosts!r}", f"allowed: {', '.join(HOSTS)} (docs/fleet.md)")
    spec = GridSpec(hosts=hosts, path=path, sha256=sha256, name=name, description=str(doc.get("description", "")), model=model,
                    arms=tuple(arms), axes=axes, fixed=fixed, include=tuple(inc), exclude=tuple(exc), primary=primary,
                    passes=_int(path, "passes", doc.get("passes", 1)),
                    repetitions=_int(path, "repetitions", doc.get("repetitions", 3)),
                    warmups=warmups,
                    order=order, seed=seed, baseline=baseline, timeout_s=float(timeout))
    _validate_engines(spec)
    return spec


def _validate_engines(spec: GridSpec) -> None:
    """Each arm's options, and the workload of every cell it runs in, as its engine can honour them: refused
    here (at load, so at `harness plan`), before anything runs."""
    from harness.engines import engine_class
    cells = expand(spec)
    for a in spec.arms:
        mine = [c for c in cells if a in arms_for(spec, c)]
        values = {k: (f"axes.{k}" if k in spec.axes else f"workload.{k}", {c.params[k] for c in mine})
                  for k in ("batch", "context_len", "prompt_len", "gen_len") if mine and k in mine[0].params}
        engine_class(a.engine)().validate(spec.path, a, values, spec.warmups)
        for c in mine:
            _validate_hardware(spec, a, c)


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
    auto = any(arm.options.get(k) == "auto" for k in ("max_num_seqs", "kv_cache_memory_bytes"))
    if name is None and not auto:
        return
    from harness import emulate, hardware
    where = f"{spec.path}: arms[{arm.name}] cell {cell.id}"
    threads = int(arm.options.get("threads") or cell.params.get("threads") or 1)
    prof = hardware.current_profile(name) if name else hardware.current_profile()
    if name:
        emulate.plan(name, threads, arm.cpus, where)
    model = model_of(spec, cell.params)
    if arm.engine not in ("vllm", "llama.cpp") or model == "none":
        return
    batch, ctxlen = int(cell.params.get("batch", 1)), int(cell.params["context_len"])
    if arm.engine == "vllm":
        dtype = arm.options.get("dtype")
        if dtype == "auto":
            dtype = hardware.derive_dtype(prof, "vllm")[0]
        elif dtype is None:
            dtype = "bfloat16" if (cell.params.get("form") or arm.form) == "hf-bf16" else "float32"
        adm = hardware.vllm_admission(model, prof, dtype, ctxlen)
    else:
        form = cell.params.get("form") or arm.form or "gguf-f32"
        if form == "auto":
            form = f"gguf-{hardware.derive_dtype(prof, 'llama.cpp')[0]}"
        adm = hardware.llamacpp_admission(model, prof, form, ctxlen)
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
                raise _err(path, f"primary.{key}", f"unknown {key[:-1]} {bad[0]!r}", f"known: {', '.join(allowed)}")
            out[key] = list(vals)
    if "cells" in raw:
        rules = raw["cells"]
        if not isinstance(rules, list) or not rules or not all(isinstance(r, dict) for r in rules):
            raise _err(path, "primary.cells", "must be a list of mappings {axis: value}")
        for j, r in enumerate(rules):
            for k in r:
                if k not in AXIS_NAMES:
                    raise _err(path, f"primary.cells[{j}].{k}", "unknown axis", f"known: {', '.join(AXIS_NAMES)}")
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
    cells = []
    for combo in itertools.product(*(spec.axes[k] for k in keys)):
        params = {**spec.fixed, **dict(zip(keys, combo))}
        if spec.include and not any(_matches(r, params) for r in spec.include):
            continue
        if any(_matches({k: v for k, v in r.items() if k != "arm"}, params) and "arm" not in r for r in spec.exclude):
            continue
        cells.append(Cell(id=cell_id(params), params=params))
    return cells


def arms_for(spec: GridSpec, cell: Cell) -> list[Arm]:
    """Arms that run in a cell: exclude rules that name an arm remove it from matching cells."""
    out = []
    for a in spec.arms:
        if any("arm" in r and _matches(r, cell.params, a.name) for r in spec.exclude):
            continue
        out.append(a)
    return out
