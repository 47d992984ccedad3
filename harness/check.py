"""`harness check`: every artifact valid, its provenance complete, its id matching its content.

One line per problem, `path: field: reason`. Reads only; never changes a file.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from harness.artifact import id_matches, loads, migrate, parse
from harness.probe import host_key
from harness.store import gc_paused
from harness.errors import UserError
from harness.metrics import DEFINITIONS_VERSION, REQUEST_METRICS

# Dotted paths that every artifact must carry, non-empty.
COMMON = (
    "grid.path", "grid.sha256", "grid.name",
    "model.name", "model.form", "model.source", "model.format", "model.dtype",
    "engine.name", "engine.version", "engine.build_commit", "engine.build",
    "harness.version", "harness.commit",
    "host.key", "host.identity.status", "host.identity.sha256",
    "host.cpu.model", "host.cpu.isa", "host.cpu.isa_tier", "host.cpu.logical_cores", "host.cpu.physical_cores", "host.numa",
    "host.memory.total_bytes", "host.memory.available_bytes", "host.cgroup", "host.kernel", "host.governor",
    "host.loadavg_before", "host.loadavg_after",
    "execution.threads", "execution.cpu_affinity", "execution.numa_policy", "execution.env",
    "execution.requested", "execution.compile_cache", "execution.command",
    "timing.start", "timing.end",
)
HOST = tuple(f for f in COMMON if f.startswith("host."))
# Per kind: what every artifact of the kind carries, and what an ok one carries besides.
REQUIRED = {
    "run": (COMMON + ("grid.cell", "grid.arm", "grid.order", "grid.run_key", "workload.prompt_token_hash",
                      "residency.after_load", "residency.peak_memory", "residency.page_cache"),
            ("execution.effective", "metrics")),
    "reference": (COMMON + ("grid.build", "model.files", "prompt_set.sha256", "prompt_set.token_ids_sha256",
                            "prompt_set.chat_template_sha256", "prompt_set.tokenizer_sha256", "decoding", "outputs"),
                  ("execution.effective",)),
    "fidelity": (COMMON + ("grid.build", "model.files", "prompt_set.sha256", "prompt_set.token_ids_sha256",
                           "prompt_set.chat_template_sha256", "prompt_set.tokenizer_sha256", "decoding", "reference.id",
                           "reference.model_sha256", "reference.engine_build", "reference.prompt_set_sha256", "verdict"),
                 ("execution.effective", "prompts", "summary")),
    "calibration": (("grid.name", "grid.path", "harness.version", "harness.commit", "method", "results",
                     "timing.start", "timing.end") + HOST, ()),
}
REQUIRED_MODEL = ("model.files", "residency.before", "residency.after_run")
# What a host record carries besides, unless it is a migrated legacy record (identity not recorded).
HOST_IDENTITY = ("host.identity.source", "host.cpu.vendor", "host.cpu.family", "host.cpu.model_number",
                 "host.cpu.stepping", "host.cpu.microcode", "host.cpu.flags", "host.cpu.flags_sha256", "host.cpu.sockets",
                 "host.cpu.caches", "host.memory.total_bytes")


_PARTS: dict[str, tuple[str, ...]] = {}


def _parts(dotted: str) -> tuple[str, ...]:
    parts = _PARTS.get(dotted)
    if parts is None:
        parts = _PARTS[dotted] = tuple(dotted.split("."))
    return parts


def _sha_cache() -> Any:
    from harness.hashcache import HashCache
    return HashCache.default()


def check_doc(doc: Any, where: str, verify_models: bool = True, allow_unknown_commit: bool = False,
              finite: bool = False) -> list[str]:
    """Problems with one parsed JSON document (field checks on its migrated form). `finite`: the strict parser
    read it (no NaN or infinity), so the id may be verified the fast way first."""
    problems = []
    if not isinstance(doc, dict):
        return [f"{where}: (top level): not a JSON object"]
    try:
        if not id_matches(doc, finite and isinstance(doc, dict)):
            problems.append(f"{where}: id: does not match the content (edited after it was written?)")
    except ValueError as e:  # NaN or infinity cannot be canonical JSON
        problems.append(f"{where}: id: content is not canonical JSON ({e})")
    try:
        a = parse(doc, where)
        doc = migrate(dict(doc), where)
    except UserError as e:
        return problems + [f"{where}: {e.problem}"]
    except ValidationError as e:
        return problems + [f"{where}: {'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']}"
                           for err in e.errors()]
    name = Path(where).name
    if name.endswith(".json") and name[:-5] != doc.get("id"):
        problems.append(f"{where}: id: file name is not <id>.json")
    always, when_ok = REQUIRED[a.kind]
    needed = list(always)
    if not a.host.identity.status.startswith("legacy"):
        needed += HOST_IDENTITY
    if a.status == "ok":
        needed += when_ok
    else:
        needed += ["error"]
    if a.kind == "run" and a.engine.name != "command" and a.execution.observe != "bare":
        needed += REQUIRED_MODEL
    elif a.kind == "run" and a.engine.name != "command":
        needed += ["model.files"]  # a bare run has no residency: it measured what observing costs
    for f in needed:  # the walk is inlined: 55 paths a document, 10,000 documents in `make bench`
        v: Any = doc
        for part in _parts(f):
            v = v.get(part, KeyError) if isinstance(v, dict) else KeyError
            if v is KeyError:
                break
        if v is KeyError:
            problems.append(f"{where}: {f}: missing")
        elif not v and v is not False and v != 0:  # None, "", [], {}: present but empty
            problems.append(f"{where}: {f}: empty")
    if host_key(doc["host"]) != a.host.key:
        problems.append(f"{where}: host.key: {a.host.key} does not match the host block (it hashes to "
                        f"{host_key(doc['host'])})")
    problems += _emulation_problems(doc, a, where)
    if a.harness.commit.startswith("unknown") or a.harness.dirty is None:
        if not allow_unknown_commit:
            problems.append(f"{where}: harness.commit: {a.harness.commit!r}, tree state "
                            f"{'unknown' if a.harness.dirty is None else 'known'}: published artifacts come from a "
                            "clean git checkout (pass --allow-unknown-commit to accept an install without git)")
    elif a.harness.dirty:
        problems.append(f"{where}: harness.dirty: written by a dirty tree ({', '.join(a.harness.dirty_files[:3])}); "
                        "published artifacts come from clean trees")
    if a.kind == "fidelity" and a.status == "ok" and not a.cross_engine and not a.thresholds:
        problems.append(f"{where}: thresholds: empty; a gated fidelity artifact records the thresholds it met or missed")
    if a.kind == "run" and a.status == "ok":
        for mname, m in a.metrics.items():
            if not m.samples:
                problems.append(f"{where}: metrics.{mname}.samples: empty (raw samples are required)")
        problems += read_back_problems(a, where)
    if verify_models and getattr(a, "model", None) is not None and a.model.files:
        problems += _check_model_files(a, where)
    return problems


def _emulation_problems(doc: dict, a: Any, where: str) -> list[str]:
    """A run that emulated a hardware class says so consistently: the host's emulation, the machine it ran on
    (host.machine_key hashes the same host block, native), and execution.emulation with a status per cap."""
    emu = a.host.emulation
    if not emu:
        if a.kind == "run" and a.execution.emulation:
            return [f"{where}: execution.emulation: present but host.emulation is null"]
        return []
    out = []
    mk = doc["host"].get("machine_key")
    if mk != host_key({**doc["host"], "emulation": None}):
        out.append(f"{where}: host.machine_key: {mk} is not the native key of this host block")
    if a.kind == "run":
        rec = a.execution.emulation
        if not rec or rec.get("class") != emu:
            out.append(f"{where}: execution.emulation: missing or not of class {emu}")
        elif not all(isinstance(c, dict) and str(c.get("status", "")).startswith(("emulated", "not emulated",
                                                                                    "unverified"))
                     for c in rec.get("caps", {}).values()) or not rec.get("caps"):
            out.append(f"{where}: execution.emulation.caps: every cap needs a status (emulated, not emulated: why, "
                       "or unverified: why)")
        elif a.status == "ok" and any(str(c["status"]).startswith("unverified") for c in rec["caps"].values()):
            out.append(f"{where}: execution.emulation.caps: an ok run left a cap unverified")
    return out


def read_back_problems(a: Any, where: str) -> list[str]:
    """A run whose engine used another value than the one requested for an enforced setting fails; a run
    that claims the shared metric definitions must carry their exact text."""
    out = []
    for name, row in (a.execution.settings or {}).items():
        if row.get("rule") != "enforced":
            continue
        req, eff = row.get("requested"), row.get("effective")
        if eff is None:
            out.append(f"{where}: execution.settings.{name}: requested {req!r}, not read back from the engine "
                       "(declare it observe_only in the arm if it cannot be)")
        elif eff != req:
            out.append(f"{where}: execution.settings.{name}: requested {req!r}, engine used {eff!r}")
    if a.execution.effective.get("metric_definitions") == DEFINITIONS_VERSION:
        for mname, m in a.metrics.items():
            if mname in REQUEST_METRICS and m.definition != REQUEST_METRICS[mname][2]:
                out.append(f"{where}: metrics.{mname}.definition: not the shared definition of {mname} "
                           f"({DEFINITIONS_VERSION}, harness/metrics.py)")
    return out


def _check_model_files(a: Any, where: str) -> list[str]:
    return [f"{where}: {p}" for p in _model_file_problems(a.model.name, tuple((f.path, f.sha256) for f in a.model.files))]


@lru_cache(maxsize=256)
def _model_file_problems(name: str, files: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """The recorded model files that differ from this machine's, once per distinct file list per process (a
    store of thousands of runs of one model compares its files once, not once per artifact)."""
    from harness import models
    if name not in models.MODELS:
        return (f"model.name: unknown model {name!r}",)
    try:
        root = models.model_dir(name)
    except Exception:
        return ()
    if not root.exists():
        return ()  # the model is not prepared here: nothing local to compare with
    cache = _sha_cache()
    out = []
    for rel, sha in files:
        p = root / rel  # an absolute path (a fidelity build given as a file) stays as it is
        if p.exists() and cache.sha256(p) != sha:
            out.append(f"model.files[{rel}].sha256: differs from the local file {p}")
    cache.save()
    return tuple(out)


def iter_artifact_paths(paths: Iterable[str]) -> tuple[list[Path], list[str]]:
    files, problems = [], []
    for p in map(Path, paths):
        if p.is_symlink():
            problems.append(f"{p}: (file): is a symlink; artifacts are plain files")
        elif p.is_dir():
            for q in sorted(p.rglob("*.json"), key=os.fspath):
                if q.is_symlink():
                    problems.append(f"{q}: (file): is a symlink; artifacts are plain files")
                elif not q.name.startswith(".tmp-"):
                    files.append(q)
        elif p.is_file():
            files.append(p)
        else:
            raise UserError(str(p), "no such file or directory", "pass artifact files or store directories")
    return files, problems


def _check_file(f: Path, verify_models: bool, allow_unknown_commit: bool) -> tuple[list[str], Any]:
    """One file's problems, and its document when a later cross-check needs it (fidelity, reference) or its id."""
    where = str(f)
    try:
        raw = f.read_bytes()
    except OSError as e:
        return [f"{where}: (file): unreadable: {e.strerror}"], None
    if not raw.strip():
        return [f"{where}: (file): empty file"], None
    try:
        doc, finite = loads(raw)
    except UnicodeDecodeError as e:
        return [f"{where}: (file): not UTF-8 at byte {e.start}"], None
    except ValueError as e:
        return [f"{where}: (file): invalid JSON ({e.msg} at line {e.lineno}); truncated?"], None
    problems = check_doc(doc, where, verify_models, allow_unknown_commit, finite)
    if isinstance(doc, dict) and doc.get("kind") in ("fidelity", "reference"):
        return problems, doc
    return problems, {"id": doc.get("id")} if isinstance(doc, dict) else None


