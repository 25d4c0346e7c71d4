"""Cursor: mark-delete advance, cumulative ack, holes and backlog, recovery;
HoleCompensator."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pylimiter.pulsar.cursor import AckRangeSet, Cursor, HoleCompensator


def test_pulsar_ack_1_2_4_5_then_3():
    # Pulsar's ManagedCursorTest: entries 1..5 after mark-delete 0.
    c = Cursor([(3, 10)], (3, 0))
    for e in (1, 2, 4, 5):
        assert c.ack((3, e))
    assert c.mark_delete_position == (3, 2)
    assert c.acked.ranges() == [((3, 3), (3, 5))]
    assert c.ack((3, 3))
    assert c.mark_delete_position == (3, 5)
    assert c.acked.ranges() == [] and len(c.acked) == 0


def test_mark_delete_advances_exactly_when_the_first_gap_closes():
    c = Cursor([(1, 10)], (1, -1))
    c.ack((1, 2))
    c.ack((1, 1))
    assert c.mark_delete_position == (1, -1)     # entry 0 is still a hole
    assert c.ack((1, 0))
    assert c.mark_delete_position == (1, 2)
    assert c.ack((1, 2)) is False and c.ack((1, 0)) is False   # at or below mark-delete
    c.ack((1, 4))
    assert c.ack((1, 4)) is False                # already in a range
    assert c.mark_delete_position == (1, 2)


def test_acknowledged_run_is_followed_across_ledgers():
    # Ledger 2 is empty (skipped); the run ends ledger 1 and goes on in ledger 3.
    c = Cursor([(1, 3), (2, 0), (3, 4)], (1, -1))
    c.ack((3, 0))
    c.ack((3, 1))
    c.ack((1, 1))
    c.ack((1, 2))
    assert c.mark_delete_position == (1, -1)
    c.ack((1, 0))
    assert c.mark_delete_position == (3, 1)
    assert c.acked.ranges() == []


def test_cumulative_ack_moves_forward_only_then_follows_a_run():
    c = Cursor([(1, 5), (4, 5)], (1, -1))
    c.ack((1, 3))
    c.ack((4, 0))
    c.ack((4, 2))
    c.ack_cumulative((1, 1))
    assert c.mark_delete_position == (1, 1)
    assert c.acked.ranges() == [((1, 2), (1, 3)), ((4, -1), (4, 0)), ((4, 1), (4, 2))]
    c.ack_cumulative((1, 4))                     # drops (1,2..3], then follows 4:0
    assert c.mark_delete_position == (4, 0)
    assert c.acked.ranges() == [((4, 1), (4, 2))]
    c.ack_cumulative((1, 0))                     # behind mark-delete: nothing changes
    assert c.mark_delete_position == (4, 0)
    c.ack_cumulative((4, 1))
    assert c.mark_delete_position == (4, 2) and c.acked.ranges() == []


def test_holes_and_backlog_follow_figure_3():
    # M0..M5 read; M2 and M4 were never acknowledged.
    c = Cursor([(1, 8)], (1, -1))
    for e in (0, 1, 3, 5):
        c.ack((1, e))
    read = (1, 6)
    assert list(c.holes(read)) == [(1, 2), (1, 4)]
    assert c.backlog(read) == 2
    assert c.mark_delete_position == (1, 1)
    assert list(c.holes((1, 3))) == [(1, 2)]     # read position bounds the holes
    assert c.backlog((9, 0)) == 4                # everything published: 2, 4, 6, 7
    assert list(c.holes((1, 2))) == [] and c.backlog((1, 0)) == 0


def test_holes_span_ledgers_and_skip_empty_ones():
    c = Cursor([(1, 3), (2, 0), (5, 3)], (1, 0))
    c.ack((5, 1))
    assert list(c.holes((5, 3))) == [(1, 1), (1, 2), (5, 0), (5, 2)]
    assert c.backlog((5, 3)) == 4


def test_positions_outside_the_ledgers_are_refused():
    c = Cursor([(1, 3), (3, 2)], (1, -1))
    for bad in [(1, 3), (2, 0), (3, 2), (0, 0), (1, -1)]:
        with pytest.raises(ValueError, match="not an entry"):
            c.ack(bad)
        with pytest.raises(ValueError, match="not an entry"):
            c.ack_cumulative(bad)
    assert c.mark_delete_position == (1, -1) and len(c.acked) == 0
    c.append_ledger(7, 2)
    assert c.ack((7, 1))
    with pytest.raises(ValueError, match="must increase"):
        c.append_ledger(7, 1)
    with pytest.raises(ValueError, match="entry_count"):
        c.append_ledger(9, -1)


@pytest.mark.parametrize("ledgers, md, message", [
    ([(2, 1), (1, 1)], (2, -1), "must increase"),
    ([(1, 3)], (2, -1), "not an entry"),
    ([(1, 3)], (1, 3), "not an entry"),
    ([], (1, -1), "not an entry"),
])
def test_bad_construction(ledgers, md, message):
    with pytest.raises(ValueError, match=message):
        Cursor(ledgers, md)


def test_records_round_trip_and_a_record_across_ledgers_is_split():
    ledgers = [(1, 10), (2, 5), (3, 0), (4, 6)]
    c = Cursor(ledgers, (1, -1))
    for p in [(1, 3), (1, 4), (2, 0), (4, 2)]:
        c.ack(p)
    records = c.acked.to_records()
    d = Cursor(ledgers, (1, -1))
    d.recover(records)
    assert d.acked.ranges() == c.acked.ranges()
    # A record written by a broker that merged ledgers: ((1,7), (4,1)].
    d.recover([((1, 7), (4, 1))])
    assert d.acked.ranges() == [((1, 7), (1, 9)), ((2, -1), (2, 4)), ((4, -1), (4, 1))]
    assert d.mark_delete_position == (1, -1)
    # Unknown ledgers and parts beyond a ledger's end are skipped.
    d.recover([((9, 1), (9, 3)), ((2, 3), (2, 40))])
    assert d.acked.ranges() == [((2, 3), (2, 4))]
    with pytest.raises(ValueError, match="upper is below lower"):
        d.recover([((4, 1), (2, 0))])
    assert d.acked.ranges() == [((2, 3), (2, 4))]            # unchanged on error


def test_recover_drops_what_mark_delete_covers_and_advances():
    c = Cursor([(1, 10), (2, 4)], (1, 4))
    c.recover([((1, 1), (1, 3)), ((1, 4), (1, 6)), ((1, 9), (2, 0)), ((2, 1), (2, 2))])
    assert c.mark_delete_position == (1, 6)
    # (1,9..2,0] has nothing left in ledger 1; entry 2:1 is still a hole.
    assert c.acked.ranges() == [((2, -1), (2, 0)), ((2, 1), (2, 2))]
    c.ack((1, 7))
    c.ack((1, 8))
    c.ack((1, 9))
    assert c.mark_delete_position == (2, 0)
    c.ack((2, 1))
    assert c.mark_delete_position == (2, 2) and len(c.acked) == 0


# ---- a stateful check against a list of entries ---------------------------------------

LEDGERS = [(1, 4), (2, 0), (3, 3), (6, 5)]
ENTRIES = [(ledger, e) for ledger, n in LEDGERS for e in range(n)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(ENTRIES)), max_size=25),
       st.sampled_from(ENTRIES + [(9, 0)]))
def test_cursor_matches_a_set_of_acknowledged_entries(acks, read):
    c = Cursor(LEDGERS, (1, -1))
    acked = set()
    for cumulative, pos in acks:
        if cumulative:
            c.ack_cumulative(pos)
            acked.update(p for p in ENTRIES if p <= pos)
        else:
            c.ack(pos)
            acked.add(pos)
        prefix = 0
        while prefix < len(ENTRIES) and ENTRIES[prefix] in acked:
            prefix += 1
        md = ENTRIES[prefix - 1] if prefix else (1, -1)
        assert c.mark_delete_position == md
        assert all(r[1] > md for r in c.acked.ranges())
        assert c.acked.cardinality == len([p for p in acked if p > md])
    expected = [p for p in ENTRIES if p < read and p not in acked]
    assert list(c.holes(read)) == expected
    assert c.backlog(read) == len(expected)


# ---- HoleCompensator -----------------------------------------------------------------

def test_compensator_returns_old_enough_sent_holes_in_order():
    c = Cursor([(1, 10)], (1, -1))
    for e in (0, 1, 3, 6):
        c.ack((1, e))
    sent = {(1, e): 1000 for e in range(8)}
    sent[(1, 5)] = 1950                            # sent recently
    del sent[(1, 4)]                               # never sent
    comp = HoleCompensator(c, min_age_ms=100)
    before = dict(sent)
    assert comp.due((1, 8), 2000, sent) == [(1, 2), (1, 7)]
    assert sent == before                          # not modified
    assert comp.due((1, 8), 1100, sent) == []      # 100 ms old is not > 100 ms
    assert comp.due((1, 3), 2000, sent) == [(1, 2)]


def test_compensator_agrees_whichever_side_it_walks():
    # Many sends on record (walks the holes) and few (checks each send).
    c = Cursor([(1, 500), (2, 500)], (1, -1))
    for e in range(0, 500, 3):
        c.ack((1, e))
        c.ack((2, e))
    every = {p: 0 for p in [(1, e) for e in range(500)] + [(2, e) for e in range(500)]}
    few = {(2, 4): 0, (1, 7): 0, (1, 9): 0, (2, 3): 0, (1, 499): 0}
    comp = HoleCompensator(c, min_age_ms=10)
    walked = comp.due((2, 300), 100, every)
    assert walked == list(c.holes((2, 300)))
    assert comp.due((2, 300), 100, few) == [(1, 7), (1, 499), (2, 4)]


def test_compensator_rejects_bad_arguments():
    c = Cursor([(1, 1)], (1, -1))
    with pytest.raises(ValueError):
        HoleCompensator(c, min_age_ms=-1)
    with pytest.raises(TypeError):
        HoleCompensator(AckRangeSet(), min_age_ms=1)
    with pytest.raises(TypeError):
        HoleCompensator(c, min_age_ms="1")
