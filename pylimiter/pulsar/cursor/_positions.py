"""Positions: ``(ledger_id, entry_id)`` pairs, ordered lexicographically.

Any pair of integers is accepted (lists loaded from JSON, numpy integers);
positions are always returned as tuples of ``int``.  ``bool`` is refused:
``(True, 3)`` is almost certainly a bug, not ledger 1.
"""

from __future__ import annotations

import operator

from ...spark.show import show

Position = tuple[int, int]

#: Ids are stored as signed 64-bit integers, as Pulsar's longs.
MAX_ID = 2**63 - 1


def _int(value, what: str, whole) -> int:
    if type(value) is int:
        return value
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a pair of integers, got {show(whole)}")
    if isinstance(value, int):
        return int.__index__(value)     # an int subclass: no override runs
    try:
        return operator.index(value)
    except Exception as exc:
        # Whatever a foreign __index__ raises, the value is not an integer
        # this module can use (KeyboardInterrupt and the like propagate).
        raise TypeError(f"{what} must be a pair of integers, got a "
                        f"{type(value).__name__}") from exc


def as_position(value, what: str = "position") -> Position:
    """as_position returns ``value`` as an ``(int, int)`` tuple.  Raises
    TypeError for anything that is not a pair of integers, and ValueError
    for a negative ledger id, an entry id below -1 (``(L, -1)`` is the
    position before a ledger's first entry) or an id beyond 2**63 - 1."""
    if type(value) is tuple and len(value) == 2:
        ledger, entry = value
        if (type(ledger) is int and type(entry) is int and 0 <= ledger <= MAX_ID
                and -1 <= entry <= MAX_ID):
            return value
    try:
        ledger, entry = value
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be a (ledger_id, entry_id) pair, got {show(value)}") from None
    ledger = _int(ledger, what, value)
    entry = _int(entry, what, value)
    if ledger < 0:
        raise ValueError(f"{what} {show(value)}: ledger_id must be >= 0")
    if entry < -1:
        raise ValueError(f"{what} {show(value)}: entry_id must be >= -1")
    if ledger > MAX_ID or entry > MAX_ID:
        raise ValueError(f"{what} {show(value)}: ids must fit in a signed 64-bit integer")
    return (ledger, entry)


def fmt(position: Position) -> str:
    """Pulsar's notation, ``5:1226``."""
    return f"{position[0]}:{position[1]}"
