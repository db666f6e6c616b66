"""Errors a user sees: one line naming the problem and the next step, never a traceback.

UserError (exit 1): bad input, wrong tree, bad option — the user can fix it.
InfraError (exit 3): the machine or a tool failed (build failure, guest hang, full disk).
"""

from __future__ import annotations


class KpgoError(Exception):
    exit_code = 2

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} — {self.hint}"
        return self.message


class UserError(KpgoError):
    exit_code = 1


class InfraError(KpgoError):
    exit_code = 3
