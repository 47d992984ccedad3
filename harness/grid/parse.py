"""A grid document parsed: its fields read and checked in the order a reader meets them (model, arms, axes,
workload, size, order, rules, primaries), then the whole spec validated against its engines and this machine."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import harness.grid.validate as validate
import harness.grid.versions as versions
from harness import sequential, views, workloads
from harness.engines import engine_class, get_engine
from harness.engines.capabilities import Patches, capability
from harness.grid.spec import (ARM_FIELDS, AXIS_NAMES, ENV_NAME, HOSTS, MAX_ARMS, MAX_CELLS, MAX_NAME_BYTES,
                               MAX_RULE_CHECKS, MAX_RULES, MAX_RUNS, MAX_TIMEOUT_S, NUMERIC_AXES, OBSERVE, ORDERS,
                               PRIMARY_FIELDS, STRING_AXES, TOP_FIELDS, Arm, GridSpec, cpu_list, err, integer,
                               name_problem, opt, short)
from harness.grid.yamlfile import entries, grid_name, only_fields


def model_name(path: str, fld: str, v: Any) -> str:
    """A zoo model's name, a registered model's (harness models add), or your model given by path (a mapping:
    harness/usermodels.py), which is then known by its name."""
    from harness import models, usermodels
    from harness import voices
    if isinstance(v, dict):
        return models.register(usermodels.from_mapping(path, fld, v))
    if voices.known(v):
        return v
    if not models.known(v):
        raise err(path, fld, f"unknown model {short(v)}", f"known: {', '.join(models.known_names() + list(voices.VOICES))}, or "
                  "{name: NAME, gguf: PATH} for your own")
    return v


def _rule_values(path: str, fld: str, rule: dict, allow_arm: bool) -> None:
    """The values of an include/exclude/primary.cells rule, typed as their axis is (a rule `{threads: true}`
    would match threads 1, since True == 1 in Python)."""
    for k, v in rule.items():
        if k == "arm" and allow_arm:
            continue
        if k not in AXIS_NAMES:
            raise err(path, f"{fld}.{k}", "unknown axis", f"known: {', '.join(AXIS_NAMES)}{', arm' if allow_arm else ''}")
        if _kind_value(path, f"{fld}.{k}", k, v, rule=True):
            continue
        if k in NUMERIC_AXES:
            integer(path, f"{fld}.{k}", v)
        elif not isinstance(v, str) or not v:
            raise err(path, f"{fld}.{k}", f"must be a name, got {short(v)}")


def _arm(path: str, f: str, ra: dict, engines: Any, avail: list[int] | None) -> Arm:
    eng = ra.get("engine")
    if not isinstance(eng, str) or eng not in engines:
        raise err(path, f"{f}.engine", f"unknown engine {short(eng)}", f"known: {', '.join(sorted(engines))}")
    an = ra.get("name", eng)
    why = name_problem(an) or ("holds '|', the separator of run keys (cell|arm|pass)" if "|" in an else None)
    if why:
        raise err(path, f"{f}.name", f"{why}, got {short(an)} (an arm's name is part of file names and run keys)",
                  f"letters, digits, '.', '-' and '_', at most {MAX_NAME_BYTES} bytes")
    form = ra.get("form")
    if form is not None and (not isinstance(form, str) or not form):
        raise err(path, f"{f}.form", f"must be a form name, got {short(form)}", "e.g. gguf-f32 or hf-fp32")
    opts = opt(ra, "options", {})
    if not isinstance(opts, dict):
        raise err(path, f"{f}.options", f"must be a mapping, got {short(opts)}")
    env = _env(path, f, ra)
    cpus = _cpus(path, f, ra.get("cpus"), avail)
    pat = ra.get("patches")
    if pat is not None:
        capability(get_engine(eng), Patches).validate_patches(path, f"{f}.patches", pat)
    if "threads" in opts:
        integer(path, f"{f}.options.threads", opts["threads"])
    if "threads" in ra:
        if "threads" in opts:
            raise err(path, f"{f}.threads", "is given both here and in options", "give it once")
        opts = {**opts, "threads": integer(path, f"{f}.threads", ra["threads"])}
    numa = ra.get("numa")
    if numa is not None:
        integer(path, f"{f}.numa", numa, lo=0)
    observe = ra.get("observe", "full")
    if observe not in OBSERVE:
        raise err(path, f"{f}.observe", f"unknown value {short(observe)}", f"allowed: {', '.join(OBSERVE)}")
    oo = opt(ra, "observe_only", [])
    from harness.engines.base import SETTINGS
    if not isinstance(oo, list) or not all(isinstance(x, str) and (x in SETTINGS or x.startswith("options."))
                                           for x in oo):
        raise err(path, f"{f}.observe_only", f"must be a list of settings, got {short(oo)}",
                  f"settings: {', '.join(SETTINGS)}, or options.KEY")
    hw = ra.get("hardware")
    if hw is not None and (not isinstance(hw, str) or not hw):
        raise err(path, f"{f}.hardware", f"must be a class name, got {short(hw)}", "see grids/hardware/")
    return Arm(name=an, engine=eng, form=form, options=opts, env={k: str(v) for k, v in env.items()}, patches=pat,
               cpus=cpus, numa=numa, observe=observe, observe_only=tuple(oo), hardware=None if hw == "native" else hw)


def _env(path: str, f: str, ra: dict) -> dict:
    """An arm's env: environment variable names to plain strings."""
    env = opt(ra, "env", {})
    if not isinstance(env, dict):
        raise err(path, f"{f}.env", f"must be a mapping of names to strings, got {short(env)}")
    for k, v in env.items():
        if not isinstance(k, str) or not ENV_NAME.fullmatch(k):
            raise err(path, f"{f}.env", f"{short(k)} is not an environment variable name",
                      "letters, digits and _, not starting with a digit")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise err(path, f"{f}.env.{k}", f"must be a string, got {short(v)}",
                      "quote it (YAML reads unquoted yes/no/true/false as booleans)")
        if isinstance(v, float) and not math.isfinite(v) or isinstance(v, str) and "\0" in v:
            raise err(path, f"{f}.env.{k}", f"{short(v)} cannot be an environment value", "give a plain string")
    return env


