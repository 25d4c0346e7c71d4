"""The entry cache under misuse, both implementations (issue 18): objects
built with __new__ alone, every attribute of every object in every state,
copy and pickle, hostile clocks (BaseException at each call site, readings
outside int64, INT64_MIN, re-entry), released memoryviews, the per-entry
overhead against max_size_bytes, the hostile-argument matrix, and the
garbage collector running inside deallocators.

Anything that could crash the interpreter runs in a subprocess
(``run_isolated``), so a crash fails one test instead of aborting pytest.
"""

from __future__ import annotations

import copy
import inspect
import os
import pickle
import sys
from importlib import import_module

import pytest

from pylimiter.pulsar.cache import (
    ENTRY_OVERHEAD_BYTES,
    EntryReader,
    NotInitialisedError,
)

from ..hostile import hostile_values, outcome, run_isolated
from .kit import DEBUG_BUILD, MODULES, MS, FakeClock, ScriptedClock, check_manager, snapshot

C, PY = MODULES["c"], MODULES["python"]
both = pytest.mark.parametrize("modname", [pytest.param(C, marks=pytest.mark.c_extension), PY],
                               ids=["c", "python"])


# ---- objects built with __new__ alone (items 2 and 3) ------------------------------------------


def _calls(mod):
    """Every method and attribute of each class, as (class, label, call(obj))."""
    entry = lambda: mod.CacheEntry("k", 1)  # noqa: E731
    out = []
    for label, fn in [
            ("key", lambda o: o.key), ("size", lambda o: o.size),
            ("timestamp_ns", lambda o: o.timestamp_ns), ("accessed", lambda o: o.accessed),
            ("accessed=", lambda o: setattr(o, "accessed", True)),
            ("removed", lambda o: o.removed), ("requeue_count", lambda o: o.requeue_count),
            ("expected_reads", lambda o: o.expected_reads),
            ("has_expected_reads", lambda o: o.has_expected_reads),
            ("mark_read", lambda o: o.mark_read()),
            ("add_expected_read", lambda o: o.add_expected_read())]:
        out.append((mod.CacheEntry, label, fn))
    for label, fn in [
            ("max_requeue", lambda o: o.max_requeue_count_when_expected_reads),
            ("max_requeue=", lambda o: setattr(o, "max_requeue_count_when_expected_reads", 3)),
            ("max_requeue=bad", lambda o: setattr(o, "max_requeue_count_when_expected_reads",
                                                  "x")),
            ("extend_ttl", lambda o: o.extend_ttl_of_recently_accessed),
            ("extend_ttl=", lambda o: setattr(o, "extend_ttl_of_recently_accessed", False)),
            ("add", lambda o: o.add(entry())), ("add(bad)", lambda o: o.add(None)),
            ("is_empty", lambda o: o.is_empty()), ("len", len), ("iter", iter),
            ("size", lambda o: o.size), ("non_evictable", lambda o: o.non_evictable()),
            ("evict_before", lambda o: o.evict_before(0)),
            ("evict_before(bad)", lambda o: o.evict_before("x")),
            ("evict_least_accessed", lambda o: o.evict_least_accessed(1))]:
        out.append((mod.RemovalQueue, label, fn))
    for label, fn in [
            ("name", lambda o: o.name), ("manager", lambda o: o.manager),
            ("size", lambda o: o.size), ("len", len), ("contains", lambda o: (1, 1) in o),
            ("contains(bad)", lambda o: "x" in o),
            ("insert", lambda o: o.insert((1, 1), b"x")),
            ("insert(bad)", lambda o: o.insert("x", b"x")),
            ("get", lambda o: o.get((1, 1))), ("get_range", lambda o: o.get_range((0, 0), (1, 1))),
            ("mark_read", lambda o: o.mark_read((1, 1))),
            ("add_expected_read", lambda o: o.add_expected_read((1, 1))),
            ("invalidate_up_to", lambda o: o.invalidate_up_to((1, 1))),
            ("clear", lambda o: o.clear())]:
        out.append((mod.EntryCache, label, fn))
    for label, fn in [
            ("max_size_bytes", lambda o: o.max_size_bytes),
            ("max_size_bytes=", lambda o: setattr(o, "max_size_bytes", 10)),
            ("max_size_bytes=bad", lambda o: setattr(o, "max_size_bytes", -1)),
            ("entry_overhead_bytes", lambda o: o.entry_overhead_bytes),
            ("eviction_watermark", lambda o: o.eviction_watermark),
            ("eviction_trigger", lambda o: o.eviction_trigger),
            ("time_threshold_ms", lambda o: o.time_threshold_ms),
            ("max_requeue", lambda o: o.max_requeue_count_when_expected_reads),
            ("max_requeue=", lambda o: setattr(o, "max_requeue_count_when_expected_reads", 1)),
            ("extend_ttl", lambda o: o.extend_ttl_of_recently_accessed),
            ("extend_ttl=", lambda o: setattr(o, "extend_ttl_of_recently_accessed", True)),
            ("cache", lambda o: o.cache("t")), ("cache(bad)", lambda o: o.cache(3)),
            ("size", lambda o: o.size), ("average_entry_size", lambda o: o.average_entry_size),
            ("non_evictable", lambda o: o.non_evictable()), ("stats", lambda o: o.stats()),
            ("run_eviction", lambda o: o.run_eviction())]:
        out.append((mod.EntryCacheManager, label, fn))
    return out