def _check_chunk(args: tuple[list[str], bool, bool]) -> list[tuple[list[str], Any]]:
    files, verify_models, allow = args
    with gc_paused():
        return [_check_file(Path(f), verify_models, allow) for f in files]


PARALLEL_FROM = 400  # artifacts; below this a process pool costs more than it saves


def check(paths: Iterable[str], verify_models: bool = True, allow_unknown_commit: bool = False) -> tuple[int, list[str]]:
    """(number of artifacts checked, problems). Large stores are checked on every CPU this process may use
    (each file independently; the cross-file checks, duplicate ids and fidelity references, run after)."""
    files, problems = iter_artifact_paths(paths)
    _model_file_problems.cache_clear()  # model files are compared afresh by every check
    workers = min(len(os.sched_getaffinity(0)), 8)
    if len(files) >= PARALLEL_FROM and workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        n = max(1, len(files) // (workers * 4))
        chunks = [([str(f) for f in files[i:i + n]], verify_models, allow_unknown_commit)
                  for i in range(0, len(files), n)]
        with ProcessPoolExecutor(workers) as pool:
            results = [r for chunk in pool.map(_check_chunk, chunks) for r in chunk]
    else:
        results = _check_chunk(([str(f) for f in files], verify_models, allow_unknown_commit))
    seen: dict[str, Path] = {}
    fidelity_refs: list[tuple[str, dict]] = []
    references: dict[str, dict] = {}
    for f, (probs, doc) in zip(files, results):
        where = str(f)
        problems += probs
        if not isinstance(doc, dict):
            continue
        if doc.get("kind") == "fidelity" and isinstance(doc.get("reference"), dict):
            fidelity_refs.append((where, doc))
        if doc.get("kind") == "reference" and isinstance(doc.get("id"), str):
            references[doc["id"]] = doc
        aid = doc.get("id")
        if isinstance(aid, str):
            if aid in seen and seen[aid].resolve() != f.resolve():
                problems.append(f"{where}: id: duplicate of {seen[aid]}")
            seen.setdefault(aid, f)
    problems += _check_references(fidelity_refs, references)
    return len(files), problems


def _check_references(fidelity_docs: list[tuple[str, dict]], references: dict[str, dict]) -> list[str]:
    """Each fidelity artifact's reference is among the checked ones, and is what the artifact says it is."""
    from harness.fidelity import reference_mismatch
    out = []
    for where, doc in fidelity_docs:
        rid = doc["reference"].get("id")
        if rid not in references:
            out.append(f"{where}: reference.id: {str(rid)[:12]}... is not among the checked artifacts "
                       "(check the fidelity store and baselines together)")
            continue
        try:
            ref, fid = parse(references[rid], rid), parse(doc, where)
        except (UserError, ValidationError):
            continue  # reported above
        eng = None if fid.cross_engine else {"build_commit": fid.engine.build_commit, "build": fid.engine.build}
        why = reference_mismatch(ref, fid.reference, fid.prompt_set.model_dump(), eng)
        if why:
            out.append(f"{where}: reference: {', '.join(why)} from reference {rid[:12]}...")
    return out
