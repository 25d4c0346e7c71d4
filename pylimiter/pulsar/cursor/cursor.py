"""Cursor: one subscription's acknowledgment state over a topic's ledgers,
after Pulsar's ``ManagedCursorImpl``, and HoleCompensator, Tencent's task
that redelivers acknowledgment holes.

Everything at or below ``mark_delete_position`` is acknowledged; acks beyond
it live in ``acked`` (an AckRangeSet).  Mark-delete advances whenever the
first range starts right after it, that is when no entry of the topic lies
in ``(mark_delete, first_range.lower]`` (Pulsar's ``asyncDelete`` asks the
managed ledger for the number of entries in that interval): acking 3 after
1, 2, 4, 5 moves mark-delete from 2 to 5 in one step, and an acknowledged
run that ends a ledger is followed into the next ledger's first range.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence

from ._positions import MAX_ID, Position, _int, as_position, fmt, show
from .ranges import AckRangeSet


class Cursor:
    """Cursor tracks what one subscription acknowledged over ``ledgers``,
    a sequence of ``(ledger_id, entry_count)`` with increasing ids.

    ``mark_delete`` is the position everything up to is acknowledged: an
    entry of a ledger, or ``(L, -1)`` for a ledger L in ``ledgers`` (nothing
    of L acknowledged yet).  ValueError for ids that do not increase, a
    negative entry count or a mark-delete position outside ``ledgers``.
    """

    __slots__ = ("_acked", "_count", "_ids", "_md")

    def __init__(self, ledgers: Sequence[tuple[int, int]], mark_delete) -> None:
        self._ids: list[int] = []
        self._count: dict[int, int] = {}
        for item in ledgers:
            ledger_id, entry_count = _pair(item, "ledgers must hold (ledger_id, entry_count) "
                                                 "pairs")
            self.append_ledger(ledger_id, entry_count)
        md = as_position(mark_delete, "mark_delete")
        if md[0] not in self._count or md[1] >= self._count[md[0]]:
            raise ValueError(f"mark_delete {fmt(md)} is not an entry of ledgers, nor (L, -1) "
                             f"for one of them")
        self._md: Position = md
        self._acked = AckRangeSet()

    # ---- the topic's entries -------------------------------------------------------

    def append_ledger(self, ledger_id: int, entry_count: int) -> None:
        """append_ledger adds a ledger the topic rolled over to.  ValueError
        when its id is not above every known id or above 2**63 - 1, or its
        count is negative or above 2**63 (entry ids are signed 64-bit)."""
        ledger_id = _int(ledger_id, "ledger", (ledger_id, entry_count))
        entry_count = _int(entry_count, "ledger", (ledger_id, entry_count))
        if not 0 <= ledger_id <= MAX_ID:
            raise ValueError(f"ledger id must be in [0, 2**63 - 1], got {ledger_id}")
        if entry_count > MAX_ID + 1:
            raise ValueError(f"ledger {ledger_id}: entry_count must be <= 2**63, "
                             f"got {entry_count}")
        if self._ids and ledger_id <= self._ids[-1]:
            raise ValueError(f"ledger ids must increase: {ledger_id} after {self._ids[-1]}")
        if entry_count < 0:
            raise ValueError(f"ledger {ledger_id}: entry_count must be >= 0, got {entry_count}")
        self._ids.append(ledger_id)
        self._count[ledger_id] = entry_count

    def _entry(self, position, what: str = "position") -> Position:
        pos = as_position(position, what)
        n = self._count.get(pos[0])
        if n is None or not 0 <= pos[1] < n:
            raise ValueError(f"{what} {fmt(pos)} is not an entry of this cursor's ledgers")
        return pos

    def _next_entry(self, pos: Position) -> Position | None:
        """The first entry after ``pos``, or None at the end of the topic."""
        ledger, entry = pos
        n = self._count.get(ledger)
        if n is not None and entry + 1 < n:
            return (ledger, entry + 1)
        ids = self._ids
        for k in range(bisect_right(ids, ledger), len(ids)):
            if self._count[ids[k]]:
                return (ids[k], 0)
        return None

    def _windows(self, read_position: Position) -> Iterator[tuple[int, int, int]]:
        """(ledger, start, stop): the entries start..stop-1 of each ledger
        that lie after mark-delete and before ``read_position``."""
        md_l, md_e = self._md
        rd_l, rd_e = read_position
        ids = self._ids
        for k in range(bisect_left(ids, md_l), len(ids)):
            ledger = ids[k]
            if ledger > rd_l:
                return
            start = md_e + 1 if ledger == md_l else 0
            stop = self._count[ledger]
            if ledger == rd_l:
                stop = min(stop, max(rd_e, 0))
            if start < stop:
                yield ledger, start, stop

    # ---- acknowledgments -----------------------------------------------------------

    @property
    def mark_delete_position(self) -> Position:
        """Everything at or below this position is acknowledged."""
        return self._md

    @property
    def acked(self) -> AckRangeSet:
        """The acknowledgments beyond mark-delete (Pulsar's
        individuallyDeletedMessages)."""
        return self._acked

    def _advance(self) -> None:
        """Move mark-delete over an acknowledged run that starts right after
        it, as often as one does (across ledger ends), dropping those ranges."""
        acked = self._acked
        while True:
            first = acked.first_range()
            if first is None:
                return
            lower, upper = first
            if lower > self._md:
                nxt = self._next_entry(self._md)
                if nxt is not None and nxt <= lower:
                    return                      # an unacknowledged entry is in between
            self._md = max(self._md, upper)
            acked.remove_at_most(self._md)

    def ack(self, position) -> bool:
        """ack acknowledges one entry.  Returns False if it already was (at or
        below mark-delete, or in a range).  When it closes the gap after
        mark-delete, mark-delete advances over the acknowledged run.
        ValueError for a position that is not an entry of the ledgers."""
        pos = self._entry(position)
        if pos <= self._md or not self._acked.add(pos):
            return False
        self._advance()
        return True

    def ack_cumulative(self, position) -> None:
        """ack_cumulative acknowledges everything up to ``position``:
        mark-delete moves there if that is beyond it (else nothing changes),
        the ranges below are dropped, and mark-delete then advances over an
        acknowledged run that follows, across ledgers."""
        pos = self._entry(position)
        if pos <= self._md:
            return
        self._md = pos
        self._acked.remove_at_most(pos)
        self._advance()

    # ---- holes -----------------------------------------------------------------------

    def holes(self, read_position) -> Iterator[Position]:
        """holes yields, ascending, the entries after mark-delete and before
        ``read_position`` that are not acknowledged."""
        read = as_position(read_position, "read_position")
        return self._holes(read)

    def _holes(self, read: Position) -> Iterator[Position]:
        for ledger, start, stop in self._windows(read):
            e = start
            for lo, hi in self._acked._ledger_spans(ledger, start, stop):
                for x in range(e, min(lo + 1, stop)):
                    yield (ledger, x)
                e = hi + 1
            for x in range(e, stop):
                yield (ledger, x)

    def backlog(self, read_position) -> int:
        """backlog counts the holes before ``read_position`` (the definition of
        the seed's Figure 3; Pulsar's msgBacklog also counts unread entries)."""
        read = as_position(read_position, "read_position")
        total = 0
        for ledger, start, stop in self._windows(read):
            total += stop - start - self._acked_within(ledger, start, stop)
        return total

    def _acked_within(self, ledger: int, start: int, stop: int) -> int:
        """Acknowledged entries of ``ledger`` in start..stop-1."""
        n = 0
        for lo, hi in self._acked._ledger_spans(ledger, start, stop):
            a = max(lo + 1, start)
            if a >= stop:
                break
            n += min(hi + 1, stop) - a
        return n

    def _holes_through(self, position: Position) -> int:
        """Holes in (mark-delete, position]."""
        nxt = self._next_entry(position)
        if nxt is None:
            nxt = (position[0], position[1] + 1)
        return self.backlog(nxt)

    def recover(self, records) -> None:
        """recover replaces ``acked`` with persisted ``to_records()`` output.
        A record across ledgers ``((L1, e1), (L2, e2)]`` is split per ledger
        as Pulsar's recovery does: ``((L1, e1), (L1, n1 - 1)]``, the whole of
        every ledger in between, then ``((L2, -1), (L2, e2)]``.  Parts that
        are empty, lie in ledgers not in ``ledgers`` or beyond a ledger's
        last entry are skipped.  Then ranges at or below mark-delete are
        dropped and mark-delete advances over a run starting right after it.
        ValueError for a record whose upper is below its lower; the set is
        unchanged then."""
        parts = []
        for rec in records:
            lower, upper = _pair(rec, "a record must be a (lower, upper) pair")
            lower = as_position(lower, "lower")
            upper = as_position(upper, "upper")
            if upper < lower:
                raise ValueError(f"record ({fmt(lower)}..{fmt(upper)}]: upper is below lower")
            parts.extend(self._split(lower, upper))
        self._acked._clear()
        for ledger, a, b in parts:
            self._acked.add_range((ledger, a), (ledger, b))
        self._acked.remove_at_most(self._md)
        self._advance()

    def _split(self, lower: Position, upper: Position) -> Iterator[tuple[int, int, int]]:
        (l1, e1), (l2, e2) = lower, upper
        ids = self._ids
        for k in range(bisect_left(ids, l1), bisect_right(ids, l2)):
            ledger = ids[k]
            last = self._count[ledger] - 1
            a = e1 if ledger == l1 else -1
            b = min(e2, last) if ledger == l2 else last
            if a < b:
                yield ledger, a, b

    def __copy__(self) -> "Cursor":
        """An independent cursor with the same ledgers and acknowledgments."""
        other = Cursor.__new__(Cursor)
        other._ids = list(self._ids)
        other._count = dict(self._count)
        other._md = self._md
        other._acked = self._acked.__copy__()
        return other

    def __deepcopy__(self, memo) -> "Cursor":
        return self.__copy__()

    def __repr__(self) -> str:
        return (f"Cursor(mark_delete={fmt(self._md)}, ranges={len(self._acked)}, "
                f"ledgers={len(self._ids)})")


class HoleCompensator:
    """HoleCompensator finds the holes to redeliver (Tencent's compensation
    task): acknowledgment holes that were sent to a consumer more than
    ``min_age_ms`` ago and are still not acknowledged."""

    __slots__ = ("cursor", "min_age_ms")

    def __init__(self, cursor: Cursor, *, min_age_ms: int) -> None:
        self.cursor = cursor
        self.min_age_ms = min_age_ms

    def __setattr__(self, name, value):
        # The settings stay valid when changed later, not only at __init__.
        if name == "cursor":
            as_cursor(value)
        elif name == "min_age_ms":
            value = _time(value, "min_age_ms")
            if value < 0:
                raise ValueError(f"min_age_ms must be >= 0, got {value}")
        object.__setattr__(self, name, value)

    def due(self, read_position, now_ms: int, sent_at: Mapping[Position, int]) -> list[Position]:
        """due returns, ascending, the holes before ``read_position`` that are
        in ``sent_at`` and were sent more than ``min_age_ms`` before
        ``now_ms``.  Holes missing from ``sent_at`` are not due; ``sent_at``
        is not modified.  Times are finite numbers (NaN or an infinity is a
        ValueError, as a key that is not a position is a TypeError)."""
        cur = self.cursor
        read = as_position(read_position, "read_position")
        now_ms = _time(now_ms, "now_ms")
        if not isinstance(sent_at, Mapping):
            raise TypeError(f"sent_at must be a Mapping of position to send time, got "
                            f"{type(sent_at).__name__}")
        # Checked and normalised once: foreign keys never meet a comparison.
        sent = {}
        for key, t in sent_at.items():
            pos = as_position(key, "a sent_at key")
            sent[pos] = _time(t, "a sent_at time")
        age = self.min_age_ms
        md, acked, count = cur._md, cur._acked, cur._count
        if len(sent) < 64 or len(sent) * 4 < cur.backlog(read):
            # Few sends on record: check each one instead of walking every hole.
            out = []
            for pos, t in sent.items():
                if (now_ms - t > age and md < pos < read and 0 <= pos[1] < count.get(pos[0], 0)
                        and not acked.contains(pos)):
                    out.append(pos)
            out.sort()
            return out
        return [p for p in cur._holes(read) if p in sent and now_ms - sent[p] > age]


def as_cursor(value) -> Cursor:
    """``value`` if it is a Cursor, else a TypeError naming what it is."""
    if not isinstance(value, Cursor):
        raise TypeError(f"cursor must be a Cursor, got {type(value).__name__}")
    return value


def _pair(item, message: str) -> tuple:
    """The two values of ``item``, or a TypeError: ``message``, got what."""
    try:
        first, second = item
    except (TypeError, ValueError):
        raise TypeError(f"{message}, got {show(item)}") from None
    return first, second


def _time(value, what: str):
    """A time in ms: an int or a float, finite and within +-2**63 (NaN and
    infinities are a ValueError; bool and other types a TypeError)."""
    t = type(value)
    if t is not int and t is not float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what} must be a number, got {show(value)}")
        value = int.__index__(value) if isinstance(value, int) else float.__float__(value)
    if not -2**63 <= value <= 2**63:        # false for NaN
        raise ValueError(f"{what} must be a finite number within +-2**63, got {show(value)}")
    return value