def uninitialised_checks(modname: str) -> None:
    """Run in a subprocess by the test below (on the old C extension this
    wrote through an unset pointer: EntryCache.__new__(EntryCache).get()
    incremented a counter at id(None) + 112)."""
    mod = import_module(modname)
    for cls, label, fn in _calls(mod):
        obj = cls.__new__(cls)
        try:
            fn(obj)
        except NotInitialisedError as exc:
            assert isinstance(exc, RuntimeError) and isinstance(exc, AttributeError)
            assert "not initialised" in str(exc), exc
        else:
            raise AssertionError(f"{cls.__name__}.{label} on an uninitialised object "
                                 f"did not raise")
    for cls in (mod.CacheEntry, mod.RemovalQueue, mod.EntryCache, mod.EntryCacheManager):
        obj = cls.__new__(cls)
        assert repr(obj) == f"<{cls.__name__} uninitialised>"
        assert not hasattr(obj, "size")
        members = dict(inspect.getmembers(obj))
        assert "size" not in members and "__class__" in members
        dir(obj)
    # An uninitialised entry is refused as an argument (ValueError), and the
    # failed calls above left the objects uninitialised, not half-built.
    q = mod.RemovalQueue()
    try:
        q.add(mod.CacheEntry.__new__(mod.CacheEntry))
    except ValueError:
        pass
    else:
        raise AssertionError("an uninitialised entry was queued")
    m = mod.EntryCacheManager.__new__(mod.EntryCacheManager)
    for bad in (lambda: setattr(m, "max_size_bytes", 5), lambda: m.cache("t")):
        try:
            bad()
        except NotInitialisedError:
            pass
    m.__init__(100, entry_overhead_bytes=0)
    assert m.cache("t").insert((1, 1), b"x") and m.size == 1
    print("ok")


@both
def test_objects_built_with_new_alone_refuse_everything(modname):
    assert run_isolated(f"from tests.pulsar.cache.test_hostile import uninitialised_checks\n"
                        f"uninitialised_checks({modname!r})").strip() == "ok"


def test_entry_cache_init_is_refused(cm):
    with pytest.raises(TypeError, match="EntryCacheManager.cache"):
        cm.EntryCache()


