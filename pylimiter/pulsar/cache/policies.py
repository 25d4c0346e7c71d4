"""The eviction policies the simulator compares, each a small class that
builds a cache manager with the EntryCacheManager interface (``cache(name)``
with insert/get/get_range/mark_read/add_expected_read/invalidate_up_to/clear,
``run_eviction()``, ``stats()``, ``size``):

``pip430``                    PIP-430 as merged: the global removal queue,
                              entries inserted with expected read counts
                              (cacheEvictionByExpectedReadCount=true), TTL
                              extension of recently accessed entries
``pip430-no-expected-reads``  the same queue with read counting off
``fifo``                      the same queue, no requeues: TTL and size only
``lru``                       one global LRU bounded by size (no TTL), the
                              kind Tencent moved to (OHC)
``legacy``                    Pulsar before PIP-430: every pass scans every
                              topic's cache for expired entries from its
                              lowest position; size eviction picks the
                              largest caches holding half the bytes and frees
                              from each in proportion, oldest positions
                              first; inserts are refused once the cache is
                              full; entries are invalidated up to the slowest
                              cursor's read position

``invalidate_on`` tells the replayer which cursor position drops entries:
``mark_delete`` (entries every subscription acknowledged, which nobody can
read again) or ``slowest_read`` (Pulsar's default before PIP-430,
cacheEvictionByMarkDeletedPosition=false: entries every cursor has read,
including ones still waiting for redelivery).
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right, insort
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from . import EntryCacheManager
from ._common import (
    DEFAULT_EVICTION_TRIGGER,
    DEFAULT_EVICTION_WATERMARK,
    DEFAULT_MAX_REQUEUE,
    DEFAULT_TIME_THRESHOLD_MS,
    CacheStats,
    check_bound,
    check_max_size,
    check_position,
    check_time_threshold_ms,
    data_size,
)

__all__ = ["POLICIES", "Policy", "LegacyCacheManager", "LRUCacheManager"]


@dataclass(frozen=True)
class Policy:
    """Policy names one eviction policy and builds its manager."""

    name: str
    description: str
    uses_expected_reads: bool
    invalidate_on: str          # "mark_delete" or "slowest_read"
    factory: Callable

    def build(self, max_size_bytes: int, *, time_threshold_ms: float = DEFAULT_TIME_THRESHOLD_MS,
              max_requeue: int = DEFAULT_MAX_REQUEUE,
              eviction_watermark: float = DEFAULT_EVICTION_WATERMARK,
              clock: Callable[[], int] = time.monotonic_ns):
        """A fresh manager for ``max_size_bytes`` with this policy
        (managedLedgerCacheEvictionTimeThresholdMillis, ...MaxTimes,
        managedLedgerCacheEvictionWatermark)."""
        return self.factory(max_size_bytes, time_threshold_ms=time_threshold_ms,
                            max_requeue=max_requeue, eviction_watermark=eviction_watermark,
                            clock=clock)


def _queue_policy(extend: bool, requeues: bool):
    def build(max_size_bytes, *, time_threshold_ms, max_requeue, eviction_watermark, clock):
        # entry_overhead_bytes=0: a broker's managedLedgerCacheSizeMB counts
        # payload bytes only, and the reference policies below do the same.
        return EntryCacheManager(max_size_bytes, time_threshold_ms=time_threshold_ms,
                                 eviction_watermark=eviction_watermark,
                                 max_requeue_count_when_expected_reads=max_requeue if requeues
                                 else 0,
                                 extend_ttl_of_recently_accessed=extend, clock=clock,
                                 entry_overhead_bytes=0)
    return build


# ---- per-topic sorted entries, shared by the two reference policies ----------------------


class _SortedCache:
    """One topic's entries by position, in position order, for the pure
    Python reference policies.  Subclasses decide eviction."""

    __slots__ = ("name", "_m", "_entries", "_order", "size")

    def __init__(self, manager, name: str):
        self.name, self._m = name, manager
        self._entries: dict[tuple, tuple] = {}      # pos -> (data, size, timestamp)
        self._order: list[tuple] = []
        self.size = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, position) -> bool:
        return check_position(position) in self._entries

    def insert(self, position, data, *, expected_reads: int = 0) -> bool:
        """EntryCache.insert's checks; these policies do not count reads, so
        ``expected_reads`` is ignored.  False when caching is off or the
        position is cached already; else the policy's ``_insert``."""
        pos = check_position(position)
        size = data_size(data)
        if self._m._max == 0 or pos in self._entries:
            return False
        return self._insert(pos, data, size)

    def _add(self, pos, data, size, ts) -> None:
        self._entries[pos] = (data, size, ts)
        if not self._order or self._order[-1] < pos:
            self._order.append(pos)
        else:
            insort(self._order, pos)
        self.size += size
        self._m._size += size

    def _remove_prefix(self, upto: int) -> tuple[int, int]:
        b = 0
        for pos in self._order[:upto]:
            b += self._entries.pop(pos)[1]
            self._m._forget(self, pos)
        del self._order[:upto]
        self.size -= b
        self._m._size -= b
        return upto, b

    def _remove(self, pos) -> int:
        size = self._entries.pop(pos)[1]
        del self._order[bisect_left(self._order, pos)]
        self.size -= size
        self._m._size -= size
        return size

    def get(self, position):
        e = self._entries.get(check_position(position))
        if e is None:
            self._m._misses += 1
            return None
        self._m._hits += 1
        self._m._touch(self, position)
        return e[0]

    def get_range(self, first, last) -> list:
        lo, hi = check_bound(first), check_bound(last)
        out = []
        for pos in self._order[bisect_left(self._order, lo):bisect_right(self._order, hi)]:
            self._m._touch(self, pos)
            out.append(self._entries[pos][0])
        return out

    def mark_read(self, position) -> None:
        """No read counting in this policy."""

    def add_expected_read(self, position) -> None:
        """No read counting in this policy."""

    def invalidate_up_to(self, position) -> tuple[int, int]:
        return self._remove_prefix(bisect_right(self._order, check_bound(position)))

    def clear(self) -> tuple[int, int]:
        return self._remove_prefix(len(self._order))


