"""TTL (is_entry_expired, Expirer) and BacklogQuota."""

from __future__ import annotations

import pytest

from pylimiter.pulsar.cursor import (
    BacklogQuota,
    Cursor,
    EntryMeta,
    Expirer,
    is_entry_expired,
)

DAY_MS = 86_400_000
DAY_S = 86_400


def test_ttl_is_strict_at_the_boundary():
    assert not is_entry_expired(10, 1000, 11_000)
    assert is_entry_expired(10, 1000, 11_001)
    assert not is_entry_expired(0.5, 0, 500) and is_entry_expired(0.5, 0, 501)


def test_ttl_zero_or_negative_never_expires():
    assert not is_entry_expired(0, 0, 10**15)
    assert not is_entry_expired(-5, 0, 10**15)


def test_seed_case_delay_10_days_ttl_5_days():
    publish, deliver = 0, 10 * DAY_MS
    ours = {"deliver_at_ms": deliver}
    assert not is_entry_expired(5 * DAY_S, publish, 6 * DAY_MS, **ours)
    assert not is_entry_expired(5 * DAY_S, publish, 14 * DAY_MS, **ours)
    assert not is_entry_expired(5 * DAY_S, publish, 15 * DAY_MS, **ours)
    assert is_entry_expired(5 * DAY_S, publish, 15 * DAY_MS + 1, **ours)
    # Pulsar's rule: gone after day 5, five days before anyone could read it.
    pulsar = {"deliver_at_ms": deliver, "delayed": "publish"}
    assert not is_entry_expired(5 * DAY_S, publish, 5 * DAY_MS, **pulsar)
    assert is_entry_expired(5 * DAY_S, publish, 5 * DAY_MS + 1, **pulsar)


def test_deliver_at_before_publish_is_ignored():
    assert is_entry_expired(1, 5000, 6001, deliver_at_ms=100)
    assert is_entry_expired(1, 5000, 6001, deliver_at_ms=5000)


def test_unknown_delayed_mode_is_refused():
    with pytest.raises(ValueError, match="delayed must be one of"):
        is_entry_expired(1, 0, 0, delayed="deliver")
    with pytest.raises(ValueError, match="delayed must be one of"):
        is_entry_expired(0, 0, 0, delayed=None)
    with pytest.raises(ValueError, match="delayed must be one of"):
        Expirer(Cursor([(1, 1)], (1, -1)), 5, delayed="later")


def _topic(delays_days, ttl_days=5):
    """Ten messages published on day 0 at 1 ms apart, some delayed."""
    cursor = Cursor([(1, len(delays_days))], (1, -1))
    entries = [EntryMeta((1, i), i, (i + d * DAY_MS) if d else None)
               for i, d in enumerate(delays_days)]
    return cursor, entries


def test_expirer_never_acks_a_delayed_message_before_deliver_at_plus_ttl():
    cursor, entries = _topic([0, 0, 10, 0, 0, 3, 0])
    ex = Expirer(cursor, 5 * DAY_S)
    assert ex.expire(entries, 6 * DAY_MS) == 5         # all but the two delayed ones
    assert cursor.mark_delete_position == (1, 1)       # stops at the 10-day message
    assert cursor.acked.ranges() == [((1, 2), (1, 4)), ((1, 5), (1, 6))]
    assert list(cursor.holes((1, 7))) == [(1, 2), (1, 5)]
    assert ex.expire(entries, 8 * DAY_MS + 5) == 0     # 3-day one: due after day 8 + 5 ms
    assert ex.expire(entries, 8 * DAY_MS + 6) == 1
    assert ex.expire(entries, 15 * DAY_MS) == 0        # 10 days + 5 days, not yet (strict)
    assert ex.expire(entries, 15 * DAY_MS + 3) == 1
    assert cursor.mark_delete_position == (1, 6) and len(cursor.acked) == 0


def test_expirer_publish_mode_reproduces_the_loss():
    cursor, entries = _topic([0, 0, 10, 0, 0, 3, 0])
    ex = Expirer(cursor, 5 * DAY_S, delayed="publish")
    assert ex.expire(entries, 5 * DAY_MS + 7) == 7     # the delayed ones go too
    assert cursor.mark_delete_position == (1, 6)


def test_expirer_publish_mode_acks_everything_before_the_last_expired_entry():
    # Publish times out of order (a producer with a skewed clock): Pulsar's
    # mark-delete jumps to the newest expired entry, taking unexpired ones along.
    cursor = Cursor([(1, 4)], (1, -1))
    entries = [EntryMeta((1, 0), 100), EntryMeta((1, 1), 9000), EntryMeta((1, 2), 100),
               EntryMeta((1, 3), 9000)]
    cursor.ack((1, 1))
    assert Expirer(cursor, 1, delayed="publish").expire(entries, 2000) == 2
    assert cursor.mark_delete_position == (1, 2)
    other = Cursor([(1, 4)], (1, -1))
    assert Expirer(other, 1).expire(entries, 2000) == 2
    assert other.mark_delete_position == (1, 0) and other.acked.ranges() == [((1, 1), (1, 2))]


