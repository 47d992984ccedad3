"""Hardware classes: what a machine offers an engine (ISA tier, cores, memory), the settings each engine
should use on it (`harness adapt`), and the caps under which a bigger machine emulates a smaller one.

A class is a file under grids/hardware/ (NAME.yaml). The profile derivations read is this machine's probe,
or the file named by EDGE_HARNESS_HW_PROFILE (a class file: planning for another machine), recorded as
such. Derivations are pure functions of a profile and the model's geometry, so they are tested on committed
profiles; what they take from measurements (runtime overhead, start-up cost) is named with its evidence.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.errors import UserError
from harness.paths import PROJECT_ROOT

CLASSES_DIR = PROJECT_ROOT / "grids" / "hardware"
PROFILE_ENV = "EDGE_HARNESS_HW_PROFILE"
GIB = 1 << 30

# ISA tiers per architecture, lowest first, with the /proc/cpuinfo flags each one implies.
TIERS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "x86_64": (("baseline", ("sse4_2",)), ("avx2", ("avx", "avx2", "fma", "f16c")),
               ("avx512", ("avx512f", "avx512bw", "avx512vl")), ("avx512-bf16", ("avx512_vnni", "avx512_bf16")),
               ("amx", ("amx_tile", "amx_bf16", "amx_int8"))),
    "aarch64": (("neon", ("asimd",)), ("dotprod", ("asimddp",)), ("i8mm", ("i8mm", "bf16")), ("sve", ("sve",))),
}


def tier_rank(arch: str, tier: str) -> int:
    names = [t for t, _ in TIERS.get(arch, ())]
    if tier not in names:
        raise ValueError(f"unknown ISA tier {tier!r} for {arch} (known: {', '.join(names)})")
    return names.index(tier)


def tier_flags(arch: str, tier: str) -> dict[str, bool]:
    """The ISA feature map a tier implies: every flag of it and of the tiers below, and none above."""
    rank = tier_rank(arch, tier)
    return {f: i <= rank for i, (_, flags) in enumerate(TIERS[arch]) for f in flags}


class Cluster(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    cores: int = Field(gt=0)
    performance: bool = Field(True, description="false for efficiency (little) cores")


class HardwareClass(BaseModel):
    """A declared machine: the caps a run is held to when it emulates this class."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    description: str
    arch: Literal["x86_64", "aarch64"]
    isa_tier: str
    cores: int = Field(gt=0, description="cores the engine may use (one thread each)")
    memory_gib: float = Field(gt=0, description="memory available to the engine process, GiB")
    clusters: list[Cluster] | None = Field(None, description="big/little clusters, where the cores differ")
    bandwidth_tier: str | None = Field(None, description="from a calibration under this class's caps, if any")

    @model_validator(mode="after")
    def _consistent(self) -> "HardwareClass":
        tier_rank(self.arch, self.isa_tier)
        if self.clusters and sum(c.cores for c in self.clusters) != self.cores:
            raise ValueError(f"clusters hold {sum(c.cores for c in self.clusters)} cores, cores says {self.cores}")
        return self


def _class_error(path: Path, e: ValidationError) -> UserError:
    err = e.errors()[0]
    field = ".".join(str(x) for x in err["loc"]) or "(top level)"
    return UserError(str(path), f"{field}: {err['msg']}", "see docs/hardware.md for the class fields")


def load_class_file(path: Path) -> HardwareClass:
    from harness.paths import read_utf8
    text = read_utf8(path, "save the class file as UTF-8")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(str(path), f"invalid YAML: {str(e).splitlines()[0]}", "fix the YAML syntax") from e
    if not isinstance(doc, dict):
        raise UserError(str(path), "top level is not a mapping", "see docs/hardware.md for the class fields")
    try:
        hc = HardwareClass.model_validate(doc)
    except ValidationError as e:
        raise _class_error(path, e) from e
    if hc.name != path.stem:
        raise UserError(str(path), f"name: {hc.name!r} differs from the file name", f"name the file {hc.name}.yaml")
    return hc


def classes(root: Path | None = None) -> dict[str, HardwareClass]:
    d = root or CLASSES_DIR
    return {p.stem: load_class_file(p) for p in sorted(d.glob("*.yaml"))}


def get_class(name: str, root: Path | None = None) -> HardwareClass:
    known = classes(root)
    if name not in known:
        raise UserError(name, "unknown hardware class", f"known: {', '.join(known) or 'none'} (files in grids/hardware/)")
    return known[name]


