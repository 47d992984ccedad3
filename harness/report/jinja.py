"""The report's templates (reports/templates) and their jinja2 environment."""

from __future__ import annotations

from functools import lru_cache

import jinja2

from harness.paths import PROJECT_ROOT


TEMPLATES = PROJECT_ROOT / "reports" / "templates"


def md_cell(v: object) -> str:
    """A value as one cell of a Markdown table: a '|' escaped (it would end the cell) and a line break as a space
    (it would end the row); names from a grid or a store reach the tables through it (the templates' `| cell`)."""
    return str(v).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ") \
        if isinstance(v, str) else str(v)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), keep_trailing_newline=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined,
                             bytecode_cache=_bytecode_cache())
    env.filters["cell"] = md_cell
    return env


@lru_cache(maxsize=1)
def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """Compiled templates, outside the checkout (keyed by jinja on each template's source checksum): compiling
    them was 0.3 s of every report. None where the cache folder cannot be made: templates compile each time."""
    from harness.paths import cache_root
    d = cache_root() / "jinja"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(d))
