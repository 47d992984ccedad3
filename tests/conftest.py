"""Shared fixtures: grid files written to tmp, and the CLI called in-process."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from harness.cli import main


@pytest.fixture
def write_grid(tmp_path: Path):
    def _write(text: str, name: str = "grid.yaml") -> Path:
        p = tmp_path / name
        p.write_text(textwrap.dedent(text))
        return p
    return _write


@pytest.fixture
def cli(capsys):
    def _run(*argv: str) -> tuple[int, str, str]:
        rc = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return rc, out, err
    return _run


COMMAND_GRID = """
name: cmd
arms:
  - {name: a, engine: command, options: {cmd: "true"}}
  - {name: b, engine: command, options: {cmd: "true"}}
workload: {prompt_len: 1, context_len: 1, gen_len: 1}
threads: 1
passes: 4
repetitions: 2
warmups: 1
"""
