"""AckRangeSet: the acknowledged positions beyond a cursor's mark-delete
position, as Pulsar's ``individuallyDeletedMessages`` keeps them.

Layout and why
--------------
A range is open below and closed above, ``(lower, upper]``, in one ledger:
``((5, 1226), (5, 1280)]`` says entries 1227..1280 of ledger 5 are
acknowledged and 5:1226 is not.  Ranges never span ledgers (Pulsar's
``OpenLongPairRangeSet`` keeps one bitmap per ledger, so a range ends where
a ledger does), and touching ranges in one ledger are always coalesced, so
the representation of a set of positions is unique.

Each ledger holds two ``array('q')`` of the same length, ``lo`` (open lower
entry ids) and ``hi`` (closed upper entry ids), both ascending because the
ranges are disjoint and never touch (``hi[k] < lo[k + 1]``).  That is 16
bytes per range plus the arrays' over-allocation, against 70-odd bytes for
two lists of Python ints; a lookup is a ``bisect`` on ``hi``.  Ledger ids are
kept in a sorted list beside a dict from id to arrays.

The common case, acks arriving in order at the tail of the newest ledger,
skips the search: the set remembers the ledger it touched last, and an
entry beyond that ledger's last range either extends it or opens a new one
at the end.

Not thread-safe: the cursor that owns a set serialises access (Pulsar holds
the cursor's write lock for every change).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator

from ._positions import Position, as_position, fmt

Range = tuple[Position, Position]


class AckRangeSet:
    """AckRangeSet holds acknowledged positions as coalesced ranges
    ``(lower, upper]`` within one ledger each.

    ``len(s)`` is the number of ranges and ``s.cardinality`` the number of
    acknowledged positions.  ``sys.getsizeof(s)`` is the memory the set holds
    (its arrays, lists and dict included).
    """

    __slots__ = ("_card", "_chi", "_cl", "_clo", "_ids", "_led", "_nranges")

    def __init__(self) -> None:
        self._ids: list[int] = []                       # ledger ids with ranges, ascending
        self._led: dict = {}                            # ledger id -> (lo, hi) arrays
        self._nranges = 0
        self._card = 0
        # The ledger touched last and its arrays, for the in-order fast path;
        # None when it has no ranges any more.
        self._cl: int | None = None
        self._clo = self._chi = None

    # ---- internals ---------------------------------------------------------------

    def _arrays(self, ledger: int):
        """The (lo, hi) arrays of ``ledger``, created empty if needed."""
        led = self._led.get(ledger)
        if led is None:
            led = (array("q"), array("q"))
            self._led[ledger] = led
            insort(self._ids, ledger)
        self._cl, self._clo, self._chi = ledger, led[0], led[1]
        return led

    def _drop_ledger(self, ledger: int) -> None:
        del self._led[ledger]
        del self._ids[bisect_left(self._ids, ledger)]
        if self._cl == ledger:
            self._cl = self._clo = self._chi = None

    def _ledger_ranges(self, ledger: int):
        """(lo, hi) of ``ledger`` or None; read-only use by the cursor."""
        return self._led.get(ledger)

    def _clear(self) -> None:
        self._ids.clear()
        self._led.clear()
        self._nranges = self._card = 0
        self._cl = self._clo = self._chi = None

    # ---- changes -----------------------------------------------------------------

    def add(self, position) -> bool:
        """add acknowledges ``position``: ``((L, e-1), (L, e)]`` joins the set
        and coalesces with its neighbours in ledger L.  Returns False if the
        position was already acknowledged.  TypeError for anything but a pair
        of integers, ValueError for an entry id below 0."""
        try:
            ledger, entry = position
        except (TypeError, ValueError):
            return self._add_slow(position)         # says what a position is
        if ledger == self._cl and type(entry) is int and type(ledger) is int:
            hi = self._chi
            last = hi[-1]
            if entry > last:
                # In-order ack at the tail of the ledger touched last.  An
                # entry beyond 2**63 - 1 fails the first array write, before
                # anything changed.
                if entry == last + 1:
                    hi[-1] = entry
                else:
                    hi.append(entry)
                    self._clo.append(entry - 1)
                    self._nranges += 1
                self._card += 1
                return True
        return self._add_slow(position)

    def _add_slow(self, position) -> bool:
        ledger, entry = as_position(position)
        if entry < 0:
            raise ValueError(f"position {position!r}: entry_id must be >= 0 to be acknowledged")
        lo, hi = self._arrays(ledger)
        n = len(hi)
        i = bisect_left(hi, entry)              # first range whose upper is >= entry
        if i < n and lo[i] < entry:
            return False                        # lo < entry <= hi: already there
        join_prev = i > 0 and hi[i - 1] == entry - 1
        join_next = i < n and lo[i] == entry
        if join_prev and join_next:             # closes the gap between two ranges
            hi[i - 1] = hi[i]
            del lo[i]
            del hi[i]
            self._nranges -= 1
        elif join_prev:
            hi[i - 1] = entry
        elif join_next:
            lo[i] = entry - 1
        else:
            hi.insert(i, entry)
            lo.insert(i, entry - 1)
            self._nranges += 1
        self._card += 1
        return True

    def add_range(self, lower, upper) -> None:
        """add_range acknowledges ``(lower, upper]`` within one ledger,
        coalescing with whatever it touches or overlaps.  ``lower == upper``
        adds nothing.  ValueError when the two are in different ledgers or
        ``upper < lower``."""
        la, a = as_position(lower, "lower")
        lb, b = as_position(upper, "upper")
        if la != lb:
            raise ValueError(f"range ({fmt((la, a))}..{fmt((lb, b))}] spans ledgers {la} and "
                             f"{lb}; a range lies within one ledger")
        if b < a:
            raise ValueError(f"range ({fmt((la, a))}..{fmt((lb, b))}]: upper is below lower")
        if a == b:
            return
        lo, hi = self._arrays(la)
        i = bisect_left(hi, a)                  # first range touching (a, b] from the left
        j = bisect_right(lo, b)                 # first range entirely to the right
        if i == j:
            lo.insert(i, a)
            hi.insert(i, b)
            self._nranges += 1
            self._card += b - a
            return
        new_lo = min(a, lo[i])
        new_hi = max(b, hi[j - 1])
        covered = sum(hi[k] - lo[k] for k in range(i, j))
        lo[i] = new_lo
        hi[i] = new_hi
        del lo[i + 1:j]
        del hi[i + 1:j]
        self._nranges -= j - i - 1
        self._card += (new_hi - new_lo) - covered

    def remove_at_most(self, position) -> None:
        """remove_at_most forgets every position <= ``position`` (the
        mark-delete position moved past them); a range it cuts keeps its
        part above."""
        ledger, entry = as_position(position)
        k = bisect_left(self._ids, ledger)
        for gone in self._ids[:k]:
            lo, hi = self._led.pop(gone)
            self._card -= sum(hi) - sum(lo)
            self._nranges -= len(hi)
        if k:
            del self._ids[:k]
            if self._cl is not None and self._cl < ledger:
                self._cl = self._clo = self._chi = None
        led = self._led.get(ledger)
        if led is None:
            return
        lo, hi = led
        i = bisect_right(hi, entry)             # ranges [0, i) end at or below entry
        if i:
            self._card -= sum(hi[:i]) - sum(lo[:i])
            self._nranges -= i
            del lo[:i]
            del hi[:i]
        if lo and lo[0] < entry:
            self._card -= entry - lo[0]
            lo[0] = entry
        if not hi:
            self._drop_ledger(ledger)

    # ---- queries -----------------------------------------------------------------

    def contains(self, position) -> bool:
        """contains says whether ``position`` is acknowledged."""
        ledger, entry = as_position(position)
        led = self._led.get(ledger)
        if led is None:
            return False
        lo, hi = led
        i = bisect_left(hi, entry)
        return i < len(hi) and lo[i] < entry

    __contains__ = contains

    def ranges(self) -> list[Range]:
        """ranges returns every range, coalesced and ascending, as
        ``((L, lower), (L, upper))`` tuples."""
        out = []
        for ledger in self._ids:
            lo, hi = self._led[ledger]
            out.extend(((ledger, a), (ledger, b)) for a, b in zip(lo, hi))
        return out

    def _iter_ranges(self) -> Iterator[Range]:
        for ledger in list(self._ids):
            lo, hi = self._led[ledger]
            for a, b in zip(lo, hi):
                yield (ledger, a), (ledger, b)

    def first_range(self) -> Range | None:
        """first_range returns the lowest range, or None when the set is empty."""
        if not self._ids:
            return None
        ledger = self._ids[0]
        lo, hi = self._led[ledger]
        return (ledger, lo[0]), (ledger, hi[0])

    def __len__(self) -> int:
        return self._nranges

    @property
    def cardinality(self) -> int:
        """The number of acknowledged positions."""
        return self._card

    def to_records(self, max_ranges: int | None = None) -> list[Range]:
        """to_records returns the ranges for persistence; with ``max_ranges``,
        only the first ``max_ranges`` of them (Pulsar persists at most
        ``managedLedgerMaxUnackedRangesToPersist``, 10000 by default, and the
        rest are lost on a broker restart: those entries are redelivered)."""
        if max_ranges is None:
            return self.ranges()
        if isinstance(max_ranges, bool) or not isinstance(max_ranges, int):
            raise TypeError(f"max_ranges must be an int or None, got {max_ranges!r}")
        if max_ranges < 0:
            raise ValueError(f"max_ranges must be >= 0, got {max_ranges}")
        out: list[Range] = []
        if max_ranges == 0:
            return out
        for r in self._iter_ranges():
            out.append(r)
            if len(out) == max_ranges:
                break
        return out

    def __sizeof__(self) -> int:
        size = object.__sizeof__(self) + sys.getsizeof(self._ids) + sys.getsizeof(self._led)
        for ledger, (lo, hi) in self._led.items():
            size += sys.getsizeof(ledger) + sys.getsizeof((lo, hi))
            size += sys.getsizeof(lo) + sys.getsizeof(hi)
        return size

    def __repr__(self) -> str:
        shown = [f"({fmt(a)}..{fmt(b)}]" for a, b in self.to_records(8)]
        more = ", ..." if self._nranges > 8 else ""
        return (f"AckRangeSet([{', '.join(shown)}{more}], ranges={self._nranges}, "
                f"cardinality={self._card})")
