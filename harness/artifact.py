"""The artifact schema: one immutable type per kind, versioned, with a content-hash id.

JSON on disk; `load` refuses unknown or future schema versions and migrates older ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from harness.errors import UserError

SCHEMA_VERSION = 2


def _path_name(v: str) -> str:
    """A name the report and the store turn into a path component (harness.paths.name_problem)."""
    from harness.paths import name_problem
    why = name_problem(v)
    if why:
        raise ValueError(f"cannot be a file name: {why}")
    return v


PathName = Annotated[str, AfterValidator(_path_name)]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Metric(Frozen):
    unit: str
    definition: str = Field(min_length=1, description="how it was measured")
    samples: list[float] = Field(description="one value per measured repetition, warm-ups excluded")
    warmup_samples: list[float] = Field(default_factory=list, description="warm-up values, flagged, never dropped")
    higher_is_better: bool = True


class StopRule(Frozen):
    """passes: {until: step}: what the runner's looks waited for, so that the report reads the history as it did."""
    until: Literal["step"]
    alpha: float = Field(gt=0, lt=0.5, description="the family level of the history's steps over every look")
    metrics: list[str] = Field(min_length=1, description="the primary metrics whose steps it waited on")


class DerivedFrom(Frozen):
    path: str = Field(description="the committed grid file this one was made from (relative to the checkout, or "
                                  "absolute where it lies outside it)")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of that file when this grid was made")
    by: str = Field(description="what made this grid from it (e.g. harness bisect: the probe and its versions)")


class GridRef(Frozen):
    path: str
    sha256: str
    name: PathName
    cell: str
    cell_params: dict[str, Any]
    arm: str
    pass_index: int = Field(ge=0)
    position: int = Field(ge=0, description="position of this run within its pass")
    order: str
    seed: int
    run_key: str
    baseline_arm: str
    primary: dict[str, Any] | None = Field(None, description="the grid's declared primary comparisons (the family "
                                           "given verdicts); null: every comparison")
    looks: list[int] | None = Field(None, description="passes: {until: verdict}: the numbers of passes at which the "
                                    "runner looked (each interval at 1 - alpha/(m K), K looks); null: fixed passes")
    stop: StopRule | None = Field(None, description="passes: {until: step}: the rule the looks stopped on; null: "
                                  "until: verdict, or fixed passes")
    derived_from: DerivedFrom | None = Field(None, description="a grid the harness made from a committed one (a "
                                             "bisect's probe, written under the user's cache): that file, verified "
                                             "against git by `harness check` as grid.path is; null: the grid is its "
                                             "own file")


class ModelFile(Frozen):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


# The execution block's field holding the command line a run executed. Named once here: "command" is also an
# engine's name, and outside harness/engines/ no dict is keyed by an engine's name (tests/test_engine_names.py).
COMMAND = "command"

class ModelRef(Frozen):
    name: str
    form: str
    source: dict[str, Any]
    format: str
    dtype: str
    parameters: int = Field(gt=0)
    files: list[ModelFile] = Field(description="every weight, config and tokenizer file; empty only for the command engine")


class EngineRef(Frozen):
    name: str
    version: str
    build_commit: str
    build: dict[str, Any] = Field(description="build flags, compiler, binary or wheel sha256")
    patches: list[dict[str, Any]] = Field(default_factory=list, description="runtime patch manifest (vLLM)")
    overrides: dict[str, Any] = Field(default_factory=dict)


class HarnessRef(Frozen):
    version: str
    commit: str = Field(description="git commit of the harness tree, or 'unknown (not a git checkout)'")
    dirty: bool | None = Field(description="uncommitted changes to code or grids; null when unknown (no git)")
    dirty_files: list[str] = Field(default_factory=list)


class Execution(Frozen):
    threads: int = Field(gt=0)
    cpu_affinity: list[int]
    numa_policy: str
    env: dict[str, str]
    requested: dict[str, Any]
    effective: dict[str, Any]
    compile_cache: dict[str, Any]
    eager: bool | None
    command: list[str] | list[list[str]] = Field(description="the command that ran, or the commands where there "
                                                           "were several")
    settings: dict[str, dict[str, Any]] | None = Field(
        None, description="each declared setting: requested, effective (read back from the engine), source, rule "
                          "(enforced: `harness check` fails the run if they differ; observe only); absent before "
                          "the read-back rule")
    observe: Literal["full", "bare"] = Field("full", description="full: memory poller during the run and residency "
                                             "scans around it; bare: neither (measures what observing costs)")
    emulation: dict[str, Any] | None = Field(None, description="the hardware class the run emulated: each cap (cores, "
                                             "memory, isa) as requested, applied and read back, with its status "
                                             "(emulated, or not emulated: why); null when native")
    executor: dict[str, Any] | None = Field(None, description="where a fleet ran it (`harness run --executor ray`): "
                                            "{name: ray, node_id, node_ip, ray_version}; absent for a local run")