def _cpus(path: str, f: str, cpus: Any, avail: list[int] | None) -> list[int] | None:
    """An arm's cpus: distinct CPU numbers, among `avail` (the CPUs this process may run on) when given."""
    if cpus is not None:
        if not isinstance(cpus, list) or not cpus or any(isinstance(c, bool) or not isinstance(c, int) for c in cpus):
            raise err(path, f"{f}.cpus", f"must be a non-empty list of CPU numbers, got {short(cpus)}",
                      "e.g. [0, 1]")
        seen: set[int] = set()
        dup = sorted({c for c in cpus if c in seen or seen.add(c)})  # type: ignore[func-returns-value]
        if dup:
            raise err(path, f"{f}.cpus", f"CPU {dup[0]} is listed twice", "list each CPU once")
        if min(cpus) < 0:
            raise err(path, f"{f}.cpus", f"CPU {min(cpus)} is negative", "CPU numbers start at 0")
        missing = sorted(seen - set(avail)) if avail is not None else []
        if missing:
            raise err(path, f"{f}.cpus", f"CPU {cpu_list(missing)} not among the CPUs this process may run on "
                      f"({cpu_list(avail)}, os.sched_getaffinity)",
                      "list CPUs of this machine, or plan and run the grid on the machine that has them")
    return cpus


