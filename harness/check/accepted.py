"""The accepted artifacts: what `harness check` accepts of one document or one parsed artifact, and the
store's artifacts filtered to those. The bottom layer that hardware, the engines and the report read other
artifacts through (calibrations, costs, overheads); it imports nothing of the command above it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from pydantic import ValidationError

from harness.artifact import id_matches, migrate, parse
from harness.errors import UserError
from harness.check.content import content_problems
from harness.check.modelfiles import check_model_files


def check_doc(doc: Any, where: str, verify_models: bool = True, allow_unknown_commit: bool = False,
              finite: bool = False) -> list[str]:
    """Problems with one parsed JSON document (field checks on its migrated form). `finite`: the strict parser
    read it (no NaN or infinity), so the id may be verified the fast way first."""
    problems, a = doc_problems(doc, where, allow_unknown_commit, finite)
    if verify_models and getattr(a, "model", None) is not None and a.model.files:
        problems += check_model_files(a, where)
    return problems


def doc_problems(doc: Any, where: str, allow_unknown_commit: bool, finite: bool,
                 shared: dict | None = None) -> tuple[list[str], Any]:
    """check_doc but the model files: (problems, the parsed artifact or None where it does not parse). `shared`:
    as for artifact.parse, where `finite`."""
    problems: list[str] = []
    if not isinstance(doc, dict):
        return [f"{where}: (top level): not a JSON object"], None
    try:
        if not id_matches(doc, finite and isinstance(doc, dict)):
            problems.append(f"{where}: id: does not match the content (edited after it was written?)")
    except ValueError as e:  # NaN or infinity cannot be canonical JSON
        problems.append(f"{where}: id: content is not canonical JSON ({e})")
    try:
        a = parse(doc, where, shared if finite else None)
        doc = migrate(dict(doc), where)
    except UserError as e:
        return problems + [f"{where}: {e.problem}"], None
    except ValidationError as e:
        return problems + [f"{where}: {'.'.join(str(x) for x in err['loc']) or '(top level)'}: {err['msg']}"
                           for err in e.errors()], None
    name = Path(where).name
    if name.endswith(".json") and name[:-5] != doc.get("id"):
        problems.append(f"{where}: id: file name is not <id>.json")
    problems += content_problems(doc, a, where, allow_unknown_commit)
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
    return content_problems(doc, a, where, allow_unknown_commit, tree_state)


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
