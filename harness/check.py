"""`harness check`: every artifact valid, its provenance complete, its id matching its content, and its figures
consistent with each other (settings with the engine's read-back, samples with the workload and the run's
timing, the cell with its parameters, the CPUs with the host).

One line per problem, `path: field: reason`. Reads only; never changes a file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import time
from datetime import datetime
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
    problems, a = _doc_problems(doc, where, allow_unknown_commit, finite)
    if verify_models and getattr(a, "model", None) is not None and a.model.files:
        problems += _check_model_files(a, where)
    return problems


def _doc_problems(doc: Any, where: str, allow_unknown_commit: bool, finite: bool) -> tuple[list[str], Any]:
    """check_doc but the model files: (problems, the parsed artifact or None where it does not parse)."""
    problems: list[str] = []
    if not isinstance(doc, dict):
        return [f"{where}: (top level): not a JSON object"], None
    try:
        if not id_matches(doc, finite and isinstance(doc, dict)):
            problems.append(f"{where}: id: does not match the content (edited after it was written?)")
    except ValueError as e:  # NaN or infinity cannot be canonical JSON
        problems.append(f"{where}: id: content is not canonical JSON ({e})")
    try:
        a = parse(doc, where)
        doc = migrate(dict(doc), where)
    except UserError as e:
        return problems + [f"{where}: {e.problem}"], None
    except ValidationError as e:
        return problems + [f"{where}: {'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']}"
                           for err in e.errors()], None
    name = Path(where).name
    if name.endswith(".json") and name[:-5] != doc.get("id"):
        problems.append(f"{where}: id: file name is not <id>.json")
    problems += _content_problems(doc, a, where, allow_unknown_commit)
    return problems, a


def problems_of(a: Any, where: str, allow_unknown_commit: bool = False, tree_state: bool = True) -> list[str]:
    """What `harness check` finds in one parsed artifact (an artifact object as harness.store.load_path or
    harness.artifact.parse returns it: RunArtifact, FidelityArtifact, ReferenceArtifact, CalibrationArtifact),
    one `where: field: reason` line per problem; [] when check accepts it.

    Applies every rule check_doc applies to a single artifact's content: required provenance, host key,
    emulation evidence, harness tree state (unless `tree_state` is False: then neither an unknown commit nor a
    dirty tree is a problem; `allow_unknown_commit` as for `harness check`), enforced settings, and the
    consistency rules (settings against the engine's read-back, sample counts against the workload, samples
    against the run's timing, finite and plausibly signed samples, the cell id against its parameters,
    threads and CPUs against the affinity and the host). Cheap and pure: no file is read, no model file is
    hashed (as `harness check --no-model-hashes`). Not applied, because a parsed object no longer has what
    they need: the id against the file's bytes (load_path parsed, and migrated, what was on disk: run
    `harness check` on the files for that), the file name, and the rules across artifacts (duplicate ids, a
    fidelity artifact's reference). Never raises for a well-typed artifact."""
    doc = a.model_dump(mode="json")
    return _content_problems(doc, a, where, allow_unknown_commit, tree_state)


def load_accepted(store: Any, grid_name: str | None = None,
                  folders: tuple[str, ...] | None = None) -> tuple[list, list[str]]:
    """The artifacts of a store's grid (or of the whole store; `folders`: only those grid folders) that hash to
    their id and that `harness check` accepts (`accepted`, the tree state aside), and one line per file left
    out: the door every lookup of other artifacts goes through (calibrations, costs, overheads)."""
    from harness.store import gc_paused, load_path
    loaded, left = [], list(store.left_out)
    with gc_paused():
        for p in store.iter_paths(grid_name):
            if folders is not None and p.parent.name not in folders:
                continue
            try:
                loaded.append((load_path(p, verify_id=True), str(p)))
            except UserError as e:
                left.append(str(e))
        arts, refused = accepted(loaded, tree_state=False)
    return arts, left + refused


def accepted(artifacts: Iterable[tuple[Any, str]], allow_unknown_commit: bool = False,
             tree_state: bool = True) -> tuple[list[Any], list[str]]:
    """Filter parsed artifacts to those check accepts: from (artifact, where) pairs (where: its path, named in
    the problem lines), (the accepted artifacts in their given order, the problem lines of the refused ones).
    An artifact is refused when problems_of finds anything in it; see problems_of for what is and is not
    checked (no id-against-bytes, no model hashes, no cross-artifact rules)."""
    ok, lines = [], []
    for a, where in artifacts:
        probs = problems_of(a, where, allow_unknown_commit, tree_state)
        if probs:
            lines += probs
        else:
            ok.append(a)
    return ok, lines


def _content_problems(doc: dict, a: Any, where: str, allow_unknown_commit: bool = False,
                      tree_state: bool = True) -> list[str]:
    """The rules on one artifact's content: `doc` its migrated JSON form, `a` the parsed artifact."""
    problems: list[str] = []
    always, when_ok = REQUIRED[a.kind]
    needed = list(always)
    if not a.host.identity.status.startswith("legacy"):
        needed += HOST_IDENTITY
    if a.status == "ok":
        needed += when_ok
    else:
        needed += ["error"]
    needs_model = a.kind == "run" and _needs_model(a.engine.name)
    if needs_model and a.execution.observe != "bare":
        needed += REQUIRED_MODEL
    elif needs_model:
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
    if tree_state and (a.harness.commit.startswith("unknown") or a.harness.dirty is None):
        if not allow_unknown_commit:
            problems.append(f"{where}: harness.commit: {a.harness.commit!r}, tree state "
                            f"{'unknown' if a.harness.dirty is None else 'known'}: published artifacts come from a "
                            "clean git checkout (pass --allow-unknown-commit to accept an install without git)")
    elif tree_state and a.harness.dirty:
        problems.append(f"{where}: harness.dirty: written by a dirty tree ({', '.join(a.harness.dirty_files[:3])}); "
                        "published artifacts come from clean trees")
    if a.kind == "fidelity" and a.status == "ok" and not a.cross_engine and not a.thresholds:
        problems.append(f"{where}: thresholds: empty; a gated fidelity artifact records the thresholds it met or missed")
    if a.kind == "run" and a.status == "ok":
        for mname, m in a.metrics.items():
            if not m.samples:
                problems.append(f"{where}: metrics.{mname}.samples: empty (raw samples are required)")
        problems += read_back_problems(a, where)
    problems += consistency_problems(a, where)
    return problems


def _needs_model(engine: str) -> bool:
    """Whether a run of this engine loads a model (an unknown engine is held to the model fields)."""
    from harness.engines import ENGINES, engine_class
    return engine_class(engine).needs_model if engine in ENGINES else True


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
        else:
            out += _cap_evidence_problems(a, rec, where)
    return out


def _cap_evidence_problems(a: Any, rec: dict, where: str) -> list[str]:
    """Each cap's status against its own evidence (harness/emulate.py, record): cores emulated means the engine
    ran on at most the class's cores, as execution.settings.cpus read back; memory emulated means the memory
    available at engine start was the class's within emulate.MEMORY_TOLERANCE; `emulated` means every cap was;
    and no run uses more threads or CPUs than the class has cores."""
    out, caps = [], rec["caps"]
    f = f"{where}: execution.emulation"
    cores, mem = caps.get("cores") or {}, caps.get("memory") or {}
    n = cores.get("requested")
    if isinstance(n, int) and not isinstance(n, bool):
        ex = a.execution
        if ex.threads > n or len(ex.cpu_affinity) > n:
            out.append(f"{f}.caps.cores: the class has {n} cores, the run used {ex.threads} threads on "
                       f"{len(ex.cpu_affinity)} CPU(s)")
        if cores.get("status") == "emulated":
            eff = cores.get("effective")
            read = ((ex.settings or {}).get("cpus") or {}).get("effective")
            if not isinstance(eff, list) or not 0 < len(eff) <= n:
                out.append(f"{f}.caps.cores: status emulated, but the engine ran on {eff!r} (the class has {n} cores)")
            elif ex.settings is not None and eff != read:
                out.append(f"{f}.caps.cores.effective: {eff}, but the engine's affinity as read back "
                           f"(execution.settings.cpus.effective) is {read!r}")
    if mem.get("status") == "emulated":
        want, avail = mem.get("requested_bytes"), mem.get("effective_available_bytes")
        if not (isinstance(want, int) and isinstance(avail, int) and want > 0
                and abs(avail - want) <= MEMORY_TOLERANCE * want):
            out.append(f"{f}.caps.memory: status emulated, but {avail!r} B were available at engine start for the "
                       f"class's {want!r} B (tolerance {MEMORY_TOLERANCE:.0%})")
    all_emulated = all(c.get("status") == "emulated" for c in caps.values())
    if "emulated" in rec and rec["emulated"] != all_emulated:
        out.append(f"{f}.emulated: {rec['emulated']!r}, but " + (
            "every cap is emulated" if all_emulated else
            f"cap(s) {', '.join(k for k, c in caps.items() if c.get('status') != 'emulated')} are not"))
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


# ---- consistency: figures that contradict each other, though each is well-formed -----------------------------

# Each settings row whose effective value the engine also wrote, raw, into execution.effective: the keys (dotted
# where nested) that hold that read-back. Every present key must agree with the row. Rows not named here and not
# `options.<key>` are derived from what the engine measured (batch: the fewest concurrent sequences; warmups: the
# warm-up repetitions it ran), not read back into execution.effective.
READ_BACK_KEYS: dict[str, tuple[str, ...]] = {
    "threads": ("threads", "n_threads", "torch_threads", "decode_test.n_threads"),
    "cpus": ("cpu_affinity",),
    "dtype": ("dtype",),
    "context_len": ("n_ctx_per_seq", "max_model_len"),
    "kv_cache_memory_bytes": ("kv_cache_memory_bytes",),
    "options.eager": ("enforce_eager",),
}
# Settings rows whose requested value is the workload's.
WORKLOAD_SETTINGS = ("prompt_len", "gen_len", "context_len", "batch", "warmups", "repetitions")
# The cell parameters a run's workload copies (batch defaults to 1).
CELL_WORKLOAD = ("prompt_len", "context_len", "gen_len", "batch")
# Seconds per unit of the time-valued metric units.
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# Units of quantities that cannot be negative besides times and rates (anything per second, tok/s): sizes, counts.
NONNEGATIVE_UNITS = {"B", "bytes", "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "tok", "tokens", "count",
                     "requests", "steps"}
# A sample may exceed the run's wall clock (timing, UTC) by this much: samples are timed by monotonic clocks
# inside the span, the span by the wall clock around it.
RUN_SLACK_S, RUN_SLACK = 0.5, 0.01
# timing.duration_s against end - start (one Span takes both: they differ by under a millisecond in the store).
DURATION_SLACK_S = 1.0
# Relative tolerance of a figure recomputed from the others by its shared definition (harness/metrics.py).
REL_TOL = 1e-6
_PER = re.compile(r"one sample per run|per request|per repetition")
# harness/emulate.py's MEMORY_TOLERANCE: the memory cap holds when the memory available at engine start is the
# class's within it. Restated here, as cell_id and run_key below are (tests/test_hostile_check.py holds them
# equal to the originals): importing harness.emulate, harness.grid or harness.schedule imports yaml and more,
# which would cost `harness check` more time than all of its consistency rules take.
MEMORY_TOLERANCE = 0.05


def cell_id(params: dict) -> str:
    """harness.grid.cell_id, restated."""
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def run_key(cell: str, arm: str, pass_index: int) -> str:
    """harness.schedule.run_key, restated."""
    return hashlib.sha256(f"{cell}|{arm}|{pass_index}".encode()).hexdigest()[:16]


def consistency_problems(a: Any, where: str) -> list[str]:
    """Figures of one parsed artifact that contradict each other: what a plausible lie (an edited artifact whose
    id was recomputed) cannot keep consistent. Timing for every kind; CPUs for every engine artifact; for runs
    the cell, the settings against the read-back, and (ok runs) the samples against the workload and timing."""
    out = _timing_problems(a, where)
    if hasattr(a, "execution"):
        out += _affinity_problems(a, where)
    if hasattr(a, "engine") and isinstance(a.engine.build, dict):
        out += _build_problems(a.engine.build, where)
    if a.kind == "run":
        out += _cell_problems(a, where)
        out += _settings_problems(a, where)
        if a.status == "ok":
            out += _sample_problems(a, where)
    return out


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _build_problems(b: dict, where: str) -> list[str]:
    """The build that ran, as the engine recorded it: every content hash it names is a sha256, and a run of
    prebuilt binaries ran the binary whose hash the build lists (two arms of two builds differ by these)."""
    out = [f"{where}: engine.build.{k}: {_short(b[k])} is not a sha256" for k in ("binary_sha256", "tree_sha256",
           "sdist_sha256") if k in b and not (isinstance(b[k], str) and _SHA256.fullmatch(b[k]))]
    listed = b.get("binaries_sha256")
    if listed is not None:
        if not isinstance(listed, dict) or not all(isinstance(v, str) and _SHA256.fullmatch(v) for v in listed.values()):
            out.append(f"{where}: engine.build.binaries_sha256: must map each binary to its sha256")
        elif isinstance(b.get("binary"), str) and b["binary"] in listed and listed[b["binary"]] != b.get("binary_sha256"):
            out.append(f"{where}: engine.build.binary_sha256: {_short(b.get('binary_sha256'))}, but the build lists "
                       f"{b['binary']} as {listed[b['binary']]}: the run did not use the build it names")
    return out


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


def _instant(ts: str) -> datetime:
    return datetime.fromisoformat(ts[:-1] + "+00:00" if ts.endswith("Z") else ts)


def _timing_problems(a: Any, where: str) -> list[str]:
    t = a.timing
    out, at = [], {}
    for name in ("start", "end"):
        try:
            at[name] = _instant(getattr(t, name))
        except (ValueError, TypeError):
            out.append(f"{where}: timing.{name}: {getattr(t, name)!r} is not an ISO 8601 timestamp")
    if out:
        return out
    try:
        span = (at["end"] - at["start"]).total_seconds()
    except TypeError:
        return [f"{where}: timing: start {t.start!r} and end {t.end!r} mix times with and without a time zone"]
    if span < 0:
        return [f"{where}: timing.end: {t.end} is before timing.start {t.start}"]
    if abs(t.duration_s - span) > DURATION_SLACK_S + RUN_SLACK * span:
        return [f"{where}: timing.duration_s: {t.duration_s:.6g} s, but end - start is {span:.6g} s"]
    return []


def _affinity_problems(a: Any, where: str) -> list[str]:
    """The harness pins one engine thread per CPU (runner: cpus = the arm's, or the first `threads`), on CPUs
    this host has online."""
    ex, out = a.execution, []
    aff = ex.cpu_affinity
    if aff and ex.threads > len(aff):
        out.append(f"{where}: execution.threads: {ex.threads} threads on {len(aff)} CPU(s) {aff}: runs pin one "
                   "thread per CPU")
    if len(set(aff)) != len(aff):
        out.append(f"{where}: execution.cpu_affinity: {aff} lists a CPU twice")
    cpu = a.host.cpu
    online, n = cpu.get("online_cpus"), cpu.get("logical_cores")
    if isinstance(online, list) and online:
        have, what = set(online), f"host.cpu.online_cpus ({len(online)} CPUs)"
    elif isinstance(n, int) and not isinstance(n, bool) and n > 0:
        have, what = set(range(n)), f"host.cpu.logical_cores ({n})"
    else:
        return out
    read = ((ex.settings or {}).get("cpus") or {}).get("effective")
    for field, cpus in (("execution.cpu_affinity", aff), ("execution.settings.cpus.effective", read)):
        if isinstance(cpus, list):
            beyond = [c for c in cpus if c not in have]
            if beyond:
                out.append(f"{where}: {field}: CPU(s) {beyond} are not on this host ({what})")
    return out


def _cell_problems(a: Any, where: str) -> list[str]:
    g, w, out = a.grid, a.workload, []
    params = g.cell_params
    try:
        want = cell_id(params)
    except Exception:  # unsortable keys cannot come from a grid file
        want = None
    if g.cell != want:
        out.append(f"{where}: grid.cell: {g.cell!r} is not the id of grid.cell_params ({want!r})")
    elif g.run_key != run_key(g.cell, g.arm, g.pass_index):
        out.append(f"{where}: grid.run_key: {g.run_key} is not the key of cell {g.cell!r}, arm {g.arm!r}, pass "
                   f"{g.pass_index} ({run_key(g.cell, g.arm, g.pass_index)})")
    for k in CELL_WORKLOAD:
        if k not in params and k != "batch":
            out.append(f"{where}: grid.cell_params.{k}: missing (workload.{k} is {getattr(w, k)})")
        elif getattr(w, k) != params.get(k, 1):
            out.append(f"{where}: workload.{k}: {getattr(w, k)}, but the cell's {k} is {params.get(k, 1)!r}")
    return out


def _lookup(d: dict, dotted: str) -> Any:
    v: Any = d
    for part in _parts(dotted):
        v = v.get(part, KeyError) if isinstance(v, dict) else KeyError
        if v is KeyError:
            break
    return v


def _settings_problems(a: Any, where: str) -> list[str]:
    """Each settings row agrees with what else the artifact says: its request with execution and the workload,
    its effective value with the engine's raw read-back in execution.effective."""
    ex, out = a.execution, []
    rows = ex.settings or {}
    for name, want, field in (("threads", ex.threads, "execution.threads"),
                              ("cpus", ex.cpu_affinity, "execution.cpu_affinity"),
                              *((k, getattr(a.workload, k), f"workload.{k}") for k in WORKLOAD_SETTINGS)):
        row = rows.get(name)
        if isinstance(row, dict) and "requested" in row and row["requested"] != want:
            out.append(f"{where}: execution.settings.{name}.requested: {row['requested']!r}, but {field} is {want!r}")
    for name, row in rows.items():
        if not isinstance(row, dict) or row.get("effective") is None:
            continue
        keys = READ_BACK_KEYS.get(name) or ((name[8:],) if name.startswith("options.") else ())
        for key in keys:
            v = _lookup(ex.effective, key)
            if v is not KeyError and v != row["effective"]:
                out.append(f"{where}: execution.settings.{name}.effective: {row['effective']!r}, but the engine's "
                           f"read-back execution.effective.{key} is {v!r}")
    return out


@lru_cache(maxsize=1024)
def _per(definition: str) -> str | None:
    """What one sample of a metric is, as its definition says (the last phrase that says it): request,
    repetition, run; None where the definition does not say."""
    found = _PER.findall(definition)
    return None if not found else {"one sample per run": "run", "per request": "request",
                                   "per repetition": "repetition"}[found[-1]]


def _nonnegative(unit: str) -> bool:
    return unit in TIME_UNITS or unit in NONNEGATIVE_UNITS or unit.endswith("/s")


def _sample_problems(a: Any, where: str) -> list[str]:
    """An ok run's samples: finite, of a possible sign, as many as the workload ran (the definition says per
    what), none longer than the run, and (shared definitions) each rate what its times make."""
    w, dur, out = a.workload, a.timing.duration_s, []
    reps, batch, warm = w.repetitions, w.batch, w.warmups
    limit = dur * (1 + RUN_SLACK) + RUN_SLACK_S
    shared = a.execution.effective.get("metric_definitions") == DEFINITIONS_VERSION
    counted: dict[str, str] = {}  # the metrics with finite samples, as many as their definition makes
    for name, m in a.metrics.items():
        xs, ws = m.samples, m.warmup_samples
        total = sum(xs) + sum(ws)  # finite: no NaN or infinity among them (the common case, tested fast)
        finite = math.isfinite(total)
        if not finite or (xs and min(xs) < 0) or (ws and min(ws) < 0):
            finite = _value_problems(out, f"{where}: metrics.{name}", m)  # element by element (or the sum overflowed)
        per = _per(m.definition)
        n, nw = len(xs), len(ws)
        if per is None:
            if n not in (1, reps, reps * batch):
                out.append(f"{where}: metrics.{name}.samples: {n} samples, but workload.repetitions is {reps} (batch "
                           f"{batch}): one per repetition ({reps}), per request ({reps * batch}) or per run (1)")
            if nw not in (0, warm, warm * batch):
                out.append(f"{where}: metrics.{name}.warmup_samples: {nw} samples, but workload.warmups is {warm} "
                           f"(batch {batch})")
        else:
            want, want_w = (1, 0) if per == "run" else (reps, warm) if per == "repetition" else (reps * batch,
                                                                                             warm * batch)
            exact = shared and name in REQUEST_METRICS and m.definition == REQUEST_METRICS[name][2]
            if n != want:
                how = {"run": "one per run", "repetition": f"one per repetition: workload.repetitions {reps}",
                       "request": f"one per request: workload.repetitions {reps} x batch {batch}"}[per]
                out.append(f"{where}: metrics.{name}.samples: {n} samples, but its definition makes {want} ({how})")
            if nw != want_w and (nw or exact or per == "run"):  # an engine may not report its warm-ups; shared ones do
                how = {"run": "none for a per-run figure", "repetition": f"workload.warmups {warm}",
                       "request": f"workload.warmups {warm} x batch {batch}"}[per]
                out.append(f"{where}: metrics.{name}.warmup_samples: {nw} samples, but its definition makes {want_w} "
                           f"({how})")
            elif n == want and finite:
                counted[name] = per
        scale = TIME_UNITS.get(m.unit)
        if scale is None or not finite or not xs:
            continue
        # repetitions run one after another, the requests of one together: what they take adds up within the run
        if counted.get(name) == "request" and batch > 1:
            both = ws + xs
            total = sum(max(both[i:i + batch]) for i in range(0, len(both), batch))
        elif counted.get(name) not in ("repetition", "request"):
            total = max(max(xs), max(ws) if ws else 0.0)
        if total * scale <= limit:
            continue
        longest = max(max(xs), max(ws) if ws else 0.0) * scale
        if longest > limit:
            out.append(f"{where}: metrics.{name}.samples: {longest:.6g} s, longer than the whole run "
                       f"(timing.duration_s {dur:.6g} s)")
        else:
            out.append(f"{where}: metrics.{name}.samples: its repetitions take {total * scale:.6g} s together, longer "
                       f"than the whole run (timing.duration_s {dur:.6g} s)")
    if shared:
        out += _request_figure_problems(a, where, counted)
    return out


def _value_problems(out: list[str], f: str, m: Any) -> bool:
    """Appends a line for each list of a metric with a sample that is not finite, or negative where its unit
    cannot be; whether its samples are all finite."""
    finite = True
    for field, xs in (("samples", m.samples), ("warmup_samples", m.warmup_samples)):
        bad = [(i, x) for i, x in enumerate(xs) if not math.isfinite(x)]
        if bad:
            finite = False
            out.append(f"{f}.{field}[{bad[0][0]}]: {bad[0][1]} is not a finite number"
                       + (f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""))
            continue
        neg = [(i, x) for i, x in enumerate(xs) if x < 0] if _nonnegative(m.unit) else []
        if neg:
            what = "time" if m.unit in TIME_UNITS else "rate" if m.unit.endswith("/s") else "size or count"
            out.append(f"{f}.{field}[{neg[0][0]}]: {neg[0][1]!r} {m.unit} is negative, which a {what} cannot be"
                       + (f" (and {len(neg) - 1} more)" if len(neg) > 1 else ""))
    return finite


def _request_figure_problems(a: Any, where: str, counted: dict[str, str]) -> list[str]:
    """Under the shared definitions (harness/metrics.py) every request's figures come from its token timestamps:
    ttft_s <= e2e_s, prefill_tok_s = prompt_len / ttft_s, decode_tok_s = (gen_len - 1) / (e2e_s - ttft_s), the
    gaps' percentiles in order and within e2e_s - ttft_s, output_tok_s = batch x gen_len / the repetition's
    longest e2e_s. The first request that contradicts them is named, per metric."""
    m, w = a.metrics, a.workload
    shared = {k for k in counted if k in REQUEST_METRICS and m[k].definition == REQUEST_METRICS[k][2]}
    if not {"ttft_s", "e2e_s"} <= shared:
        return []
    out = []
    p, g, b = w.prompt_len, w.gen_len, w.batch
    for field in ("samples", "warmup_samples"):
        tt, e2 = getattr(m["ttft_s"], field), getattr(m["e2e_s"], field)
        here = f"{where}: metrics.{{}}.{field}[{{}}]: "
        for i, (t, e) in enumerate(zip(tt, e2)):
            if t > e:
                out.append(here.format("ttft_s", i) + f"{t:.6g} s, after the request's last token (e2e_s {e:.6g} s)")
                break
        if "prefill_tok_s" in shared:
            for i, (x, t) in enumerate(zip(getattr(m["prefill_tok_s"], field), tt)):
                if t <= 0 or abs(x - p / t) > REL_TOL * p / t:
                    out.append(here.format("prefill_tok_s", i) + f"{x:.6g} tok/s, but prompt_len {p} / ttft_s "
                               f"{t:.6g} s is {p / t if t > 0 else math.inf:.6g}")
                    break
        if "decode_tok_s" in shared:
            for i, (x, t, e) in enumerate(zip(getattr(m["decode_tok_s"], field), tt, e2)):
                if e <= t or abs(x - (g - 1) / (e - t)) > REL_TOL * (g - 1) / (e - t):
                    out.append(here.format("decode_tok_s", i) + f"{x:.6g} tok/s, but (gen_len {g} - 1) / (e2e_s - "
                               f"ttft_s = {e - t:.6g} s) is {(g - 1) / (e - t) if e > t else math.inf:.6g}")
                    break
        prev = None
        for q in ("itl_p50_s", "itl_p90_s", "itl_p99_s", "itl_max_s"):
            if q not in shared:
                prev = None
                continue
            xs = getattr(m[q], field)
            for i, (x, t, e) in enumerate(zip(xs, tt, e2)):
                if x > (e - t) * (1 + REL_TOL) + 1e-9:
                    out.append(here.format(q, i) + f"{x:.6g} s, but the request decoded for {e - t:.6g} s in all "
                               "(e2e_s - ttft_s)")
                    break
            if prev is not None:
                for i, (x, y) in enumerate(zip(xs, prev[1])):
                    if x < y * (1 - REL_TOL):
                        out.append(here.format(q, i) + f"{x:.6g} s, below {prev[0]} {y:.6g} s of the same request")
                        break
            prev = (q, xs)
        if "output_tok_s" in shared and len(tt) == len(getattr(m["output_tok_s"], field)) * b:
            for r, x in enumerate(getattr(m["output_tok_s"], field)):
                last = max(e2[r * b:(r + 1) * b])
                if last <= 0 or abs(x - b * g / last) > REL_TOL * b * g / last:
                    out.append(here.format("output_tok_s", r) + f"{x:.6g} tok/s, but batch {b} x gen_len {g} / the "
                               f"repetition's longest e2e_s {last:.6g} s is "
                               f"{b * g / last if last > 0 else math.inf:.6g}")
                    break
    return out


def _users_model(a: Any) -> bool:
    """A user's model (given by path, or a synthetic shape from a config): another machine may not know it."""
    return isinstance(a.model.source, dict) and ("user_source" in a.model.source or "shape_of" in a.model.source)


def _check_model_files(a: Any, where: str) -> list[str]:
    files = _comparable(tuple((f.path, f.sha256) for f in a.model.files))
    return [f"{where}: {p}" for p in _model_file_problems(a.model.name, files, _users_model(a))]


def _comparable(files: tuple) -> tuple:
    """The recorded model files this machine's zoo can vouch for: not those of a derived form (harness/models.py
    DERIVED: made on each machine, on demand, by a third-party builder or quantizer, whose bytes are that build's:
    ONNX Runtime GenAI's builder stamped the commit of the checkout its venv lies in into the graph, so two builds
    of one recipe differed in bytes). Their artifacts record the sha256 of the bytes that ran, and the form's
    manifest entry (recipe, graph summary) says how it was made."""
    from harness.models import DERIVED
    return tuple((p, s) for p, s in files if p.split("/", 1)[0] not in DERIVED)


@lru_cache(maxsize=256)
def _model_file_problems(name: str, files: tuple[tuple[str, str], ...], user: bool = False) -> tuple[str, ...]:
    """The recorded model files that differ from this machine's, once per distinct file list per process (a
    store of thousands of runs of one model compares its files once, not once per artifact). A user's model
    (given by path) that this machine does not know has nothing local to compare with."""
    from harness import models
    if not models.known(name):
        return () if user else (f"model.name: unknown model {name!r}",)
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
    """The artifact files to check under the given files and store folders (harness.store.walk: links are never
    followed, FIFOs and devices never opened), and one problem line per entry that is not a plain file."""
    sources, problems = _artifact_paths(paths)
    return [Path(f) for f, _ in sources], problems


def _artifact_paths(paths: Iterable[str]) -> tuple[list[tuple[str, Path | None]], list[str]]:
    """iter_artifact_paths, each file (as str of its Path) with the store folder it was found under (None: named
    itself)."""
    from harness.store import walk_names
    files: list[tuple[str, Path | None]] = []
    problems = []
    for p in map(Path, paths):
        if p.is_symlink():
            problems.append(f"{p}: (file): is a symlink; artifacts are plain files")
        elif p.is_dir():
            found, odd = walk_names(p)
            files += [(f, p) for f in found]
            problems += [f"{q}: (file): {why}" for q, why in odd]
        elif p.is_file():
            files.append((str(p), None))
        elif p.exists():
            problems.append(f"{p}: (file): not a regular file (a FIFO, device or socket)")
        else:
            raise UserError(str(p), "no such file or directory", "pass artifact files or store directories")
    return files, problems


def _check_file(f: Path, allow_unknown_commit: bool) -> tuple[list[str], dict | None]:
    """One file's problems but its model files', and what the checks across files need of it (its record: id,
    kind, model files, the summary of a reference or fidelity artifact), JSON, as the verification cache keeps it.
    Read through harness.store.read_bytes: a regular file, not a link, bounded in size and nesting."""
    from harness.store import MAX_DEPTH, read_bytes, too_deep
    where = str(f)
    try:
        raw = read_bytes(f)
    except UserError as e:
        return [f"{where}: (file): {e.problem}"], None
    if not raw.strip():
        return [f"{where}: (file): empty file"], None
    if too_deep(raw):
        return [f"{where}: (file): JSON nested more than {MAX_DEPTH} deep"], None
    try:
        doc, finite = loads(raw)
    except UnicodeDecodeError as e:
        return [f"{where}: (file): not UTF-8 at byte {e.start}"], None
    except json.JSONDecodeError as e:
        return [f"{where}: (file): invalid JSON ({e.msg} at line {e.lineno}); truncated?"], None
    except (ValueError, RecursionError) as e:
        return [f"{where}: (file): invalid JSON ({e})"], None
    problems, a = _doc_problems(doc, where, allow_unknown_commit, finite)
    if not isinstance(doc, dict):
        return problems, None
    rec: dict[str, Any] = {"id": doc.get("id")}
    if getattr(a, "model", None) is not None and a.model.files:
        rec["model"] = [a.model.name, [[m.path, m.sha256] for m in a.model.files], _users_model(a)]
    kind = doc.get("kind")
    if kind == "reference" and isinstance(doc.get("id"), str):
        rec["reference"] = _ref_summary(a) if a is not None else None
    if kind == "run" and a is not None and a.workload.load and "sweep" in a.workload.load:
        if isinstance(a.workload.load["sweep"], dict):
            rec["sweep"] = _sweep_record(a)
        else:
            problems.append(f"{where}: workload.load.sweep: must be a mapping (a rate sweep point's record), got "
                            f"{type(a.workload.load['sweep']).__name__}")
    if kind == "fidelity" and isinstance(doc.get("reference"), dict):
        rec["fidelity"] = {"rid": doc["reference"].get("id"), "parsed": None if a is None else {
            "reference": a.reference, "prompt_set": a.prompt_set.model_dump(mode="json"),
            "engine": None if a.cross_engine else {"build_commit": a.engine.build_commit, "build": a.engine.build}}}
    return problems, rec


def _check_chunk(args: tuple[list[str], bool]) -> list[tuple[list[str], dict | None]]:
    files, allow = args
    with gc_paused():
        return [_check_file(Path(f), allow) for f in files]


PARALLEL_FROM = 400  # artifacts; below this a process pool costs more than it saves
CACHE_FROM = 400  # artifacts in a store folder; a smaller one is checked whole each time, uncached


def check(paths: Iterable[str], verify_models: bool = True, allow_unknown_commit: bool = False) -> tuple[int, list[str]]:
    """(number of artifacts checked, problems). Incremental: what checking a file of a store folder found is kept
    in the store's verification cache (harness.hashcache.StoreCache: under the user's cache folder, never in the
    store) and reused while the file is unchanged (its size, mtime, ctime, inode and device); the rest is checked
    on every CPU this process may use. The checks across files (duplicate ids, fidelity references) run over
    every file's record, and the model files are compared afresh, each time: the result is the same as without
    the cache."""
    with gc_paused():  # the cache's entries and the records: many small containers, no cycles
        return _check(paths, verify_models, allow_unknown_commit)


def _check(paths: Iterable[str], verify_models: bool, allow_unknown_commit: bool) -> tuple[int, list[str]]:
    from collections import Counter

    from harness.hashcache import StoreCache, stamp
    sources, problems = _artifact_paths(paths)
    _model_file_problems.cache_clear()  # model files are compared afresh by every check
    caches = {root: StoreCache("check", root, cache_options(allow_unknown_commit))
              for root, n in Counter(r for _, r in sources).items() if root is not None and n >= CACHE_FROM}
    prefixes = {root: os.path.join(str(root), "") for root in caches}
    now = time.time_ns()  # before any file is stat'd or read (StoreCache.put)
    results: list[Any] = []
    todo: list[tuple[int, Any, str, list[int]]] = []  # (index, cache, relative path, stamp)
    for where, root in sources:
        cache, hit = caches.get(root), None  # type: ignore[arg-type]
        if cache is not None:
            prefix = prefixes[root]
            rel = where[len(prefix):] if where.startswith(prefix) else os.path.relpath(where, root)
            try:
                st = os.lstat(where)
            except OSError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):  # gone, or replaced since the walk: checked, not kept
                cache = None
            else:
                hit = cache.get(rel, stamp(st))
        if isinstance(hit, list) and len(hit) == 2:
            results.append(([f"{where}: {line}" for line in hit[0]] if hit[0] else [], hit[1]))
        else:
            todo.append((len(results), cache, rel if cache else "", stamp(st) if cache else []))
            results.append(None)
    checked = _check_files([sources[i][0] for i, *_ in todo], allow_unknown_commit)
    for (i, cache, rel, st), r in zip(todo, checked):
        results[i] = r
        where = f"{sources[i][0]}: "
        if cache is not None and all(line.startswith(where) for line in r[0]):
            cache.put(rel, st, [[line[len(where):] for line in r[0]], r[1]], now)
    for cache in caches.values():
        cache.save()
    seen: dict[str, str] = {}
    fidelity_recs: list[tuple[str, dict]] = []
    references: dict[str, dict | None] = {}
    for (where, _), (probs, rec) in zip(sources, results):
        problems += probs
        if rec is None:
            continue
        if verify_models and "model" in rec:
            name, mfiles, user = rec["model"]
            files = _comparable(tuple(map(tuple, mfiles)))
            problems += [f"{where}: {p}" for p in _model_file_problems(name, files, user)]
        if "fidelity" in rec:
            fidelity_recs.append((where, rec["fidelity"]))
        if "reference" in rec:
            references[rec["id"]] = rec["reference"]
        aid = rec["id"]
        if isinstance(aid, str):
            if aid in seen and Path(seen[aid]).resolve() != Path(where).resolve():
                problems.append(f"{where}: id: duplicate of {seen[aid]}")
            seen.setdefault(aid, where)
    problems += _check_references(fidelity_recs, references)
    problems += _check_sweeps([(where, rec["sweep"]) for (where, _), (_, rec) in zip(sources, results)
                               if rec is not None and isinstance(rec.get("sweep"), dict)])
    return len(sources), problems


