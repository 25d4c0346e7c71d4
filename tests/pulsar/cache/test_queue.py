"""The removal queue and its entries, on both implementations: Pulsar's
RangeCacheRemovalQueueTest cases restated (queue settings written as
(max requeues, extend TTL of recently accessed)), then the rest of the rule."""

from __future__ import annotations

import pytest

from .kit import MS, FakeClock


def entries(cm, clock, *specs):
    """CacheEntry per (key, size, expected_reads), stamped with clock.now."""
    return [cm.CacheEntry(k, s, expected_reads=r, timestamp_ns=clock.now) for k, s, r in specs]


# ---- Pulsar's RangeCacheRemovalQueueTest, restated --------------------------------


def test_new_queue_is_empty_and_not_after_an_add(cm):
    q = cm.RemovalQueue(0, False)
    assert q.is_empty() and len(q) == 0
    q.add(cm.CacheEntry((1, 1), 10))
    assert not q.is_empty() and len(q) == 1


def test_time_eviction_requeues_entry_with_expected_reads_once(cm):
    clock = FakeClock(100 * MS)
    q = cm.RemovalQueue(1, False, clock=clock)
    (e,) = entries(cm, clock, ((2, 1), 10, 1))
    q.add(e)
    clock.advance(10 * MS)
    assert q.evict_before(clock.now - 1) == (0, 0)
    assert not q.is_empty() and e.requeue_count == 1 and not e.removed
    assert e.timestamp_ns == clock.now            # requeued: stamped with now
    clock.advance(10 * MS)
    assert q.evict_before(clock.now - 1) == (1, 10)
    assert q.is_empty() and e.removed


def test_time_eviction_requeues_recently_accessed_entry_once(cm):
    clock = FakeClock(100 * MS)
    q = cm.RemovalQueue(0, True, clock=clock)
    (e,) = entries(cm, clock, ((3, 1), 10, 0))
    q.add(e)
    e.accessed = True
    clock.advance(10 * MS)
    assert q.evict_before(clock.now - 1) == (0, 0)
    assert e.requeue_count == 1 and not e.accessed and not q.is_empty()
    clock.advance(10 * MS)
    assert q.evict_before(clock.now - 1) == (1, 10)
    assert q.is_empty() and e.removed


def _three(cm, q):
    clock = FakeClock()
    e1, e2, e3 = entries(cm, clock, ((11, 1), 40, 0), ((11, 2), 50, 3), ((11, 3), 30, 0))
    for e in (e1, e2, e3):
        q.add(e)
    e1.accessed = True
    return e1, e2, e3


def test_size_eviction_evicts_as_long_as_needed(cm):
    q = cm.RemovalQueue(1, True)
    e1, e2, e3 = _three(cm, q)
    assert q.evict_least_accessed(120) == (3, 120)
    assert e1.removed and e2.removed and e3.removed and q.is_empty()


def test_size_eviction_evicts_easiest_first(cm):
    q = cm.RemovalQueue(1, True)
    e1, e2, e3 = _three(cm, q)
    assert q.evict_least_accessed(20) == (1, 30)
    assert not e1.removed and not e2.removed and e3.removed


def test_size_eviction_evicts_expected_reads_last(cm):
    q = cm.RemovalQueue(5, True)
    e1, e2, e3 = _three(cm, q)
    assert q.evict_least_accessed(35) == (2, 70)
    assert e1.removed and not e2.removed and e3.removed
    assert e2.requeue_count == 1 and len(q) == 1


def test_non_evictable_counts_entries_with_expected_reads(cm):
    q = cm.RemovalQueue(0, False)
    clock = FakeClock()
    w1, w2 = entries(cm, clock, ((1, 1), 100, 2), ((1, 2), 50, 1))
    q.add(w1)
    q.add(w2)
    assert q.non_evictable() == (2, 150)
    w2.mark_read()
    assert q.non_evictable() == (1, 100)


# ---- entries -----------------------------------------------------------------------


def test_untracked_entry_ignores_read_counting(cm):
    for n in (0, -3):
        e = cm.CacheEntry("k", 1, expected_reads=n)
        assert e.expected_reads is None and not e.has_expected_reads
        e.add_expected_read()
        e.mark_read()
        assert e.expected_reads is None


def test_tracked_entry_counts_below_zero(cm):
    e = cm.CacheEntry("k", 1, expected_reads=1)
    e.mark_read()
    assert e.expected_reads == 0 and not e.has_expected_reads
    e.mark_read()
    assert e.expected_reads == -1
    e.add_expected_read()
    e.add_expected_read()
    assert e.expected_reads == 1 and e.has_expected_reads


def test_entry_defaults_and_fields(cm):
    import time

    before = time.monotonic_ns()
    e = cm.CacheEntry(("t", 7), 123)
    assert before <= e.timestamp_ns <= time.monotonic_ns()
    assert e.key == ("t", 7) and e.size == 123
    assert not e.accessed and not e.removed and e.requeue_count == 0
    e.accessed = 1
    assert e.accessed is True
    assert cm.CacheEntry("k", 0, timestamp_ns=-5).timestamp_ns == -5
    for name in ("key", "size", "timestamp_ns", "removed", "requeue_count"):
        with pytest.raises(AttributeError):
            setattr(e, name, 1)


@pytest.mark.parametrize("kwargs, exc", [
    (dict(key=[1], size=1), TypeError),
    (dict(key="k", size=-1), ValueError),
    (dict(key="k", size=True), TypeError),
    (dict(key="k", size=1.0), TypeError),
    (dict(key="k", size=1, expected_reads="2"), TypeError),
    (dict(key="k", size=1, expected_reads=1 << 40), ValueError),
    (dict(key="k", size=1, timestamp_ns=1.5), TypeError),
])
def test_entry_rejects_bad_arguments(cm, kwargs, exc):
    with pytest.raises(exc):
        cm.CacheEntry(**kwargs)


