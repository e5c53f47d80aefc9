"""The one error type a user sees: a single line that says what to change."""

from __future__ import annotations

import re


class UserError(ValueError):
    """Bad input from the user. The CLI prints it as one line on stderr and exits with code 2."""


_SECRET_RE = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^@\s]*@")


def redact(text: str) -> str:
    """`text` with the password of every URL in it (`postgresql://user:pass@host`) replaced
    by `***`: messages and reports quote storage URLs, and terminals, logs and shared HTML
    keep what they are given."""
    return _SECRET_RE.sub(r"\1:***@", text)
