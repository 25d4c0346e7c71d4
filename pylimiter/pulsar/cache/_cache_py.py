"""Pure-Python implementation of the broker entry cache (PIP-430): the
executable specification that the C implementation (``_cache_c``) is tested
against, with the same classes, methods, errors and results.

Structures: the removal queue is an OrderedDict used as an insertion-ordered
set of entries (head first), so an entry moves to the tail or leaves from
the middle in O(1); an EntryCache is a dict from position to entry plus a
sorted list of its positions for range reads and invalidation.

Entries removed by invalidation or ``clear()`` leave the queue at once.
Pulsar leaves them in its lock-free queue until a walk reaches them and then
drops them; either way they never stop a walk and never count toward
``size_to_free`` or a walk's totals, which is all the rule asks.

As in the C twin: payloads of removed entries are dropped only once the walk
or invalidation is over (a payload's release may run Python code, which then
sees a consistent cache); the clock is the only user code a walk calls, and
after it returns the walk looks at the head again, as the C walk does.  An
object built with ``cls.__new__(cls)`` alone raises NotInitialisedError from
every method and attribute (``__getattr__`` turns the missing state into it,
at no cost to initialised objects); ``__init__`` runs once; copy and pickle
are refused.

MemoryError (issue 32): every operation is all-or-nothing, as in C.  Each
method first computes everything that allocates (new ints, the entry, lists,
the tuple it returns), then makes its changes with steps that cannot fail:
slot stores and dict deletions.  The few container changes that can fail
(an OrderedDict or dict insertion, the first OrderedDict deletion after its
table grew) come first and leave the container as it was when they fail;
an insertion into the index is undone if the queue's then fails.  A walk is
made of such steps, one per entry: it stops between two entries, as when
the clock raises, keeping what it removed, and the next walk finishes it.
An EntryCache's sorted positions may keep positions whose entry a walk
removed (deleting from a list can reallocate, and fail, after the rest of
an eviction is done): readers skip them, the next insert into that cache
prunes them once they outnumber the entries, and invalidate_up_to/clear
drop them.  Removed entries are chained through a slot, not appended to a
list, so dropping their payloads after a walk allocates nothing.

Not thread-safe: use a manager, its caches and queues from one thread (an
asyncio loop's), as the simulator and EntryReader do.
"""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from typing import Callable, Hashable, Iterator, Optional, Union

from ._common import (
    DEFAULT_EVICTION_TRIGGER,
    DEFAULT_EVICTION_WATERMARK,
    DEFAULT_MAX_REQUEUE,
    DEFAULT_TIME_THRESHOLD_MS,
    ENTRY_OVERHEAD_BYTES,
    MAX_ID,
    MAX_U64,
    MIN_I64,
    CacheStats,
    NotInitialisedError,
    already_initialised_error,
    already_queued_error,
    cache_name_error,
    check_bound,
    check_clock,
    check_entry_overhead,
    check_expected_reads,
    check_key,
    check_max_requeue,
    check_max_size,
    check_position,
    check_size,
    check_size_to_free,
    check_thresholds,
    check_time_threshold_ms,
    check_timestamp,
    clock_error,
    copy_error,
    data_size,
    not_initialised_entry_error,
    not_initialised_error,
    removed_error,
    show,
    threshold_bytes,
    total_bytes_error,
)

__all__ = ["CacheEntry", "RemovalQueue", "EntryCache", "EntryCacheManager", "CacheStats",
           "NotInitialisedError"]

Data = Union[bytes, memoryview]


def _now(clock) -> int:
    now = clock()
    if type(now) is int and MIN_I64 <= now <= MAX_ID:
        return now
    raise clock_error(now)


def _is_set(obj, attr: str) -> bool:
    try:
        object.__getattribute__(obj, attr)
    except AttributeError:
        return False
    return True