def test_init_runs_once_and_a_second_call_changes_nothing(cm):
    clock = FakeClock(0)
    e = cm.CacheEntry("k", 5, expected_reads=2, timestamp_ns=1)
    q = cm.RemovalQueue(2, False, clock=clock)
    q.add(e)
    m = cm.EntryCacheManager(1000, clock=clock, entry_overhead_bytes=0)
    m.cache("t").insert((1, 1), b"abc")
    for obj, args in ((e, ("j", 9)), (q, (0, True)), (m, (5,))):
        with pytest.raises(RuntimeError, match="already initialised"):
            obj.__init__(*args)
    assert (e.key, e.size, e.expected_reads, e.timestamp_ns) == ("k", 5, 2, 1)
    assert list(q) == [e] and q.size == 5 and q.max_requeue_count_when_expected_reads == 2
    assert not q.extend_ttl_of_recently_accessed
    assert m.max_size_bytes == 1000 and m.cache("t").get((1, 1)) == b"abc"
    # A failed first __init__ leaves the object uninitialised: a later one works.
    m2 = cm.EntryCacheManager.__new__(cm.EntryCacheManager)
    with pytest.raises(ValueError):
        m2.__init__(1000, eviction_watermark=2.0)
    with pytest.raises(NotInitialisedError):
        m2.size
    m2.__init__(1000)
    assert m2.size == 0


# ---- every attribute of every object in every state (item 2) -------------------------------


@both
def test_attribute_walk_in_every_state(modname):
    code = f"""
import gc
from importlib import import_module
from tests.pulsar.cache.kit import cache_objects_in_every_state
from tests.pulsar.hostile import walk
gc.set_threshold(1)
mod = import_module({modname!r})
n = 0
for label, obj in cache_objects_in_every_state(mod):
    n += walk(obj)
del obj
gc.collect()
print(n)
"""
    assert int(run_isolated(code)) > 100


@both
def test_copy_and_pickle_are_refused(modname):
    mod = import_module(modname)
    m = mod.EntryCacheManager(1000)
    c = m.cache("t")
    c.insert((1, 1), b"x")
    q = mod.RemovalQueue()
    e = mod.CacheEntry("k", 1)
    q.add(e)
    for obj in (m, c, q, e, mod.CacheEntry("free", 1),
                mod.RemovalQueue.__new__(mod.RemovalQueue)):
        for attempt in (copy.copy, copy.deepcopy, pickle.dumps,
                        lambda o: pickle.dumps(o, protocol=0)):
            with pytest.raises(TypeError, match="cannot be copied or pickled"):
                attempt(obj)
    assert list(q) == [e] and len(c) == 1


# ---- the clock (items 5, 6, 9) ---------------------------------------------------------------


@both
def test_int64_min_from_the_clock_is_a_time_like_any_other(modname):
    # The C walk used INT64_MIN as "no reading yet": a clock that returned
    # it made every requeue ask for a reading again, for ever.
    code = f"""
from importlib import import_module
mod = import_module({modname!r})
low = -2**63
q = mod.RemovalQueue(3, True, clock=lambda: low)
e = mod.CacheEntry(1, 1, expected_reads=3, timestamp_ns=low)
f = mod.CacheEntry(2, 1, timestamp_ns=low)
q.add(e); q.add(f)
f.accessed = True
print(q.evict_before(low + 1), e.requeue_count, f.requeue_count)
m = mod.EntryCacheManager(50, clock=lambda: low, time_threshold_ms=0)
c = m.cache("t")
for i in range(40):
    c.insert((1, i), b"x", expected_reads=2)
print(m.run_eviction(), len(c) <= 50)
"""
    out = run_isolated(code, timeout=60).split("\n")
    assert out[0] == "(2, 2) 3 1"
    assert out[1].endswith("True")


@both
@pytest.mark.parametrize("reading, exc", [(2**63, ValueError), (-2**63 - 1, ValueError),
                                          (2**64, ValueError), (1.5, TypeError),
                                          (True, TypeError), (None, TypeError)])
def test_clock_readings_outside_int64_are_refused(modname, reading, exc):
    mod = import_module(modname)
    clock = ScriptedClock(1000)
    m = mod.EntryCacheManager(1 << 20, clock=clock, entry_overhead_bytes=0)
    c = m.cache("t0")
    c.insert((1, 1), b"a", expected_reads=1)
    before = snapshot(m)
    clock.values[clock.reads + 1] = reading
    with pytest.raises(exc):
        c.insert((1, 2), b"b")
    clock.values[clock.reads + 1] = reading
    with pytest.raises(exc):
        m.run_eviction()
    q = mod.RemovalQueue(clock=lambda: reading)
    q.add(mod.CacheEntry("k", 1, expected_reads=1, timestamp_ns=0))
    with pytest.raises(exc):
        q.evict_before(10)
    assert q.size == 1 and len(q) == 1
    assert snapshot(m) == before
    check_manager(m)


