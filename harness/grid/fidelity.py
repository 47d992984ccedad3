"""A fidelity grid (`kind: fidelity`, `harness fidelity`): the model, the committed prompt set, the builds
checked against their engines' references and the thresholds they must meet. Read by the grid package's one
YAML reader, with its field readers, as a speed grid is."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from harness.engines import get_engine
from harness.engines.capabilities import Fidelity, IsaCap, Patches, capability
from harness.grid.spec import err as _err
from harness.grid.parse import model_name
from harness.grid.yamlfile import entries, grid_name, only_fields

THRESHOLDS = {  # name -> (summary metric, direction)
    "min_exact_match_rate": ("exact_match_rate", ">="),
    "min_token_agreement": ("token_agreement", ">="),
    "min_first_divergence": ("median_first_divergence", ">="),
    "min_top1_agreement": ("top1_agreement", ">="),
    "max_mean_kl": ("mean_kl", "<="),
}
TOP_FIELDS = {"kind", "name", "description", "model", "prompts", "gen_len", "top_k", "threads", "seed", "timeout_s",
              "references", "builds", "thresholds", "cross_engine"}
BUILD_FIELDS = {"name", "engine", "form", "path", "options", "thresholds"}


@dataclass(frozen=True)
class Build:
    name: str
    engine: str
    form: str | None
    path: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class FidelityGrid:
    path: str
    sha256: str
    name: str
    description: str
    model: str
    prompts_path: Path
    gen_len: int
    top_k: int
    threads: int
    seed: int
    timeout_s: float
    references: dict[str, str]
    builds: tuple[Build, ...]
    thresholds: dict[str, float]
    cross_engine: tuple[tuple[str, str], ...]
    named_references: tuple[str, ...] = ()  # the engines whose reference form the grid names (others: defaults)


def _thresholds(path: str, fld: str, raw: Any) -> dict[str, float]:
    if not isinstance(raw, dict):
        raise _err(path, fld, "must be a mapping of threshold name to number", f"known: {', '.join(THRESHOLDS)}")
    out = {}
    for k, v in raw.items():
        if k not in THRESHOLDS:
            raise _err(path, f"{fld}.{k}", "unknown threshold", f"known: {', '.join(THRESHOLDS)}")
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise _err(path, f"{fld}.{k}", f"must be a number >= 0, got {v!r}")
        out[k] = float(v)
    return out


@lru_cache(maxsize=1)
def default_references() -> dict[str, str]:
    """The engines with a fidelity mode (Fidelity.reference_form set), and each one's default reference form."""
    from harness.engines import ENGINES
    return {n: f for n in ENGINES if (f := capability(get_engine(n), Fidelity).reference_form)}