def from_dict(doc: Any, path: str, sha256: str, cpus: list[int] | None = None) -> GridSpec:
    """A grid document, validated: every rule of the document itself, the engines' and the emulated hardware
    classes' rules; and, given `cpus` (the CPUs of the machine that will run it, as load() passes), the arms'
    cpus and the native runs' threads against them."""
    if not isinstance(doc, dict):
        raise err(path, "(top level)", "must be a mapping of grid fields", "see docs/harness.md")
    kind = doc.get("kind", "speed")
    if kind != "speed":
        raise err(path, "kind", f"{short(kind)} grids are not run by `harness run`",
                  "run a kind: fidelity grid with `harness fidelity`" if kind == "fidelity"
                  else "kind is speed (the default) or fidelity")
    only_fields(path, "", doc, TOP_FIELDS)
    name = grid_name(path, doc.get("name"))
    description = opt(doc, "description", "")
    if not isinstance(description, str):
        raise err(path, "description", f"must be a string (free text), got {short(description)}", "quote it")
    doc, model = _model(path, doc)
    doc = versions.expand(path, doc)
    arms = _arms(path, doc, model, cpus)
    names = [a.name for a in arms]
    axes = _axes(path, doc)
    fixed, kind_fields = _workload(path, doc, axes, arms)
    passes, looks = sequential.parse(path, doc.get("passes", 1))
    repetitions = integer(path, "repetitions", doc.get("repetitions", 3))
    warmups = integer(path, "warmups", doc.get("warmups", 1), lo=0)
    n_cells = _size(path, axes, len(arms), passes)
    order = doc.get("order", "interleaved")
    if order not in ORDERS:
        raise err(path, "order", f"unknown order {short(order)}", f"allowed: {', '.join(ORDERS)}")
    baseline = doc.get("baseline", names[0])
    if baseline not in names:
        raise err(path, "baseline", f"unknown arm {short(baseline)}", f"arms: {', '.join(names)}")
    inc, exc = _rules(path, doc, names)
    primary = _primary(path, doc.get("primary"), arms, baseline)
    n_rules = len(inc) + len(exc) + len((primary or {}).get("cells", ()))
    if n_cells * len(arms) * n_rules > MAX_RULE_CHECKS:  # each rule is matched against every cell and arm
        raise err(path, "include/exclude", f"{n_rules} rules (include, exclude, primary.cells) x {n_cells:,} cells x "
                  f"{len(arms)} arms = {n_cells * len(arms) * n_rules:,} rule checks, more than {MAX_RULE_CHECKS:,}",
                  "narrow the axes instead of filtering a large product, or split the grid")
    timeout = doc.get("timeout_s", 900)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or not 0 < timeout <= MAX_TIMEOUT_S:
        raise err(path, "timeout_s", f"must be a positive number of seconds up to {MAX_TIMEOUT_S:,} (a week), "
                  f"got {short(timeout)}")
    seed = doc.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise err(path, "seed", f"must be an integer, got {short(seed)}")
    hosts = doc.get("hosts", "spread")
    if hosts not in HOSTS:
        raise err(path, "hosts", f"unknown value {short(hosts)}", f"allowed: {', '.join(HOSTS)} (docs/fleet.md)")
    rspec = views.parse(path, doc.get("report"), tuple(names))  # what the report shows: refused here, read by it
    derived = _derived_from(path, doc.get("derived_from"))
    spec = GridSpec(derived_from=derived, hosts=hosts, path=path, sha256=sha256, name=name, description=description, model=model,
                    arms=tuple(arms), axes=axes, fixed=fixed, include=tuple(inc), exclude=tuple(exc), primary=primary,
                    passes=passes, repetitions=repetitions, warmups=warmups,
                    order=order, seed=seed, baseline=baseline, timeout_s=float(timeout), **kind_fields)
    if looks is not None:  # sequential passes: the looks, once the family is known
        from harness.grid.cells import family
        until = sequential.until(doc.get("passes"))
        alpha = sequential.step_alpha(path, doc.get("passes"))  # a smaller level: as a larger family at 0.05
        m = len(family(spec)) if until == "verdict" else \
            sequential.scaled(sequential.step_family(path, rspec.history, primary, n_cells), alpha)
        spec = replace(spec, looks=sequential.resolve(path, passes, looks, m, until), until=until,
                       history=rspec.history if until == "step" else (), step_alpha=alpha, looked_m=m)
    for kind in workloads.kinds():
        kind.validate(spec)
    validate.engines(spec, cpus)
    validate.user_forms(spec)
    return spec


def _model(path: str, doc: dict) -> tuple[dict, str]:
    """The grid's model (or `none`), or the models of its model axis, which the document then names by name
    (a model given by path is registered, and known by its name from then on)."""
    from harness.models import MODELS
    axes_doc = doc.get("axes")
    axis_models = axes_doc.get("model") if isinstance(axes_doc, dict) else None
    if axis_models is None:
        model = doc.get("model", "none")
        return doc, model if model == "none" else model_name(path, "model", model)
    if "model" in doc:
        raise err(path, "model", "is given both as the grid's model and as an axis", "keep one of them")
    vals = axis_models if isinstance(axis_models, list) else [axis_models]
    if not vals:
        raise err(path, "axes.model", "must list at least one model", f"known: {', '.join(sorted(MODELS))}")
    names = [model_name(path, f"axes.model[{i}]", m) for i, m in enumerate(vals)]
    if len(set(names)) != len(names):
        raise err(path, "axes.model", f"names a model twice: {short(names, 200)}", "give each model once")
    return {**doc, "axes": {**axes_doc, "model": names}}, names[0]