def test_expirer_skips_and_does_not_count_acknowledged_entries():
    cursor, entries = _topic([0, 0, 0, 0])
    cursor.ack((1, 2))
    assert Expirer(cursor, 1).expire(entries, 10**9) == 3
    assert Expirer(cursor, 1).expire(entries, 10**9) == 0
    assert cursor.mark_delete_position == (1, 3)


def test_expirer_with_ttl_zero_does_nothing():
    cursor, entries = _topic([0, 0])
    for mode in ("deliverable", "publish"):
        assert Expirer(cursor, 0, delayed=mode).expire(entries, 10**12) == 0
    assert cursor.mark_delete_position == (1, -1)


def test_expirer_accepts_plain_tuples_and_rejects_garbage():
    cursor = Cursor([(1, 2)], (1, -1))
    assert Expirer(cursor, 1).expire([([1, 0], 0), ((1, 1), 0, None)], 5000) == 2
    with pytest.raises(TypeError):
        Expirer(cursor, 1).expire([5], 0)
    with pytest.raises(TypeError):
        Expirer(object(), 1)


# ---- BacklogQuota ----------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["producer_request_hold", "producer_exception",
                                    "consumer_backlog_eviction"])
def test_size_limit_is_hit_at_the_limit(policy):
    q = BacklogQuota(limit_size=1000, policy=policy)
    assert q.check(999, 10**6) is None                # no time limit set
    assert q.check(1000, 0) == policy
    assert q.check(1001, 0) == policy


@pytest.mark.parametrize("policy", ["producer_request_hold", "producer_exception",
                                    "consumer_backlog_eviction"])
def test_time_limit_is_strict(policy):
    q = BacklogQuota(limit_time_s=60, policy=policy)
    assert q.check(10**12, 59.9) is None              # no size limit set
    assert q.check(0, 60) is None
    assert q.check(0, 60.001) == policy


def test_disabled_limits_and_defaults():
    assert BacklogQuota().check(10**15, 10**9) is None
    assert BacklogQuota().policy == "producer_request_hold"
    assert BacklogQuota(limit_size=0).check(0, 0) == "producer_request_hold"
    assert BacklogQuota(limit_size=-1, limit_time_s=0).check(10**9, 10**9) is None
    assert BacklogQuota(limit_size=10, limit_time_s=5).check(0, 6) == "producer_request_hold"


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="policy must be one of"):
        BacklogQuota(policy="drop_everything")
    with pytest.raises(TypeError):
        BacklogQuota(limit_size=1.5)


def test_eviction_acks_oldest_holes_first_until_at_or_below_target():
    cursor = Cursor([(1, 6), (2, 4)], (1, -1))
    cursor.ack((1, 1))
    cursor.ack((1, 4))
    sizes = {(1, e): 100 for e in range(6)} | {(2, e): 100 for e in range(4)}
    sizes[(1, 0)] = 50
    q = BacklogQuota(limit_size=700, policy="consumer_backlog_eviction")
    # holes before (2,3): 1:0 1:2 1:3 1:5 2:0 2:1 2:2 = 650 bytes
    assert q.evict(cursor, (2, 3), sizes, target_size=400) == 3   # 650 -> 600 -> 500 -> 400
    assert cursor.mark_delete_position == (1, 4)
    assert list(cursor.holes((2, 3))) == [(1, 5), (2, 0), (2, 1), (2, 2)]
    assert q.evict(cursor, (2, 3), sizes, target_size=400) == 0
    assert q.evict(cursor, (2, 3), sizes, target_size=0) == 4
    assert cursor.backlog((2, 3)) == 0


def test_eviction_needs_the_eviction_policy_and_every_hole_size():
    cursor = Cursor([(1, 3)], (1, -1))
    with pytest.raises(ValueError, match="consumer_backlog_eviction"):
        BacklogQuota(limit_size=1).evict(cursor, (1, 3), {}, 0)
    q = BacklogQuota(limit_size=1, policy="consumer_backlog_eviction")
    with pytest.raises(ValueError, match="no size for hole 1:1"):
        q.evict(cursor, (1, 3), {(1, 0): 5, (1, 2): 5}, 0)
    assert cursor.mark_delete_position == (1, -1)
    with pytest.raises(ValueError, match="target_size"):
        q.evict(cursor, (1, 3), {}, -1)