# --- profiles --------------------------------------------------------------------------------------------

def profile_from_class(hc: HardwareClass, source: str) -> dict[str, Any]:
    mem = int(hc.memory_gib * GIB)
    return {"source": source, "class": hc.name, "arch": hc.arch, "isa_tier": hc.isa_tier,
            "isa": tier_flags(hc.arch, hc.isa_tier), "cores": hc.cores, "cpus": list(range(hc.cores)),
            "clusters": [c.model_dump() for c in hc.clusters] if hc.clusters else None,
            "memory_total_bytes": mem, "memory_available_bytes": mem}


def profile_from_probe(host: dict) -> dict[str, Any]:
    cpu = host.get("cpu", {})
    arch = cpu.get("arch", "unknown")
    cpus = one_cpu_per_core(cpu.get("affinity") or cpu.get("online_cpus") or [])
    # one inference thread per physical core: SMT siblings share the core's vector units
    cores = max(1, len(cpus))
    isa = {f: bool(v) for f, v in cpu.get("isa", {}).items()}
    tier = cpu.get("isa_tier") or "baseline"
    if arch in TIERS:  # the tier in this module's terms: the highest whose flags (and those below) are all present
        tier = TIERS[arch][0][0]
        for name, flags in TIERS[arch]:
            if not all(isa.get(f, False) for f in flags):
                break
            tier = name
    mem = host.get("memory", {})
    return {"source": "probe", "class": None, "arch": arch, "isa_tier": tier, "isa": isa, "cores": cores,
            "cpus": cpus, "clusters": clusters_from_sysfs(cpus),
            "memory_total_bytes": mem.get("total_bytes"), "memory_available_bytes": mem.get("available_bytes")}


def one_cpu_per_core(cpus: list[int], sys_cpu: str = "/sys/devices/system/cpu") -> list[int]:
    """The first CPU of each physical core among `cpus` (SMT siblings dropped), by the kernel's topology; all
    of them where the topology is unreadable."""
    seen: set[tuple[str, str]] = set()
    out = []
    for c in cpus:
        try:
            core = Path(f"{sys_cpu}/cpu{c}/topology/core_id").read_text().strip()
            pkg = Path(f"{sys_cpu}/cpu{c}/topology/physical_package_id").read_text().strip()
        except OSError:
            return list(cpus)
        if (pkg, core) not in seen:
            seen.add((pkg, core))
            out.append(c)
    return out


def clusters_from_sysfs(cpus: list[int], sys_cpu: str = "/sys/devices/system/cpu") -> list[dict] | None:
    """Big/little clusters where the kernel reports them (arm64 cpu_capacity: each CPU's relative capacity,
    1024 the biggest): CPUs grouped by capacity, biggest first, the biggest ones the performance cluster.
    None where the kernel reports none or all CPUs are alike."""
    caps: dict[int, list[int]] = {}
    for c in cpus:
        try:
            caps.setdefault(int(Path(f"{sys_cpu}/cpu{c}/cpu_capacity").read_text().strip()), []).append(c)
        except (OSError, ValueError):
            return None
    if len(caps) < 2:
        return None
    top = max(caps)
    return [{"name": f"capacity-{cap}", "cores": len(cs), "performance": cap == top, "cpus": cs}
            for cap, cs in sorted(caps.items(), reverse=True)]


def current_profile(class_name: str | None = None) -> dict[str, Any]:
    """The profile derivations read: a named class, else EDGE_HARNESS_HW_PROFILE's class file, else this
    machine's probe. Its `source` says which."""
    if class_name:
        return profile_from_class(get_class(class_name), f"class {class_name}")
    env = os.environ.get(PROFILE_ENV)
    if env:
        p = Path(env)
        if not p.is_file():
            raise UserError(env, f"{PROFILE_ENV}: no such file", "name a class file (grids/hardware/*.yaml) or unset it")
        hc = load_class_file(p)
        return profile_from_class(hc, f"{PROFILE_ENV}={env}")
    from harness.probe import probe
    return profile_from_probe(probe())