def _arms(path: str, doc: dict, model: str, avail: list[int] | None) -> list[Arm]:
    from harness.engines import ENGINES
    from harness.models import MODELS
    raw_arms = entries(path, "arms", doc.get("arms"), ARM_FIELDS, "each arm: {name, engine, ...}")
    if len(raw_arms) > MAX_ARMS:
        raise err(path, "arms", f"{len(raw_arms):,} arms, more than the {MAX_ARMS} a grid may compare",
                  "split the comparison into several grids")
    arms = [_arm(path, f, ra, ENGINES, avail) for f, ra in raw_arms]
    if model == "none" and any(engine_class(a.engine).needs_model for a in arms):
        raise err(path, "model", "is required when an arm runs a model engine", f"known: {', '.join(sorted(MODELS))}")
    names = [a.name for a in arms]
    if len(set(names)) != len(names):
        raise err(path, "arms", f"arm names must be unique, got {short(names, 200)}")
    return arms


def _axes(path: str, doc: dict) -> dict[str, list]:
    axes_raw = opt(doc, "axes", {})
    if not isinstance(axes_raw, dict):
        raise err(path, "axes", "must be a mapping of axis name to a list of values")
    axes: dict[str, list] = {}
    for k, v in axes_raw.items():
        if k not in AXIS_NAMES:
            raise err(path, f"axes.{k}", "unknown axis", f"known axes: {', '.join(AXIS_NAMES)}")
        vals = v if isinstance(v, list) else [v]
        if not vals:
            raise err(path, f"axes.{k}", "must list at least one value")
        if k not in STRING_AXES:
            for x in vals:
                if not _kind_value(path, f"axes.{k}", k, x, rule=False):
                    integer(path, f"axes.{k}", x)
        elif not all(isinstance(x, str) and x for x in vals):
            raise err(path, f"axes.{k}", f"must list names, got {short(vals)}")
        seen: set = set()
        dup = [x for x in vals if x in seen or seen.add(x)]  # type: ignore[func-returns-value]
        if dup:  # two cells of one id would share their runs' keys
            raise err(path, f"axes.{k}", f"{short(dup[0])} is listed twice", "list each value once")
        axes[k] = vals
    return axes


def _kind_value(path: str, fld: str, axis: str, v: Any, rule: bool) -> bool:
    """A value of an axis a workload kind adds, checked by that kind (False: no kind's, the numeric rule applies)."""
    return any(kind.axis_value(path, fld, axis, v, rule) for kind in workloads.kinds())


def _workload(path: str, doc: dict, axes: dict[str, list], arms: list[Arm]) -> tuple[dict, dict[str, Any]]:
    """The cells' fixed parameters (the workload's, less what the axes vary), and the GridSpec fields the workload
    kinds set (harness/workloads): each kind takes its own fields of `workload:` and may add axes."""
    workload = opt(doc, "workload", {})
    if not isinstance(workload, dict):
        raise err(path, "workload", f"must be a mapping, got {short(workload)}")
    workload = dict(workload)
    spec_fields: dict[str, Any] = {"kinds": {}}
    kind_cells: dict[str, Any] = {}
    for kind in workloads.kinds():
        fields, cells = kind.parse(path, workload, axes)
        spec_fields["kinds"][kind.name] = fields
        kind_cells |= cells
    for k in workload:
        if k not in NUMERIC_AXES:
            where = {"form": "set form on each arm, or as axes.form", "hardware": "set hardware on an arm, or as "
                     "axes.hardware", "model": "set the grid's model, or axes.model"}
            raise err(path, f"workload.{k}", "unknown field", where.get(k, f"allowed: {', '.join(NUMERIC_AXES)}"))
    fixed = {k: integer(path, f"workload.{k}", v) for k, v in workload.items()}
    if "threads" in doc:
        fixed.setdefault("threads", integer(path, "threads", doc["threads"]))
    fixed.setdefault("batch", 1)
    fixed |= kind_cells
    for kind in workloads.kinds():
        kind.require(path, fixed, axes)
    if "threads" not in fixed and "threads" not in axes and not all("threads" in a.options for a in arms):
        raise err(path, "threads", "is required (top level, workload, an axis, or every arm)",
                  "set the thread count you mean to measure")
    for k in axes:
        fixed.pop(k, None)
    return fixed, spec_fields