# ---- the queue -----------------------------------------------------------------------


def test_add_rejects_queued_removed_and_foreign_objects(cm):
    q1, q2 = cm.RemovalQueue(), cm.RemovalQueue()
    e = cm.CacheEntry("k", 5)
    q1.add(e)
    with pytest.raises(ValueError, match="already in a removal queue"):
        q1.add(e)
    with pytest.raises(ValueError, match="already in a removal queue"):
        q2.add(e)
    assert q1.evict_least_accessed(1) == (1, 5)
    with pytest.raises(ValueError, match="removed"):
        q2.add(e)
    with pytest.raises(TypeError):
        q1.add("not an entry")
    assert len(q1) == len(q2) == 0 and q1.size == q2.size == 0


def test_size_to_free_must_be_positive(cm):
    q = cm.RemovalQueue()
    for bad, exc in ((0, ValueError), (-1, ValueError), (1.5, TypeError)):
        with pytest.raises(exc):
            q.evict_least_accessed(bad)
    assert q.evict_least_accessed(10) == (0, 0)           # stops on an empty queue
    assert q.evict_least_accessed(1 << 80) == (0, 0)


def test_time_walk_stops_at_the_first_entry_not_older(cm):
    clock = FakeClock(1000)
    q = cm.RemovalQueue(0, False, clock=clock)
    a, b, c = (cm.CacheEntry(k, 1, timestamp_ns=ts) for k, ts in (("a", 10), ("b", 500), ("c", 5)))
    for e in (a, b, c):
        q.add(e)
    # c is older than the threshold too, but b stops the walk first.
    assert q.evict_before(100) == (1, 1)
    assert a.removed and not b.removed and not c.removed
    assert [e.key for e in q] == ["b", "c"]
    assert q.evict_before(10_000) == (2, 2) and q.is_empty()


def test_requeue_moves_to_tail_and_reads_the_clock_lazily(cm):
    clock = FakeClock(50)
    q = cm.RemovalQueue(2, True, clock=clock)
    a = cm.CacheEntry("a", 1, expected_reads=1, timestamp_ns=0)
    b = cm.CacheEntry("b", 1, timestamp_ns=0)
    q.add(a)
    q.add(b)
    assert q.evict_before(10) == (1, 1)
    assert [e.key for e in q] == ["a"] and a.timestamp_ns == 50 and clock.reads == 1
    # Nothing older: no clock reading at all (the O(1) pass).
    assert q.evict_before(10) == (0, 0) and clock.reads == 1


def test_size_walk_cycles_until_requeues_are_spent(cm):
    q = cm.RemovalQueue(2, True)
    es = [cm.CacheEntry(i, 10, expected_reads=5) for i in range(4)]
    for e in es:
        q.add(e)
        e.accessed = True
    # Accessed and with reads: 1 requeue for access (clears it, counts 1),
    # one more for reads (count 2 = max), then removal.
    assert q.evict_least_accessed(40) == (4, 40)
    assert all(e.removed and e.requeue_count == 2 for e in es)


def test_settings_change_at_run_time(cm):
    q = cm.RemovalQueue(0, False)
    assert q.max_requeue_count_when_expected_reads == 0
    assert q.extend_ttl_of_recently_accessed is False
    q.max_requeue_count_when_expected_reads = 3
    q.extend_ttl_of_recently_accessed = True
    e = cm.CacheEntry("k", 10, expected_reads=1)
    q.add(e)
    assert q.evict_least_accessed(10) == (1, 10) and e.requeue_count == 3
    with pytest.raises(ValueError):
        q.max_requeue_count_when_expected_reads = -1


def test_clock_must_return_int_nanoseconds(cm):
    q = cm.RemovalQueue(1, False, clock=lambda: 1.5)
    q.add(cm.CacheEntry("k", 1, expected_reads=1, timestamp_ns=0))
    with pytest.raises(TypeError, match="clock"):
        q.evict_before(10)
    assert len(q) == 1                                   # nothing lost
    with pytest.raises(TypeError):
        cm.RemovalQueue(clock=42)


def test_evicted_payloads_are_released(cm):
    """The queue's reference and the payload go when an entry is evicted."""
    import sys

    m = cm.EntryCacheManager(1 << 20)
    payload = b"p" * 1000
    base = sys.getrefcount(payload)
    c = m.cache("t")
    for i in range(100):
        c.insert((1, i), payload)
    assert sys.getrefcount(payload) == base + 100
    m.max_size_bytes = 0
    m.run_eviction()
    assert sys.getrefcount(payload) == base and m.size == 0
    for i in range(50):
        assert m.cache("u").insert((2, i), payload) is False
    m.max_size_bytes = 1 << 20
    for i in range(50):
        c.insert((3, i), payload)
    c.invalidate_up_to((3, 24))
    assert sys.getrefcount(payload) == base + 25
    c.clear()
    assert sys.getrefcount(payload) == base


def test_dropping_a_manager_frees_its_entries(cm):
    import gc

    # While a memoryview of it lives, a bytearray cannot be resized.
    buf = bytearray(64)
    m = cm.EntryCacheManager(1 << 20)
    c = m.cache("t")
    view = memoryview(buf)
    for i in range(10):
        assert c.insert((1, i), view[i:i + 4])
    del m, c, view
    gc.collect()
    buf.extend(b"more")      # BufferError if a cached view had survived
