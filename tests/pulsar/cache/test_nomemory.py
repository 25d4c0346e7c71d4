"""The entry cache under MemoryError, both implementations (issue 32, G7):
every operation is run again and again with its k-th allocation failing
(``_testcapi.set_nomemory``), for every k until it completes untouched.

The pure twin once left the cache inconsistent (``clear()`` raising
KeyError, a size of -492): an entry was out of the queue but still in its
cache's index, or a byte total was updated for half an eviction.

What must hold after each injected MemoryError:

* an operation on entries (insert, get, get_range, mark_read,
  add_expected_read, invalidate_up_to, clear, cache(), the settings, a
  queue's add) is all-or-nothing: everything the cache shows afterwards,
  through its public API, is what it shows without the call or after a
  normal one (the pure twin: always without it, it raises only before
  changing anything);
* a walk (run_eviction, evict_before, evict_least_accessed, the eviction
  an insert starts) stops between two entries, as when the clock raises:
  what it removed stays removed and counted, and running it again finishes
  it, so the cache ends exactly where one uninterrupted walk takes it.

Both are checked by a trace of the cache's behaviour from then on (its
stats, contents, reads and evictions down to empty), compared with the
same trace of a cache that never failed.
"""

from __future__ import annotations

import gc
from importlib import import_module

import pytest

from .kit import DEBUG_BUILD, MODULES, MS, FakeClock, check_manager, snapshot

_testcapi = pytest.importorskip("_testcapi")

C, PY = MODULES["c"], MODULES["python"]
both = pytest.mark.parametrize("modname", [pytest.param(C, marks=pytest.mark.c_extension), PY],
                               ids=["c", "python"])

NAMES = ("t0", "t1", "t2")
#: More consecutive k with no MemoryError than this: the operation makes
#: fewer allocations than k (it cannot be failed any more).
QUIET_RUN = 12


