"""The grid file: read (yamlfile), parsed and validated (parse, serving, validate), and expanded purely into
cells x arms x passes (cells). Speed grids and fidelity grids (fidelity) are read by the one loader, `load`.

    spec.py      types, limits and the field readers the others share
    yamlfile.py  the hostile-YAML reader and the shape readers (known fields, entries, the grid's name)
    parse.py     a speed grid's document, field by field, into a GridSpec
    serving.py   a server grid's load and latency bounds
    validate.py  the spec against its engines, this machine's CPUs, emulated classes and a user's models
    versions.py  an arm over versions (build: {versions: [...]}) into one arm per version
    cells.py     expansion: cells, the arms in each, the forms they load, the family given verdicts
    fidelity.py  a fidelity grid's document, into a FidelityGrid

Every error names the file, the field and what is allowed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import harness.grid.fidelity as _fidelity
from harness.grid.cells import arms_for, expand, family, in_family, model_forms
from harness.grid.fidelity import Build, FidelityGrid
from harness.grid.parse import from_dict, model_name
from harness.grid.spec import (ARM_FIELDS, AXIS_NAMES, HOSTS, MAX_ALIASES, MAX_ARMS,
                               MAX_CELLS, MAX_DEPTH, MAX_GRID_BYTES, MAX_NODES, MAX_RULES, MAX_RUNS, MAX_TIMEOUT_S,
                               NUMERIC_AXES, ORDERS, STRING_AXES, TOP_FIELDS, WORKLOAD_FIELDS, Arm, Cell,
                               GridSpec, cell_id, cpu_list, hardware_of, machine_cpus, model_of)
from harness.grid.yamlfile import entries, grid_name, only_fields, read_yaml
from harness.grid.versions import expand as expand_versions

__all__ = ["ARM_FIELDS", "AXIS_NAMES", "HOSTS", "MAX_ALIASES", "MAX_ARMS", "MAX_CELLS",
           "MAX_DEPTH", "MAX_GRID_BYTES", "MAX_NODES", "MAX_RULES", "MAX_RUNS", "MAX_TIMEOUT_S", "NUMERIC_AXES",
           "ORDERS", "STRING_AXES", "TOP_FIELDS", "WORKLOAD_FIELDS", "Arm", "Build", "Cell",
           "FidelityGrid", "GridSpec", "arms_for", "cell_id", "cpu_list", "entries", "expand", "family", "from_dict",
           "grid_name", "hardware_of", "in_family", "load", "machine_cpus", "model_forms", "model_name", "model_of",
           "only_fields", "read_expanded", "read_yaml"]

# a grid's kind -> what its document becomes (the kind is the document's `kind`, speed by default)
KINDS = ("speed", "fidelity")


def load(path: str | Path, kind: str = "speed") -> Any:
    """A grid file as `harness plan`/`run` (kind speed: a GridSpec) or `harness fidelity` (kind fidelity: a
    FidelityGrid) reads it. A speed grid is also held to what this machine can run: an arm's cpus among the
    CPUs this process may use, a native run's threads within them."""
    doc, sha = read_yaml(path)
    if kind == "fidelity":
        return _fidelity.from_dict(doc, str(path), sha)
    if kind != "speed":
        raise ValueError(f"grid kind {kind!r}: one of {', '.join(KINDS)}")
    return from_dict(doc, str(path), sha, cpus=machine_cpus())


def read_expanded(path: str | Path) -> tuple[Any, str]:
    """read_yaml, with each versioned arm as its versions (what from_dict parses and the report reads)."""
    doc, sha = read_yaml(path)
    return (expand_versions(str(path), doc) if isinstance(doc, dict) else doc), sha
