"""Reading a grid file (speed and fidelity grids alike): a bounded, regular UTF-8 file, YAML without object
tags, duplicate keys, alias bombs or deep nesting, and only plain values; and the readers of its fields'
shapes (known fields, lists of entries, the grid's name)."""

from __future__ import annotations

import hashlib
import math
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from harness.errors import UserError
from harness.grid.spec import (MAX_ALIASES, MAX_DEPTH, MAX_GRID_BYTES, MAX_NAME_BYTES, MAX_NODES, err, name_problem,
                               short)


class _Refused(Exception):
    """Raised by the grid loader: a document the harness will not read (line, problem, fix)."""

    def __init__(self, mark: Any, problem: str, fix: str) -> None:
        self.line = mark.line + 1 if mark is not None else None
        self.problem, self.fix = problem, fix
        super().__init__(problem)


class GridLoader(yaml.SafeLoader):
    """yaml.SafeLoader (no object tags) that also refuses a duplicate key in any mapping (YAML keeps the
    last silently), more than MAX_ALIASES alias uses and nesting deeper than MAX_DEPTH."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(self.peek_event().start_mark, f"more than {MAX_ALIASES} aliases (*name)",
                               "write the values out; a grid needs few aliases")
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels",
                               "a grid needs a few levels of mappings and lists")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                # merge keys (<<: *base) are YAML's explicit way to override, not duplicates
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line
                try:
                    first = seen.get(key)
                    seen.setdefault(key, line)
                except TypeError:
                    continue  # unhashable: SafeConstructor refuses it
                if first is not None:
                    raise _Refused(key_node.start_mark, f"duplicate key {short(key)} (lines {first + 1} and "
                                   f"{line + 1}; YAML would keep the last silently)", "keep one of them")
        return super().construct_mapping(node, deep=deep)


def _read_grid_text(p: Path) -> tuple[str, bytes]:
    """The file's text and bytes: a regular file of at most MAX_GRID_BYTES, UTF-8. Opened without blocking
    (a FIFO) and read with a bound (a device such as /dev/zero never ends)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserError(str(p), f"unreadable: {e.strerror}", "check the path") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(str(p), "is not a regular file", "give the path of a grid file (YAML)")
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_GRID_BYTES + 1)
    except OSError as e:
        raise UserError(str(p), f"unreadable: {e.strerror}", "check the path") from None
    finally:
        os.close(fd)
    if len(raw) > MAX_GRID_BYTES:
        raise UserError(str(p), f"larger than {MAX_GRID_BYTES} bytes ({MAX_GRID_BYTES >> 20} MiB): not a grid file",
                        "a grid is a few kilobytes of YAML; split it or check the path")
    try:
        return raw.decode("utf-8"), raw
    except UnicodeDecodeError as e:
        raise UserError(str(p), f"not UTF-8 at byte {e.start}", "save the grid as UTF-8") from None


_PLAIN = (str, int, float, bool, type(None))


def _check_tree(path: str, doc: Any) -> None:
    """Every value of the document, aliases expanded, walked once without recursion: at most MAX_NODES
    values and MAX_DEPTH levels (an alias bomb or a recursive alias is refused here, before any code walks
    it), string keys, finite numbers, no NUL, and only the types YAML's plain mappings, lists and scalars make."""
    stack: list[tuple[Any, tuple, int]] = [(doc, (), 1)]
    count = 0

    def where(trail: tuple) -> str:
        out = ""
        for t in trail:
            out += f"[{t}]" if isinstance(t, int) else (f".{t}" if out else str(t))
        return out or "(top level)"

    while stack:
        v, trail, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise err(path, "(document)", f"more than {MAX_NODES:,} values once its aliases are expanded",
                      "a grid is small: write it without aliases that multiply")
        if depth > MAX_DEPTH:
            raise err(path, where(trail), f"nested deeper than {MAX_DEPTH} levels (a recursive alias?)",
                      "a grid needs a few levels of mappings and lists")
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    raise err(path, where(trail), f"key {short(k)} is not a string",
                              "quote it: YAML reads unquoted yes/no/on/off/numbers/null as other types")
                if "\0" in k:
                    raise err(path, where(trail), f"key {short(k)} holds a NUL character", "remove it")
                stack.append((x, (*trail, k), depth + 1))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                stack.append((x, (*trail, i), depth + 1))
        elif isinstance(v, float) and not math.isfinite(v):
            raise err(path, where(trail), f"{v} is not a finite number", "give a finite number")
        elif isinstance(v, str) and "\0" in v:
            raise err(path, where(trail), "holds a NUL character", "remove it")
        elif not isinstance(v, _PLAIN):
            raise err(path, where(trail), f"a {type(v).__name__} ({short(v)}) has no meaning in a grid",
                      "quote it to make it a string, or give a number")


def read_yaml(path: str | Path) -> tuple[Any, str]:
    """A grid file's document and the sha256 of its bytes (speed and fidelity grids alike). Refused, one
    line each: a file that is not a regular file or exceeds MAX_GRID_BYTES, invalid YAML, object tags, a
    duplicate key, more than MAX_ALIASES aliases, nesting deeper than MAX_DEPTH, a document of more than
    MAX_NODES values, a non-string key, a non-finite number, a NUL."""
    p = Path(path)
    text, raw = _read_grid_text(p)
    try:
        doc = yaml.load(text, Loader=GridLoader)  # noqa: S506 (a SafeLoader)
    except _Refused as e:
        where = f"line {e.line}: " if e.line else ""
        raise UserError(str(p), f"{where}{e.problem}", e.fix) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise UserError(str(p), f"invalid YAML{where}: {problem}", "fix the YAML syntax") from None
    except (ValueError, OverflowError, RecursionError) as e:  # e.g. an integer of more digits than Python reads
        raise UserError(str(p), f"invalid YAML value: {short(' '.join(str(e).split()), 120)}",
                        "fix the value (quote it to make it a string)") from None
    _check_tree(str(p), doc)
    return doc, hashlib.sha256(raw).hexdigest()


def only_fields(path: str, prefix: str, mapping: dict, allowed: set[str]) -> None:
    """Refuse the first unknown field of a mapping, naming the ones allowed."""
    bad = set(mapping) - allowed
    if bad:
        first = sorted(bad, key=lambda k: (not isinstance(k, str), str(k)))[0]
        if not isinstance(first, str):
            first = repr(first)
        fld = f"{prefix}.{first}" if prefix else first
        raise err(path, fld, "unknown field", f"allowed: {', '.join(sorted(allowed))}")


def entries(path: str, fld: str, raw: Any, allowed: set[str], hint: str) -> list[tuple[str, dict]]:
    """A non-empty list of mappings with known fields, as (field path, mapping) pairs."""
    if not isinstance(raw, list) or not raw:
        raise err(path, fld, "must be a non-empty list", hint)
    out = []
    for i, item in enumerate(raw):
        f = f"{fld}[{i}]"
        if not isinstance(item, dict):
            raise err(path, f, "must be a mapping", hint)
        only_fields(path, f, item, allowed)
        out.append((f, item))
    return out


def grid_name(path: str, name: Any) -> str:
    """The grid's name: the store's folder artifacts/<name>/ and the stem of its plots."""
    why = name_problem(name)
    if why or not name.replace("-", "").replace("_", "").isalnum():
        raise err(path, "name", f"{why or 'must be letters, digits, - and _'}, got {short(name)}",
                  f"a name of letters, digits, - and _ (at most {MAX_NAME_BYTES} bytes, not starting with -)")
    return name
