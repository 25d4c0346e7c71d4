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

All ranges, of every ledger, form one sequence ordered by (ledger, upper),
cut into chunks of at most ``_MAX_CHUNK`` ranges.  A chunk is three
``array('q')`` of the same length: ledger ids, open lower entry ids and
closed upper entry ids, 24 bytes per range whatever the pattern (a ledger
with a single acknowledged entry costs one range, not a dict entry and two
arrays).  ``_maxes`` holds the (ledger, upper) of the last range of every
chunk but the last, so finding a position is a ``bisect`` over the chunks
then two inside one chunk: O(log n).  An insert or a delete moves at most
one chunk's arrays (O(_MAX_CHUNK), a memmove), so acknowledgments in any
order cost O(log n) each instead of a memmove of everything after them.
Chunks split in halves when full (except that an append at the very end
starts a new chunk, so in-order acks leave full chunks) and merge with a
neighbour when they fall under ``_MIN_CHUNK``.

The common case, acks arriving in order at the tail of the newest ledger,
skips the search: an entry beyond the last range either extends it or opens
a new one at the end of the last chunk (whose arrays the set keeps at hand).
Both paths accept and refuse the same inputs, with the same exception types.

Not thread-safe: the cursor that owns a set serialises access (Pulsar holds
the cursor's write lock for every change).
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from ._positions import MAX_ID, Position, as_position, fmt, show

Range = tuple[Position, Position]

#: A chunk holds at most this many ranges (a split moves half of them) ...
_MAX_CHUNK = 1024
#: ... and at least this many unless it is the only one (else it merges).
_MIN_CHUNK = 128


class AckRangeSet:
    """AckRangeSet holds acknowledged positions as coalesced ranges
    ``(lower, upper]`` within one ledger each.

    ``len(s)`` is the number of ranges and ``s.cardinality`` the number of
    acknowledged positions.  ``sys.getsizeof(s)`` is the memory the set holds
    (its arrays and lists included).  ``copy.copy`` and ``copy.deepcopy``
    give an independent set; pickling works.
    """

    __slots__ = ("_card", "_hi", "_led", "_lo", "_maxes", "_nranges", "_thi", "_tl", "_tled",
                 "_tlo")

    def __init__(self) -> None:
        self._led: list[array] = []     # chunk k: ledger id of each range
        self._lo: list[array] = []      # chunk k: open lower entry ids
        self._hi: list[array] = []      # chunk k: closed upper entry ids
        self._maxes: list[tuple[int, int]] = []   # (ledger, upper) ending chunk k < last
        self._nranges = 0
        self._card = 0
        # The last chunk's arrays and the last range's ledger, for the
        # in-order fast path (None when empty); _retail() after any change
        # other than the fast path's own.
        self._tl = self._tled = self._tlo = self._thi = None

    def _retail(self) -> None:
        if self._hi:
            self._tled, self._tlo, self._thi = self._led[-1], self._lo[-1], self._hi[-1]
            self._tl = self._tled[-1]
        else:
            self._tl = self._tled = self._tlo = self._thi = None

    # ---- chunk internals -----------------------------------------------------------

    def _locate(self, ledger: int, entry: int) -> tuple[int, int]:
        """(chunk, index) of the first range with (ledger, upper) >=
        (ledger, entry); index == len(chunk) only past the last range.
        There must be at least one chunk."""
        k = bisect_left(self._maxes, (ledger, entry))
        led = self._led[k]
        a = bisect_left(led, ledger)
        b = bisect_right(led, ledger, a)
        return k, bisect_left(self._hi[k], entry, a, b)

    def _fix_max(self, k: int) -> None:
        if k < len(self._maxes):
            self._maxes[k] = (self._led[k][-1], self._hi[k][-1])

    def _set_hi(self, k: int, j: int, value: int) -> None:
        hi = self._hi[k]
        hi[j] = value
        if j == len(hi) - 1:
            self._fix_max(k)

    def _remove_chunk(self, k: int) -> None:
        last = len(self._hi) - 1
        del self._led[k], self._lo[k], self._hi[k]
        if k < last:
            del self._maxes[k]
        elif k > 0:
            del self._maxes[k - 1]      # chunk k - 1 is the last one now: no max

    def _split(self, k: int) -> None:
        """Cut chunk k in halves; both are fresh arrays, so neither keeps the
        other's allocation."""
        half = len(self._hi[k]) // 2
        for chunks in (self._led, self._lo, self._hi):
            arr = chunks[k]
            chunks[k:k + 1] = [array("q", arr[:half]), array("q", arr[half:])]
        self._maxes.insert(k, (self._led[k][-1], self._hi[k][-1]))

    def _rebalance(self, k: int) -> None:
        """Merge chunk k with a neighbour when it is small (then split the
        result again if it is too big)."""
        n = len(self._hi)
        if n < 2 or not 0 <= k < n or len(self._hi[k]) >= _MIN_CHUNK:
            return
        a = k if k + 1 < n else k - 1
        b = a + 1
        for chunks in (self._led, self._lo, self._hi):
            chunks[a].extend(chunks[b])
            del chunks[b]
        if b == n - 1:
            del self._maxes[a]          # a is the last chunk now
        else:
            self._maxes[a] = self._maxes[b]
            del self._maxes[b]
        if len(self._hi[a]) > _MAX_CHUNK:
            self._split(a)

    def _insert(self, k: int, j: int, ledger: int, lo: int, hi: int) -> None:
        if not self._hi:
            self._led.append(array("q", (ledger,)))
            self._lo.append(array("q", (lo,)))
            self._hi.append(array("q", (hi,)))
            return
        his = self._hi[k]
        n = len(his)
        if n >= _MAX_CHUNK and j == n and k == len(self._hi) - 1:
            # An append past the end: a new chunk keeps the full one full.
            self._maxes.append((self._led[k][-1], his[-1]))
            self._led.append(array("q", (ledger,)))
            self._lo.append(array("q", (lo,)))
            self._hi.append(array("q", (hi,)))
            return
        self._led[k].insert(j, ledger)
        self._lo[k].insert(j, lo)
        his.insert(j, hi)
        if j == n:
            self._fix_max(k)
        if n + 1 > _MAX_CHUNK:
            self._split(k)

    def _delete_span(self, k: int, j: int, count: int) -> None:
        """Delete ``count`` consecutive ranges starting at (k, j), then merge
        the (at most two) chunks it left short."""
        first = last = -1
        while count > 0:
            hi = self._hi[k]
            take = min(count, len(hi) - j)
            del self._led[k][j:j + take], self._lo[k][j:j + take], hi[j:j + take]
            count -= take
            if not hi:
                self._remove_chunk(k)   # the next chunk is now chunk k
            else:
                if j == len(hi):
                    self._fix_max(k)
                if first < 0:
                    first = k
                last = k
                k += 1
            j = 0
        # The higher one first: a merge never moves the chunks before it.
        if last > first:
            self._rebalance(last)
        if first >= 0:
            self._rebalance(first)

    def _ledger_spans(self, ledger: int, start: int, stop: int) -> list[tuple[int, int]]:
        """(lower, upper) of the ranges of ``ledger`` with upper >= start and
        lower < stop, ascending; a snapshot, so the caller may change the set
        while it uses it."""
        out: list[tuple[int, int]] = []
        if not self._hi:
            return out
        k, j = self._locate(ledger, start)
        nchunks = len(self._hi)
        while k < nchunks:
            led, lo, hi = self._led[k], self._lo[k], self._hi[k]
            end = bisect_right(led, ledger, j)
            stop_at = bisect_left(lo, stop, j, end)        # ranges with lower < stop
            out.extend(zip(lo[j:stop_at], hi[j:stop_at]))
            if stop_at < len(hi):
                break
            k, j = k + 1, 0
        return out

    def _clear(self) -> None:
        self._led.clear()
        self._lo.clear()
        self._hi.clear()
        self._maxes.clear()
        self._nranges = self._card = 0
        self._retail()

    # ---- changes -----------------------------------------------------------------

    def add(self, position) -> bool:
        """add acknowledges ``position``: ``((L, e-1), (L, e)]`` joins the set
        and coalesces with its neighbours in ledger L.  Returns False if the
        position was already acknowledged.  TypeError for anything but a pair
        of integers, ValueError for an entry id below 0 or an id beyond
        2**63 - 1."""
        if type(position) is tuple and len(position) == 2:
            ledger, entry = position
            # In order at the tail of the last range's ledger.  Anything else
            # takes the slow path, which says what is wrong: an id past
            # 2**63 - 1 fails the first array write here, before anything
            # changed, and goes there too (ValueError, not OverflowError).
            if type(ledger) is int and ledger == self._tl and type(entry) is int:
                hi = self._thi
                last = hi[-1]
                if entry > last:
                    try:
                        if entry == last + 1:
                            hi[-1] = entry
                            self._card += 1
                            return True
                        if len(hi) < _MAX_CHUNK:
                            hi.append(entry)
                            self._tlo.append(entry - 1)
                            self._tled.append(ledger)
                            self._nranges += 1
                            self._card += 1
                            return True
                    except OverflowError:
                        pass
            elif (type(ledger) is int and type(entry) is int and self._tl is not None
                  and self._tl < ledger <= MAX_ID and 0 <= entry <= MAX_ID):
                hi = self._thi
                if len(hi) < _MAX_CHUNK:
                    # The first ack of a later ledger (one ack per ledger, in order).
                    hi.append(entry)
                    self._tlo.append(entry - 1)
                    self._tled.append(ledger)
                    self._tl = ledger
                    self._nranges += 1
                    self._card += 1
                    return True
        return self._add_slow(position)

    def _add_slow(self, position) -> bool:
        changed = self._add_at(position)
        self._retail()
        return changed

    def _add_at(self, position) -> bool:
        ledger, entry = as_position(position)
        if entry < 0:
            raise ValueError(f"position {show(position)}: entry_id must be >= 0 to be acknowledged")
        if not self._hi:
            self._insert(0, 0, ledger, entry - 1, entry)
            self._nranges += 1
            self._card += 1
            return True
        k, j = self._locate(ledger, entry)
        led, lo, hi = self._led[k], self._lo[k], self._hi[k]
        n = len(hi)
        if j < n and led[j] == ledger and lo[j] < entry:
            return False                        # lo < entry <= hi: already there
        join_next = j < n and led[j] == ledger and lo[j] == entry
        if j > 0:
            pk, pj = k, j - 1
        elif k > 0:
            pk, pj = k - 1, len(self._hi[k - 1]) - 1
        else:
            pk = pj = -1
        join_prev = (pk >= 0 and self._led[pk][pj] == ledger
                     and self._hi[pk][pj] == entry - 1)
        if join_prev and join_next:             # closes the gap between two ranges
            self._set_hi(pk, pj, hi[j])
            self._delete_span(k, j, 1)
            self._nranges -= 1
        elif join_prev:
            self._set_hi(pk, pj, entry)
        elif join_next:
            lo[j] = entry - 1
        else:
            self._insert(k, j, ledger, entry - 1, entry)
            self._nranges += 1
        self._card += 1
        return True

    def add_range(self, lower, upper) -> None:
        """add_range acknowledges ``(lower, upper]`` within one ledger,
        coalescing with whatever it touches or overlaps.  ``lower == upper``
        adds nothing.  ValueError when the two are in different ledgers or
        ``upper < lower``."""
        self._add_range(lower, upper)
        self._retail()

    def _add_range(self, lower, upper) -> None:
        la, a = as_position(lower, "lower")
        lb, b = as_position(upper, "upper")
        if la != lb:
            raise ValueError(f"range ({fmt((la, a))}..{fmt((lb, b))}] spans ledgers {la} and "
                             f"{lb}; a range lies within one ledger")
        if b < a:
            raise ValueError(f"range ({fmt((la, a))}..{fmt((lb, b))}]: upper is below lower")
        if a == b:
            return
        if not self._hi:
            self._insert(0, 0, la, a, b)
            self._nranges += 1
            self._card += b - a
            return
        # Ranges (lo, hi] that touch or overlap (a, b]: hi >= a and lo <= b,
        # consecutive from the first range with (ledger, hi) >= (la, a).
        k, j = self._locate(la, a)
        new_lo, new_hi = a, b
        covered = count = 0
        kk, jj = k, j
        while kk < len(self._hi):
            led, lo, hi = self._led[kk], self._lo[kk], self._hi[kk]
            end = bisect_right(led, la, jj)
            stop = bisect_right(lo, b, jj, end)
            if stop > jj:
                new_lo = min(new_lo, lo[jj])
                new_hi = max(new_hi, hi[stop - 1])
                covered += sum(hi[jj:stop]) - sum(lo[jj:stop])
                count += stop - jj
            if stop < len(hi):
                break
            kk, jj = kk + 1, 0
        if count == 0:
            self._insert(k, j, la, a, b)
            self._nranges += 1
            self._card += b - a
            return
        # The first merged range becomes the union; the others go.
        self._lo[k][j] = new_lo
        self._set_hi(k, j, new_hi)
        if count > 1:
            if j + 1 < len(self._hi[k]):
                self._delete_span(k, j + 1, count - 1)
            else:
                self._delete_span(k + 1, 0, count - 1)
        self._nranges -= count - 1
        self._card += (new_hi - new_lo) - covered

    def remove_at_most(self, position) -> None:
        """remove_at_most forgets every position <= ``position`` (the
        mark-delete position moved past them); a range it cuts keeps its
        part above."""
        self._remove_at_most(position)
        self._retail()

    def _remove_at_most(self, position) -> None:
        ledger, entry = as_position(position)
        if not self._hi:
            return
        k, j = self._locate(ledger, entry)
        if j < len(self._hi[k]) and self._led[k][j] == ledger and self._hi[k][j] == entry:
            j += 1                              # ends exactly at the position: goes too
        # Whole chunks before k, then the first j ranges of chunk k.
        for c in range(k):
            self._card -= sum(self._hi[c]) - sum(self._lo[c])
            self._nranges -= len(self._hi[c])
        if k:
            del self._led[:k], self._lo[:k], self._hi[:k], self._maxes[:k]
        if j:
            lo, hi = self._lo[0], self._hi[0]
            self._card -= sum(hi[:j]) - sum(lo[:j])
            self._nranges -= j
            self._delete_span(0, 0, j)
        if self._hi:
            led, lo = self._led[0], self._lo[0]
            if led[0] == ledger and lo[0] < entry:
                self._card -= entry - lo[0]
                lo[0] = entry

    # ---- queries -----------------------------------------------------------------

    def contains(self, position) -> bool:
        """contains says whether ``position`` is acknowledged."""
        ledger, entry = as_position(position)
        if not self._hi:
            return False
        k, j = self._locate(ledger, entry)
        return (j < len(self._hi[k]) and self._led[k][j] == ledger
                and self._lo[k][j] < entry)

    __contains__ = contains

    def _iter_ranges(self) -> Iterator[Range]:
        for led, lo, hi in zip(self._led, self._lo, self._hi):
            for ledger, a, b in zip(led, lo, hi):
                yield (ledger, a), (ledger, b)

    def ranges(self) -> list[Range]:
        """ranges returns every range, coalesced and ascending, as
        ``((L, lower), (L, upper))`` tuples."""
        return list(self._iter_ranges())

    def first_range(self) -> Range | None:
        """first_range returns the lowest range, or None when the set is empty."""
        if not self._hi:
            return None
        ledger = self._led[0][0]
        return (ledger, self._lo[0][0]), (ledger, self._hi[0][0])

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
            raise TypeError(f"max_ranges must be an int or None, got {show(max_ranges)}")
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

    def __copy__(self) -> "AckRangeSet":
        other = AckRangeSet()
        other._led = [array("q", a) for a in self._led]
        other._lo = [array("q", a) for a in self._lo]
        other._hi = [array("q", a) for a in self._hi]
        other._maxes = list(self._maxes)
        other._nranges, other._card = self._nranges, self._card
        other._retail()
        return other

    def __deepcopy__(self, memo) -> "AckRangeSet":
        return self.__copy__()

    def __sizeof__(self) -> int:
        size = object.__sizeof__(self)
        for chunks in (self._led, self._lo, self._hi):
            size += sys.getsizeof(chunks) + sum(map(sys.getsizeof, chunks))
        size += sys.getsizeof(self._maxes)
        for t in self._maxes:
            size += sys.getsizeof(t) + sys.getsizeof(t[0]) + sys.getsizeof(t[1])
        return size

    def __repr__(self) -> str:
        shown = [f"({fmt(a)}..{fmt(b)}]" for a, b in self.to_records(8)]
        more = ", ..." if self._nranges > 8 else ""
        return (f"AckRangeSet([{', '.join(shown)}{more}], ranges={self._nranges}, "
                f"cardinality={self._card})")
