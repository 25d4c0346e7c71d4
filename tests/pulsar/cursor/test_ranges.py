"""AckRangeSet: ranges (lower, upper] per ledger, coalesced, checked against
a plain set of positions."""

from __future__ import annotations

import random
import sys
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylimiter.pulsar.cursor import AckRangeSet
from pylimiter.pulsar.cursor import ranges as ranges_mod


def test_add_coalesces_with_both_neighbours():
    s = AckRangeSet()
    assert s.add((5, 1)) and s.add((5, 3))
    assert s.ranges() == [((5, 0), (5, 1)), ((5, 2), (5, 3))]
    assert len(s) == 2
    assert s.add((5, 2))                        # fills the gap: one range
    assert s.ranges() == [((5, 0), (5, 3))]
    assert len(s) == 1 and s.cardinality == 3
    assert s.add((5, 0)) and s.add((5, 4))      # extends below and above
    assert s.ranges() == [((5, -1), (5, 4))]


def test_adding_inside_an_existing_range_changes_nothing():
    s = AckRangeSet()
    s.add_range((5, 1226), (5, 1280))
    before = s.ranges()
    assert s.add((5, 1250)) is False
    assert s.add((5, 1280)) is False
    assert s.add((5, 1227)) is False
    assert s.ranges() == before and s.cardinality == 54
    assert not s.contains((5, 1226)) and s.contains((5, 1227)) and s.contains((5, 1280))
    assert (5, 1281) not in s
    s.add_range((5, 1230), (5, 1240))           # inside: no change
    assert s.ranges() == before and len(s) == 1


def test_ranges_never_span_ledgers():
    s = AckRangeSet()
    for e in range(3):
        s.add((1, e))
    s.add((2, 0))
    s.add((2, 1))
    assert s.ranges() == [((1, -1), (1, 2)), ((2, -1), (2, 1))]
    assert len(s) == 2 and s.cardinality == 5
    with pytest.raises(ValueError, match="spans ledgers 1 and 2"):
        s.add_range((1, 2), (2, 3))


def test_add_range_merges_every_range_it_touches():
    s = AckRangeSet()
    for e in (2, 5, 6, 9, 20):
        s.add((3, e))
    s.add_range((3, 2), (3, 9))                 # touches (1,2] and overlaps (4,6], (8,9]
    assert s.ranges() == [((3, 1), (3, 9)), ((3, 19), (3, 20))]
    assert s.cardinality == 9
    s.add_range((3, 4), (3, 4))                 # lower == upper: nothing
    assert s.cardinality == 9
    with pytest.raises(ValueError, match="upper is below lower"):
        s.add_range((3, 5), (3, 4))


def test_remove_at_most_in_the_middle_of_a_range():
    s = AckRangeSet()
    s.add_range((1, 3), (1, 8))
    s.add_range((2, -1), (2, 4))
    s.add_range((2, 10), (2, 20))
    s.remove_at_most((2, 15))                   # ledger 1 gone, (2,-1..4] gone, cut at 15
    assert s.ranges() == [((2, 15), (2, 20))]
    assert s.cardinality == 5 and len(s) == 1
    assert not s.contains((2, 15)) and s.contains((2, 16))
    s.remove_at_most((2, 20))
    assert s.ranges() == [] and len(s) == 0 and s.cardinality == 0
    assert s.first_range() is None
    assert s.add((2, 30))                       # usable after emptying
    assert s.first_range() == ((2, 29), (2, 30))


def test_remove_at_most_below_everything_keeps_all():
    s = AckRangeSet()
    s.add_range((4, 10), (4, 12))
    s.remove_at_most((4, 5))
    s.remove_at_most((3, 100))
    assert s.ranges() == [((4, 10), (4, 12))]


def test_positions_accept_lists_and_return_tuples():
    s = AckRangeSet()
    assert s.add([7, 3])
    s.add_range([7, 10], [7, 12])
    assert s.contains([7, 11])
    assert s.ranges() == [((7, 2), (7, 3)), ((7, 10), (7, 12))]
    assert all(type(p) is tuple for r in s.ranges() for p in r)
    assert s.first_range() == ((7, 2), (7, 3))