def from_dict(doc: Any, sp: str, sha: str) -> FidelityGrid:
    """A fidelity grid's document (read by grid.read_yaml, as a speed grid's is), validated."""
    from harness import models
    p = Path(sp)
    engines = tuple(default_references())
    if not isinstance(doc, dict):
        raise _err(sp, "(top level)", "must be a mapping", "see docs/harness.md, fidelity grids")
    if doc.get("kind") != "fidelity":
        raise _err(sp, "kind", f"is {doc.get('kind')!r}, not fidelity", "`harness fidelity` runs grids with kind: fidelity; "
                   "use `harness run` for speed grids")
    from harness import voices
    if voices.known(doc.get("model")):  # a voice: audio fidelity (harness/workloads/speech/fidelity.py)
        from harness.workloads.speech.fidelity import from_dict as speech_grid
        return speech_grid(doc, sp, sha)  # type: ignore[return-value]
    only_fields(sp, "", doc, TOP_FIELDS)
    name = grid_name(sp, doc.get("name"))
    model = doc.get("model")
    if model is None:
        raise _err(sp, "model", "is required", f"known: {', '.join(models.known_names())}, or {{name: NAME, gguf: PATH}}")
    model = model_name(sp, "model", model)  # the zoo's, yours registered by `harness models add`, or yours by path
    if models.is_synthetic(model):
        raise _err(sp, "model", f"{model}: synthetic weights: speed only (random weights have no outputs to keep)",
                   f"check fidelity on a real model: {', '.join(m for m in models.default_models() if m != 'tiny-llama')}")
    for req in ("prompts", "gen_len", "threads", "thresholds", "builds"):
        if req not in doc:
            raise _err(sp, req, "is required and has no default", "see grids/fidelity.yaml")
    prompts_path = (p.parent / str(doc["prompts"])).resolve()
    if not prompts_path.is_file():
        raise _err(sp, "prompts", f"no such prompt set {prompts_path}", "give a path relative to the grid file")
    ints = {}
    for k, lo, default in (("gen_len", 1, None), ("top_k", 1, 20), ("threads", 1, None), ("seed", 0, 0)):
        v = doc.get(k, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise _err(sp, k, f"must be an integer >= {lo}, got {v!r}")
        ints[k] = v
    refs = dict(default_references())
    raw_refs = doc.get("references") or {}
    if not isinstance(raw_refs, dict) or any(k not in engines for k in raw_refs):
        raise _err(sp, "references", f"must map an engine ({', '.join(engines)}) to its reference form")
    refs.update(raw_refs)
    named = tuple(sorted(raw_refs))
    thresholds = _thresholds(sp, "thresholds", doc["thresholds"])
    builds = [_build(sp, f, b, engines, thresholds)
              for f, b in entries(sp, "builds", doc["builds"], BUILD_FIELDS, "each build: {name, engine, form}")]
    names = [b.name for b in builds]
    if len(set(names)) != len(names):
        raise _err(sp, "builds", f"build names must be unique, got {names}")
    cross = []
    for i, c in enumerate(doc.get("cross_engine") or []):
        if not isinstance(c, dict) or c.get("build") not in names or c.get("against") not in engines:
            raise _err(sp, f"cross_engine[{i}]", "must be {build: <a build name>, against: <an engine>}",
                       f"builds: {', '.join(names)}")
        cross.append((c["build"], c["against"]))
    used = {b.engine for b in builds} | {against for _, against in cross}
    refs = {e: form for e, form in refs.items() if e in used}  # the references this grid's builds are scored on
    timeout = doc.get("timeout_s", 900)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise _err(sp, "timeout_s", f"must be a positive number of seconds, got {timeout!r}")
    return FidelityGrid(path=sp, sha256=sha, name=name,
                        description=str(doc.get("description", "")), model=model, prompts_path=prompts_path,
                        gen_len=ints["gen_len"], top_k=ints["top_k"], threads=ints["threads"], seed=ints["seed"],
                        timeout_s=float(timeout), references=refs, builds=tuple(builds), thresholds=thresholds,
                        cross_engine=tuple(cross), named_references=named)


def _build(sp: str, f: str, b: dict, engines: tuple[str, ...], thresholds: dict[str, float]) -> Build:
    """One entry of builds: a zoo form (or a GGUF file) of an engine with a fidelity mode, its options as the
    engine checks them, and its thresholds over the grid's."""
    if b.get("engine") not in engines:
        raise _err(sp, f"{f}.engine", f"unknown engine {b.get('engine')!r}", f"known: {', '.join(engines)}")
    if not isinstance(b.get("name"), str) or not b["name"]:
        raise _err(sp, f"{f}.name", "must be a non-empty string")
    if ("form" in b) == ("path" in b):
        raise _err(sp, f, "needs exactly one of form (a zoo form) or path (a GGUF file)")
    bpath = None
    eng = capability(get_engine(b["engine"]), Fidelity)
    if "path" in b:
        if not eng.accepts_file:
            files = [n for n in engines if capability(get_engine(n), Fidelity).accepts_file]
            raise _err(sp, f"{f}.path", f"a {b['engine']} build cannot be a file (only {', '.join(files)})",
                       f"use form for {b['engine']}")
        bpath = str((Path(sp).parent / str(b["path"])).resolve())
    else:
        if not str(b["form"]).startswith(eng.form_prefix):
            raise _err(sp, f"{f}.form", f"{b['engine']} needs a {eng.form_prefix}* form, got {b['form']!r}")
        if capability(eng, IsaCap).isa_bound(b["form"]):  # a form whose kernels only some ISA tiers have: refused here, never run
            from harness import hardware
            why = capability(eng, IsaCap).isa_refusal(b["form"], b.get("options") or {}, hardware.current_profile())
            if why:
                raise _err(sp, f"{f}.form", why, "check this build on a host whose ISA tier has the kernel, or drop "
                                                  "it (docs/quantization.md)")
    opts = b.get("options") or {}
    if not isinstance(opts, dict) or (set(opts) - eng.fidelity_options):
        raise _err(sp, f"{f}.options", f"unknown option for {b['engine']}",
                   f"known: {', '.join(sorted(eng.fidelity_options)) or 'none'}")
    if "patches" in opts:
        capability(eng, Patches).validate_patches(sp, f"{f}.options.patches", opts["patches"])
    opts = eng.fidelity_check_options(sp, f"{f}.options", opts)
    return Build(name=b["name"], engine=b["engine"], form=b.get("form"), path=bpath, options=opts,
                 thresholds={**thresholds, **_thresholds(sp, f"{f}.thresholds", b.get("thresholds") or {})})
