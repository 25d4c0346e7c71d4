"""Shared by the cache tests (their `cm` fixture is in conftest.py): the
implementations' modules, a settable clock, the consistency checks a manager
must pass after anything, and every cache object in every state (for the
attribute walk of tests/pulsar/hostile.py)."""

from __future__ import annotations

import sys

import pytest

from pylimiter._impls import TWINS

#: tag -> the cache module of that implementation (from the one list of twins)
MODULES = dict(zip(("c", "python"), TWINS["cache"]))
MS = 1_000_000

#: A Py_DEBUG interpreter (python3.11-dbg): every allocation and refcount is
#: checked, so the same work takes 10-80x longer (more under
#: gc.set_threshold(1)).  The property tests then run fewer examples and the
#: simulator's workloads are left to the release build, so the debug tier
#: stays within its budget while still driving every code path of the
#: extension.
DEBUG_BUILD = hasattr(sys, "gettotalrefcount")


def examples(n: int) -> int:
    """Hypothesis examples for a property test: ``n``, or a twelfth (at least
    5) on a debug build."""
    return max(5, n // 12) if DEBUG_BUILD else n


release_only = pytest.mark.skipif(
    DEBUG_BUILD, reason="a simulator workload: too slow under Py_DEBUG, run by the release build")


class FakeClock:
    """A clock the test moves: int nanoseconds, counts its readings."""

    def __init__(self, now: int = 0):
        self.now = now
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now

    def advance(self, ns: int) -> int:
        self.now += ns
        return self.now


class ScriptedClock(FakeClock):
    """A FakeClock with a script: before its n-th reading (1-based) it runs
    ``actions[n]()`` (which may raise, KeyboardInterrupt included, or call
    back into the cache), and it hands out ``values[n]`` instead of ``now``
    when there is one."""

    def __init__(self, now: int = 0):
        super().__init__(now)
        self.actions: dict[int, object] = {}
        self.values: dict[int, object] = {}

    def __call__(self):
        self.reads += 1
        n = self.reads
        action = self.actions.pop(n, None)
        if action is not None:
            action()
        if n in self.values:
            return self.values.pop(n)
        return self.now


# ---- consistency of a manager and its caches ------------------------------------------------


def check_manager(m, names=("t0", "t1", "t2")):
    """What must hold after any sequence of calls, exceptions included: the
    manager's gauges are the sums over its caches, every cached position
    answers, and sizes are consistent with the counts."""
    st = m.stats()
    caches = [m.cache(n) for n in names]
    assert st.size == m.size == sum(c.size for c in caches)
    assert st.entries == sum(len(c) for c in caches)
    assert 0 <= st.size and 0 <= st.entries
    assert st.size >= st.entries * m.entry_overhead_bytes
    ne, nb = m.non_evictable()
    assert 0 <= ne <= st.entries and 0 <= nb <= st.size
    assert st.evicted_entries >= 0 and st.evicted_bytes >= 0 and st.requeues >= 0
    return st


def snapshot(m, names=("t0", "t1", "t2")):
    """The observable state, without touching `accessed` (get_range would)."""
    return (m.stats(), m.non_evictable(), m.average_entry_size,
            tuple((len(m.cache(n)), m.cache(n).size) for n in names))


def cache_objects_in_every_state(mod):
    """(label, object) for every cache object in every state: fresh,
    populated, after eviction, cleared, uninitialised (built with __new__),
    and the entries a cache made."""
    out = []
    clock = FakeClock(10**9)
    for cls in (mod.CacheEntry, mod.RemovalQueue, mod.EntryCache, mod.EntryCacheManager):
        out.append((f"{cls.__name__} uninitialised", cls.__new__(cls)))
    out.append(("entry fresh", mod.CacheEntry("k", 3)))
    tracked = mod.CacheEntry(("k", 1), 5, expected_reads=2, timestamp_ns=7)
    out.append(("entry tracked", tracked))
    q = mod.RemovalQueue(2, True, clock=clock)
    out.append(("queue fresh", q))
    q2 = mod.RemovalQueue(0, False, clock=clock)
    queued = [mod.CacheEntry(i, 10, timestamp_ns=i) for i in range(5)]
    for e in queued:
        q2.add(e)
    queued[0].accessed = True
    out += [("queue populated", q2), ("entry queued", queued[1])]
    q2.evict_before(3)
    out += [("queue after eviction", q2), ("entry evicted", queued[0])]
    m = mod.EntryCacheManager(4000, clock=clock, time_threshold_ms=1)
    out.append(("manager fresh", m))
    c = m.cache("t")
    out.append(("cache fresh", c))
    for i in range(20):
        c.insert((1, i), b"x" * 50, expected_reads=i % 3)
    c.get((1, 3))
    out += [("manager populated", m), ("cache populated", c)]
    clock.advance(10 * MS)
    m.run_eviction()
    out += [("manager after eviction", m), ("cache after eviction", c)]
    c.invalidate_up_to((1, 10))
    c2 = m.cache("u")
    c2.insert((0, 0), memoryview(b"abc"))
    c2.clear()
    out += [("cache cleared", c2), ("cache invalidated", c)]
    if mod.__name__.endswith("_py"):
        # The pure twin exposes the entries an EntryCache made (C keeps them
        # inside the extension).
        out += [(f"cache entry {i}", e) for i, e in enumerate(list(m._queue)[:3])]
    m0 = mod.EntryCacheManager(0, clock=clock)
    out.append(("manager disabled", m0))
    return out