class Workload(Frozen):
    prompt_len: int | None = Field(gt=0, description="tokens; null for a speech request (a text: `speech`)")
    context_len: int | None = Field(gt=0)
    gen_len: int | None = Field(gt=0)
    batch: int = Field(gt=0)
    warmups: int = Field(ge=0)
    repetitions: int = Field(gt=0)
    prompt_token_hash: str
    load: dict[str, Any] | None = Field(None, description="a server engine's load as the cell asked it (harness/"
                                        "serving.py): requests, concurrency and/or rate, arrival, burstiness, seed; "
                                        "absent for request and command engines")
    speech: dict[str, Any] | None = Field(None, description="a speech run's texts: the committed set, its sha256, "
                                          "the chunking (harness/workloads/speech)")
    slo: dict[str, float] | None = Field(None, description="the grid's latency bounds of goodput (ttft_s, tpot_s, "
                                         "e2e_s), where it has them")


class Residency(Frozen):
    before: dict[str, dict[str, int]]
    after_load: dict[str, Any]
    after_run: dict[str, dict[str, int]]
    peak_memory: dict[str, Any]
    page_cache: str = Field(description="cold or warm: whether the weights were resident before the run")


class Timing(Frozen):
    start: str
    end: str
    duration_s: float = Field(ge=0)


class HostIdentity(Frozen):
    status: str = Field(description="recorded, unreadable, or 'legacy: identity not recorded' (migrated records)")
    source: str = Field(description="where the identity was read (/etc/machine-id, DMI product uuid)")
    sha256: str = Field(description="sha256 of the identity, salted; the raw value is never recorded")


class Host(BaseModel):
    """The measuring machine: its key and identity are typed; the rest of the probe's profile (cpu, memory,
    numa, cgroup, kernel, load) is kept as recorded."""
    model_config = ConfigDict(frozen=True, extra="allow")
    key: str = Field(pattern=r"^[0-9a-f]{12}$", description="sha256 prefix of what changes results: machine "
                     "identity, CPU identity and flags, cores, memory size, emulated class (probe.key_inputs)")
    identity: HostIdentity
    emulation: str | None = Field(None, description="the hardware class emulated by the run; null when native")
    cpu: dict[str, Any]
    memory: dict[str, Any]

    @model_validator(mode="after")
    def _machine_key(self) -> "Host":
        mk = getattr(self, "machine_key", None)  # an emulated run's machine: a path component of the report
        if mk is not None and not (isinstance(mk, str) and re.fullmatch(r"[0-9a-f]{12}", mk)):
            raise ValueError("machine_key: must be 12 hex digits (a host key)")
        return self

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)


class Stamped(Frozen):
    """What every artifact kind carries: version, content id, the harness tree, the host and the timing."""
    schema_version: Literal[2] = SCHEMA_VERSION
    id: str = Field(pattern=r"^[0-9a-f]{64}$")
    harness: HarnessRef
    host: Host
    timing: Timing


class EngineStamped(Stamped):
    """What every artifact of an engine process carries besides: the model, the engine and how it ran."""
    model: ModelRef
    engine: EngineRef
    execution: Execution


class StepPart(Frozen):
    mean_ms: float
    median_ms: float
    p90_ms: float


class Attribution(Frozen):
    """Where a decode step's time went (harness/metrics.py, attribution)."""
    source: str = Field(description="what timed the parts: the vLLM runtime's step-attribution patch, or edge-bench")
    definition: str
    steps: int = Field(gt=0, description="decode steps of the measured repetitions")
    parts: dict[str, StepPart] = Field(description="schedule, prepare, forward, sample, update, detokenize, output, "
                                       "rest: those the engine has")
    part_definitions: dict[str, str]
    step_mean_ms: float = Field(description="mean wall time of a step as the engine timed it (= the parts' sum)")
    itl_mean_ms: float = Field(description="mean gap between the token timestamps of consecutive decode steps")
    itl_median_ms: float
    accounted: float | None = Field(description="the parts' summed means / itl_mean_ms")
    model_share: float | None = Field(description="mean forward / itl_mean_ms")
    engine_forward_mean_ms: float | None = Field(None, description="the forward as the engine's own timer saw it "
                                                 "(llama.cpp: llama_perf_context eval time), where it has one")
    inside_forward: dict[str, StepPart] | None = Field(None, description="parts timed inside the forward by the code "
                                                       "that runs there (linear_kernel: the decode-gemv kernel), "
                                                       "already counted in forward; absent where none ran")
    inside_forward_definitions: dict[str, str] | None = None