def _loaded(mod, clock):
    """A manager with entries that a walk requeues (expected reads, accessed)
    and removes, over three caches."""
    m = mod.EntryCacheManager(3000, clock=clock, time_threshold_ms=1, entry_overhead_bytes=0)
    for i in range(24):
        c = m.cache(f"t{i % 3}")
        c.insert((i % 2, i), b"x" * (50 + i), expected_reads=i % 3)
        if i % 4 == 0:
            c.get((i % 2, i))
        clock.advance(1000)
    return m


def _advance(m, clock):
    clock.advance(5 * MS)


def _time_pass_then_shrink(m, clock):
    # A time pass first (everything is requeued or removed, stamped now);
    # with the clock not moved, the next pass's time walk stops at once and
    # the reading that follows is the size walk's.
    clock.advance(5 * MS)
    m.run_eviction()
    m.max_size_bytes = 600


SITES = {
    # label: (prepare, act, which reading raises counted from the next one)
    "insert: the entry's stamp": (_advance, lambda m: m.cache("t0").insert((5, 0), b"y" * 10),
                                  1),
    "insert: its eviction walk": (_advance,
                                  lambda m: m.cache("t0").insert((5, 0), b"y" * 2500), 2),
    "run_eviction: the pass's reading": (_advance, lambda m: m.run_eviction(), 1),
    "run_eviction: the time walk": (_advance, lambda m: m.run_eviction(), 2),
    "run_eviction: the size walk": (_time_pass_then_shrink, lambda m: m.run_eviction(), 2),
}


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, RuntimeError])
@pytest.mark.parametrize("site", sorted(SITES))
def test_an_exception_from_the_clock_leaves_the_cache_consistent(cm, site, exc):
    _clock_raises_at(cm, site, exc)


def _clock_raises_at(mod, site, exc):
    prepare, act, nth = SITES[site]
    clock = ScriptedClock(10**9)
    m = _loaded(mod, clock)
    prepare(m, clock)

    def boom():
        raise exc("from the clock")
    clock.actions[clock.reads + nth] = boom
    with pytest.raises(exc):
        act(m)
    assert not clock.actions, "the clock was not read where expected"
    check_manager(m)
    after = snapshot(m)
    # The cache keeps working: the next pass and insert succeed.
    clock.advance(5 * MS)
    m.run_eviction()
    m.cache("t1").insert((9, 9), b"z")
    check_manager(m)
    return (after, snapshot(m), clock.reads,
            [m.cache(n).get_range((0, 0), (9, 99)) for n in ("t0", "t1", "t2")])


@pytest.mark.c_extension
@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
@pytest.mark.parametrize("site", sorted(SITES))
def test_an_exception_from_the_clock_leaves_both_twins_equal(site, exc):
    # The pure twin once lost the evictions a walk had made before the
    # clock raised; C kept them.
    assert _clock_raises_at(import_module(C), site, exc) == \
        _clock_raises_at(import_module(PY), site, exc)


@both
def test_eviction_counts_survive_a_clock_that_raises_mid_walk(modname):
    mod = import_module(modname)
    clock = ScriptedClock(0)
    m = mod.EntryCacheManager(10**6, clock=clock, time_threshold_ms=1, entry_overhead_bytes=0)
    c = m.cache("t0")
    for i in range(6):      # plain, plain, plain, tracked, plain, plain
        c.insert((1, i), b"x" * 10, expected_reads=1 if i == 3 else 0)
    clock.advance(10 * MS)

    def boom():
        raise KeyboardInterrupt
    clock.actions[clock.reads + 2] = boom       # the requeue of (1, 3)
    with pytest.raises(KeyboardInterrupt):
        m.run_eviction()
    st = check_manager(m)
    # Three entries were removed before the walk needed the time: they are
    # gone and counted (the pure twin once lost the counts).
    assert (st.evicted_entries, st.evicted_bytes, st.entries) == (3, 30, 3)
    assert [c.get((1, i)) is None for i in range(6)] == [True] * 3 + [False] * 3


