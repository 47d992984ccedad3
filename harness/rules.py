"""Rules that the modules making runs share with `harness check`, which judges those runs by them: one
definition each. Standard library only, so that `harness check` imports them without the grid's, the
schedule's or emulation's imports (yaml and more), which would cost it more than all its rules take."""

from __future__ import annotations

import hashlib

# emulation (harness/emulate.py): the memory cap holds when the memory available at engine start is the
# class's within this share of it
MEMORY_TOLERANCE = 0.05


def cell_id(params: dict) -> str:
    """A cell's id: its parameters, sorted by name."""
    return ",".join(f"{k}={params[k]}" for k in sorted(params))


def run_key(cell: str, arm: str, pass_index: int) -> str:
    """A run's key in its grid: its cell, arm and pass (resuming a series finds the runs it has by it)."""
    return hashlib.sha256(f"{cell}|{arm}|{pass_index}".encode()).hexdigest()[:16]