class RunArtifact(EngineStamped):
    kind: Literal["run"] = "run"
    status: Literal["ok", "failed", "timeout"]
    error: str | None = None
    stderr_tail: str | None = None
    grid: GridRef
    workload: Workload
    residency: Residency
    metrics: dict[str, Metric]
    attribution: Attribution | None = Field(None, description="per-part decode step times, where the run timed them "
                                            "(vLLM arm with the step-attribution patch; llama.cpp arm with "
                                            "options.attribution); absent otherwise")
    serving: dict[str, Any] | None = Field(None, description="a server engine's raw samples: per repetition, each "
                                           "request's send, chunk arrival times and tokens, usage and error "
                                           "(warm-up requests flagged); whether the client kept the schedule; the "
                                           "usage check; the server log's last lines. Absent for other engines")


class FidelityGridRef(Frozen):
    path: str
    sha256: str
    name: PathName
    build: str = Field(description="the build's name in the fidelity grid")


class PromptSetRef(Frozen):
    name: str
    path: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the prompt set file")
    n_prompts: int = Field(gt=0)
    chat_template_sha256: str = Field(description="sha256 of the model's own chat template, applied to every prompt")
    tokenizer_sha256: str = Field(description="sha256 of the tokenizer.json that turned the prompts into token ids")
    token_ids_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the prompts' token ids, as sent")


class Decoding(Frozen):
    gen_len: int = Field(gt=0, description="tokens generated per prompt (end-of-generation does not stop it)")
    temperature: float = 0.0
    top_k: int = Field(gt=0, description="log-probabilities kept per position")
    seed: int


class GreedyOutput(Frozen):
    id: str = Field(description="prompt id in the prompt set")
    category: str
    prompt_tokens: int = Field(gt=0)
    ids: list[int] = Field(description="the greedy token ids")
    logprobs: list[float] = Field(default_factory=list, description="log-probability of each greedy token")
    top: list[list[tuple[int, float]]] = Field(default_factory=list, description="per position: top_k [id, logprob] "
                                               "of the teacher-forced pass over these greedy ids (as builds are scored)")
    forced_argmax_agreement: float | None = Field(None, ge=0, le=1, description="share of positions whose "
                                                  "teacher-forced argmax is the greedy token: batched vs incremental "
                                                  "numerics of the same build")


class PromptFidelity(Frozen):
    id: str
    category: str
    ids: list[int] = Field(description="this build's greedy token ids")
    exact_match: bool
    first_divergence: int | None = Field(description="first position whose token differs from the reference; null if none")
    token_agreement: float = Field(ge=0, le=1, description="share of positions with the reference's token")
    top1_agreement: float | None = Field(description="teacher-forced on the reference's tokens: share of positions where "
                                                     "the build's argmax is the reference's argmax")
    mean_kl: float | None = Field(description="teacher-forced: mean KL(reference || build) over the reference's top-k "
                                              "plus one bucket for the rest (a lower bound of the full KL), nats")
    kl_outside_topk: int = Field(0, description="reference candidates outside the build's returned log-probs "
                                               "(their probability bounded by the build's smallest returned one)")


class ReferenceArtifact(EngineStamped):
    """A reference build's greedy outputs (bf16 by default) over a prompt set: what builds are compared with."""
    kind: Literal["reference"] = "reference"
    status: Literal["ok"] = "ok"
    grid: FidelityGridRef
    prompt_set: PromptSetRef
    decoding: Decoding
    outputs: list[GreedyOutput]