def class_name_of(profile: dict[str, Any]) -> str:
    """A descriptive class name for a profile: arch-tier-<cores>c-<memory>g (x86 drops its arch's name)."""
    mem = profile.get("memory_total_bytes")
    gib = f"{round(mem / GIB)}g" if isinstance(mem, int) else "unknown-mem"
    arch = "x86" if profile["arch"] == "x86_64" else "arm64" if profile["arch"] == "aarch64" else profile["arch"]
    return f"{arch}-{profile['isa_tier']}-{profile['cores']}c-{gib}"


def exceeds(hc: HardwareClass, profile: dict[str, Any]) -> list[str]:
    """The caps of a class this machine cannot emulate (it lacks them): empty when it can."""
    out = []
    if hc.arch != profile["arch"]:
        return [f"arch {hc.arch} on a {profile['arch']} machine"]
    if tier_rank(hc.arch, hc.isa_tier) > tier_rank(profile["arch"], profile["isa_tier"]):
        out.append(f"ISA tier {hc.isa_tier} above this machine's {profile['isa_tier']}")
    if hc.cores > profile["cores"]:
        out.append(f"{hc.cores} cores, this machine offers {profile['cores']}")
    avail = profile.get("memory_available_bytes")
    if isinstance(avail, int) and hc.memory_gib * GIB > avail:
        out.append(f"{hc.memory_gib:g} GiB, this machine has {avail / GIB:.1f} GiB available")
    return out


# --- derivations -----------------------------------------------------------------------------------------

def derive_threads(profile: dict[str, Any]) -> tuple[int, list[int], str]:
    """One thread per core the engine may use; on big/little machines only the performance cluster (a step
    waits for its slowest thread, and a little core is the slowest)."""
    clusters = profile.get("clusters")
    if clusters and any(not c.get("performance", True) for c in clusters):
        cpus, offset = [], 0
        for c in clusters:  # a class lists clusters in CPU-number order; a probed cluster names its CPUs
            if c.get("performance", True):
                cpus += c.get("cpus") or list(range(offset, offset + c["cores"]))
            offset += c["cores"]
        return len(cpus), cpus, f"the {len(cpus)} performance cores only: a decode step waits for its slowest thread"
    return profile["cores"], list(profile["cpus"])[:profile["cores"]], "one thread per core, pinned"


def disjoint_ranges(cpus: list[int], engines: int) -> list[list[int]]:
    """CPU ranges for engines running side by side: equal, disjoint, contiguous; none when there are fewer
    CPUs than engines."""
    if engines <= 0 or len(cpus) < engines:
        return []
    per = len(cpus) // engines
    return [cpus[i * per:(i + 1) * per] for i in range(engines)]