@both
def test_a_clock_that_inserts_the_same_position_during_insert(modname):
    mod = import_module(modname)
    clock = ScriptedClock(0)
    m = mod.EntryCacheManager(10**6, clock=clock, time_threshold_ms=1, entry_overhead_bytes=0)
    c = m.cache("t0")

    def reenter():
        assert c.insert((1, 1), b"inner")
    clock.actions[1] = reenter
    # The outer insert finds the position taken after reading the clock: it
    # returns False and caches nothing (C once queued an orphan entry that
    # no index held; the pure twin overwrote the index and later failed
    # with KeyError).
    assert c.insert((1, 1), b"outer") is False
    st = check_manager(m)
    assert (st.entries, st.inserts, len(c), c.get((1, 1))) == (1, 1, 1, b"inner")
    clock.advance(10 * MS)
    assert m.run_eviction() == (0, 0)           # the get above: requeued once
    clock.advance(10 * MS)
    assert m.run_eviction() == (1, 5)
    st = check_manager(m)
    assert (st.entries, st.size, len(c)) == (0, 0, 0)


@pytest.mark.c_extension
def test_a_clock_that_reenters_during_a_walk_gives_the_same_result_in_both():
    results = []
    for modname in (C, PY):
        mod = import_module(modname)
        clock = ScriptedClock(10**9)
        m = _loaded(mod, clock)
        clock.advance(5 * MS)
        calls = []

        def reenter(m=m, calls=calls):
            # While the walk waits for the time: read, insert (which may
            # start its own walk), invalidate and clear another cache.
            calls.append(m.cache("t1").get_range((0, 0), (1, 99)))
            m.cache("t2").insert((7, 1), b"q" * 2000)
            m.cache("t0").invalidate_up_to((0, 10))
            m.cache("t1").clear()
        clock.actions[clock.reads + 2] = reenter
        got = m.run_eviction()
        check_manager(m)
        results.append((got, snapshot(m), calls, clock.reads))
    assert results[0] == results[1]


@both
@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, RuntimeError])
def test_an_exception_from_storage_gives_the_permit_back(modname, exc):
    import asyncio

    mod = import_module(modname)
    m = mod.EntryCacheManager(1 << 20, clock=FakeClock(0))
    calls = []

    async def storage(name, first, last):
        calls.append((first, last))
        if len(calls) == 2:
            raise exc("from storage")
        return [b"d" * 10 for _ in range(last[1] - first[1] + 1)]

    reader = EntryReader(m, storage, 1000)
    m.cache("t0").insert((1, 2), b"cached")
    with pytest.raises(exc):
        asyncio.run(reader.read("t0", (1, 0), (1, 5)))
    # The first run (1:0..1:1) was inserted, the second raised: its permit
    # is back and nothing of it was cached.
    assert calls == [((1, 0), (1, 1)), ((1, 3), (1, 5))]
    assert reader.semaphore.acquired_permits == 0
    st = check_manager(m)
    assert st.entries == 3 and [m.cache("t0").get((1, e)) is None for e in range(6)] == [
        False, False, False, True, True, True]


@both
def test_a_released_memoryview_is_refused(modname):
    mod = import_module(modname)
    m = mod.EntryCacheManager(1000)
    c = m.cache("t")
    mv = memoryview(b"abcdef")
    mv.release()
    with pytest.raises(ValueError, match="released"):
        c.insert((1, 1), mv)
    assert len(c) == 0 and m.stats().inserts == 0
    live = memoryview(bytearray(b"abc"))
    assert c.insert((1, 2), live) and c.get((1, 2)) is live


# ---- the per-entry overhead (item 12) ----------------------------------------------------------