def _size(path: str, axes: dict[str, list], n_arms: int, passes: int) -> int:
    """The grid's cells, before anything is expanded (include/exclude only remove from them), within MAX_CELLS
    and its runs within MAX_RUNS."""
    n_cells = math.prod(len(v) for v in axes.values())
    n_runs = n_cells * n_arms * passes
    shape = " x ".join(f"{len(axes[k])} {k}" for k in sorted(axes)) or "no axes"
    if n_runs > MAX_RUNS:
        raise err(path, "passes x arms x axes", f"{n_cells:,} cells ({shape}) x {n_arms} arms x {passes:,} passes "
                  f"= {n_runs:,} runs, more than the {MAX_RUNS:,} a grid may hold",
                  f"split it into grids of at most {MAX_RUNS:,} runs (fewer passes, arms or axis values)")
    if n_cells > MAX_CELLS:
        raise err(path, "axes", f"{shape} = {n_cells:,} cells, more than the {MAX_CELLS:,} a grid may hold",
                  f"split it into grids of at most {MAX_CELLS:,} cells (fewer axis values)")
    return n_cells


def _rules(path: str, doc: dict, names: list[str]) -> tuple[list, list]:
    """include and exclude: lists of {axis: value} rules (exclude's may name an arm)."""
    inc, exc = opt(doc, "include", []), opt(doc, "exclude", [])
    for fname, rules in (("include", inc), ("exclude", exc)):
        if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
            raise err(path, fname, "must be a list of mappings {axis: value}")
        if len(rules) > MAX_RULES:
            raise err(path, fname, f"{len(rules):,} rules, more than {MAX_RULES}", "use axes and fewer rules")
        for j, r in enumerate(rules):
            _rule_values(path, f"{fname}[{j}]", r, allow_arm=True)
            if "arm" in r and r["arm"] not in names:
                raise err(path, f"{fname}[{j}].arm", f"unknown arm {short(r['arm'])}", f"arms: {', '.join(names)}")
    return inc, exc


def _primary(path: str, raw: Any, arms: list[Arm], baseline: str) -> dict | None:
    """`primary: {metrics: [...], arms: [...], cells: [{axis: value}, ...]}`: the comparisons that get verdicts
    (the family); the others are exploratory estimates. Every field optional; names checked."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise err(path, "primary", "must be a mapping with any of metrics, arms, cells", "see docs/harness.md")
    only_fields(path, "primary", raw, PRIMARY_FIELDS)
    from harness.engines import engine_metrics
    known = sorted({m for a in arms for m in engine_metrics(a.engine)})
    out: dict[str, Any] = {}
    for key, allowed in (("metrics", known), ("arms", [a.name for a in arms if a.name != baseline])):
        if key in raw:
            vals = raw[key]
            if not isinstance(vals, list) or not vals or not all(isinstance(v, str) for v in vals):
                raise err(path, f"primary.{key}", "must be a non-empty list of names", f"known: {', '.join(allowed)}")
            bad = [v for v in vals if v not in allowed]
            if bad:
                raise err(path, f"primary.{key}", f"unknown {key[:-1]} {short(bad[0])}", f"known: {', '.join(allowed)}")
            out[key] = list(vals)
    if "cells" in raw:
        rules = raw["cells"]
        if not isinstance(rules, list) or not rules or not all(isinstance(r, dict) for r in rules):
            raise err(path, "primary.cells", "must be a list of mappings {axis: value}")
        if len(rules) > MAX_RULES:
            raise err(path, "primary.cells", f"{len(rules):,} rules, more than {MAX_RULES}", "declare fewer cells")
        for j, r in enumerate(rules):
            _rule_values(path, f"primary.cells[{j}]", r, allow_arm=False)
        out["cells"] = [dict(r) for r in rules]
    return out


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _derived_from(path: str, d: Any) -> dict[str, str] | None:
    """`derived_from`: the committed grid a made one comes from (harness bisect writes it into each probe):
    {path, sha256, by}, recorded in every artifact (grid.derived_from) and checked against git like grid.path."""
    if d is None:
        return None
    fix = "derived_from is written by harness bisect: {path: the template, sha256: its hash, by: what made it}"
    if not isinstance(d, dict) or set(d) != {"path", "sha256", "by"}:
        raise err(path, "derived_from", f"must be a mapping of path, sha256 and by, got {short(d)}", fix)
    if not all(isinstance(v, str) and 0 < len(v) <= 1000 for v in d.values()) or not _SHA256.fullmatch(d["sha256"]):
        raise err(path, "derived_from", "path and by must be text, sha256 64 hex digits", fix)
    return dict(d)
