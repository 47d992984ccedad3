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