def test_entries_count_a_fixed_overhead_against_the_limit(cm):
    # A million empty payloads under a 1 KiB limit once held +649 MiB and
    # evicted nothing: every entry counted 0 bytes.
    m = cm.EntryCacheManager(1024, clock=FakeClock(0))
    assert m.entry_overhead_bytes == ENTRY_OVERHEAD_BYTES == 192
    c = m.cache("t")
    n = 20000
    for i in range(n):
        c.insert((1, i), b"")
        assert m.size <= 1024
    st = check_manager(m, ("t",))
    assert st.entries <= 1024 // ENTRY_OVERHEAD_BYTES
    assert st.evicted_entries == n - st.entries
    assert st.size == st.entries * ENTRY_OVERHEAD_BYTES
    assert m.average_entry_size == 0        # payload bytes: the read path's estimate


def test_entry_overhead_bytes_is_what_each_entry_adds(cm):
    m = cm.EntryCacheManager(10**6, entry_overhead_bytes=100)
    c = m.cache("t")
    c.insert((1, 1), b"x" * 50)
    c.insert((1, 2), memoryview(b"x" * 30))
    assert (m.size, c.size, m.stats().size) == (280, 280, 280)
    assert m.average_entry_size == 40
    assert c.invalidate_up_to((1, 1)) == (1, 150)
    assert c.clear() == (1, 130)
    m0 = cm.EntryCacheManager(10**6, entry_overhead_bytes=0)
    m0.cache("t").insert((1, 1), b"x" * 50)
    assert m0.size == 50
    for bad, exc in ((-1, ValueError), (2**63, ValueError), (1.5, TypeError),
                     (True, TypeError), (None, TypeError), ("7", TypeError)):
        with pytest.raises(exc):
            cm.EntryCacheManager(100, entry_overhead_bytes=bad)
    big = cm.EntryCacheManager(100, entry_overhead_bytes=2**63 - 1)
    with pytest.raises(ValueError, match="2\\*\\*63"):
        big.cache("t").insert((1, 1), b"x")
    assert big.size == 0


@pytest.mark.c_extension
@pytest.mark.skipif(DEBUG_BUILD or "san" in os.environ.get("LD_PRELOAD", ""),
                    reason="a debug build's or a sanitizer's allocator pads every block")
@pytest.mark.parametrize("layout", ["dense", "sparse", "one-per-ledger"])
def test_memory_per_cached_entry_is_within_the_overhead(layout):
    # Resident memory per entry (payloads made beforehand), C extension:
    # sparse positions once cost ~681 bytes each (a 64-slot page per entry).
    code = f"""
import gc, os
from pylimiter.pulsar.cache import _cache_c as mod
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
n = 300_000
pos = {{"dense": [(1, i) for i in range(n)], "sparse": [(1, 64 * i) for i in range(n)],
        "one-per-ledger": [(i, 0) for i in range(n)]}}[{layout!r}]
data = b"payload"
gc.collect()
before = rss()
m = mod.EntryCacheManager(1 << 62, clock=lambda: 0)
c = m.cache("t")
for p in pos:
    c.insert(p, data)
print((rss() - before) / n, flush=True)
os._exit(0)
"""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/statm")
    # The child leaves without freeing what it measured: under qemu the
    # teardown of 300,000 entries alone took the cp314 aarch64 check past
    # the 120 s limit on a loaded host, after the figure was printed.
    per_entry = float(run_isolated(code, timeout=300))
    assert per_entry <= ENTRY_OVERHEAD_BYTES


# ---- the hostile-argument matrix ---------------------------------------------------------------


async def _storage(name, first, last):
    return [b"s" * 10 for _ in range(last[1] - first[1] + 1)]


