"""EntryCacheManager and EntryCache on both implementations: trigger and
watermark arithmetic, the disabled cache, live limit changes, stats, range
reads and invalidation, argument errors."""

from __future__ import annotations

from array import array

import pytest

from .kit import MS, FakeClock

KB = b"x" * 100


def mgr(cm, *args, **kw):
    """A manager that counts payload bytes only (entry_overhead_bytes=0):
    these tests check Pulsar's arithmetic; the overhead has tests of its
    own (cache/test_hostile.py)."""
    kw.setdefault("entry_overhead_bytes", 0)
    return cm.EntryCacheManager(*args, **kw)


def filled(cm, n, size=100, **kw):
    clock = kw.pop("clock", FakeClock())
    m = mgr(cm, kw.pop("max_size_bytes", 1000), clock=clock, **kw)
    c = m.cache("t")
    for i in range(n):
        assert c.insert((1, i), b"x" * size)
        clock.advance(1)
    return m, c, clock


# ---- thresholds ----------------------------------------------------------------------


def test_trigger_and_watermark_arithmetic(cm):
    # max 1000: trigger floor(0.98 * 1000) = 980, watermark 900.
    m, c, _ = filled(cm, 9)
    assert m.size == 900 and m.stats().evicted_entries == 0
    assert c.insert((1, 9), b"x" * 80)                     # 980: not above the trigger
    assert m.size == 980 and m.stats().evicted_entries == 0
    assert c.insert((1, 10), b"x")                        # 981 > 980: free 81 -> oldest 100
    st = m.stats()
    assert (st.evicted_entries, st.evicted_bytes, st.size) == (1, 100, 881)
    assert c.get((1, 0)) is None and c.get((1, 1)) is not None


def test_fractional_thresholds_floor(cm):
    m = mgr(cm, 999, eviction_watermark=0.5, eviction_trigger=0.75)
    c = m.cache("t")
    # trigger floor(749.25) = 749, watermark floor(499.5) = 499
    for i in range(7):
        c.insert((0, i), b"x" * 107)                      # 749 after 7
    assert m.size == 749 and m.stats().evicted_entries == 0
    c.insert((0, 7), b"x")                                # 750 > 749 -> free 251: 3 entries
    assert m.stats().evicted_entries == 3 and m.size == 750 - 321


def test_insert_returns_true_when_its_own_entry_is_evicted(cm):
    m = mgr(cm, 100)
    c = m.cache("t")
    assert c.insert((1, 1), b"x" * 500) is True
    assert m.size == 0 and len(c) == 0 and m.stats().inserts == 1


def test_threshold_arguments_are_checked(cm):
    for kw, exc in ((dict(max_size_bytes=-1), ValueError),
                    (dict(max_size_bytes=1.5), TypeError),
                    (dict(max_size_bytes=10, eviction_watermark=0), ValueError),
                    (dict(max_size_bytes=10, eviction_trigger=1.5), ValueError),
                    (dict(max_size_bytes=10, eviction_watermark=0.99), ValueError),
                    (dict(max_size_bytes=10, time_threshold_ms=-1), ValueError),
                    (dict(max_size_bytes=10, max_requeue_count_when_expected_reads=-1),
                     ValueError),
                    (dict(max_size_bytes=10, clock=3), TypeError)):
        with pytest.raises(exc):
            mgr(cm, **kw)


# ---- disabled and live changes ---------------------------------------------------------


def test_disabled_cache_inserts_nothing(cm):
    m = mgr(cm, 0)
    c = m.cache("t")
    assert c.insert((1, 1), KB) is False
    assert c.get((1, 1)) is None
    st = m.stats()
    assert (st.inserts, st.misses, st.size, st.entries) == (0, 1, 0, 0)
    assert m.run_eviction() == (0, 0)


def test_live_max_change_evicts_on_the_next_insert_or_pass(cm):
    m, c, clock = filled(cm, 8)
    m.max_size_bytes = 500                   # trigger 490, watermark 450
    assert m.size == 800 and m.max_size_bytes == 500
    assert m.run_eviction() == (4, 400)      # nothing expired; size pass: free 350
    assert m.size == 400
    m.max_size_bytes = 2000
    assert c.insert((1, 100), KB) and m.size == 500
    with pytest.raises(ValueError):
        m.max_size_bytes = -5
    assert m.max_size_bytes == 2000