class _Guarded:
    """Copy and pickle refused; ``_ok()`` raises NotInitialisedError on an
    object built with ``cls.__new__(cls)`` alone (its ``_SENTINEL`` slot is
    unset).  Each public method and property calls it (or reads the
    sentinel in a try) first: a class-level ``__getattr__`` would do the same
    with less code, but it turns off CPython's fast slot reads for every
    attribute of the class."""

    __slots__ = ()
    _SENTINEL = ""

    def _ok(self) -> None:
        try:
            object.__getattribute__(self, self._SENTINEL)
        except AttributeError:
            raise not_initialised_error(type(self).__name__) from None

    def __reduce__(self):
        raise copy_error(type(self).__name__)

    def __reduce_ex__(self, protocol):
        raise copy_error(type(self).__name__)

    def __copy__(self):
        raise copy_error(type(self).__name__)

    def __deepcopy__(self, memo):
        raise copy_error(type(self).__name__)


class CacheEntry(_Guarded):
    """CacheEntry is one cached entry as the removal queue sees it.

    ``expected_reads <= 0`` means the entry has no read-count tracking
    (Pulsar's ``EntryReadCountHandlerImpl.maybeCreate`` returns null):
    ``expected_reads`` is then None and ``mark_read``/``add_expected_read``
    do nothing.  ``timestamp_ns`` defaults to ``time.monotonic_ns()``;
    entries made by an EntryCache are stamped with their manager's clock.
    """

    __slots__ = ("_key", "_size", "_ts", "_accessed", "_removed", "_requeues", "_reads",
                 "_tracked", "_owner", "_data", "_queue", "_next_gone")
    _SENTINEL = "_size"

    def __init__(self, key: Hashable, size: int, *, expected_reads: int = 0,
                 timestamp_ns: Optional[int] = None):
        if _is_set(self, "_size"):
            raise already_initialised_error("CacheEntry")
        check_key(key)  # an unhashable key is a TypeError here, not later
        size = check_size(size)
        n = check_expected_reads(expected_reads)
        ts = time.monotonic_ns() if timestamp_ns is None else check_timestamp(timestamp_ns)
        self._key = key
        self._ts = ts
        self._tracked = n > 0
        self._reads = n if n > 0 else 0
        self._accessed = False
        self._removed = False
        self._requeues = 0
        self._owner: Optional[EntryCache] = None
        self._data: Optional[Data] = None
        self._queue: Optional[RemovalQueue] = None
        self._next_gone: Optional[CacheEntry] = None
        self._size = size           # last: the object counts as initialised from here

    @property
    def key(self) -> Hashable:
        """The key (the position for entries made by an EntryCache)."""
        self._ok()
        return self._key

    @property
    def size(self) -> int:
        """Bytes this entry accounts for."""
        self._ok()
        return self._size

    @property
    def timestamp_ns(self) -> int:
        """Creation time, reset to the queue clock's now by every requeue."""
        self._ok()
        return self._ts

    @property
    def accessed(self) -> bool:
        """Set by a cache hit (get, get_range, EntryReader); cleared by a
        requeue."""
        self._ok()
        return self._accessed

    @accessed.setter
    def accessed(self, value: bool) -> None:
        self._ok()
        self._accessed = bool(value)

    @property
    def removed(self) -> bool:
        """True once a removal queue evicted it or its cache invalidated it."""
        self._ok()
        return self._removed

    @property
    def requeue_count(self) -> int:
        """Requeues by either walk; never reset."""
        self._ok()
        return self._requeues

    @property
    def expected_reads(self) -> Optional[int]:
        """Reads still expected (may be negative: Pulsar has no floor), or
        None when the entry has no read-count tracking."""
        self._ok()
        return self._reads if self._tracked else None

    @property
    def has_expected_reads(self) -> bool:
        """Tracked and expected_reads > 0."""
        self._ok()
        return self._tracked and self._reads > 0

    def mark_read(self) -> None:
        """One expected read happened (the entry was delivered once)."""
        self._ok()
        if self._tracked and self._reads > MIN_I64:
            self._reads -= 1

    def add_expected_read(self) -> None:
        """One more read is expected (the entry went on a replay queue)."""
        self._ok()
        if self._tracked and self._reads < MAX_ID:
            self._reads += 1

    def __repr__(self) -> str:
        if not _is_set(self, "_size"):
            return "<CacheEntry uninitialised>"
        state = " removed" if self._removed else ""
        return (f"<CacheEntry key={show(self._key)} size={self._size} "
                f"expected_reads={self.expected_reads} requeues={self._requeues}{state}>")