def _targets(mod, m):
    """(label, call(x)) for every public constructor, method and setting of
    the cache, with x in one argument position; the rest valid."""
    clock = FakeClock(10**9)
    q = mod.RemovalQueue(clock=clock)
    e = mod.CacheEntry("k", 1)
    c = m.cache("t0")
    reader = EntryReader(m, _storage, 1000)

    def read(first, last, reads=0):
        import asyncio
        return asyncio.run(reader.read("t1", first, last, expected_reads=reads))
    return [
        ("CacheEntry(key)", lambda x: mod.CacheEntry(x, 1)),
        ("CacheEntry(size)", lambda x: mod.CacheEntry("k", x)),
        ("CacheEntry(expected_reads)", lambda x: mod.CacheEntry("k", 1, expected_reads=x)),
        ("CacheEntry(timestamp_ns)", lambda x: mod.CacheEntry("k", 1, timestamp_ns=x)),
        ("entry.accessed=", lambda x: setattr(e, "accessed", x)),
        ("RemovalQueue(max_requeue)", lambda x: mod.RemovalQueue(x)),
        ("RemovalQueue(clock)", lambda x: mod.RemovalQueue(clock=x)),
        ("queue.add", lambda x: q.add(x)),
        ("queue.evict_before", lambda x: q.evict_before(x)),
        ("queue.evict_least_accessed", lambda x: q.evict_least_accessed(x)),
        ("queue.max_requeue=", lambda x: setattr(q, "max_requeue_count_when_expected_reads", x)),
        ("EntryCacheManager(max_size_bytes)", lambda x: mod.EntryCacheManager(x)),
        ("EntryCacheManager(eviction_watermark)",
         lambda x: mod.EntryCacheManager(100, eviction_watermark=x)),
        ("EntryCacheManager(eviction_trigger)",
         lambda x: mod.EntryCacheManager(100, eviction_trigger=x)),
        ("EntryCacheManager(time_threshold_ms)",
         lambda x: mod.EntryCacheManager(100, time_threshold_ms=x)),
        ("EntryCacheManager(max_requeue)",
         lambda x: mod.EntryCacheManager(100, max_requeue_count_when_expected_reads=x)),
        ("EntryCacheManager(clock)", lambda x: mod.EntryCacheManager(100, clock=x)),
        ("EntryCacheManager(entry_overhead_bytes)",
         lambda x: mod.EntryCacheManager(100, entry_overhead_bytes=x)),
        ("manager.max_size_bytes=", lambda x: setattr(m, "max_size_bytes", x)),
        ("manager.max_requeue=", lambda x: setattr(m, "max_requeue_count_when_expected_reads", x)),
        ("manager.cache", lambda x: m.cache(x)),
        ("cache.insert(position)", lambda x: c.insert(x, b"v")),
        ("cache.insert(ledger)", lambda x: c.insert((x, 1), b"v")),
        ("cache.insert(entry)", lambda x: c.insert((1, x), b"v")),
        ("cache.insert(data)", lambda x: c.insert((1, 2), x)),
        ("cache.insert(expected_reads)", lambda x: c.insert((1, 3), b"v", expected_reads=x)),
        ("cache.get", lambda x: c.get(x)),
        ("cache.get(entry)", lambda x: c.get((1, x))),
        ("cache.contains", lambda x: x in c),
        ("cache.get_range(first)", lambda x: c.get_range(x, (9, 9))),
        ("cache.get_range(last ledger)", lambda x: c.get_range((0, 0), (x, 9))),
        ("cache.mark_read", lambda x: c.mark_read((x, 1))),
        ("cache.add_expected_read", lambda x: c.add_expected_read((1, x))),
        ("cache.invalidate_up_to", lambda x: c.invalidate_up_to(x)),
        ("cache.invalidate_up_to(entry)", lambda x: c.invalidate_up_to((0, x))),
        ("EntryReader(manager)", lambda x: EntryReader(x, _storage, 100)),
        ("EntryReader(storage)", lambda x: EntryReader(m, x, 100)),
        ("EntryReader(limit)", lambda x: EntryReader(m, _storage, x)),
        ("EntryReader(acquire_timeout)", lambda x: EntryReader(m, _storage, 100,
                                                              acquire_timeout=x)),
        ("EntryReader(max_queue_size)", lambda x: EntryReader(m, _storage, 100,
                                                             max_queue_size=x)),
        ("reader.estimate", lambda x: reader.estimate(x)),
        ("reader.read(first)", lambda x: read((4, x), (4, 3))),
        ("reader.read(last)", lambda x: read((4, 0), (4, x))),
        ("reader.read(expected_reads)", lambda x: read((4, 0), (4, 1), x)),
    ]


