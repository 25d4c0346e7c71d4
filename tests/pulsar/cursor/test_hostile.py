"""The cursor library under misuse (issue 18): the hostile-argument matrix
over every public constructor and method, NaN and infinities wherever a
time, size or limit is taken, ids past 2**63 - 1, both ack paths raising
alike, and exceptions (KeyboardInterrupt included) from the caller's
mappings and iterables leaving the cursor consistent."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import pytest

from pylimiter.pulsar.cursor import (
    AckRangeSet,
    BacklogQuota,
    Cursor,
    EntryMeta,
    Expirer,
    HoleCompensator,
    is_entry_expired,
)
from pylimiter.pulsar.cursor import ranges as ranges_mod

from ..hostile import hostile_values, memory_cap, outcome, run_isolated


def check_cursor(c: Cursor):
    """What holds after anything: ranges coalesced, ascending, above
    mark-delete, within the ledgers; the counts add up."""
    s = c.acked
    rs = s.ranges()
    assert len(rs) == len(s)
    assert s.cardinality == sum(b[1] - a[1] for a, b in rs)
    for (a, b), nxt in zip(rs, rs[1:] + [None]):
        assert a[0] == b[0] and a[1] < b[1]
        assert b > c.mark_delete_position
        if nxt is not None:
            assert b[0] < nxt[0][0] or b[1] < nxt[0][1]
    n = len(s._hi)
    assert len(s._maxes) == max(n - 1, 0)
    assert all(0 < len(h) <= ranges_mod._MAX_CHUNK for h in s._hi)


def make_cursor():
    c = Cursor([(1, 20), (2, 0), (3, 10)], (1, 2))
    for e in (4, 5, 9, 15):
        c.ack((1, e))
    c.ack((3, 7))
    return c


class Pairs(Mapping):
    """A mapping kept as a list of pairs, so any key fits (even unhashable
    or uncomparable ones): what a caller's own Mapping may hold."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __getitem__(self, key):
        for k, v in self.pairs:
            if k is key:
                return v
        raise KeyError(key)

    def __iter__(self):
        return (k for k, _ in self.pairs)

    def __len__(self):
        return len(self.pairs)