class FidelityArtifact(EngineStamped):
    """One build's greedy fidelity against its reference, with the thresholds it was gated on."""
    kind: Literal["fidelity"] = "fidelity"
    status: Literal["ok", "failed", "timeout"]
    error: str | None = None
    stderr_tail: str | None = None
    grid: FidelityGridRef
    prompt_set: PromptSetRef
    decoding: Decoding
    reference: dict[str, Any] = Field(description="id, engine, form, model sha256s and engine build of the reference")
    cross_engine: bool = Field(description="compared with another engine's reference: reported, never gated")
    prompts: list[PromptFidelity]
    summary: dict[str, float | int | None]
    thresholds: dict[str, float]
    verdict: Literal["pass", "fail", "not gated", "error"]
    failures: list[str] = Field(default_factory=list, description="each threshold missed, and where prompts diverged")


class AudioFidelityArtifact(EngineStamped):
    """One speech build's audio against its engine's full-precision voice over the committed texts (docs/speech.md)."""
    kind: Literal["audio-fidelity"] = "audio-fidelity"
    status: Literal["ok", "failed", "timeout"]
    error: str | None = None
    stderr_tail: str | None = None
    grid: FidelityGridRef
    texts: dict[str, Any] = Field(description="the committed text sets spoken (name -> sha256) and the texts' ids")
    reference: dict[str, Any] = Field(description="engine, form, model sha256s and each text's audio sha256 of the "
                                                  "reference, spoken in the same call; `asr`: the ASR round trip's "
                                                  "recogniser, its files' sha256s and settings, where one ran")
    cross_engine: bool = Field(False, description="always false: a speech build is gated on its own engine's voice")
    items: list[dict[str, Any]] = Field(description="per text: samples, the reference's, duration ratio, log-spectral "
                                                    "distance (dB, aligned), identical, audio sha256; with the ASR "
                                                    "round trip, the build's and the reference's transcripts and "
                                                    "word error rates")
    summary: dict[str, float | int | None]
    thresholds: dict[str, float]
    verdict: Literal["pass", "fail", "error"]
    failures: list[str] = Field(default_factory=list)


class CalibrationSource(Frozen):
    name: Literal["calibration"] = "calibration"
    path: str = Field(description="the command that measured it")


class CalibrationArtifact(Stamped):
    """The machine's ceiling (`harness probe --bandwidth`): read bandwidth and matrix FLOP/s per thread count."""
    kind: Literal["calibration"] = "calibration"
    status: Literal["ok"] = "ok"
    grid: CalibrationSource
    method: dict[str, Any]
    results: list[dict[str, Any]] = Field(description="per thread count: threads, torch_threads, samples by measure")


ARTIFACT_TYPES: dict[str, type[BaseModel]] = {"run": RunArtifact, "reference": ReferenceArtifact,
                                              "fidelity": FidelityArtifact, "calibration": CalibrationArtifact,
                                              "audio-fidelity": AudioFidelityArtifact}

LEGACY_IDENTITY = {"status": "legacy: identity not recorded", "source": "unknown", "sha256": "unknown"}


def update_to_2(doc: dict) -> dict:
    """Version 1 recorded no machine identity and no host key: mark the identity as not recorded and derive
    the key from what was recorded (CPU model, ISA features, cores, memory size). Nothing is invented."""
    from harness.probe import host_key, isa_tier
    doc = dict(doc)
    host = dict(doc.get("host") or {})
    cpu = dict(host.get("cpu") or {})
    if isinstance(cpu.get("isa"), dict):
        cpu["isa_tier"] = isa_tier(cpu["isa"])
    host.update(cpu=cpu, identity=dict(LEGACY_IDENTITY), emulation=None)
    host["key"] = host_key(host)
    doc["host"] = host
    doc["schema_version"] = 2
    return doc


# Migrations: MIGRATIONS[n] turns a version-n document into version n+1.
MIGRATIONS: dict[int, Any] = {1: update_to_2}


def loads(raw: bytes) -> tuple[Any, bool]:
    """An artifact file's JSON, and whether the strict parser read it (then it holds no NaN or infinity):
    pydantic-core's parser (twice as fast as json's on artifacts); where it refuses the bytes, the standard
    library's verdict (its error names the line; it also reads NaN, which the id check then reports)."""
    import pydantic_core
    try:
        return pydantic_core.from_json(raw, allow_inf_nan=False), True
    except ValueError:
        return json.loads(raw.decode("utf-8")), False