class RemovalQueue(_Guarded):
    """RemovalQueue holds entries in global insertion order (head first) and
    evicts from the head, PIP-430's ``RangeCacheRemovalQueue``.

    An entry met by a walk is requeued (moved to the tail, timestamp reset
    to the clock's now, ``accessed`` cleared, ``requeue_count`` + 1) when
    ``(extend_ttl_of_recently_accessed and entry.accessed)`` or
    ``(entry.has_expected_reads and entry.requeue_count <
    max_requeue_count_when_expected_reads)``, else removed.  Removing an
    entry removes it from the EntryCache that owns it and sets ``removed``.
    """

    __slots__ = ("_order", "_bytes", "_max_requeue", "_extend", "_clock", "_requeues",
                 "_evicted_entries", "_evicted_bytes")
    _SENTINEL = "_order"

    def __init__(self, max_requeue_count_when_expected_reads: int = DEFAULT_MAX_REQUEUE,
                 extend_ttl_of_recently_accessed: bool = True, *,
                 clock: Callable[[], int] = time.monotonic_ns):
        if _is_set(self, "_order"):
            raise already_initialised_error("RemovalQueue")
        max_requeue = check_max_requeue(max_requeue_count_when_expected_reads)
        extend = bool(extend_ttl_of_recently_accessed)
        check_clock(clock)
        self._max_requeue = max_requeue
        self._extend = extend
        self._clock = clock
        self._bytes = 0
        self._requeues = 0
        self._evicted_entries = 0
        self._evicted_bytes = 0
        self._order: OrderedDict[CacheEntry, None] = OrderedDict()   # last: initialised

    # ---- settings (PIP-430's are dynamic) ------------------------------------

    @property
    def max_requeue_count_when_expected_reads(self) -> int:
        """managedLedgerCacheEvictionExtendTTLOfEntriesWithRemainingExpectedReadsMaxTimes."""
        self._ok()
        return self._max_requeue

    @max_requeue_count_when_expected_reads.setter
    def max_requeue_count_when_expected_reads(self, value: int) -> None:
        self._ok()
        self._max_requeue = check_max_requeue(value)

    @property
    def extend_ttl_of_recently_accessed(self) -> bool:
        """managedLedgerCacheEvictionExtendTTLOfRecentlyAccessed."""
        self._ok()
        return self._extend

    @extend_ttl_of_recently_accessed.setter
    def extend_ttl_of_recently_accessed(self, value: bool) -> None:
        self._ok()
        self._extend = bool(value)

    # ---- contents ------------------------------------------------------------

    def add(self, entry: CacheEntry) -> None:
        """Append ``entry`` at the tail.  An entry that is queued already
        (here or elsewhere), was removed or was never initialised is a
        ValueError, and so is one that would take the queue's byte total past
        2**63 - 1."""
        self._ok()
        order = self._order
        if type(entry) is not CacheEntry:
            raise TypeError(f"expected a CacheEntry, not {type(entry).__name__}")
        if not _is_set(entry, "_size"):
            raise not_initialised_entry_error()
        if entry._removed:
            raise removed_error()
        if entry._queue is not None:
            raise already_queued_error()
        if entry._size > MAX_ID - self._bytes:
            raise total_bytes_error("the queue")
        nbytes = self._bytes + entry._size
        order[entry] = None         # the one step that can fail, and then changes nothing
        entry._queue = self
        self._bytes = nbytes

    def is_empty(self) -> bool:
        """True when no entry is queued."""
        self._ok()
        return not self._order

    def __len__(self) -> int:
        self._ok()
        return len(self._order)

    def __iter__(self) -> Iterator[CacheEntry]:
        """The queued entries, head (next to be walked) first; a snapshot."""
        self._ok()
        return iter(list(self._order))

    @property
    def size(self) -> int:
        """Bytes of the queued entries."""
        self._ok()
        return self._bytes

    def non_evictable(self) -> tuple[int, int]:
        """(entries, bytes) of the queued entries with has_expected_reads."""
        self._ok()
        n = b = 0
        for e in self._order:
            if e._tracked and e._reads > 0:
                n += 1
                b += e._size
        return n, b

    # ---- walks ---------------------------------------------------------------

    def evict_before(self, timestamp_ns: int) -> tuple[int, int]:
        """Walk from the head over entries older than ``timestamp_ns``,
        requeueing or removing each by the rule; the first entry that is not
        older stops the walk.  Returns (entries removed, bytes removed)."""
        self._ok()
        before = check_timestamp(timestamp_ns)
        return self._walk(before, 0)

    def evict_least_accessed(self, size_to_free: int) -> tuple[int, int]:
        """Walk from the head, requeueing or removing each entry by the rule,
        cycling past the tail as often as needed, until the bytes removed
        reach ``size_to_free`` (> 0, else ValueError) or the queue is empty.
        Returns (entries removed, bytes removed)."""
        self._ok()
        return self._walk(None, min(check_size_to_free(size_to_free), MAX_ID))

    def _walk(self, before: Optional[int], size_to_free: int) -> tuple[int, int]:
        order = self._order
        n = b = 0
        now = None
        max_requeue, extend = self._max_requeue, self._extend
        gone: Optional[CacheEntry] = None       # removed entries, chained
        try:
            # Each requeue clears `accessed` and counts toward the limit, so an
            # entry is requeued at most max_requeue + 1 times per walk: it ends.
            # Each step (one entry requeued or removed) computes what it
            # allocates first, then changes the queue with one call that fails
            # without changing anything, then stores: a MemoryError anywhere
            # ends the walk between two entries.
            while order:
                if before is None and b >= size_to_free:
                    break
                e = next(iter(order))
                if before is not None and not e._ts < before:
                    break
                if (extend and e._accessed) or (
                        e._tracked and e._reads > 0 and e._requeues < max_requeue):
                    if now is None:
                        # The clock may re-enter the cache: read it, then look
                        # at the (current) head and settings again, as C does.
                        now = _now(self._clock)
                        max_requeue, extend = self._max_requeue, self._extend
                        continue
                    requeues = e._requeues + 1
                    total = self._requeues + 1
                    order.move_to_end(e)
                    e._ts = now
                    e._accessed = False
                    e._requeues = requeues
                    self._requeues = total
                else:
                    # Evict e: out of the queue and out of its EntryCache,
                    # counted at once (a clock that raises later in the walk
                    # loses nothing).
                    size = e._size
                    qbytes = self._bytes - size
                    evicted = self._evicted_entries + 1
                    evicted_bytes = self._evicted_bytes + size
                    if evicted_bytes > MAX_U64:
                        evicted_bytes = MAX_U64
                    n1 = n + 1
                    b1 = b + size
                    if b1 > MAX_ID:
                        b1 = MAX_ID
                    owner = e._owner
                    if owner is not None:
                        index = owner._index
                        csize = owner._size - size
                    del order[e]
                    self._bytes = qbytes
                    e._queue = None
                    e._removed = True
                    if owner is not None:
                        # Its position stays in owner._sorted (see the module
                        # docstring): deleting it could fail after this.
                        del index[e._key]
                        owner._size = csize
                        e._owner = None
                    self._evicted_entries = evicted
                    self._evicted_bytes = evicted_bytes
                    e._next_gone = gone
                    gone = e
                    n = n1
                    b = b1
        finally:
            # After the walk: a payload's release runs code.
            while gone is not None:
                e = gone
                gone = e._next_gone
                e._next_gone = None
                e._data = None
        return n, b

    def __repr__(self) -> str:
        if not _is_set(self, "_order"):
            return "<RemovalQueue uninitialised>"
        return (f"<RemovalQueue entries={len(self._order)} bytes={self._bytes} "
                f"max_requeue={self._max_requeue} extend_ttl={self._extend}>")


