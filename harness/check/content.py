"""The rules on one artifact's content: the provenance every kind carries (required, non-empty), its host
key, a harness tree that was clean and known, the evidence of an emulated class's caps, and the settings the
engine was asked for against the ones it read back."""

from __future__ import annotations

from typing import Any
from harness.check.consistency import consistency_problems, parts


from harness.probe import host_key
from harness.rules import MEMORY_TOLERANCE
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
    "audio-fidelity": (COMMON + ("grid.build", "model.files", "texts.sets", "texts.ids", "reference.engine",
                                 "reference.form", "reference.model_sha256", "thresholds", "verdict"),
                       ("execution.effective", "items", "summary", "reference.audio_sha256")),
    "calibration": (("grid.name", "grid.path", "harness.version", "harness.commit", "method", "results",
                     "timing.start", "timing.end") + HOST, ()),
}
REQUIRED_MODEL = ("model.files", "residency.before", "residency.after_run")
# What a host record carries besides, unless it is a migrated legacy record (identity not recorded).
HOST_IDENTITY = ("host.identity.source", "host.cpu.vendor", "host.cpu.family", "host.cpu.model_number",
                 "host.cpu.stepping", "host.cpu.microcode", "host.cpu.flags", "host.cpu.flags_sha256", "host.cpu.sockets",
                 "host.cpu.caches", "host.memory.total_bytes")


def content_problems(doc: dict, a: Any, where: str, allow_unknown_commit: bool = False,
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
        for part in parts(f):
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
    available at engine start was the class's within rules.MEMORY_TOLERANCE; `emulated` means every cap was;
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