def test_zero_at_run_time_disables_and_the_next_pass_empties(cm):
    m, c, clock = filled(cm, 5, max_requeue_count_when_expected_reads=5)
    c.insert((2, 0), KB, expected_reads=3)   # expected reads and accessed do not save it
    c.get((2, 0))
    m.max_size_bytes = 0
    assert c.insert((3, 0), KB) is False
    assert m.size == 600
    n, b = m.run_eviction()
    assert (n, b) == (6, 600) and m.size == 0 and len(c) == 0


def test_run_eviction_expires_by_time_then_size(cm):
    clock = FakeClock(10 * 1000 * MS)
    m = mgr(cm, 10_000, time_threshold_ms=1000, clock=clock)
    c = m.cache("t")
    for i in range(5):
        c.insert((1, i), KB)
    c.insert((1, 5), KB, expected_reads=1)
    c.get((1, 1))
    clock.advance(999 * MS)
    assert m.run_eviction() == (0, 0)          # nothing older than 1 s yet
    clock.advance(2 * MS)
    # 0, 2, 3, 4 go; 1 (accessed) and 5 (expected reads) are requeued.
    assert m.run_eviction() == (4, 400)
    st = m.stats()
    assert st.requeues == 2 and st.entries == 2 and st.evicted_entries == 4
    clock.advance(1001 * MS)
    assert m.run_eviction() == (1, 100)        # 1 goes; 5 has requeues left
    assert c.get((1, 5)) is not None


def test_requeue_settings_reach_the_queue(cm):
    m = mgr(cm, 100, max_requeue_count_when_expected_reads=0,
                             extend_ttl_of_recently_accessed=False)
    assert m.max_requeue_count_when_expected_reads == 0
    assert m.extend_ttl_of_recently_accessed is False
    m.max_requeue_count_when_expected_reads = 7
    m.extend_ttl_of_recently_accessed = True
    assert (m.max_requeue_count_when_expected_reads, m.extend_ttl_of_recently_accessed) == (7, True)
    assert (m.eviction_watermark, m.eviction_trigger, m.time_threshold_ms) == (0.9, 0.98, 1000)


# ---- stats ---------------------------------------------------------------------------------


def test_stats_count_hits_misses_inserts_and_evictions_only(cm):
    m, c, _ = filled(cm, 3)
    assert c.insert((1, 0), KB) is False                 # duplicate: not an insert
    c.get((1, 0))
    c.get((1, 1))
    c.get((9, 9))
    c.get_range((1, 0), (1, 2))                          # no counter
    c.invalidate_up_to((1, 0))                           # not an eviction
    st = m.stats()
    assert (st.hits, st.misses, st.inserts) == (2, 1, 3)
    assert (st.evicted_entries, st.evicted_bytes, st.size, st.entries) == (0, 0, 200, 2)
    assert st.hit_rate == pytest.approx(2 / 3)
    c.clear()
    assert m.stats().evicted_entries == 0 and m.size == 0
    assert m.average_entry_size == 100


def test_average_entry_size(cm):
    m = mgr(cm, 1 << 20)
    assert m.average_entry_size is None
    c = m.cache("t")
    c.insert((0, 0), b"x" * 10)
    c.insert((0, 1), b"x" * 21)
    assert m.average_entry_size == 15


# ---- EntryCache ---------------------------------------------------------------------------


def test_cache_by_name_is_created_once(cm):
    m = mgr(cm, 100)
    assert m.cache("a") is m.cache("a") and m.cache("a") is not m.cache("b")
    assert m.cache("a").name == "a" and m.cache("a").manager is m
    with pytest.raises(TypeError):
        m.cache(1)
    with pytest.raises(TypeError):
        cm.EntryCache()


def test_get_range_in_position_order_across_ledgers_and_pages(cm):
    m = mgr(cm, 1 << 30)
    c = m.cache("t")
    positions = [(2, 5), (1, 200), (1, 3), (1, 64), (3, 0), (1, 63), (2, 0)]
    for p in positions:
        c.insert(p, f"{p}".encode())
    got = c.get_range((1, 3), (2, 5))
    assert got == [f"{p}".encode() for p in sorted(positions) if (1, 3) <= p <= (2, 5)]
    assert c.get_range((1, 4), (1, 62)) == []
    assert c.get_range((2, 5), (1, 0)) == []                      # first > last
    assert c.get_range((-1, -1), (1, 3)) == [b"(1, 3)"]           # bounds may be negative
    assert c.get_range((0, 0), (9, 1 << 62)) == [f"{p}".encode() for p in sorted(positions)]


