"""The one error type a user sees: a single line that says what to change."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user. The CLI prints it as one line on stderr and exits with code 2."""