def _fails_at(k: int, fn) -> bool:
    """Run ``fn()`` with the (k+1)-th allocation from now failing; True if it
    raised MemoryError.  The collector is off meanwhile, so only ``fn``
    allocates."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        _testcapi.set_nomemory(k, k + 1)
        try:
            fn()
        finally:
            _testcapi.remove_mem_hooks()
    except MemoryError:
        return True
    finally:
        if enabled:
            gc.enable()
    return False


def _every_allocation(build, act, *, allocates=True):
    """Yield (failed, state) for k = 0, 1, ...: ``state = build()``, then
    ``act(state)`` with its k-th allocation failing; stops once QUIET_RUN
    runs in a row did not fail.  ``allocates``: at least one run must fail
    (the pure twin allocates in every operation; C reads and counts without
    allocating)."""
    quiet = k = 0
    failures = 0
    while quiet < QUIET_RUN:
        state = build()
        failed = _fails_at(k, lambda: act(state))
        failures += failed
        quiet = 0 if failed else quiet + 1
        yield failed, state
        k += 1
    assert failures or not allocates, "no allocation failed: the injection did not work"


# ---- a manager and its caches ------------------------------------------------------------------


def _loaded(mod):
    """A manager with counters past the small-int cache (so every increment
    allocates), entries over three caches that a walk requeues (expected
    reads, accessed) or removes, and positions past 256."""
    clock = FakeClock(10**9)
    # Trigger == watermark: a size walk stopped anywhere above the watermark
    # is also above the trigger, so the next pass finishes it.
    m = mod.EntryCacheManager(8000, clock=clock, time_threshold_ms=2, entry_overhead_bytes=40,
                              max_requeue_count_when_expected_reads=2,
                              eviction_watermark=0.9, eviction_trigger=0.9)
    scratch = m.cache("t2")
    scratch.insert((0, 1000), b"k")
    for i in range(300):
        scratch.insert((0, 2000 + i), b"s")
        scratch.get((0, 1000))          # accessed: requeued by every pass
        scratch.get((0, 5))             # a miss
        clock.advance(3 * MS)
        m.run_eviction()                # removes (0, 2000 + i), requeues (0, 1000)
    for i in range(24):
        c = m.cache(NAMES[i % 3])
        c.insert((1 + i % 2, 300 + i), b"p" * (60 + 7 * i), expected_reads=i % 3)
        if i % 4 == 0:
            c.get((1 + i % 2, 300 + i))
        clock.advance(MS // 10)
    c = m.cache("t0")
    c.invalidate_up_to((1, 300))        # a hole in t0's positions
    return m, clock


def _positions():
    return [(0, 1000), (0, 5), (1, 999), (7, 7)] + [(1 + i % 2, 300 + i) for i in range(26)]


def _trace(m, clock):
    """Everything the manager shows through its API from now on: state,
    membership, reads, then passes under a shrinking limit (their order
    shows each entry's place in the queue, its requeues and expected
    reads), then clearing every cache."""
    check_manager(m, NAMES)
    out = [snapshot(m, NAMES), m.max_size_bytes, repr(m),
           [[p in m.cache(n) for p in _positions()] for n in NAMES]]
    for limit in (6000, 3000, 1500, 800, 400, 0):
        clock.advance(MS)
        m.max_size_bytes = limit
        out.append((m.run_eviction(), snapshot(m, NAMES),
                    [[p in m.cache(n) for p in _positions()] for n in NAMES]))
        check_manager(m, NAMES)
        if limit == 3000:
            # The payloads (get_range marks what it reads accessed), then
            # one read of everything: entries expecting two keep one.
            out.append([m.cache(n).get_range((0, 0), (9, 10**6)) for n in NAMES])
            for n in NAMES:
                for p in _positions():
                    m.cache(n).mark_read(p)
            out.append(snapshot(m, NAMES))
    out.append([m.cache(n).clear() for n in NAMES])
    st = check_manager(m, NAMES)
    assert st.size == st.entries == 0
    out.append(st)
    return out


def _evicting_insert(m, clock):
    # 40 + 3000 bytes on ~2400: above the trigger, so the insert walks.
    return m.cache("t1").insert((2, 900), b"E" * 3000, expected_reads=1)


def _redo_insert(m, clock):
    # The insert again (False if it got in before the walk failed), then a
    # pass: the time walk finds nothing old, the size walk finishes.
    _evicting_insert(m, clock)
    m.run_eviction()


def _expire(m, clock):
    clock.advance(3 * MS)


def _shrink(m, clock):
    m.max_size_bytes = 2000


def _nothing(m, clock):
    pass


#: label: (prepare, act, redo).  redo None: all-or-nothing; else a walk,
#: which redo(m, clock) finishes after a failure (and follows after success).
MANAGER_OPS = {
    "insert": (_nothing, lambda m, c: m.cache("t1").insert((1, 999), b"n" * 90,
                                                           expected_reads=2), None),
    "insert at a position a walk emptied": (
        _nothing, lambda m, c: m.cache("t2").insert((0, 2100), b"again"), None),
    "insert that evicts": (_nothing, _evicting_insert, _redo_insert),
    "get (hit)": (_nothing, lambda m, c: m.cache("t0").get((1, 304)), None),
    "get (miss)": (_nothing, lambda m, c: m.cache("t0").get((1, 999)), None),
    "get_range": (_nothing, lambda m, c: m.cache("t0").get_range((1, 0), (2, 10**6)), None),
    "mark_read": (_nothing, lambda m, c: m.cache("t1").mark_read((2, 301)), None),
    "add_expected_read": (_nothing, lambda m, c: m.cache("t1").add_expected_read((2, 307)),
                          None),
    "invalidate_up_to": (_nothing, lambda m, c: m.cache("t1").invalidate_up_to((2, 316)),
                         None),
    "clear": (_nothing, lambda m, c: m.cache("t0").clear(), None),
    "clear (the walked cache)": (_nothing, lambda m, c: m.cache("t2").clear(), None),
    "cache (a new one)": (_nothing, lambda m, c: m.cache("t9"), None),
    "max_size_bytes=": (_nothing, lambda m, c: setattr(m, "max_size_bytes", 7000), None),
    "max_requeue=": (_nothing, lambda m, c: setattr(
        m, "max_requeue_count_when_expected_reads", 300), None),
    "run_eviction (time walk)": (_expire, lambda m, c: m.run_eviction(),
                                 lambda m, c: m.run_eviction()),
    "run_eviction (size walk)": (_shrink, lambda m, c: m.run_eviction(),
                                 lambda m, c: m.run_eviction()),
    "run_eviction (both walks)": (lambda m, c: (_expire(m, c), _shrink(m, c)),
                                  lambda m, c: m.run_eviction(), lambda m, c: m.run_eviction()),
}


#: Operations the pure twin does without allocating (small ints, no result):
#: nothing to fail.
NO_ALLOCATION = {"mark_read", "add_expected_read", "max_requeue="}


def _built(mod, prepare):
    def build():
        m, clock = _loaded(mod)
        prepare(m, clock)
        return m, clock
    return build


@both
@pytest.mark.parametrize("label", list(MANAGER_OPS))
def test_a_memory_error_in_a_cache_operation_loses_nothing(modname, label):
    mod = import_module(modname)
    prepare, act, redo = MANAGER_OPS[label]
    build = _built(mod, prepare)
    m, clock = build()
    untouched = _trace(m, clock)
    m, clock = build()
    act(m, clock)
    if redo is not None:
        redo(m, clock)
    done = _trace(m, clock)
    assert done != untouched, "the operation changes nothing: the test shows nothing"
    seen = set()
    for failed, (m, clock) in _every_allocation(
            build, lambda s: act(*s), allocates=modname == PY and label not in NO_ALLOCATION):
        if failed:
            check_manager(m, NAMES)             # consistent at once, before any repair
            if redo is not None:
                redo(m, clock)
        elif redo is not None:
            redo(m, clock)
        got = _trace(m, clock)
        if not failed or redo is not None:
            assert got == done
        else:
            assert got in (untouched, done), "a MemoryError left the operation half done"
            seen.add("untouched" if got == untouched else "done")
    if modname == PY and redo is None:
        # The pure twin raises only before it changes anything.
        assert seen <= {"untouched"}


# ---- what the traces above cannot see -------------------------------------------------------


@both
def test_a_memory_error_setting_max_size_bytes_keeps_limit_and_thresholds_together(modname):
    # The trace sets a limit of its own before its first pass, so it cannot
    # tell a new limit with the old thresholds (the C twin stored the limit,
    # then computed the thresholds in Python) from a whole update: a pass
    # under the limit the manager shows can.
    mod = import_module(modname)

    def build():
        m = mod.EntryCacheManager(10_000, clock=FakeClock(0), entry_overhead_bytes=0,
                                  eviction_watermark=0.5, eviction_trigger=0.5)
        m.cache("t").insert((0, 1), b"x" * 3000)   # under 5000, over 4000's trigger
        return m

    for _failed, m in _every_allocation(build, lambda m: setattr(m, "max_size_bytes", 4000)):
        limit = m.max_size_bytes
        assert limit in (10_000, 4000)
        # 4000's thresholds (2000) evict the entry; 10_000's (5000) do not.
        want = ((1, 3000), 0) if limit == 4000 else ((0, 0), 1)
        assert (m.run_eviction(), len(m.cache("t"))) == want


@both
def test_a_memory_error_in_an_insert_whose_byte_total_spills(modname):
    # The C twin keeps the payload bytes ever inserted in an int64 plus a
    # Python int carry; an insert that spills into the carry once counted
    # itself, then failed making the carry's int, and average_entry_size
    # halved.  A stride-0 view: 2**62 bytes that take one.
    np = pytest.importorskip("numpy")
    huge = memoryview(np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=(1 << 62,),
                                                      strides=(0,)))
    assert huge.nbytes == 1 << 62
    mod = import_module(modname)

    def build():
        m = mod.EntryCacheManager(10_000, clock=FakeClock(0), entry_overhead_bytes=0)
        m.cache("t").insert((0, 1), huge)   # counted, then evicted at once
        return m

    for _failed, m in _every_allocation(build, lambda m: m.cache("t").insert((0, 2), huge)):
        m.run_eviction()    # finishes the eviction the insert starts, if it failed
        # Not inserted, or inserted and counted in full.
        assert (m.stats().inserts, m.average_entry_size) in ((1, 1 << 62), (2, 1 << 62))
        assert (len(m.cache("t")), m.size) == (0, 0)
        check_manager(m, ["t"])


@both
def test_a_memory_error_in_a_long_get_range_marks_nothing(modname):
    # More entries than the C twin remembers without allocating (32): its
    # list of the entries to mark grows on the heap, and that can fail too.
    mod = import_module(modname)

    def build():
        m = mod.EntryCacheManager(10**6, clock=FakeClock(10**9), entry_overhead_bytes=0,
                                  eviction_watermark=0.5, eviction_trigger=0.5)
        for i in range(100):
            m.cache("t").insert((1, i), b"p" * 10)
        return m

    def after(m):
        # A size walk down to half: the entries get_range marked are
        # requeued, the others removed, so what is left shows the marks.
        m.max_size_bytes = 1000
        m.run_eviction()
        return [p in m.cache("t") for p in ((1, i) for i in range(100))]

    def act(m):
        return m.cache("t").get_range((1, 0), (1, 59))

    untouched = after(build())
    m = build()
    assert act(m) == [b"p" * 10] * 60
    done = after(m)
    assert done != untouched, "the marks change nothing: the test shows nothing"
    for failed, m in _every_allocation(build, act):
        assert after(m) == (untouched if failed else done)


# ---- a RemovalQueue of its own -----------------------------------------------------------------


def _queue(mod):
    """A queue with entries to requeue and remove, and counters past 256."""
    clock = FakeClock(10**6)
    q = mod.RemovalQueue(2, True, clock=clock)
    for i in range(300):                # requeue and eviction counters past 256
        e = mod.CacheEntry(("old", i), 1000 + i, timestamp_ns=i)
        e.accessed = True
        q.add(e)
    q.evict_before(10**5)               # requeues all 300, stamped 10**6
    q.evict_least_accessed(300 * 1000)  # removes them (accessed was cleared)
    entries = []
    for i in range(20):
        e = mod.CacheEntry(("k", 300 + i), 500 + 3 * i, expected_reads=i % 3,
                           timestamp_ns=10**6 + i)
        e.accessed = i % 4 == 0
        q.add(e)
        entries.append(e)
    return q, clock, entries


def _queue_trace(q, entries):
    def fields(e):
        return (e.key, e.size, e.timestamp_ns, e.accessed, e.removed, e.requeue_count,
                e.expected_reads)
    out = [len(q), q.size, q.is_empty(), q.non_evictable(), [fields(e) for e in q],
           [fields(e) for e in entries]]
    out.append(q.evict_least_accessed(10**9))   # the walk order shows every field's effect
    out += [len(q), q.size, [fields(e) for e in entries]]
    assert q.size == sum(e.size for e in q) >= 0
    return out


def _free_rest(target):
    def redo(q, entries, before):
        freed = before - q.size
        if freed < target:
            q.evict_least_accessed(target - freed)
    return redo


#: label: (act(q, entries), redo(q, entries, size before) or None)
QUEUE_OPS = {
    "add": (lambda q, es: q.add(type(es[0])(("new", 1), 77, expected_reads=1,
                                            timestamp_ns=10**6 + 3)), None),
    "evict_before": (lambda q, es: q.evict_before(10**6 + 15),
                     lambda q, es, before: q.evict_before(10**6 + 15)),
    "evict_least_accessed": (lambda q, es: q.evict_least_accessed(6000), _free_rest(6000)),
}


@both
@pytest.mark.parametrize("label", list(QUEUE_OPS))
def test_a_memory_error_in_a_queue_operation_loses_nothing(modname, label):
    mod = import_module(modname)
    act, redo = QUEUE_OPS[label]

    def build():
        q, clock, entries = _queue(mod)
        return q, entries, q.size

    q, entries, size = build()
    untouched = _queue_trace(q, entries)
    q, entries, size = build()
    act(q, entries)
    done = _queue_trace(q, entries)
    seen = set()
    for failed, (q, entries, size) in _every_allocation(build, lambda s: act(s[0], s[1]),
                                                        allocates=modname == PY):
        if failed and redo is not None:
            redo(q, entries, size)
        got = _queue_trace(q, entries)
        if not failed or redo is not None:
            assert got == done
        else:
            assert got in (untouched, done), "a MemoryError left the operation half done"
            seen.add("untouched" if got == untouched else "done")
    if modname == PY and redo is None:
        assert seen <= {"untouched"}


@pytest.mark.skipif(DEBUG_BUILD, reason="the reproducer's timing is the release build's")
def test_the_reported_clear_after_a_memory_error_in_a_walk():
    # The reproducer of issue 32 (G7), pure twin: a MemoryError during a
    # pass, then clear() raised KeyError and the size went negative.
    mod = import_module(PY)
    for k in range(200):
        m, clock = _loaded(mod)
        _shrink(m, clock)
        _fails_at(k, m.run_eviction)
        for n in NAMES:
            m.cache(n).clear()
        st = check_manager(m, NAMES)
        assert (st.size, st.entries) == (0, 0)
