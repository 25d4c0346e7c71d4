"""The argument checks the library's settings and load data share."""

from __future__ import annotations

import math
from typing import Optional

from ...spark.show import show


def number(name: str, value, low: Optional[float] = 0, high: Optional[float] = None,
           integer: bool = False) -> float:
    """``value`` if it is a number (an int when ``integer``; never a bool) that
    is finite (NaN and infinities are refused: NaN compares false with
    everything, so it would slip past every threshold) and within [low,
    high]; else a ValueError naming ``name``.  A subclass of int or float
    (numpy's float64) comes back as a plain int or float."""
    t = type(value)
    if t is not int and t is not float and not isinstance(value, bool):
        if isinstance(value, int):
            value = int.__index__(value)
        elif isinstance(value, float) and not integer:
            value = float.__float__(value)
    kinds = (int,) if integer else (int, float)
    ok = not isinstance(value, bool) and isinstance(value, kinds)
    if ok and not integer:
        try:
            ok = math.isfinite(value)       # an int too big for a float is not
        except OverflowError:
            ok = False
    if ok:
        ok = (low is None or value >= low) and (high is None or value <= high)
    if not ok:
        kind = "an int" if integer else "a finite number"
        if low is not None and high is not None:
            kind += f" in [{low:g}, {high:g}]"
        elif low is not None:
            kind += f" >= {low:g}"
        elif high is not None:
            kind += f" <= {high:g}"
        raise ValueError(f"{name} must be {kind}, got {show(value)}")
    return value


def name(what: str, value) -> str:
    """A broker or bundle name: a str (TypeError otherwise, before any
    foreign __hash__ or __eq__ runs)."""
    if type(value) is not str:
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return value


def instance(what: str, value, cls):
    if not isinstance(value, cls):
        raise TypeError(f"{what} must be a {cls.__name__}, not {type(value).__name__}")
    return value
