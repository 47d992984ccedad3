"""The artifact schema: one immutable type per kind, versioned, with a content-hash id.

JSON on disk; `load` refuses unknown or future schema versions and migrates older ones.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.errors import UserError

SCHEMA_VERSION = 1


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Metric(Frozen):
    unit: str
    definition: str = Field(min_length=1, description="how it was measured")
    samples: list[float] = Field(description="one value per measured repetition, warm-ups excluded")
    warmup_samples: list[float] = Field(default_factory=list, description="warm-up values, flagged, never dropped")
    higher_is_better: bool = True


class GridRef(Frozen):
    path: str
    sha256: str
    name: str
    cell: str
    cell_params: dict[str, Any]
    arm: str
    pass_index: int = Field(ge=0)
    position: int = Field(ge=0, description="position of this run within its pass")
    order: str
    seed: int
    run_key: str
    baseline_arm: str


class ModelFile(Frozen):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


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
    commit: str
    dirty: bool
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
    command: list[str]


class Workload(Frozen):
    prompt_len: int = Field(gt=0)
    context_len: int = Field(gt=0)
    gen_len: int = Field(gt=0)
    batch: int = Field(gt=0)
    warmups: int = Field(ge=0)
    repetitions: int = Field(gt=0)
    prompt_token_hash: str


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


class RunArtifact(Frozen):
    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["run"] = "run"
    id: str = Field(pattern=r"^[0-9a-f]{64}$")
    status: Literal["ok", "failed", "timeout"]
    error: str | None = None
    stderr_tail: str | None = None
    grid: GridRef
    model: ModelRef
    engine: EngineRef
    harness: HarnessRef
    host: dict[str, Any]
    execution: Execution
    workload: Workload
    residency: Residency
    metrics: dict[str, Metric]
    timing: Timing


ARTIFACT_TYPES: dict[str, type[BaseModel]] = {"run": RunArtifact}

# Migrations: MIGRATIONS[n] turns a version-n document into version n+1.
MIGRATIONS: dict[int, Any] = {}


def canonical(doc: dict) -> bytes:
    """The canonical bytes an id is computed from: key order and whitespace do not matter."""
    body = {k: v for k, v in doc.items() if k != "id"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def compute_id(doc: dict) -> str:
    return hashlib.sha256(canonical(doc)).hexdigest()


def finalize(doc: dict) -> RunArtifact:
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


def parse(doc: Any, where: str) -> RunArtifact:
    if not isinstance(doc, dict):
        raise UserError(where, "top level is not a JSON object", "restore the artifact from git")
    doc = migrate(doc, where)
    kind = doc.get("kind")
    if kind not in ARTIFACT_TYPES:
        raise UserError(where, f"kind: unknown kind {kind!r}", f"known kinds: {', '.join(sorted(ARTIFACT_TYPES))}")
    return ARTIFACT_TYPES[kind].model_validate(doc)  # type: ignore[return-value]


def dumps(a: BaseModel) -> str:
    return json.dumps(a.model_dump(mode="json"), sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def json_schema() -> dict:
    return {kind: t.model_json_schema() for kind, t in sorted(ARTIFACT_TYPES.items())}