class EntryCache(_Guarded):
    """EntryCache holds one topic's (managed ledger's) entries by position,
    ``RangeEntryCacheImpl``; made by ``EntryCacheManager.cache(name)``.

    Positions are ``(ledger_id, entry_id)`` tuples of ints in [0, 2**63),
    ordered lexicographically.  Every cached entry is also in the manager's
    removal queue, which evicts it; a cache hit marks it accessed.
    """

    __slots__ = ("_name", "_manager", "_index", "_sorted", "_size")
    _SENTINEL = "_manager"

    def __init__(self, *args, **kwargs):
        raise TypeError("EntryCache objects are made by EntryCacheManager.cache(name)")

    @classmethod
    def _new(cls, manager: "EntryCacheManager", name: str) -> "EntryCache":
        self = object.__new__(cls)
        self._name = name
        self._index: dict[tuple[int, int], CacheEntry] = {}
        self._sorted: list[tuple[int, int]] = []
        self._size = 0
        self._manager = manager
        return self

    @property
    def name(self) -> str:
        """The topic (managed ledger) name."""
        self._ok()
        return self._name

    @property
    def manager(self) -> "EntryCacheManager":
        """The manager whose queue and limits this cache uses."""
        self._ok()
        return self._manager

    @property
    def size(self) -> int:
        """Bytes cached here (entry_overhead_bytes included)."""
        self._ok()
        return self._size

    def __len__(self) -> int:
        self._ok()
        return len(self._index)

    def __contains__(self, position) -> bool:
        self._ok()
        return check_position(position) in self._index

    def insert(self, position: tuple[int, int], data: Data, *, expected_reads: int = 0) -> bool:
        """Cache ``data`` at ``position`` with ``expected_reads`` (<= 0: no
        read-count tracking); it accounts for its size plus the manager's
        entry_overhead_bytes.  False when the position is cached already or
        caching is disabled (max_size_bytes == 0).  If the manager is then
        above its trigger it evicts to the watermark before returning (True
        even if this entry was evicted).

        The clock is read once, before anything changes; if it re-entered
        the cache and filled the position or disabled caching, the insert
        returns False, and whatever it raises propagates with the cache
        unchanged."""
        try:
            m = self._manager
        except AttributeError:
            raise not_initialised_error("EntryCache") from None
        pos = check_position(position)
        size = data_size(data)
        n = check_expected_reads(expected_reads)
        if size > MAX_ID - m._overhead:
            raise total_bytes_error("the entry")
        charge = size + m._overhead
        index = self._index
        if m._max == 0 or pos in index:
            return False
        now = _now(m._clock)
        if m._max == 0 or pos in index:
            return False            # the clock re-entered and got there first
        q = m._queue
        if charge > MAX_ID - q._bytes:
            raise total_bytes_error("the cache")
        # Everything that allocates first (see the module docstring).
        e = object.__new__(CacheEntry)
        e._key = pos
        e._ts = now
        e._tracked = n > 0
        e._reads = n if n > 0 else 0
        e._accessed = False
        e._removed = False
        e._requeues = 0
        e._owner = self
        e._data = data
        e._queue = q                # q.add(e) without its checks: e is new and fits
        e._next_gone = None
        e._size = charge
        csize = self._size + charge
        qbytes = q._bytes + charge
        inserts = m._inserts + 1
        inserted = m._inserted_bytes + size
        s = self._sorted
        if len(s) > 2 * len(index) + 32:
            # Positions of evicted entries outnumber the entries: prune them.
            s = [p for p in s if p in index]
            self._sorted = s
        # Three insertions, each of which changes nothing when it fails.  A
        # position left in `s` by a later failure is one readers skip.
        if not s or s[-1] < pos:
            s.append(pos)
        else:
            i = bisect_left(s, pos)
            if i == len(s) or s[i] != pos:      # else left there by an eviction
                s.insert(i, pos)
        index[pos] = e
        try:
            q._order[e] = None
        except BaseException:
            del index[pos]
            raise
        self._size = csize
        q._bytes = qbytes
        m._inserts = inserts
        m._inserted_bytes = inserted
        if q._bytes > m._trigger_bytes:
            m._evict_to_watermark()
        return True

    def get(self, position: tuple[int, int]) -> Optional[Data]:
        """The cached data, or None.  A hit marks the entry accessed; each
        call counts one hit or one miss."""
        try:
            m = self._manager
        except AttributeError:
            raise not_initialised_error("EntryCache") from None
        e = self._index.get(check_position(position))
        if e is None:
            m._misses = m._misses + 1
            return None
        hits = m._hits + 1          # before anything changes: it may not fit in memory
        e._accessed = True
        m._hits = hits
        return e._data

    def get_range(self, first: tuple[int, int], last: tuple[int, int]) -> list[Data]:
        """The data of the cached entries with first <= position <= last, in
        position order (uncached positions are absent); marks them accessed,
        as Pulsar's getRange does, and changes no counter."""
        self._ok()
        lo, hi = check_bound(first), check_bound(last)
        s = self._sorted
        found = [e for e in map(self._index.get, s[bisect_left(s, lo):bisect_right(s, hi)])
                 if e is not None]
        out = [e._data for e in found]
        for e in found:             # marked only once nothing more can fail
            e._accessed = True
        return out

    def mark_read(self, position: tuple[int, int]) -> None:
        """The entry at ``position`` was delivered once (no-op if not cached)."""
        self._ok()
        e = self._index.get(check_position(position))
        if e is not None:
            e.mark_read()

    def add_expected_read(self, position: tuple[int, int]) -> None:
        """The entry at ``position`` went on a replay queue (no-op if not
        cached)."""
        self._ok()
        e = self._index.get(check_position(position))
        if e is not None:
            e.add_expected_read()

    def invalidate_up_to(self, position: tuple[int, int]) -> tuple[int, int]:
        """Drop every entry at or before ``position`` (the mark-delete moved
        past it).  Returns (entries, bytes); not counted as evictions."""
        self._ok()
        hi = check_bound(position)
        return self._drop(bisect_right(self._sorted, hi))

    def clear(self) -> tuple[int, int]:
        """Drop every entry.  Returns (entries, bytes)."""
        self._ok()
        return self._drop(len(self._sorted))

    def _drop(self, upto: int) -> tuple[int, int]:
        q = self._manager._queue
        order = q._order
        index = self._index
        s = self._sorted
        # Everything that allocates first (see the module docstring).
        gone = [e for e in map(index.get, s[:upto]) if e is not None]
        b = 0
        for e in gone:
            b += e._size
        result = (len(gone), b)
        csize = self._size - b
        qbytes = q._bytes - b
        # Only the first OrderedDict deletion can fail (rebuilding its node
        # table after the dict grew), and then nothing has changed; the
        # others and the dict deletions allocate nothing.
        for e in gone:
            del order[e]
            del index[e._key]
            e._queue = None
            e._removed = True
            e._owner = None
        self._size = csize
        q._bytes = qbytes
        try:
            del s[:upto]
            for e in gone:          # after the state is consistent (see _walk)
                e._data = None
        except MemoryError:
            pass    # stale positions are skipped; payloads go with `gone`
        return result

    def __repr__(self) -> str:
        if not _is_set(self, "_manager"):
            return "<EntryCache uninitialised>"
        return f"<EntryCache {self._name!r} entries={len(self._index)} bytes={self._size}>"