class _ReferenceManager:
    """What the two pure-Python reference managers share: caches by name,
    counters, the thresholds."""

    def __init__(self, max_size_bytes: int, *, time_threshold_ms: float, clock,
                 eviction_watermark: float = DEFAULT_EVICTION_WATERMARK):
        self._max = check_max_size(max_size_bytes)
        self._threshold_ns = check_time_threshold_ms(time_threshold_ms)
        self._trigger_bytes = int(self._max * DEFAULT_EVICTION_TRIGGER)
        self._watermark_bytes = int(self._max * eviction_watermark)
        self._clock = clock
        self._caches: dict[str, _SortedCache] = {}
        self._size = 0
        self._hits = self._misses = self._inserts = 0
        self._evicted_entries = self._evicted_bytes = 0

    cache_class = _SortedCache

    def cache(self, name: str):
        c = self._caches.get(name)
        if c is None:
            c = self._caches[name] = self.cache_class(self, name)
        return c

    @property
    def size(self) -> int:
        return self._size

    def stats(self) -> CacheStats:
        return CacheStats(self._hits, self._misses, self._inserts, self._evicted_entries,
                          self._evicted_bytes, 0, self._size,
                          sum(len(c) for c in self._caches.values()))

    def _touch(self, cache, pos) -> None:
        """A hit on ``pos`` (LRU moves it to the recent end)."""

    def _forget(self, cache, pos) -> None:
        """``pos`` left ``cache`` by invalidation."""


# ---- legacy ---------------------------------------------------------------------------------


class _LegacyCache(_SortedCache):
    __slots__ = ()

    def _insert(self, pos, data, size: int) -> bool:
        m = self._m
        # RangeEntryCacheImpl.insert: no space (currentSize >= maxSize) -> not cached.
        if m._size >= m._max:
            return False
        self._add(pos, data, size, m._clock())
        m._inserts += 1
        if m._size > m._trigger_bytes:
            m._size_eviction()
        return True

    def evict_before(self, before: int) -> tuple[int, int]:
        """RangeCache.evictLEntriesBeforeTimestamp: from the lowest position,
        stop at the first entry that is not older."""
        n = 0
        for pos in self._order:
            if not self._entries[pos][2] < before:
                break
            n += 1
        return self._remove_prefix(n) if n else (0, 0)

    def evict_oldest(self, size_to_free: int) -> tuple[int, int]:
        """RangeCache.evictLeastAccessedEntries: lowest positions first."""
        n = b = 0
        for pos in self._order:
            if b >= size_to_free:
                break
            b += self._entries[pos][1]
            n += 1
        return self._remove_prefix(n)


