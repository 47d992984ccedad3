"""What only some engines do, as named capabilities beside the core contract (harness/engines/base.py Engine).

An engine declares a capability by inheriting it (`class Vllm(Engine, Limits, Fidelity, Sizing, ...)`) and
overrides what differs from its defaults. The pipeline never asks an engine for a capability's member directly:
`capability(engine, Cap)` gives the engine itself where it declares Cap, else Cap's defaults (what an engine
without it does: no rule, no refusal, no mapping). tests/test_engine_names.py holds every engine to declaring
the capabilities whose members it sets.

    Limits      the workload and options it honours (checked at plan)
    Fidelity    greedy generation and teacher-forced scoring for `harness fidelity`
    Sizing      dtype and form rules for a hardware profile, memory admission, `harness adapt`
    IsaCap      forms whose kernels only some ISA tiers have; how an emulated ISA cap is applied and read back
    StepParts   what each part of a timed decode step is in this engine (harness/metrics.py step_parts)
    Yardsticks  how the report and exports set it beside others (llama-bench's twin, the summary's reference)
    Patches     runtime patches an arm may choose (`patches`)
    Serves      a server engine: sent a load by a client (the serving workload kind), never a batch
    Speaks      a speech engine: sent texts (the speech workload kind), streams audio chunks
    Releases    builds that are releases of a package vendoring the engine's source: what differs between two
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from harness.errors import UserError

if TYPE_CHECKING:
    from harness.grid import Arm

C = TypeVar("C")


class Limits:
    """The workload fields an engine applies and how much of them it can run: a grid asking more is refused at
    plan. `validate_options`: checks across options and workload, beyond types."""

    # workload fields applied by the engine: a field it does not honour must stay at its neutral value
    honours: ClassVar[frozenset[str]] = frozenset({"prompt_len", "gen_len", "context_len", "warmups", "repetitions"})
    max_batch: ClassVar[int | None] = 1  # concurrent requests it can run; None: no limit
    warmup_values: ClassVar[tuple[int, ...] | None] = None  # the warm-up counts it can do; None: any
    form_hint: ClassVar[str] = ""  # the fix named when a form of another engine is asked of it
    # Each settings row whose effective value the engine also writes, raw, into execution.effective: the keys
    # (dotted where nested) holding that read-back, which `harness check` holds to agree with the row. Rows not
    # named and not `options.<key>` are derived from what the engine measured, not read back.
    read_back_keys: ClassVar[dict[str, tuple[str, ...]]] = {"threads": ("threads",), "cpus": ("cpu_affinity",)}

    def validate_options(self, path: str, arm: "Arm", opts: Any, workload: dict[str, tuple[str, set]]) -> None:
        """Checks across options and workload, beyond types (an engine may add its own)."""


class Fidelity:
    """Greedy generation and teacher-forced scoring on token ids (harness/fidelity.py)."""

    reference_form: ClassVar[str | None] = None  # the form a build of this engine is compared against
    accepts_file: ClassVar[bool] = False  # a fidelity build may be a file instead of a zoo form
    fidelity_options: ClassVar[frozenset[str]] = frozenset()

    def fidelity_dtype(self, form: str | None, options: dict) -> str | None:
        return None

    def fidelity_check_options(self, path: str, fld: str, options: dict) -> dict:
        """A fidelity build's options, checked against this machine and resolved (paths relative to the grid file
        made absolute): an error is one line naming the grid file and field."""
        return options

    def reference_options(self, options: dict) -> dict:
        """Of a fidelity build's options, those that make it another build of the engine (its own tree, its own
        environment): such a build is scored against a reference of that same build, its own bf16."""
        return {}

    def fidelity_block(self, options: dict | None = None) -> dict[str, Any]:
        """The engine block of a fidelity or reference artifact (`options`: the build's, absent for a reference)."""
        info = self.engine_info()  # type: ignore[attr-defined]
        return {"name": info["name"], "version": info["version"], "build_commit": info["build_commit"],
                "build": info["build"], "patches": [], "overrides": {}}

    def fidelity_command(self, model_path: Path, threads: int, cpus: list[int], dtype: str | None, req_path: Path,
                         out_path: Path, workdir: Path, options: dict | None = None) -> tuple[list[str], dict[str, str]]:
        """The command (and its recorded environment) that answers a fidelity request (harness/fidelity.py);
        `options` are the build's (fidelity_options), absent for a reference."""
        raise UserError(self.name, "has no fidelity mode", "use a model engine (llama.cpp, vllm)")  # type: ignore

    def fidelity_result_block(self, eng: dict, result: dict) -> dict:
        """The engine block, completed from what the engine reported (e.g. the patches it applied)."""
        return eng

    def fidelity_execution(self) -> dict[str, Any]:
        return {"compile_cache": {"key": "n/a", "state": "n/a (no compile cache)"}, "eager": None}


class Sizing:
    """Derivations from a hardware profile (dtype, `form: auto`), memory admission and `harness adapt`."""

    auto_form: ClassVar[bool] = False  # takes `form: auto` (the form its dtype rule picks for a hardware profile)
    # runtime memory beyond weights and KV where nothing of this engine was measured yet (a default, never evidence)
    default_overhead: ClassVar[int] = 0

    def derive_dtype(self, profile: dict[str, Any]) -> tuple[str, str] | None:
        """The dtype this engine should compute in on a hardware profile, with the rule; None: no rule."""
        return None

    def form_for(self, profile: dict[str, Any]) -> tuple[str, str]:
        """`form: auto`: the form the dtype rule picks on this profile, with the rule."""
        raise UserError(self.name, "takes no form: auto", "name a form")  # type: ignore[attr-defined]

    def admission(self, model: str, profile: dict[str, Any], form: str | None, options: dict[str, Any],
                  context_len: int, store: Path | None = None, host: str | None = None) -> dict[str, Any] | None:
        """How many sequences of context_len this engine fits in the profile's available memory (hardware.admission,
        with the engine's weights, KV bytes, block and measured overhead); None: the engine has no memory rule."""
        return None

    def sizes_by_admission(self, options: dict[str, Any]) -> bool:
        """Whether these options ask the admission rule to size the run (vLLM's `max_num_seqs: auto`): plan then
        checks the cell fits on this machine, as it does for every run under a hardware class."""
        return False

    @classmethod
    def kv_bytes_per_token(cls, effective: dict[str, Any], kv_values: int) -> tuple[float, str] | None:
        """Bytes the KV cache holds per token in a run, from the KV types the engine read back and the model's KV
        values per token (K and V), with where the figure comes from; None: it read back no KV type
        (harness/context.py asks where the engine reported no bytes itself)."""
        return None

    @classmethod
    def overhead_parts(cls, a: Any) -> tuple[int, int] | None:
        """Weights and KV bytes of an ok run artifact (its peak RSS minus both is the runtime's overhead)."""
        return None

    def adapt(self, model: str, profile: dict[str, Any], context_len: int, gen_len: int,
              store: Path | None = None, host: str | None = None) -> list[dict[str, Any]] | None:
        """`harness adapt`: the settings this engine should use on a profile (value, rule, evidence); None: none."""
        return None


# torch's switches per x86 tier: (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, the capability torch then reports)
TORCH_CAPS = {"baseline": ("default", "SSE41", "DEFAULT"), "avx2": ("avx2", "AVX2", "AVX2"),
              "avx512": ("avx512", "AVX512_CORE", "AVX512"), "avx512-bf16": ("avx512", "AVX512_CORE_BF16", "AVX512"),
              "amx": ("avx512", "AVX512_CORE_AMX", "AVX512")}


class IsaCap:
    """ISA tiers: forms whose kernels only some tiers of this engine's build have, and how an emulated class's ISA
    cap is applied to the engine and read back (harness/emulate.py)."""

    def isa_env(self, tier: str) -> dict[str, str]:
        """The environment an emulated class's ISA tier gives the engine's process. By default torch's switches
        (any engine's process, a command's too, may load torch) and the tier itself (EDGE_HARNESS_ISA_TIER)."""
        aten, onednn, _ = TORCH_CAPS[tier]
        return {"ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": onednn, "EDGE_HARNESS_ISA_TIER": tier}

    def isa_bound(self, form: str | None) -> bool:
        """Whether this form needs kernels that only some ISA tiers of this engine's build have (isa_refusal)."""
        return False

    def isa_refusal(self, form: str, options: dict[str, Any], profile: dict[str, Any]) -> str | None:
        """Why this engine cannot run an isa_bound form on this profile's ISA tier (this machine's, or an emulated
        class's): one line naming what would load and what it lacks; None: it can. Checked at plan."""
        return None

    def isa_record(self, tier: str, env: dict[str, str], effective: dict[str, Any]) -> dict[str, Any]:
        """How an ISA cap below this machine's was applied to the engine and read back (emulate.isa_record)."""
        return {"applied": "none", "status": f"not emulated: the {self.name} engine has no ISA switch"}  # type: ignore

    @classmethod
    def isa_in_use(cls, effective: dict[str, Any]) -> list[str]:
        """The ISA features (host.cpu.isa's names) a run's read-back says its build used: `harness check` holds
        the host block to have each (a run and a host of two machines contradict each other)."""
        return []


class StepParts:
    """Decode-step attribution (harness/metrics.py step_parts): what each part it times is in this engine, and
    what it times inside the forward; step_parts_order: where its notes stand in a part's definition."""

    step_parts: ClassVar[dict[str, str]] = {}
    inside_forward: ClassVar[dict[str, str]] = {}
    step_parts_order: ClassVar[int] = 100


class Yardsticks:
    """How the report and the exports set this engine beside others."""

    definition_of: ClassVar[str | None] = None  # another engine measured by this one's own definitions (report pairs)
    definition_pairs: ClassVar[tuple[tuple[str, str], ...]] = ()  # (that engine's metric, this one's) compared
    # the form of this engine the summary sets every engine against (harness/summary.py); one engine has one
    summary_reference: ClassVar[str | None] = None

    def llama_bench_rows(self, a: Any) -> list[dict[str, Any]] | None:
        """A run artifact of this engine as llama-bench's rows (`harness export --format llama-bench-json`: every field
        of export.LLAMA_BENCH_FIELDS, samples_ns and samples_ts); None: the engine has no such mapping."""
        return None


class Patches:
    """Runtime patches an arm chooses with `patches` (the vLLM runtime's, docs/runtime.md)."""

    def validate_patches(self, path: str, where: str, patches: Any) -> None:
        """An arm's `patches`, checked against the patches the engine has (an engine without: refused)."""
        raise UserError(path, f"{where}: the {self.name} engine has no runtime patches",  # type: ignore[attr-defined]
                        "drop the arm's patches")


class Serves:
    """A server engine (harness/engines/server): the serving workload kind sends it a load, and only it. A speech
    engine serves too, where its grid gives a load (load_required False: it also runs in-process without one)."""

    load_required: ClassVar[bool] = True

    def refuse_load(self, path: str, arm: "Arm", load: dict[str, Any]) -> None:
        """Refuse a load this arm cannot be sent (its client's limits), in one line naming the grid's field."""

    def printed_medians(self, effective: dict[str, Any], medians: tuple[str, ...]) -> tuple[str, dict[str, float]]:
        """The client that sent one run's load, and the medians (seconds) of these serving metrics that the client
        tool itself printed for it, median over the run's repetitions (the serving cross-check): none where the
        harness's own client sent it."""
        return "harness", {}


class Speaks:
    """A speech engine: text in, an audio stream out (the speech workload kind sends it texts, and only it)."""

    # the speech grid's `chunking` values it streams in (harness/workloads/speech CHUNKING): sentence, a chunk per
    # sentence; engine, pieces as the engine (or an outside server) streams them
    chunking: ClassVar[tuple[str, ...]] = ("sentence",)

    @classmethod
    def chunking_for(cls, options: Any) -> tuple[str, ...]:
        """The chunking values an arm with these (raw) options streams in: the engine's own, unless an option
        changes its unit."""
        return cls.chunking


class Packages:
    """Python packages the engine runs in this environment (the extra `engines`): a client-only install has none,
    and an arm needing them is refused at plan in one line naming the extra."""

    packages: ClassVar[tuple[str, ...]] = ()

    def needed(self, opts: Any) -> tuple[str, ...]:
        """The packages this arm needs here (an arm run in an environment of its own: none)."""
        return self.packages


class Releases:
    """Builds that are releases of a package vendoring the engine's source (`build: {sdist: ..., version: V}`): what
    differs between two, for a step found between them (`harness changes`, a bisect's end)."""

    def release_changes(self, build: dict[str, Any], old: str, new: str) -> list[str] | None:
        """Lines naming what differs between the sources releases `old` and `new` of this build's package vendor;
        None where the engine cannot tell (no vendored source to compare)."""
        return None


CAPABILITIES = (Limits, Fidelity, Sizing, IsaCap, StepParts, Yardsticks, Patches, Serves, Speaks, Packages, Releases)


class _Absent:
    """A capability's defaults for an engine that does not declare it; anything else is the engine's own."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, key: str) -> Any:
        return getattr(self._engine, key)


_ABSENT: dict[tuple[type, type], type] = {}


def capability(engine: Any, cap: type[C]) -> C:
    """The engine as `cap`: itself where it declares it, else an object with cap's defaults (what an engine
    without it does)."""
    if isinstance(engine, cap):
        return engine
    cls = _ABSENT.get((cap, type(engine)))
    if cls is None:
        cls = _ABSENT[(cap, type(engine))] = type(f"No{cap.__name__}", (_Absent, cap), {})
    return cls(engine)


def has(engine: Any, cap: type) -> bool:
    """Whether an engine (or engine class) declares a capability."""
    return issubclass(engine if isinstance(engine, type) else type(engine), cap)