def _kind(result):
    """A comparable summary of a call's outcome across the twins."""
    status, value = result
    if status == "raised" or isinstance(value, (bool, int, float, str, bytes, tuple, list,
                                                 type(None))):
        return status, value
    return status, type(value).__name__


def _matrix(modname, label):
    mod = import_module(modname)
    m = mod.EntryCacheManager(4000, clock=FakeClock(10**9), time_threshold_ms=1)
    for i in range(5):
        m.cache(f"t{i % 3}").insert((1, i), b"x" * 20, expected_reads=i % 2)
    call = dict(_targets(mod, m))[label]
    got = []
    for name, value in hostile_values():
        result = outcome(call, value)
        check_manager(m)
        got.append((name, _kind(result)))
    return got


_LABELS = [t[0] for t in _targets(import_module(PY), import_module(PY).EntryCacheManager(1))]


@both
@pytest.mark.parametrize("label", _LABELS)
def test_hostile_argument_matrix(modname, label):
    """Each call works or raises TypeError/ValueError (``outcome`` lets
    nothing else through) and the manager stays consistent."""
    _matrix(modname, label)


@pytest.mark.c_extension
@pytest.mark.parametrize("label", _LABELS)
def test_hostile_argument_matrix_twins_agree(label):
    assert _matrix(C, label) == _matrix(PY, label)


# ---- the garbage collector inside deallocators (item 1) -----------------------------------------


@pytest.mark.slow          # seconds: a fresh interpreter collecting at every allocation
@both
def test_collections_inside_deallocators_and_cycles(modname):
    """gc.set_threshold(1) (a collection at almost every allocation), keys
    and payload owners whose finalisers collect and call back into caches,
    managers dropped inside reference cycles: no crash, no double free, the
    surviving manager consistent."""
    code = f"""
import gc, sys
from importlib import import_module
from array import array
mod = import_module({modname!r})
gc.set_threshold(1)
survivor = mod.EntryCacheManager(3000, clock=lambda: 0, entry_overhead_bytes=8)
sc = survivor.cache("s")
counter = [0]

class Key:
    # A key whose finaliser collects and uses another cache.
    def __init__(self, i):
        self.i = i
    def __hash__(self):
        return self.i
    def __del__(self):
        gc.collect()
        counter[0] += 1
        sc.insert((1, counter[0]), b"k" * 5)
        sc.get((1, counter[0] - 1))

class Owner:
    # Holds the manager that holds it: a cycle through the clock.
    def __init__(self, n):
        self.m = mod.EntryCacheManager(n, clock=self.now, time_threshold_ms=0)
        self.t = 0
    def now(self):
        self.t += 1
        if self.t % 7 == 0:
            gc.collect()
        return self.t

for round in range({{rounds}}):
    q = mod.RemovalQueue(2, True, clock=lambda: 5)
    entries = [mod.CacheEntry(Key(i), i, expected_reads=i % 3) for i in range(20)]
    for e in entries[:15]:
        q.add(e)
    q.evict_least_accessed(40)
    del entries, e
    del q                                   # frees queued entries: Key.__del__ runs
    o = Owner(500)
    caches = [o.m.cache(f"t{{i}}") for i in range(4)]
    for i in range(40):
        caches[i % 4].insert((i % 3, i), memoryview(array("b", b"p" * (i % 50))),
                             expected_reads=i % 2)
        caches[(i + 1) % 4].get((i % 3, max(i - 1, 0)))
    o.m.run_eviction()
    caches[1].invalidate_up_to((1, 20))
    del caches, o                           # a cycle: only the collector frees it
    gc.collect()
st = survivor.stats()
assert st.size == survivor.size == sc.size and st.entries == len(sc)
print("ok", counter[0])
"""
    out = run_isolated(code.replace("{rounds}", "10" if DEBUG_BUILD else "60"), timeout=300)
    assert out.startswith("ok")