def _targets():
    """(label, call(x, cursor)) for every public constructor and method."""
    s = AckRangeSet()
    s.add((1, 3))
    q = BacklogQuota(100, 10, "consumer_backlog_eviction")
    sizes = {(led, e): 10 for led in (1, 3) for e in range(20)}
    return [
        ("AckRangeSet.add(position)", lambda x, c: s.add(x)),
        ("AckRangeSet.add(ledger)", lambda x, c: s.add((x, 4))),
        ("AckRangeSet.add(entry)", lambda x, c: s.add((1, x))),
        ("AckRangeSet.add_range(lower)", lambda x, c: s.add_range((1, x), (1, 9))),
        ("AckRangeSet.add_range(upper)", lambda x, c: s.add_range((1, 7), (1, x))),
        ("AckRangeSet.remove_at_most", lambda x, c: s.remove_at_most((x, 0))),
        ("AckRangeSet.contains", lambda x, c: s.contains((1, x))),
        ("AckRangeSet.to_records", lambda x, c: s.to_records(x)),
        ("Cursor(ledgers)", lambda x, c: Cursor(x, (1, -1))),
        ("Cursor(ledger count)", lambda x, c: Cursor([(1, x)], (1, -1))),
        ("Cursor(mark_delete)", lambda x, c: Cursor([(1, 5)], x)),
        ("Cursor.append_ledger(id)", lambda x, c: c.append_ledger(x, 3)),
        ("Cursor.append_ledger(count)", lambda x, c: c.append_ledger(10, x)),
        ("Cursor.ack", lambda x, c: c.ack((1, x))),
        ("Cursor.ack(position)", lambda x, c: c.ack(x)),
        ("Cursor.ack_cumulative", lambda x, c: c.ack_cumulative((3, x))),
        ("Cursor.holes", lambda x, c: list(c.holes((x, 5)))),
        ("Cursor.backlog", lambda x, c: c.backlog((3, x))),
        ("Cursor.recover", lambda x, c: c.recover([((1, 2), (1, x))])),
        ("Cursor.recover(records)", lambda x, c: c.recover(x)),
        ("HoleCompensator(min_age_ms)", lambda x, c: HoleCompensator(c, min_age_ms=x)),
        ("HoleCompensator(cursor)", lambda x, c: HoleCompensator(x, min_age_ms=1)),
        ("HoleCompensator.due(now_ms)",
         lambda x, c: HoleCompensator(c, min_age_ms=1).due((3, 9), x, {(1, 3): 0})),
        ("HoleCompensator.due(sent time)",
         lambda x, c: HoleCompensator(c, min_age_ms=1).due((3, 9), 100, {(1, 3): x})),
        ("HoleCompensator.due(sent key)",
         lambda x, c: HoleCompensator(c, min_age_ms=1).due((3, 9), 100, Pairs([(x, 0)]))),
        ("HoleCompensator.min_age_ms=",
         lambda x, c: setattr(HoleCompensator(c, min_age_ms=1), "min_age_ms", x)),
        ("is_entry_expired(ttl)", lambda x, c: is_entry_expired(x, 0, 10)),
        ("is_entry_expired(publish)", lambda x, c: is_entry_expired(1, x, 10)),
        ("is_entry_expired(now)", lambda x, c: is_entry_expired(1, 0, x)),
        ("is_entry_expired(deliver_at)", lambda x, c: is_entry_expired(1, 0, 10,
                                                                       deliver_at_ms=x)),
        ("is_entry_expired(delayed)", lambda x, c: is_entry_expired(1, 0, 10, delayed=x)),
        ("Expirer(ttl)", lambda x, c: Expirer(c, x)),
        ("Expirer(delayed)", lambda x, c: Expirer(c, 1, delayed=x)),
        ("Expirer.ttl_seconds=", lambda x, c: setattr(Expirer(c, 1), "ttl_seconds", x)),
        ("Expirer.expire(now)", lambda x, c: Expirer(c, 1).expire([EntryMeta((1, 3), 0)], x)),
        ("Expirer.expire(publish)",
         lambda x, c: Expirer(c, 1).expire([EntryMeta((1, 3), x)], 10**6)),
        ("Expirer.expire(publish rule)",
         lambda x, c: Expirer(c, 1, delayed="publish").expire([EntryMeta((1, 3), x)], 10**6)),
        ("Expirer.expire(entries)", lambda x, c: Expirer(c, 1).expire(x, 10**6)),
        ("BacklogQuota(limit_size)", lambda x, c: BacklogQuota(x)),
        ("BacklogQuota(limit_time_s)", lambda x, c: BacklogQuota(10, x)),
        ("BacklogQuota(policy)", lambda x, c: BacklogQuota(10, 10, x)),
        ("BacklogQuota.limit_time_s=", lambda x, c: setattr(q, "limit_time_s", x)),
        ("BacklogQuota.check(size)", lambda x, c: q.check(x, 0)),
        ("BacklogQuota.check(age)", lambda x, c: q.check(0, x)),
        ("BacklogQuota.evict(target)", lambda x, c: q.evict(c, (3, 9), sizes, x)),
        ("BacklogQuota.evict(size)",
         lambda x, c: q.evict(c, (3, 9), {**sizes, (1, 6): x}, 5)),
        ("BacklogQuota.evict(read)", lambda x, c: q.evict(c, (x, 3), sizes, 5)),
        ("BacklogQuota.evict(sizes)", lambda x, c: q.evict(c, (3, 9), x, 5)),
    ]


@pytest.mark.parametrize("label", [t[0] for t in _targets()])
def test_hostile_argument_matrix(label):
    """Each call works or raises TypeError/ValueError, and the cursor stays
    consistent."""
    for _name, value in hostile_values():
        c = make_cursor()
        call = dict(_targets())[label]
        with memory_cap():
            outcome(call, value, c)
        check_cursor(c)


