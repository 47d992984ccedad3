"""The one user-facing error type of the harness.

`main` turns a UserError into one line on stderr and exit code 2 (usage or input error).
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or a missing prerequisite: one line naming what, where, and the fix."""

    exit_code = 2

    def __init__(self, where: str, problem: str, fix: str = "") -> None:
        self.where = where
        self.problem = problem
        self.fix = fix
        msg = f"{where}: {problem}"
        if fix:
            msg += f" (fix: {fix})"
        super().__init__(msg)


def require_engines(where: str, what: str, packages: tuple[str, ...] | list[str]) -> None:
    """Refuse, in one line naming the extra, what needs Python packages a client-only install (`pip install .`)
    does not have (the extra `engines`: torch, vLLM, transformers)."""
    import importlib.util
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        raise UserError(where, f"{what} needs {', '.join(missing)}, not installed here (a client-only install)",
                        "pip install 'edge-harness[engines]' (make installs it), or benchmark a server through the "
                        "openai engine (docs/serving.md)")
