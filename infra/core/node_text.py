"""Text that comes from a node (its phase, an error, a log line), made safe to show an operator:
a node's status file is the service user's to write, so its text is untrusted. Control
characters (terminal escapes, carriage returns, NUL) and format characters (bidirectional
overrides) are shown escaped, and the text is cut to a length."""

from __future__ import annotations

import unicodedata
from typing import Any

MAX_CHARS = 2000


def _shown(char: str) -> str:
    if unicodedata.category(char) not in ("Cc", "Cf"):
        return char
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def printable(text: str, limit: int = MAX_CHARS) -> str:
    shown = "".join(_shown(char) for char in text[:limit])
    return shown + ("…" if len(text) > limit else "")


def printable_values(value: Any) -> Any:
    """Every string in a JSON value (keys too) made printable."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable(str(k)): printable_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [printable_values(item) for item in value]
    return value