def admission(available: int, weights: int, overhead: int, kv_per_token: int, context_len: int, *,
              block: int, cap: int, reserved_blocks: int = 1) -> dict[str, Any]:
    """How many sequences of context_len fit: (available - weights - runtime overhead - the reserved blocks) / KV
    bytes per sequence (whole blocks of the engine's `block` tokens), capped at the engine's `cap` on sequences.
    0 means the cell cannot run on this profile. The engine's Sizing.admission gives its block, cap and reserve."""
    per_seq = kv_per_token * block * math.ceil(context_len / block)
    free = available - weights - overhead - kv_per_token * block * reserved_blocks
    seqs = max(0, min(cap, free // per_seq)) if per_seq > 0 else 0
    budget = kv_per_token * block * (math.ceil(context_len / block) * seqs + reserved_blocks) if seqs else 0
    return {"max_num_seqs": int(seqs), "kv_cache_memory_bytes": int(budget), "available_bytes": int(available),
            "weights_bytes": int(weights), "overhead_bytes": int(overhead), "kv_bytes_per_token": int(kv_per_token),
            "kv_bytes_per_sequence": int(per_seq), "context_len": context_len,
            "rule": f"(available - weights - runtime overhead - {_blocks(reserved_blocks)}) // KV bytes per sequence, "
                    f"at most {cap}"}


def _blocks(n: int) -> str:
    return "null block" if n == 1 else f"{n} reserved blocks"


def timeout_s(startup_s: float, s_per_token: float, tokens: int) -> int:
    """A run's timeout from measured costs: 3 x (start-up + tokens x s/token), at least 60 s."""
    return max(60, int(math.ceil(3 * (startup_s + tokens * s_per_token))))


# --- measured inputs and the whole adaptation ------------------------------------------------------------

DTYPE_BYTES = {"float32": 4, "f32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "f16": 2}


@lru_cache(maxsize=None)
def geometry(model: str) -> dict[str, Any]:
    """The model's KV geometry and parameter count, from its prepared config.json and manifest."""
    import json as _json

    from harness import models
    from runtime.patches import kv_bytes_per_token
    manifest = models.load_manifest(model)
    hf = next((f for f in ("hf-fp32", "hf-bf16", *sorted(manifest["forms"])) if f in manifest["forms"]
               and f.startswith("hf-")), None)  # a GGUF-only model of yours: the shape its GGUF recorded
    cfg = _json.loads((models.form_path(model, hf) / "config.json").read_text()) if hf else manifest["config"]
    return {"parameters": int(manifest["parameters"]), "kv_bytes_per_token_per_byte": kv_bytes_per_token(cfg, 1),
            "layers": cfg.get("num_hidden_layers"), "kv_heads": cfg.get("num_key_value_heads") or cfg.get("num_attention_heads")}


@lru_cache(maxsize=None)
def measured_overhead(engine: Any, store: Path | None = None, host: str | None = None) -> tuple[int, str]:
    """An engine's runtime memory beyond its weights and KV cache: peak RSS - weights - KV (the engine class's
    overhead_parts) of its newest ok runs in the store (median), this host's first, else any host's (software,
    not hardware). The engine's default_overhead, named as one, where the store has none."""
    import statistics

    from harness.store import Store
    root = Path(store or PROJECT_ROOT / "artifacts")
    from harness.check.accepted import load_accepted
    arts = [a for a in load_accepted(Store(root), folders=("vllm-vs-llamacpp", "batch-sweep", "quickstart"))[0]
            if a.kind == "run" and a.status == "ok" and a.engine.name == engine.name and a.residency.peak_memory]
    rows: dict[str, list[int]] = {}
    for a in arts:
        rss = a.residency.peak_memory.get("rss_bytes")
        parts = engine.overhead_parts(a)
        if not isinstance(rss, int) or parts is None:
            continue
        rows.setdefault(a.host.key, []).append(rss - parts[0] - parts[1])
    if not rows:
        d = engine.default_overhead
        return d, f"default {d >> 20} MiB: no ok {engine.name} run in {root}"
    key = host if host in rows else max(rows, key=lambda k: len(rows[k]))
    val = int(statistics.median(rows[key]))
    return val, f"median peak RSS - weights - KV of {len(rows[key])} {engine.name} runs of host {key} in {root}"


def adapt_rows(engine: Any, model: str, profile: dict[str, Any], derived: tuple[str, Any, str],
               options: dict[str, Any], context_len: int, store: Path | None, host: str | None,
               admitted: str) -> list[dict[str, Any]]:
    """The rows every engine's `adapt` shares: its derived dtype or form, threads, cpus, CPUs for two engines
    side by side and, where the profile's available memory is known, the sequences its admission rule fits
    (`admitted` names that setting; the row carries the whole admission under "admission")."""
    setting, value, rule = derived
    threads, cpus, trule = derive_threads(profile)
    rows: list[dict[str, Any]] = [
        {"setting": setting, "value": value, "rule": rule, "evidence": f"ISA tier {profile['isa_tier']} "
         f"({profile['source']})"},
        {"setting": "threads", "value": threads, "rule": trule, "evidence": f"{profile['cores']} cores"},
        {"setting": "cpus", "value": cpus, "rule": "the first cores this process may use, one CPU each "
         "(SMT siblings left idle)", "evidence": profile["source"]}]
    ranges = disjoint_ranges(cpus, 2)
    rows.append({"setting": "cpus for two engines side by side", "value": ranges or "none: one core",
                 "rule": "equal, disjoint, contiguous ranges", "evidence": f"{len(cpus)} CPUs"})
    avail = profile.get("memory_available_bytes")
    if isinstance(avail, int):
        form = value if setting == "form" else None
        adm = engine.admission(model, profile, form, options, context_len, store, host)
        if adm is not None:
            rows.append({"setting": admitted, "value": adm["max_num_seqs"], "rule": adm["rule"], "admission": adm,
                         "evidence": f"available {avail / GIB:.2f} GiB, weights {adm['weights_bytes'] / 2**20:.0f} MiB, "
                                     f"overhead {adm['overhead_bytes'] / 2**20:.0f} MiB ({adm['overhead_evidence']}), "
                                     f"KV {adm['kv_bytes_per_token']} B/token, context {context_len}"})
    return rows