@pytest.mark.parametrize("bad, exc", [
    (5, TypeError), ((1,), TypeError), ((1, 2, 3), TypeError), (("1", 2), TypeError),
    ((1.0, 2), TypeError), ((True, 2), TypeError), ((1, -1), ValueError), ((-1, 2), ValueError),
])
def test_bad_positions_are_refused_at_the_call(bad, exc):
    s = AckRangeSet()
    with pytest.raises(exc):
        s.add(bad)
    assert s.cardinality == 0 and len(s) == 0


def test_ids_beyond_64_bits_are_refused_without_changing_the_set():
    s = AckRangeSet()
    s.add((1, 5))
    for bad in [(1, 2**63), (1, 2**63 + 7), (2**63, 0)]:
        with pytest.raises((ValueError, OverflowError)):
            s.add(bad)
        assert s.ranges() == [((1, 4), (1, 5))] and s.cardinality == 1
    with pytest.raises(ValueError, match="64-bit"):
        s.add_range((1, 10), (1, 2**63))
    assert s.add((1, 2**63 - 1))
    assert s.ranges() == [((1, 4), (1, 5)), ((1, 2**63 - 2), (1, 2**63 - 1))]


def test_to_records_caps_the_number_of_ranges():
    s = AckRangeSet()
    for e in range(0, 20, 2):
        s.add((1, e))
    assert len(s.to_records()) == 10
    assert s.to_records(3) == [((1, -1), (1, 0)), ((1, 1), (1, 2)), ((1, 3), (1, 4))]
    assert s.to_records(0) == []
    assert s.to_records(100) == s.ranges()
    with pytest.raises(ValueError):
        s.to_records(-1)
    with pytest.raises(TypeError):
        s.to_records(2.5)


@pytest.mark.parametrize("pattern", ["sequential", "sparse-same-ledger", "one-per-ledger"])
def test_sizeof_is_about_24_bytes_per_range_whatever_the_pattern(pattern):
    # 24 bytes per range (ledger, lower, upper as int64) plus the chunks'
    # arrays and over-allocation; one ack per ledger once cost ~340 bytes.
    n = 20000
    positions = {"sequential": [(1, 2 * i) for i in range(n)],
                 "sparse-same-ledger": random.Random(3).sample([(1, 2 * i) for i in range(n)], n),
                 "one-per-ledger": [(i, 0) for i in range(n)]}[pattern]
    s = AckRangeSet()
    empty = sys.getsizeof(s)
    for p in positions:
        s.add(p)
    assert len(s) == n
    per_range = (sys.getsizeof(s) - empty) / len(s)
    assert 24 <= per_range < 28
    assert f"ranges={n}" in repr(s)


# ---- against a plain set of positions -------------------------------------------------

def _runs(model):
    """The coalesced (lower, upper] ranges of a set of positions."""
    out = []
    for ledger, entry in sorted(model):
        if out and out[-1][1] == (ledger, entry - 1):
            out[-1] = (out[-1][0], (ledger, entry))
        else:
            out.append(((ledger, entry - 1), (ledger, entry)))
    return out


ledgers = st.integers(0, 3)
entries = st.integers(0, 40)
ops = st.one_of(
    st.tuples(st.just("add"), ledgers, entries),
    st.tuples(st.just("range"), ledgers, st.integers(-1, 40), st.integers(0, 12)),
    st.tuples(st.just("remove"), ledgers, st.integers(-1, 41)),
)


def _check_layout(s):
    """The chunked layout's invariants: chunks non-empty and within bounds,
    _maxes matching every chunk but the last, one ascending sequence."""
    n = len(s._hi)
    assert len(s._maxes) == max(n - 1, 0)
    flat = []
    for k in range(n):
        assert 0 < len(s._hi[k]) == len(s._lo[k]) == len(s._led[k]) <= ranges_mod._MAX_CHUNK
        if k < n - 1:
            assert s._maxes[k] == (s._led[k][-1], s._hi[k][-1])
        flat.extend(zip(s._led[k], s._lo[k], s._hi[k]))
    assert flat == sorted(flat) and len(flat) == len(s)
    for (l1, _, h1), (l2, lo2, _) in zip(flat, flat[1:]):
        assert l1 < l2 or h1 < lo2                  # disjoint, never touching