def cache_options(allow_unknown_commit: bool) -> str:
    """What besides the store keys check's verification cache: the options that change a file's problems."""
    return f"allow_unknown_commit={allow_unknown_commit}"


def _relative(f: Path, root: Path) -> str:
    s, prefix = str(f), os.path.join(str(root), "")
    return s[len(prefix):] if s.startswith(prefix) else os.path.relpath(s, root)


def _check_files(files: list[str], allow_unknown_commit: bool) -> list[tuple[list[str], dict | None]]:
    """_check_file of each, on every CPU this process may use when there are many."""
    workers = min(len(os.sched_getaffinity(0)), 8)
    if len(files) < PARALLEL_FROM or workers < 2:
        return _check_chunk((files, allow_unknown_commit))
    from concurrent.futures import ProcessPoolExecutor
    n = max(1, len(files) // (workers * 4))
    chunks = [(files[i:i + n], allow_unknown_commit) for i in range(0, len(files), n)]
    with ProcessPoolExecutor(workers) as pool:
        return [r for chunk in pool.map(_check_chunk, chunks) for r in chunk]


def reference_mismatch(ref: Any, fid_ref: dict, prompt_set: dict, engine: dict | None) -> list[str]:
    """Why a reference artifact is not the one a fidelity artifact names (empty: it is)."""
    return _mismatch(_ref_summary(ref), fid_ref, prompt_set, engine)


def _ref_summary(ref: Any) -> dict:
    """What reference_mismatch compares of a reference artifact, as JSON."""
    return {"id": ref.id, "model_sha256": sorted(f.sha256 for f in ref.model.files),
            "prompt_set": [ref.prompt_set.sha256, ref.prompt_set.token_ids_sha256],
            "engine": [ref.engine.build_commit, ref.engine.build]}


def _mismatch(ref: dict, fid_ref: dict, prompt_set: dict, engine: dict | None) -> list[str]:
    out = []
    if ref["id"] != fid_ref.get("id"):
        out.append("id differs")
    if ref["model_sha256"] != sorted(fid_ref.get("model_sha256", [])):
        out.append("model hash differs")
    if ref["prompt_set"] != [prompt_set["sha256"], prompt_set["token_ids_sha256"]]:
        out.append("prompt set hash differs")
    if engine is not None and ref["engine"] != [engine["build_commit"], engine["build"]]:
        out.append("engine build differs")
    return out


def _sweep_record(a: Any) -> dict[str, Any]:
    """What the check across files needs of a rate sweep's run (harness/sweep.py): its series and pass, and for a
    probe the request throughput it measured, for a point the rate it was sent at and where that came from."""
    from harness import sweep
    sw = a.workload.load["sweep"]
    out = {"id": a.id, "series": [a.grid.sha256, a.host.key, a.grid.pass_index], "arm": a.grid.arm,
           "point": sw.get("point"), "ok": a.status == "ok"}
    if sw.get("point") in (sweep.SYNC, sweep.MAX):
        out["req_s"] = sweep._req_s(a) if a.status == "ok" else None
    else:
        out |= {"sweep": sw, "rate": a.workload.load.get("rate")}
    return out


def _check_sweeps(recs: list[tuple[str, dict]]) -> list[str]:
    """Each sweep point's rate is what its pass's probes give: the probes it names are among the checked
    artifacts, of its series and pass, measured what it says they did, are every ok probe of that pass, and the
    rate follows from them by the rule (a forged rate, or a point resolved from another pass, is caught)."""
    from harness import sweep
    probes = {r["id"]: r for _, r in recs if r.get("point") in (sweep.SYNC, sweep.MAX)}
    by_pass: dict[tuple, set] = {}
    for r in probes.values():
        if r["ok"]:
            by_pass.setdefault(tuple(r["series"]), set()).add(r["arm"])
    out = []
    for where, r in recs:
        km = sweep.between(r.get("point"))
        if km is None or "sweep" not in r:
            continue
        sw = r["sweep"]
        if "error" in sw:  # an unresolved point: failed, never sent
            if r["ok"]:
                out.append(f"{where}: workload.load.sweep: an ok run of a point that was not resolved ({sw['error']})")
            continue
        try:
            got = {arm: {p: (v["artifact"], float(v["request_throughput_req_s"])) for p, v in by.items()}
                   for arm, by in sw["from"].items()}
            lo, hi, rate = float(sw["sync_req_s"]), float(sw["max_req_s"]), float(sw["rate_req_s"])
        except (KeyError, TypeError, ValueError, AttributeError):
            out.append(f"{where}: workload.load.sweep: malformed (needs from, sync_req_s, max_req_s, rate_req_s)")
            continue
        why = []
        for arm, by in sorted(got.items()):
            for p in (sweep.SYNC, sweep.MAX):
                aid, v = by.get(p, (None, None))
                pr = probes.get(aid)
                if pr is None:
                    why.append(f"arm {arm}'s {p} probe {str(aid)[:12]}... is not among the checked artifacts")
                elif pr["series"] != r["series"] or pr["arm"] != arm or pr["point"] != p or not pr["ok"]:
                    why.append(f"arm {arm}'s {p} probe {aid[:12]}... is not an ok {p} run of arm {arm} in this pass")
                elif pr["req_s"] is None or not math.isclose(pr["req_s"], v, rel_tol=1e-9):
                    why.append(f"arm {arm}'s {p} probe measured {pr['req_s']}, not {v}")
        if not why:
            arms = by_pass.get(tuple(r["series"]), set())
            if set(got) != arms:
                why.append(f"names the probes of arms {sorted(got)}, its pass has ok probes of {sorted(arms)}")
            want_lo = min(v[sweep.SYNC][1] for v in got.values())
            want_hi = max(v[sweep.MAX][1] for v in got.values())
            want = want_lo + (want_hi - want_lo) * km[0] / (km[1] + 1)
            if not (math.isclose(lo, want_lo, rel_tol=1e-9) and math.isclose(hi, want_hi, rel_tol=1e-9)
                    and math.isclose(rate, want, rel_tol=1e-9)):
                why.append(f"rate {rate:g} req/s is not {want:g}, the rule's from its probes")
            elif not isinstance(r["rate"], (int, float)) or not math.isclose(float(r["rate"]), rate, rel_tol=1e-9):
                why.append(f"was sent at {r['rate']}, not the resolved {rate:g}")
        out += [f"{where}: workload.load.sweep: {w}" for w in why]
    return out


def _check_references(fidelity_recs: list[tuple[str, dict]], references: dict[str, dict | None]) -> list[str]:
    """Each fidelity artifact's reference is among the checked ones, and is what the artifact says it is (from
    the records of _check_file: a summary is None where its artifact did not parse, which is reported above)."""
    out = []
    for where, fid in fidelity_recs:
        rid = fid["rid"]
        if rid not in references:
            out.append(f"{where}: reference.id: {str(rid)[:12]}... is not among the checked artifacts "
                       "(check the fidelity store and baselines together)")
            continue
        ref, parsed = references[rid], fid["parsed"]
        if ref is None or parsed is None:
            continue
        why = _mismatch(ref, parsed["reference"], parsed["prompt_set"], parsed["engine"])
        if why:
            out.append(f"{where}: reference: {', '.join(why)} from reference {rid[:12]}...")
    return out