class LegacyCacheManager(_ReferenceManager):
    """Pulsar's RangeEntryCacheManagerImpl + EntryCacheDefaultEvictionPolicy
    before PIP-430 (see the module docstring)."""

    cache_class = _LegacyCache

    def run_eviction(self) -> tuple[int, int]:
        """ManagedLedgerFactoryImpl.doCacheEviction: every topic's cache,
        every pass; then size eviction when above the trigger."""
        before = self._clock() - self._threshold_ns
        n = b = 0
        for c in self._caches.values():
            if c.size > 0:
                dn, db = c.evict_before(before)
                n += dn
                b += db
        self._evicted_entries += n
        self._evicted_bytes += b
        if self._size > self._trigger_bytes:
            dn, db = self._size_eviction()
            n += dn
            b += db
        return n, b

    def _size_eviction(self) -> tuple[int, int]:
        size_to_free = self._size - self._watermark_bytes
        if size_to_free <= 0:
            return 0, 0
        caches = sorted((c for c in self._caches.values() if c.size > 0),
                        key=lambda c: c.size, reverse=True)
        total = sum(c.size for c in caches)
        chosen, chosen_size = [], 0
        for c in caches:                       # the largest caches holding half the bytes
            if chosen_size >= total * 0.5:
                break
            chosen.append(c)
            chosen_size += c.size
        n = b = 0
        for c in chosen:
            share = int(size_to_free * (c.size / chosen_size))
            if share > 0:
                dn, db = c.evict_oldest(share)
                n += dn
                b += db
        self._evicted_entries += n
        self._evicted_bytes += b
        return n, b


# ---- lru -----------------------------------------------------------------------------------


class _LRUCache(_SortedCache):
    __slots__ = ()

    def _insert(self, pos, data, size: int) -> bool:
        m = self._m
        self._add(pos, data, size, 0)
        m._lru[(self.name, pos)] = self
        m._inserts += 1
        while m._size > m._max:
            (name, victim), cache = m._lru.popitem(last=False)
            m._evicted_bytes += cache._remove(victim)
            m._evicted_entries += 1
        return True


class LRUCacheManager(_ReferenceManager):
    """One global least-recently-used order over all topics' entries, bounded
    by max_size_bytes; a hit moves an entry to the recent end; no TTL."""

    cache_class = _LRUCache

    def __init__(self, max_size_bytes: int, **kw):
        super().__init__(max_size_bytes, **kw)
        self._lru: OrderedDict[tuple, _LRUCache] = OrderedDict()

    def run_eviction(self) -> tuple[int, int]:
        """Nothing to do: size is enforced on insert, and there is no TTL."""
        return 0, 0

    def _touch(self, cache, pos) -> None:
        self._lru.move_to_end((cache.name, pos))

    def _forget(self, cache, pos) -> None:
        del self._lru[(cache.name, pos)]


def _reference(cls):
    def build(max_size_bytes, *, time_threshold_ms, max_requeue, eviction_watermark, clock):
        return cls(max_size_bytes, time_threshold_ms=time_threshold_ms, clock=clock,
                   eviction_watermark=eviction_watermark)
    return build


POLICIES: dict[str, Policy] = {p.name: p for p in (
    Policy("pip430", "removal queue, expected read counts, TTL extension of accessed entries",
           True, "mark_delete", _queue_policy(extend=True, requeues=True)),
    Policy("pip430-no-expected-reads", "removal queue, TTL extension of accessed entries",
           False, "mark_delete", _queue_policy(extend=True, requeues=False)),
    Policy("fifo", "removal queue, TTL and size only", False, "mark_delete",
           _queue_policy(extend=False, requeues=False)),
    Policy("lru", "global LRU bounded by size, no TTL", False, "mark_delete",
           _reference(LRUCacheManager)),
    Policy("legacy", "per-topic scans, proportional size eviction, read-position invalidation",
           False, "slowest_read", _reference(LegacyCacheManager)),
)}