def _replay(operations, probes):
    s = AckRangeSet()
    model = set()
    for op in operations:
        if op[0] == "add":
            _, ledger, entry = op
            assert s.add((ledger, entry)) == ((ledger, entry) not in model)
            model.add((ledger, entry))
        elif op[0] == "range":
            _, ledger, lower, width = op
            s.add_range((ledger, lower), (ledger, lower + width))
            model.update((ledger, e) for e in range(lower + 1, lower + width + 1))
        else:
            _, ledger, entry = op
            s.remove_at_most((ledger, entry))
            model = {p for p in model if p > (ledger, entry)}
        assert s.cardinality == len(model)
        _check_layout(s)
    runs = _runs(model)
    assert s.ranges() == runs
    assert len(s) == len(runs)
    assert s.first_range() == (runs[0] if runs else None)
    assert s.to_records(2) == runs[:2]
    for p in probes:
        assert s.contains(p) == (p in model)
        ledger, start = p[0], max(p[1], 0)
        for stop in (start, start + 3, 50):
            want = [(a[1], b[1]) for a, b in runs
                    if a[0] == ledger and b[1] >= start and a[1] < stop]
            assert s._ledger_spans(ledger, start, stop) == want


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=60), st.lists(st.tuples(ledgers, st.integers(-1, 41)),
                                             max_size=20))
def test_matches_a_plain_set_of_positions(operations, probes):
    _replay(operations, probes)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=80), st.lists(st.tuples(ledgers, st.integers(-1, 41)),
                                             max_size=20))
def test_matches_a_plain_set_with_tiny_chunks(operations, probes):
    # Chunks of 2..4 ranges: every split, merge and cross-chunk coalesce path
    # runs on small inputs.
    saved = ranges_mod._MAX_CHUNK, ranges_mod._MIN_CHUNK
    ranges_mod._MAX_CHUNK, ranges_mod._MIN_CHUNK = 4, 2
    try:
        _replay(operations, probes)
    finally:
        ranges_mod._MAX_CHUNK, ranges_mod._MIN_CHUNK = saved


class _CountingArray(array):
    """array('q') that counts the elements an insert or a delete shifts."""

    moved = 0

    def insert(self, i, x):
        _CountingArray.moved += len(self) - min(max(i, 0), len(self))
        super().insert(i, x)

    def __delitem__(self, key):
        n = len(self)
        if isinstance(key, slice):
            start, stop, _ = key.indices(n)
            _CountingArray.moved += n - max(stop, start)
        else:
            _CountingArray.moved += n - (key % n) - 1
        super().__delitem__(key)


def test_random_order_acks_shift_a_bounded_number_of_elements(monkeypatch):
    # 400k acks in random order once took 28 s: every insert shifted every
    # range after it (O(n) each, O(n**2) in all).  Counted, not timed: with
    # chunks an insert shifts at most one chunk, whatever the set holds.
    monkeypatch.setattr(ranges_mod, "array", _CountingArray)
    _CountingArray.moved = 0
    n = 60000
    s = AckRangeSet()
    for e in random.Random(5).sample(range(0, 2 * n, 2), n):
        s.add((1, e))
    for e in random.Random(6).sample(range(1, 2 * n, 2), n // 2):   # coalesce half of them
        s.add((1, e))
    assert len(s) == n - n // 2 and s.cardinality == n + n // 2
    # At most three arrays x one chunk (<= 1024 ranges) per operation: 2.8e8
    # at most (the quadratic layout shifted ~1.8e9 elements here).
    assert _CountingArray.moved <= 3 * (n + n // 2) * 1024
    assert ranges_mod._MAX_CHUNK <= 1024
