"""The one argument check the library's settings share."""

from __future__ import annotations

import math
from typing import Optional


def number(name: str, value, low: Optional[float] = 0, high: Optional[float] = None,
           integer: bool = False) -> float:
    """``value`` if it is a number (an int when ``integer``; never a bool or
    NaN) within [low, high]; else a ValueError naming ``name``."""
    kinds = (int,) if integer else (int, float)
    ok = (not isinstance(value, bool) and isinstance(value, kinds)
          and not (isinstance(value, float) and math.isnan(value))
          and (low is None or value >= low) and (high is None or value <= high))
    if not ok:
        kind = "an int" if integer else "a number"
        if low is not None and high is not None:
            kind += f" in [{low:g}, {high:g}]"
        elif low is not None:
            kind += f" >= {low:g}"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    return value