class EntryCacheManager(_Guarded):
    """EntryCacheManager bounds the entry caches of one broker
    (``RangeEntryCacheManagerImpl``) with one global RemovalQueue.

    ``max_size_bytes`` is managedLedgerCacheSizeMB in bytes (0 disables
    caching; negative is a ValueError).  Every cached entry counts its
    payload plus ``entry_overhead_bytes`` (default ENTRY_OVERHEAD_BYTES, what
    an entry costs in memory; 0 counts payloads only, as Pulsar does) against
    it, so the memory the cache holds is bounded by the setting.  Size
    eviction starts when the size exceeds ``floor(max * eviction_trigger)``
    and frees down to ``floor(max * eviction_watermark)``
    (managedLedgerCacheEvictionWatermark); ``time_threshold_ms`` is
    managedLedgerCacheEvictionTimeThresholdMillis; the requeue settings are
    PIP-430's
    managedLedgerCacheEvictionExtendTTLOfEntriesWithRemainingExpectedReadsMaxTimes
    and managedLedgerCacheEvictionExtendTTLOfRecentlyAccessed (inserting
    with ``expected_reads=0`` everywhere is cacheEvictionByExpectedReadCount
    off).  ``clock`` returns int nanoseconds in the int64 range and stamps
    every entry.

    The library has no scheduler: call ``run_eviction()`` every
    managedLedgerCacheEvictionIntervalMs (10 ms in Pulsar).
    """

    __slots__ = ("_max", "_overhead", "_watermark", "_trigger", "_threshold_ns",
                 "_time_threshold_ms", "_clock", "_queue", "_caches", "_hits", "_misses",
                 "_inserts", "_inserted_bytes", "_trigger_bytes", "_watermark_bytes")
    _SENTINEL = "_queue"

    def __init__(self, max_size_bytes: int, *,
                 eviction_watermark: float = DEFAULT_EVICTION_WATERMARK,
                 eviction_trigger: float = DEFAULT_EVICTION_TRIGGER,
                 time_threshold_ms: float = DEFAULT_TIME_THRESHOLD_MS,
                 max_requeue_count_when_expected_reads: int = DEFAULT_MAX_REQUEUE,
                 extend_ttl_of_recently_accessed: bool = True,
                 clock: Callable[[], int] = time.monotonic_ns,
                 entry_overhead_bytes: int = ENTRY_OVERHEAD_BYTES):
        if _is_set(self, "_queue"):
            raise already_initialised_error("EntryCacheManager")
        # Everything is checked before anything is set: a failed __init__
        # leaves the object uninitialised, not half-built.
        max_size = check_max_size(max_size_bytes)
        watermark, trigger = check_thresholds(eviction_watermark, eviction_trigger)
        threshold_ns = check_time_threshold_ms(time_threshold_ms)
        check_clock(clock)
        overhead = check_entry_overhead(entry_overhead_bytes)
        queue = RemovalQueue(max_requeue_count_when_expected_reads,
                             extend_ttl_of_recently_accessed, clock=clock)
        self._max = max_size
        self._overhead = overhead
        self._watermark, self._trigger = watermark, trigger
        self._threshold_ns = threshold_ns
        self._time_threshold_ms = time_threshold_ms
        self._clock = clock
        self._caches: dict[str, EntryCache] = {}
        self._hits = self._misses = self._inserts = self._inserted_bytes = 0
        self._recompute()
        self._queue = queue         # last: the object counts as initialised from here

    def _recompute(self, max_size: Optional[int] = None) -> None:
        # Both thresholds before any store: a MemoryError leaves all three.
        if max_size is None:
            max_size = self._max
        trigger = threshold_bytes(max_size, self._trigger)
        watermark = threshold_bytes(max_size, self._watermark)
        self._max = max_size
        self._trigger_bytes = trigger
        self._watermark_bytes = watermark

    # ---- settings ------------------------------------------------------------

    @property
    def max_size_bytes(self) -> int:
        """The limit on the bytes cached, payloads plus entry_overhead_bytes
        per entry.  Setting it only recomputes the thresholds (the next insert
        or pass evicts); 0 disables caching and the next pass empties the
        cache."""
        self._ok()
        return self._max

    @max_size_bytes.setter
    def max_size_bytes(self, value: int) -> None:
        self._ok()
        self._recompute(check_max_size(value))

    @property
    def entry_overhead_bytes(self) -> int:
        """Bytes each cached entry counts beyond its payload (default
        ENTRY_OVERHEAD_BYTES, what an entry costs in memory)."""
        self._ok()
        return self._overhead

    @property
    def eviction_watermark(self) -> float:
        """Size eviction frees down to this fraction of max_size_bytes."""
        self._ok()
        return self._watermark

    @property
    def eviction_trigger(self) -> float:
        """Size eviction starts above this fraction of max_size_bytes."""
        self._ok()
        return self._trigger

    @property
    def time_threshold_ms(self) -> float:
        """Entries older than this are expired by run_eviction (unless
        requeued)."""
        self._ok()
        return self._time_threshold_ms

    @property
    def max_requeue_count_when_expected_reads(self) -> int:
        """The queue's requeue limit for entries with expected reads."""
        self._ok()
        return self._queue.max_requeue_count_when_expected_reads

    @max_requeue_count_when_expected_reads.setter
    def max_requeue_count_when_expected_reads(self, value: int) -> None:
        self._ok()
        self._queue.max_requeue_count_when_expected_reads = value

    @property
    def extend_ttl_of_recently_accessed(self) -> bool:
        """Whether the queue requeues entries accessed since the last walk."""
        self._ok()
        return self._queue.extend_ttl_of_recently_accessed

    @extend_ttl_of_recently_accessed.setter
    def extend_ttl_of_recently_accessed(self, value: bool) -> None:
        self._ok()
        self._queue.extend_ttl_of_recently_accessed = value

    # ---- caches and state ----------------------------------------------------

    def cache(self, name: str) -> EntryCache:
        """The EntryCache of topic ``name`` (a str), created on first use."""
        self._ok()
        caches = self._caches
        if type(name) is not str:
            raise cache_name_error(name)
        c = caches.get(name)
        if c is None:
            c = caches[name] = EntryCache._new(self, name)
        return c

    @property
    def size(self) -> int:
        """Bytes cached in all caches (entry_overhead_bytes included)."""
        self._ok()
        return self._queue._bytes

    @property
    def average_entry_size(self) -> Optional[int]:
        """Mean payload size (floor) of the entries inserted so far, None
        before any (the read path's estimate; no overhead counted)."""
        self._ok()
        return self._inserted_bytes // self._inserts if self._inserts else None

    def non_evictable(self) -> tuple[int, int]:
        """(entries, bytes) cached with remaining expected reads."""
        self._ok()
        return self._queue.non_evictable()

    def stats(self) -> CacheStats:
        """A snapshot of the counters and gauges."""
        self._ok()
        q = self._queue
        return CacheStats(self._hits, self._misses, self._inserts, q._evicted_entries,
                          q._evicted_bytes, q._requeues, q._bytes, len(q._order))

    # ---- eviction ------------------------------------------------------------

    def run_eviction(self) -> tuple[int, int]:
        """One periodic pass: ``evict_before(clock() - time_threshold)``,
        then, when the size is above the trigger, ``evict_least_accessed``
        down to the watermark.  Returns the (entries, bytes) of both steps."""
        self._ok()
        q = self._queue
        n, b = q._walk(max(_now(self._clock) - self._threshold_ns, MIN_I64), 0)
        if q._bytes > self._trigger_bytes:
            n2, b2 = self._evict_to_watermark()
            n += n2
            b = min(b + b2, MAX_ID)
        return n, b

    def _evict_to_watermark(self) -> tuple[int, int]:
        q = self._queue
        free = q._bytes - self._watermark_bytes
        if free <= 0:
            return 0, 0
        return q._walk(None, free)

    def __repr__(self) -> str:
        if not _is_set(self, "_queue"):
            return "<EntryCacheManager uninitialised>"
        return (f"<EntryCacheManager max={self._max} size={self._queue._bytes} "
                f"entries={len(self._queue._order)} caches={len(self._caches)}>")