def canonical(doc: dict) -> bytes:
    """The canonical bytes an id is computed from: key order and whitespace do not matter."""
    body = {k: v for k, v in doc.items() if k != "id"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def compute_id(doc: dict) -> str:
    return hashlib.sha256(canonical(doc)).hexdigest()


def id_matches(doc: dict, finite: bool) -> bool:
    """Whether the document hashes to its id. `finite`: the document is known to hold no NaN or infinity (it was
    read by the strict parser). Then orjson first (six times faster than json on artifacts): its bytes equal the
    canonical ones except in float notation (1e-05 vs 0.00001), and a sha256 match proves they were equal;
    otherwise, and always where not finite (orjson writes NaN as null), the canonical encoding decides, which
    raises ValueError on NaN or infinity."""
    aid = doc.get("id")
    if finite:
        import orjson
        try:
            fast = orjson.dumps({k: v for k, v in doc.items() if k != "id"}, option=orjson.OPT_SORT_KEYS)
            if hashlib.sha256(fast).hexdigest() == aid:
                return True
        except (orjson.JSONEncodeError, TypeError):
            pass
    return compute_id(doc) == aid


def finalize(doc: dict) -> Any:
    """Stamp a document with its id and validate it."""
    doc = dict(doc)
    doc["id"] = "0" * 64
    # The id is computed over the validated, JSON-normalised form (5 -> 5.0 for a float field),
    # so that the bytes on disk hash to it exactly.
    body = parse(doc, "<new artifact>").model_dump(mode="json")
    body["id"] = compute_id(body)
    return parse(body, "<new artifact>")


def migrate(doc: dict, where: str) -> dict:
    v = doc.get("schema_version")
    if not isinstance(v, int):
        raise UserError(where, f"schema_version: missing or not an integer ({v!r})", "this is not an edge-harness artifact")
    if v > SCHEMA_VERSION:
        raise UserError(where, f"schema_version: {v} is newer than this harness supports ({SCHEMA_VERSION})",
                        "upgrade edge-harness to read it")
    while v < SCHEMA_VERSION:
        if v not in MIGRATIONS:
            raise UserError(where, f"schema_version: {v} has no migration", "re-run the grid to regenerate it")
        doc = MIGRATIONS[v](doc)
        v = doc["schema_version"]
    return doc


def parse(doc: Any, where: str, shared: dict | None = None) -> Any:
    """The artifact a JSON document (finite: read by a strict parser) validates to. `shared`: a table the caller
    keeps across calls; then each SHARED_FIELDS block equal, as JSON, to one validated before (in an artifact of
    the same kind) is that block's validated object, not validated again: many runs share their tree, host,
    model, engine and settings, and validating and holding each once is most of reading a large store."""
    if not isinstance(doc, dict):
        raise UserError(where, "top level is not a JSON object", "restore the artifact from git")
    doc = migrate(doc, where)
    kind = doc.get("kind")
    if kind not in ARTIFACT_TYPES:
        raise UserError(where, f"kind: unknown kind {kind!r}", f"known kinds: {', '.join(sorted(ARTIFACT_TYPES))}")
    if shared is None:
        return ARTIFACT_TYPES[kind].model_validate(doc)  # type: ignore[return-value]
    return _validate_shared(ARTIFACT_TYPES[kind], kind, doc, shared)


# Sub-objects of an artifact that many runs share (the same tree, machine, model, engine, settings). Frozen
# models, never written to.
SHARED_FIELDS = ("harness", "host", "model", "engine", "execution", "workload", "residency")


def _validate_shared(cls: type[BaseModel], kind: str, doc: dict, table: dict) -> Any:
    """cls.model_validate(doc), each shared block already validated taken from `table` (a validated object of the
    field's own class passes validation as it is), each one validated now put there. The key is the block's
    JSON (orjson: key order and number types kept), so that equal keys are equal documents, which validate to
    equal objects."""
    import orjson
    doc, missed = dict(doc), []
    for f in SHARED_FIELDS:
        v = doc.get(f)
        if not isinstance(v, dict):
            continue
        try:
            key = (kind, f, orjson.dumps(v))
        except TypeError:  # an integer beyond 64 bits: validated on its own
            continue
        hit = table.get(key)
        if hit is None:
            missed.append((f, key))
        else:
            doc[f] = hit
    a = cls.model_validate(doc)
    for f, key in missed:
        v = getattr(a, f, None)
        if isinstance(v, BaseModel):
            table[key] = v
    return a


def dumps(a: BaseModel) -> str:
    return json.dumps(a.model_dump(mode="json"), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def json_schema() -> dict:
    return {kind: t.model_json_schema() for kind, t in sorted(ARTIFACT_TYPES.items())}
