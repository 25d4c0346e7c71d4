"""show(): a caller's value as the subsystems' error messages quote it."""

from __future__ import annotations

import reprlib

__all__ = ["show"]

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80


def show(value) -> str:
    """A short repr of a caller's value for an error message: never longer
    than a line, and never an exception of its own (a foreign __repr__ may
    raise)."""
    try:
        return _REPR.repr(value)
    except Exception:
        return f"<{type(value).__name__} object>"