def test_get_range_marks_accessed(cm):
    clock = FakeClock(0)
    m = mgr(cm, 1 << 20, time_threshold_ms=1, clock=clock)
    c = m.cache("t")
    for i in range(4):
        c.insert((1, i), KB)
    c.get_range((1, 1), (1, 2))
    clock.advance(2 * MS)
    assert m.run_eviction() == (2, 200)
    assert c.get_range((0, 0), (9, 9)) == [KB, KB] and (1, 1) in c and (1, 2) in c


def test_invalidate_up_to(cm):
    m = mgr(cm, 1 << 20)
    c = m.cache("t")
    for p in [(1, 0), (1, 1), (1, 70), (2, 0), (2, 1), (3, 5)]:
        c.insert(p, KB)
    assert c.invalidate_up_to((1, -1)) == (0, 0)                  # before anything in ledger 1
    assert c.invalidate_up_to((2, 0)) == (4, 400)
    assert [p for p in [(1, 0), (1, 1), (1, 70), (2, 0), (2, 1), (3, 5)] if p in c] == [(2, 1),
                                                                                         (3, 5)]
    assert c.size == 200 and m.size == 200 and len(c) == 2
    assert c.clear() == (2, 200) and m.size == 0
    assert c.insert((1, 0), KB)                                   # positions can come back


def test_mark_read_and_add_expected_read(cm):
    m = mgr(cm, 1 << 20)
    c = m.cache("t")
    c.insert((1, 0), KB, expected_reads=1)
    c.insert((1, 1), KB)
    assert m.non_evictable() == (1, 100)
    c.mark_read((1, 0))
    assert m.non_evictable() == (0, 0)
    c.add_expected_read((1, 0))
    c.add_expected_read((1, 1))                                   # untracked: no-op
    c.mark_read((5, 5))                                           # not cached: no-op
    c.add_expected_read((5, 5))
    assert m.non_evictable() == (1, 100)


def test_memoryview_size_is_nbytes(cm):
    m = mgr(cm, 1 << 20)
    c = m.cache("t")
    assert c.insert((1, 0), memoryview(array("i", range(10))))
    assert m.size == 40


@pytest.mark.parametrize("position, exc", [
    ([1, 2], TypeError), ((1,), TypeError), ((1, 2, 3), TypeError), ((1, "2"), TypeError),
    ((True, 2), TypeError), ((1.0, 2), TypeError), ((-1, 2), ValueError), ((1, -2), ValueError),
    ((1 << 63, 0), ValueError),
])
def test_positions_are_checked(cm, position, exc):
    c = mgr(cm, 100).cache("t")
    for call in (lambda: c.insert(position, KB), lambda: c.get(position),
                 lambda: c.mark_read(position), lambda: c.add_expected_read(position)):
        with pytest.raises(exc):
            call()


def test_bounds_are_checked(cm):
    c = mgr(cm, 100).cache("t")
    with pytest.raises(TypeError):
        c.invalidate_up_to([1, 2])
    with pytest.raises(ValueError):
        c.get_range((0, 0), (1 << 63, 0))


@pytest.mark.parametrize("data", ["text", bytearray(b"x"), 5, None])
def test_data_must_be_bytes_or_memoryview(cm, data):
    m = mgr(cm, 100)
    with pytest.raises(TypeError):
        m.cache("t").insert((1, 1), data)
    with pytest.raises(TypeError):
        m.cache("t").insert((1, 1), b"x", expected_reads=1.0)
    assert m.stats().entries == 0


def test_entries_invalidated_elsewhere_do_not_count_toward_a_walk(cm):
    m, c, _ = filled(cm, 5, max_size_bytes=10_000)
    c.invalidate_up_to((1, 1))
    # the head entries are gone: freeing 120 takes (1, 2) and (1, 3)
    q_entries = m.stats().entries
    assert q_entries == 3
    m.max_size_bytes = 200                      # trigger 196, watermark 180: free 120
    assert m.run_eviction() == (2, 200)
    assert m.size == 100 and (1, 4) in c