# ---- NaN and infinities (item 7) -------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_backlog_eviction_refuses_nan_and_inf(bad):
    # A NaN target (or one NaN size) made `total <= target` always false:
    # every hole was acknowledged, the whole backlog dropped.
    q = BacklogQuota(100, -1, "consumer_backlog_eviction")
    for target, sizes in ((bad, {}), (0, {(1, 3): bad})):
        c = make_cursor()
        sizes = {**{(led, e): 10 for led in (1, 3) for e in range(20)}, **sizes}
        before = (c.mark_delete_position, c.acked.ranges())
        with pytest.raises(ValueError):
            q.evict(c, (3, 9), sizes, target)
        assert (c.mark_delete_position, c.acked.ranges()) == before
    with pytest.raises(ValueError):
        q.check(bad, 0)
    with pytest.raises(ValueError):
        q.check(0, bad)
    with pytest.raises(ValueError):
        BacklogQuota(10, bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_every_time_refuses_nan_and_inf(bad):
    c = make_cursor()
    for call in (lambda: is_entry_expired(bad, 0, 10), lambda: is_entry_expired(1, bad, 10),
                 lambda: is_entry_expired(1, 0, bad),
                 lambda: is_entry_expired(1, 0, 10, deliver_at_ms=bad),
                 lambda: Expirer(c, bad), lambda: Expirer(c, 1).expire([], bad),
                 lambda: HoleCompensator(c, min_age_ms=bad),
                 lambda: HoleCompensator(c, min_age_ms=0).due((3, 5), bad, {}),
                 lambda: HoleCompensator(c, min_age_ms=0).due((3, 5), 10, {(1, 3): bad})):
        with pytest.raises(ValueError):
            call()


def test_eviction_still_evicts_oldest_first():
    q = BacklogQuota(100, -1, "consumer_backlog_eviction")
    c = make_cursor()
    holes = list(c.holes((3, 9)))
    sizes = {h: 10 for h in holes}
    assert q.evict(c, (3, 9), sizes, 10 * (len(holes) - 3)) == 3
    assert list(c.holes((3, 9))) == holes[3:]
    check_cursor(c)


def test_eviction_stops_at_the_first_hole_without_a_size():
    # Ledgers that claim 2**62 entries: the walk costs what the sizes hold
    # (the old evict listed every hole first and ran out of memory).  In a
    # child with 1 GiB of address space, so a regression cannot take the
    # machine's memory with it.
    out = run_isolated("""
from pylimiter.pulsar.cursor import BacklogQuota, Cursor
c = Cursor([(1, 2**62)], (1, -1))
q = BacklogQuota(1, -1, "consumer_backlog_eviction")
sizes = {(1, e): 5 for e in range(100)}
try:
    q.evict(c, (1, 2**62), sizes, 0)
except ValueError as exc:
    print(exc)
assert c.mark_delete_position == (1, -1)
""", timeout=60, memory_limit=1 << 30)
    assert "no size for hole 1:100" in out


# ---- ids and the two ack paths (item 11) -----------------------------------------------------


def test_append_ledger_refuses_ids_past_int64():
    c = Cursor([(1, 5)], (1, -1))
    with pytest.raises(ValueError):
        c.append_ledger(2**63, 1)
    with pytest.raises(ValueError):
        c.append_ledger(7, 2**63 + 1)
    c.append_ledger(2**63 - 1, 2**63)
    assert c.ack((2**63 - 1, 2**63 - 1))
    check_cursor(c)


@pytest.mark.parametrize("entry", [2**63, 2**64, -2, "5", 5.0, None, True])
def test_fast_and_slow_ack_paths_raise_the_same_types(entry):
    # The in-order fast path once let an entry past 2**63 - 1 fail with
    # OverflowError (an array write) where the slow path said ValueError.
    fast = AckRangeSet()
    fast.add((1, 5))                    # (1, entry) would go at the tail: fast path
    slow = AckRangeSet()
    slow.add((2, 5))                    # (1, entry) goes before it: slow path
    errors = []
    for s in (fast, slow):
        with pytest.raises((TypeError, ValueError)) as info:
            s.add((1, entry))
        errors.append(type(info.value))
    assert errors[0] is errors[1]
    assert fast.ranges() == [((1, 4), (1, 5))] and slow.ranges() == [((2, 4), (2, 5))]


def test_copies_are_independent():
    c = make_cursor()
    d = copy.copy(c)
    e = copy.deepcopy(c)
    d.ack((1, 3))
    e.ack((3, 0))
    assert c.mark_delete_position == (1, 2) and d.mark_delete_position == (1, 5)
    assert not c.acked.contains((3, 1)) and e.mark_delete_position == (1, 2)
    for x in (c, d, e):
        check_cursor(x)


# ---- exceptions from the caller's objects (item 5) -------------------------------------------


class Interrupting(Mapping):
    """A mapping whose n-th lookup raises KeyboardInterrupt."""

    def __init__(self, data, n):
        self.data, self.n, self.calls = data, n, 0

    def __getitem__(self, key):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.data[key]

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


def test_keyboard_interrupt_from_the_sizes_acks_nothing():
    c = make_cursor()
    before = (c.mark_delete_position, c.acked.ranges())
    q = BacklogQuota(1, -1, "consumer_backlog_eviction")
    sizes = Interrupting({(led, e): 10 for led in (1, 3) for e in range(20)}, 4)
    with pytest.raises(KeyboardInterrupt):
        q.evict(c, (3, 9), sizes, 0)
    assert (c.mark_delete_position, c.acked.ranges()) == before
    check_cursor(c)


def test_keyboard_interrupt_from_the_entries_keeps_what_was_done():
    c = make_cursor()

    def entries():
        yield EntryMeta((1, 3), 0)
        yield EntryMeta((1, 6), 0)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Expirer(c, 1).expire(entries(), 10**6)
    # The two expired entries before the interrupt are acknowledged, each
    # completely (mark-delete moved over 3, 4, 5 and 6).
    assert c.mark_delete_position == (1, 6)
    check_cursor(c)


def test_keyboard_interrupt_from_sent_at_changes_nothing():
    c = make_cursor()
    comp = HoleCompensator(c, min_age_ms=1)

    class Sent(Mapping):
        def __getitem__(self, key):
            raise KeyboardInterrupt

        def __iter__(self):
            return iter([(1, 3)])

        def __len__(self):
            return 1

    with pytest.raises(KeyboardInterrupt):
        comp.due((3, 9), 100, Sent())
    assert comp.due((3, 9), 100, {(1, 3): 0}) == [(1, 3)]
    check_cursor(c)
