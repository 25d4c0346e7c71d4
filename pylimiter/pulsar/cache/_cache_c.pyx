# cython: language_level=3, embedsignature=True
"""C implementation of the broker entry cache: Cython bindings over
csrc/plim_cacheq.c (the removal queue, its walks and the position index).

The semantics are those of ``_cache_py``, the executable specification;
the tests run every case against both.  Rules that keep this module sound:

* The core never calls back into Python and never frees an entry: a walk or
  an invalidation hands back the entries it took out on a "gone" chain, and
  ``_release`` drops their payloads and references after the core call
  returned, so Python code run by a payload's release sees a consistent cache.
* A queue holds one reference to each entry linked in it; an index holds
  borrowed pointers.  An EntryCache entry is in its index iff it is in the
  manager's queue, and only the queue references it: it is freed when evicted.
* A clock reading happens only between core calls: a walk that needs "now"
  for a requeue stops before it (need_now), we read the clock and resume, so
  the clock is read lazily exactly where the pure twin reads it.
* EntryCache and EntryCacheManager are ``no_gc_clear``: when a cycle that
  holds them is collected, a cache's ``__dealloc__`` still reaches the
  manager's queue to take its entries out before freeing its index.
* Deallocation: Cython's tp_dealloc untracks the object from the GC before
  ``__dealloc__`` runs and holds a reference across it, and no object here
  has a freelist, so a collection run by Python code inside a deallocator
  (a payload's or a key's finaliser, released by ``_release``) can neither
  see the dying object nor free it twice.  A deallocator runs Python code
  only through ``_release``, after the core state is consistent, and nothing
  reachable from that code leads back to the dying object: entries hold no
  reference to their queue or cache, and the manager is only freed once no
  cache refers to it.
* Objects built with ``cls.__new__(cls)`` alone are detected (a RemovalQueue
  without a clock, an EntryCache without a manager, an EntryCacheManager
  without a queue, a CacheEntry without PLIM_CQ_INIT) and every method and
  attribute raises ``NotInitialisedError``; ``__init__`` runs once.
* Copying or pickling any of these objects is a TypeError: a copy would
  share (or lose) the core's links.

Not thread-safe, as the pure twin: one thread (an asyncio loop) per manager.
"""

cimport cython
from cpython.list cimport PyList_Append
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.stdint cimport INT64_MIN, int64_t, uint32_t, uint64_t

import time as _time

from . import _common as contract
from ._common import (
    DEFAULT_EVICTION_TRIGGER,
    DEFAULT_EVICTION_WATERMARK,
    DEFAULT_MAX_REQUEUE,
    DEFAULT_TIME_THRESHOLD_MS,
    ENTRY_OVERHEAD_BYTES,
    CacheStats,
    NotInitialisedError,
)

__all__ = ["CacheEntry", "RemovalQueue", "EntryCache", "EntryCacheManager", "CacheStats",
           "NotInitialisedError"]

# Main interpreter only (issue 32, G11): see pylimiter/_plim_main_only.h.
cdef extern from *:
    """
    #include "_plim_main_only.h"
    PLIM_MAIN_ONLY(_cache_c, "pylimiter.pulsar.cache._cache_c")
    #define PyInit__cache_c plim_cython_init__cache_c
    """

cdef extern from "plim_cacheq.h":
    unsigned PLIM_CQ_ACCESSED
    unsigned PLIM_CQ_REMOVED
    unsigned PLIM_CQ_TRACKED
    unsigned PLIM_CQ_QUEUED
    unsigned PLIM_CQ_INIT
    ctypedef struct plim_cq_index_t:
        int64_t entries
        int64_t bytes
    ctypedef struct plim_cq_entry_t:
        plim_cq_entry_t *prev
        plim_cq_entry_t *next
        plim_cq_index_t *owner
        int64_t ledger
        int64_t entry
        int64_t size
        int64_t timestamp_ns
        int64_t expected_reads
        uint32_t requeue_count
        uint32_t flags
    ctypedef struct plim_cq_t:
        plim_cq_entry_t *head
        plim_cq_entry_t *tail
        int64_t entries
        int64_t bytes
        uint64_t requeues
        uint64_t evicted_entries
        uint64_t evicted_bytes
        uint32_t max_requeue
        int extend_ttl
    ctypedef struct plim_cq_gone_t:
        plim_cq_entry_t *first
        plim_cq_entry_t *last
        int64_t entries
        int64_t bytes
    void plim_cq_entry_init(plim_cq_entry_t *e, int64_t size, int64_t timestamp_ns,
                            int64_t expected_reads)
    void plim_cq_init(plim_cq_t *q, uint32_t max_requeue, int extend_ttl)
    int plim_cq_fits(const plim_cq_t *q, const plim_cq_entry_t *e)
    void plim_cq_push(plim_cq_t *q, plim_cq_entry_t *e)
    void plim_cq_unlink(plim_cq_t *q, plim_cq_entry_t *e)
    void plim_cq_evict_before(plim_cq_t *q, int64_t before_ns, const int64_t *now_ns,
                              plim_cq_gone_t *gone, int *need_now)
    void plim_cq_evict_size(plim_cq_t *q, int64_t size_to_free, const int64_t *now_ns,
                            plim_cq_gone_t *gone, int *need_now)
    void plim_cq_non_evictable(const plim_cq_t *q, int64_t *entries, int64_t *bytes)
    void plim_cq_gone_init(plim_cq_gone_t *g)
    void plim_cq_index_init(plim_cq_index_t *ix)
    void plim_cq_index_free(plim_cq_index_t *ix)
    plim_cq_entry_t *plim_cq_index_get(plim_cq_index_t *ix, int64_t ledger, int64_t entry)
    int plim_cq_index_put(plim_cq_index_t *ix, plim_cq_entry_t *e, int64_t ledger,
                          int64_t entry)
    void plim_cq_index_remove(plim_cq_entry_t *e)
    void plim_cq_index_range(plim_cq_index_t *ix, int64_t l1, int64_t e1, int64_t l2,
                             int64_t e2, void (*fn)(plim_cq_entry_t *, void *) noexcept,
                             void *arg)
    void plim_cq_index_drop_upto(plim_cq_index_t *ix, plim_cq_t *q, int64_t ledger,
                                 int64_t entry, plim_cq_gone_t *gone)

cdef extern from "Python.h":
    Py_ssize_t PyBytes_GET_SIZE(object o)
    object PyObject_CallNoArgs(object callable)

# Entries made by an EntryCache have their position as key, kept as two
# int64 in the core entry instead of a tuple object (memory per entry).
cdef object _POSITION_KEY = object()
cdef int64_t MAX_ID = (1 << 63) - 1


# ---- small helpers ----------------------------------------------------------------


cdef inline int64_t _read_clock(object clock) except? -1:
    """One reading: an int in the int64 range (TypeError, ValueError else).
    Whatever the clock raises, KeyboardInterrupt included, propagates: every
    caller reads it where the cache is consistent."""
    now = PyObject_CallNoArgs(clock)
    if type(now) is not int:
        raise contract.clock_error(now)
    try:
        return <int64_t>now
    except OverflowError:
        raise contract.clock_error(now) from None   # a ValueError: outside int64


cdef inline int _parse_pos(object position, int64_t *ledger, int64_t *entry,
                           bint bound) except -1:
    """(ledger_id, entry_id) -> two int64; ids >= 0 unless `bound`."""
    cdef int overflow = 0
    cdef int overflow2 = 0
    cdef PyObject *a
    cdef PyObject *b
    if type(position) is tuple and PyTuple_GET_SIZE(position) == 2:
        a = PyTuple_GET_ITEM(position, 0)
        b = PyTuple_GET_ITEM(position, 1)
        if type(<object>a) is int and type(<object>b) is int:
            ledger[0] = PyLong_AsLongLongAndOverflow(<object>a, &overflow)
            entry[0] = PyLong_AsLongLongAndOverflow(<object>b, &overflow2)
            if not overflow and not overflow2 and (bound or (ledger[0] >= 0 and entry[0] >= 0)):
                return 0
    if bound:
        contract.check_bound(position)
    contract.check_position(position)
    raise AssertionError("unreachable")


cdef inline int64_t _data_size(object data) except -1:
    if type(data) is bytes:
        return PyBytes_GET_SIZE(data)
    # A memoryview's nbytes refuses a released view (the buffer is gone).
    return contract.data_size(data)


cdef Py_ssize_t ENTRY_OFFSET = 0   # offset of CacheEntry.e in the object, set below


cdef inline CacheEntry _obj(plim_cq_entry_t *e):
    return <CacheEntry>(<PyObject *>(<char *>e - ENTRY_OFFSET))


cdef void _release(plim_cq_gone_t *gone):
    """Drop the payloads and the queue's references of entries taken out by a
    core call, after the call (see the module notes)."""
    cdef plim_cq_entry_t *e = gone.first
    cdef plim_cq_entry_t *nxt
    cdef CacheEntry obj
    gone.first = gone.last = NULL
    while e != NULL:
        nxt = e.next
        e.next = NULL
        obj = _obj(e)
        obj._data = None
        Py_DECREF(obj)   # the queue's reference; `obj` still holds one here
        e = nxt


# ---- CacheEntry --------------------------------------------------------------------


@cython.final
cdef class CacheEntry:
    """CacheEntry is one cached entry as the removal queue sees it.

    ``expected_reads <= 0`` means the entry has no read-count tracking
    (Pulsar's ``EntryReadCountHandlerImpl.maybeCreate`` returns null):
    ``expected_reads`` is then None and ``mark_read``/``add_expected_read``
    do nothing.  ``timestamp_ns`` defaults to ``time.monotonic_ns()``;
    entries made by an EntryCache are stamped with their manager's clock.
    """

    # `e` must stay the first field: _obj() finds the object from it.
    cdef plim_cq_entry_t e
    cdef object _key
    cdef object _data

    def __init__(self, key, size, *, expected_reads=0, timestamp_ns=None):
        if self.e.flags & PLIM_CQ_INIT:
            raise contract.already_initialised_error("CacheEntry")
        contract.check_key(key)
        cdef int64_t sz = contract.check_size(size)
        cdef int64_t n = contract.check_expected_reads(expected_reads)
        cdef int64_t ts
        if timestamp_ns is None:
            ts = _time.monotonic_ns()
        else:
            ts = contract.check_timestamp(timestamp_ns)
        self._key = key
        plim_cq_entry_init(&self.e, sz, ts, n)

    @property
    def key(self):
        """The key (the position for entries made by an EntryCache)."""
        _entry_ready(self)
        if self._key is _POSITION_KEY:
            return (self.e.ledger, self.e.entry)
        return self._key

    @property
    def size(self):
        """Bytes this entry accounts for."""
        _entry_ready(self)
        return self.e.size

    @property
    def timestamp_ns(self):
        """Creation time, reset to the queue clock's now by every requeue."""
        _entry_ready(self)
        return self.e.timestamp_ns

    @property
    def accessed(self):
        """Set by a cache hit (get, get_range, EntryReader); cleared by a
        requeue."""
        _entry_ready(self)
        return bool(self.e.flags & PLIM_CQ_ACCESSED)

    @accessed.setter
    def accessed(self, value):
        _entry_ready(self)
        if value:
            self.e.flags |= PLIM_CQ_ACCESSED
        else:
            self.e.flags &= ~PLIM_CQ_ACCESSED

    @property
    def removed(self):
        """True once a removal queue evicted it or its cache invalidated it."""
        _entry_ready(self)
        return bool(self.e.flags & PLIM_CQ_REMOVED)

    @property
    def requeue_count(self):
        """Requeues by either walk; never reset."""
        _entry_ready(self)
        return self.e.requeue_count

    @property
    def expected_reads(self):
        """Reads still expected (may be negative: Pulsar has no floor), or
        None when the entry has no read-count tracking."""
        _entry_ready(self)
        if self.e.flags & PLIM_CQ_TRACKED:
            return self.e.expected_reads
        return None

    @property
    def has_expected_reads(self):
        """Tracked and expected_reads > 0."""
        _entry_ready(self)
        return bool(self.e.flags & PLIM_CQ_TRACKED) and self.e.expected_reads > 0

    def mark_read(self):
        """One expected read happened (the entry was delivered once)."""
        _entry_ready(self)
        if self.e.flags & PLIM_CQ_TRACKED and self.e.expected_reads > INT64_MIN:
            self.e.expected_reads -= 1

    def add_expected_read(self):
        """One more read is expected (the entry went on a replay queue)."""
        _entry_ready(self)
        if self.e.flags & PLIM_CQ_TRACKED and self.e.expected_reads < MAX_ID:
            self.e.expected_reads += 1

    def __reduce__(self):
        raise contract.copy_error("CacheEntry")

    def __reduce_ex__(self, protocol):
        raise contract.copy_error("CacheEntry")

    def __copy__(self):
        raise contract.copy_error("CacheEntry")

    def __deepcopy__(self, memo):
        raise contract.copy_error("CacheEntry")

    def __repr__(self):
        if not (self.e.flags & PLIM_CQ_INIT):
            return "<CacheEntry uninitialised>"
        state = " removed" if self.e.flags & PLIM_CQ_REMOVED else ""
        return (f"<CacheEntry key={contract.show(self.key)} size={self.e.size} "
                f"expected_reads={self.expected_reads} requeues={self.e.requeue_count}{state}>")


cdef inline int _entry_ready(CacheEntry self) except -1:
    # A function, not a cdef method: a method would add a vtable pointer to
    # every entry object.
    if not (self.e.flags & PLIM_CQ_INIT):
        raise contract.not_initialised_error("CacheEntry")
    return 0


cdef Py_ssize_t _entry_offset():
    cdef CacheEntry probe = CacheEntry.__new__(CacheEntry)
    return <char *>&probe.e - <char *><PyObject *>probe


ENTRY_OFFSET = _entry_offset()


# ---- RemovalQueue ------------------------------------------------------------------


@cython.final
cdef class RemovalQueue:
    """RemovalQueue holds entries in global insertion order (head first) and
    evicts from the head, PIP-430's ``RangeCacheRemovalQueue``.

    An entry met by a walk is requeued (moved to the tail, timestamp reset
    to the clock's now, ``accessed`` cleared, ``requeue_count`` + 1) when
    ``(extend_ttl_of_recently_accessed and entry.accessed)`` or
    ``(entry.has_expected_reads and entry.requeue_count <
    max_requeue_count_when_expected_reads)``, else removed.  Removing an
    entry removes it from the EntryCache that owns it and sets ``removed``.
    """

    cdef plim_cq_t q
    cdef object _clock      # None until __init__ ran

    def __cinit__(self):
        plim_cq_init(&self.q, DEFAULT_MAX_REQUEUE, 1)

    def __init__(self, max_requeue_count_when_expected_reads=DEFAULT_MAX_REQUEUE,
                 extend_ttl_of_recently_accessed=True, *, clock=_time.monotonic_ns):
        if self._clock is not None:
            raise contract.already_initialised_error("RemovalQueue")
        cdef uint32_t max_requeue = contract.check_max_requeue(
            max_requeue_count_when_expected_reads)
        extend = 1 if extend_ttl_of_recently_accessed else 0
        contract.check_clock(clock)
        self.q.max_requeue = max_requeue
        self.q.extend_ttl = extend
        self._clock = clock

    def __dealloc__(self):
        # Detach what is left; an entry still in an EntryCache (only when a
        # collected cycle freed the manager first) leaves that index too.
        # Payloads are dropped after the queue is empty (see _release).
        cdef plim_cq_entry_t *e
        cdef plim_cq_gone_t gone
        plim_cq_gone_init(&gone)
        while self.q.head != NULL:
            e = self.q.head
            plim_cq_unlink(&self.q, e)
            if e.owner != NULL:
                plim_cq_index_remove(e)
                e.flags |= PLIM_CQ_REMOVED
            e.next = NULL
            if gone.last != NULL:
                gone.last.next = e
            else:
                gone.first = e
            gone.last = e
        _release(&gone)

    cdef inline int _ready(self) except -1:
        if self._clock is None:
            raise contract.not_initialised_error("RemovalQueue")
        return 0

    @property
    def max_requeue_count_when_expected_reads(self):
        """managedLedgerCacheEvictionExtendTTLOfEntriesWithRemainingExpectedReadsMaxTimes."""
        self._ready()
        return self.q.max_requeue

    @max_requeue_count_when_expected_reads.setter
    def max_requeue_count_when_expected_reads(self, value):
        self._ready()
        self.q.max_requeue = contract.check_max_requeue(value)

    @property
    def extend_ttl_of_recently_accessed(self):
        """managedLedgerCacheEvictionExtendTTLOfRecentlyAccessed."""
        self._ready()
        return bool(self.q.extend_ttl)

    @extend_ttl_of_recently_accessed.setter
    def extend_ttl_of_recently_accessed(self, value):
        self._ready()
        self.q.extend_ttl = 1 if value else 0

    def add(self, entry):
        """Append ``entry`` at the tail.  An entry that is queued already
        (here or elsewhere), was removed or was never initialised is a
        ValueError, and so is one that would take the queue's byte total past
        2**63 - 1."""
        self._ready()
        if type(entry) is not CacheEntry:
            raise TypeError(f"expected a CacheEntry, not {type(entry).__name__}")
        cdef CacheEntry ce = <CacheEntry>entry
        if not (ce.e.flags & PLIM_CQ_INIT):
            raise contract.not_initialised_entry_error()
        if ce.e.flags & PLIM_CQ_REMOVED:
            raise contract.removed_error()
        if ce.e.flags & PLIM_CQ_QUEUED:
            raise contract.already_queued_error()
        if not plim_cq_fits(&self.q, &ce.e):
            raise contract.total_bytes_error("the queue")
        Py_INCREF(ce)
        plim_cq_push(&self.q, &ce.e)

    def is_empty(self):
        """True when no entry is queued."""
        self._ready()
        return self.q.head == NULL

    def __len__(self):
        self._ready()
        return self.q.entries

    def __iter__(self):
        """The queued entries, head (next to be walked) first; a snapshot."""
        self._ready()
        out = []
        cdef plim_cq_entry_t *e = self.q.head
        while e != NULL:
            out.append(_obj(e))
            e = e.next
        return iter(out)

    @property
    def size(self):
        """Bytes of the queued entries."""
        self._ready()
        return self.q.bytes

    def non_evictable(self):
        """(entries, bytes) of the queued entries with has_expected_reads."""
        self._ready()
        cdef int64_t n, b
        plim_cq_non_evictable(&self.q, &n, &b)
        return n, b

    def evict_before(self, timestamp_ns):
        """Walk from the head over entries older than ``timestamp_ns``,
        requeueing or removing each by the rule; the first entry that is not
        older stops the walk.  Returns (entries removed, bytes removed)."""
        self._ready()
        return self._walk_before(contract.check_timestamp(timestamp_ns))

    def evict_least_accessed(self, size_to_free):
        """Walk from the head, requeueing or removing each entry by the rule,
        cycling past the tail as often as needed, until the bytes removed
        reach ``size_to_free`` (> 0, else ValueError) or the queue is empty.
        Returns (entries removed, bytes removed)."""
        self._ready()
        v = contract.check_size_to_free(size_to_free)
        return self._walk_size(v if v <= MAX_ID else MAX_ID)

    cdef tuple _walk_before(self, int64_t before):
        return self._walk(True, before)

    cdef tuple _walk_size(self, int64_t size_to_free):
        return self._walk(False, size_to_free)

    cdef tuple _walk(self, bint by_time, int64_t limit):
        """One walk; a requeue that needs "now" stops the core call, we read
        the clock once, and the walk resumes from the (current) head.  The
        clock runs between core calls, so whatever it does to the cache (it
        may re-enter it) or raises (KeyboardInterrupt included) finds the
        queue consistent: what was removed so far stays removed and counted,
        its payloads are released, and the exception propagates."""
        cdef plim_cq_gone_t gone
        cdef int need_now = 0
        cdef int64_t now = 0
        cdef const int64_t *nowp = NULL
        plim_cq_gone_init(&gone)
        try:
            while True:
                if by_time:
                    plim_cq_evict_before(&self.q, limit, nowp, &gone, &need_now)
                else:
                    plim_cq_evict_size(&self.q, limit, nowp, &gone, &need_now)
                if not need_now:
                    break
                now = _read_clock(self._clock)
                nowp = &now
        finally:
            _release(&gone)
        return gone.entries, gone.bytes

    def __reduce__(self):
        raise contract.copy_error("RemovalQueue")

    def __reduce_ex__(self, protocol):
        raise contract.copy_error("RemovalQueue")

    def __copy__(self):
        raise contract.copy_error("RemovalQueue")

    def __deepcopy__(self, memo):
        raise contract.copy_error("RemovalQueue")

    def __repr__(self):
        if self._clock is None:
            return "<RemovalQueue uninitialised>"
        return (f"<RemovalQueue entries={self.q.entries} bytes={self.q.bytes} "
                f"max_requeue={self.q.max_requeue} extend_ttl={bool(self.q.extend_ttl)}>")


# ---- EntryCache --------------------------------------------------------------------


cdef struct _RangeArg:
    PyObject *out
    int failed


cdef void _collect(plim_cq_entry_t *e, void *arg) noexcept:
    cdef _RangeArg *ra = <_RangeArg *>arg
    if ra.failed:
        return
    e.flags |= PLIM_CQ_ACCESSED
    try:
        PyList_Append(<list>ra.out, _obj(e)._data)
    except BaseException:
        ra.failed = 1


@cython.final
@cython.no_gc_clear
cdef class EntryCache:
    """EntryCache holds one topic's (managed ledger's) entries by position,
    ``RangeEntryCacheImpl``; made by ``EntryCacheManager.cache(name)``.

    Positions are ``(ledger_id, entry_id)`` tuples of ints in [0, 2**63),
    ordered lexicographically.  Every cached entry is also in the manager's
    removal queue, which evicts it; a cache hit marks it accessed.
    """

    cdef plim_cq_index_t ix
    cdef str _name
    cdef EntryCacheManager _manager     # None: built with __new__ alone

    def __cinit__(self):
        plim_cq_index_init(&self.ix)

    def __init__(self, *args, **kwargs):
        raise TypeError("EntryCache objects are made by EntryCacheManager.cache(name)")

    def __dealloc__(self):
        cdef plim_cq_gone_t gone
        if self.ix.entries and self._manager is not None and self._manager._queue is not None:
            plim_cq_gone_init(&gone)
            plim_cq_index_drop_upto(&self.ix, &self._manager._queue.q, MAX_ID, MAX_ID, &gone)
            _release(&gone)
        plim_cq_index_free(&self.ix)

    cdef inline EntryCacheManager _m(self):
        """The manager, or NotInitialisedError."""
        if self._manager is None:
            raise contract.not_initialised_error("EntryCache")
        return self._manager

    @property
    def name(self):
        """The topic (managed ledger) name."""
        self._m()
        return self._name

    @property
    def manager(self):
        """The manager whose queue and limits this cache uses."""
        return self._m()

    @property
    def size(self):
        """Bytes cached here (entry_overhead_bytes included)."""
        self._m()
        return self.ix.bytes

    def __len__(self):
        self._m()
        return self.ix.entries

    def __contains__(self, position):
        self._m()
        cdef int64_t l, e
        _parse_pos(position, &l, &e, False)
        return plim_cq_index_get(&self.ix, l, e) != NULL

    def insert(self, position, data, *, expected_reads=0):
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
        cdef EntryCacheManager m = self._m()
        cdef int64_t l, e, size, n
        _parse_pos(position, &l, &e, False)
        size = _data_size(data)
        if type(expected_reads) is int and -2147483648 <= expected_reads < 2147483648:
            n = expected_reads
        else:
            n = contract.check_expected_reads(expected_reads)
        if size > MAX_ID - m._overhead:
            raise contract.total_bytes_error("the entry")
        cdef int64_t charge = size + m._overhead
        if m._max == 0 or plim_cq_index_get(&self.ix, l, e) != NULL:
            return False
        cdef int64_t now = _read_clock(m._clock)
        if m._max == 0 or plim_cq_index_get(&self.ix, l, e) != NULL:
            return False            # the clock re-entered and got there first
        cdef RemovalQueue q = m._queue
        cdef CacheEntry ce = CacheEntry.__new__(CacheEntry)
        plim_cq_entry_init(&ce.e, charge, now, n)
        if not plim_cq_fits(&q.q, &ce.e):
            raise contract.total_bytes_error("the cache")
        if plim_cq_index_put(&self.ix, &ce.e, l, e) != 0:
            raise MemoryError()     # 1 and -2 are ruled out above
        ce._key = _POSITION_KEY
        ce._data = data
        Py_INCREF(ce)
        plim_cq_push(&q.q, &ce.e)
        m._inserts += 1
        if size > MAX_ID - m._inserted_bytes:
            m._inserted_carry += m._inserted_bytes
            m._inserted_bytes = 0
        m._inserted_bytes += size
        if q.q.bytes > m._trigger_bytes:
            m._evict_to_watermark()
        return True

    def get(self, position):
        """The cached data, or None.  A hit marks the entry accessed; each
        call counts one hit or one miss."""
        cdef EntryCacheManager m = self._m()
        cdef int64_t l, e
        _parse_pos(position, &l, &e, False)
        cdef plim_cq_entry_t *ent = plim_cq_index_get(&self.ix, l, e)
        if ent == NULL:
            m._misses += 1
            return None
        ent.flags |= PLIM_CQ_ACCESSED
        m._hits += 1
        return _obj(ent)._data

    def get_range(self, first, last):
        """The data of the cached entries with first <= position <= last, in
        position order (uncached positions are absent); marks them accessed,
        as Pulsar's getRange does, and changes no counter."""
        self._m()
        cdef int64_t l1, e1, l2, e2
        _parse_pos(first, &l1, &e1, True)
        _parse_pos(last, &l2, &e2, True)
        out = []
        cdef _RangeArg ra
        ra.out = <PyObject *>out
        ra.failed = 0
        plim_cq_index_range(&self.ix, l1, e1, l2, e2, _collect, &ra)
        if ra.failed:
            raise MemoryError()
        return out

    def mark_read(self, position):
        """The entry at ``position`` was delivered once (no-op if not cached)."""
        self._m()
        cdef int64_t l, e
        _parse_pos(position, &l, &e, False)
        cdef plim_cq_entry_t *ent = plim_cq_index_get(&self.ix, l, e)
        if ent != NULL and ent.flags & PLIM_CQ_TRACKED and ent.expected_reads > INT64_MIN:
            ent.expected_reads -= 1

    def add_expected_read(self, position):
        """The entry at ``position`` went on a replay queue (no-op if not
        cached)."""
        self._m()
        cdef int64_t l, e
        _parse_pos(position, &l, &e, False)
        cdef plim_cq_entry_t *ent = plim_cq_index_get(&self.ix, l, e)
        if ent != NULL and ent.flags & PLIM_CQ_TRACKED and ent.expected_reads < MAX_ID:
            ent.expected_reads += 1

    def invalidate_up_to(self, position):
        """Drop every entry at or before ``position`` (the mark-delete moved
        past it).  Returns (entries, bytes); not counted as evictions."""
        self._m()
        cdef int64_t l, e
        _parse_pos(position, &l, &e, True)
        return self._drop(l, e)

    def clear(self):
        """Drop every entry.  Returns (entries, bytes)."""
        self._m()
        return self._drop(MAX_ID, MAX_ID)

    cdef tuple _drop(self, int64_t l, int64_t e):
        cdef plim_cq_gone_t gone
        plim_cq_gone_init(&gone)
        plim_cq_index_drop_upto(&self.ix, &self._manager._queue.q, l, e, &gone)
        _release(&gone)
        return gone.entries, gone.bytes

    def __reduce__(self):
        raise contract.copy_error("EntryCache")

    def __reduce_ex__(self, protocol):
        raise contract.copy_error("EntryCache")

    def __copy__(self):
        raise contract.copy_error("EntryCache")

    def __deepcopy__(self, memo):
        raise contract.copy_error("EntryCache")

    def __repr__(self):
        if self._manager is None:
            return "<EntryCache uninitialised>"
        return f"<EntryCache {self._name!r} entries={self.ix.entries} bytes={self.ix.bytes}>"


# ---- EntryCacheManager -------------------------------------------------------------


@cython.final
@cython.no_gc_clear
cdef class EntryCacheManager:
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

    cdef int64_t _max, _overhead
    cdef double _watermark, _trigger
    cdef int64_t _trigger_bytes, _watermark_bytes, _threshold_ns
    cdef object _time_threshold_ms
    cdef object _clock
    cdef RemovalQueue _queue        # None until __init__ ran
    cdef dict _caches
    cdef int64_t _hits, _misses, _inserts
    # Payload bytes ever inserted: _inserted_carry (an int) + _inserted_bytes,
    # so the sum never overflows and the common case stays in C.
    cdef int64_t _inserted_bytes
    cdef object _inserted_carry

    def __init__(self, max_size_bytes, *, eviction_watermark=DEFAULT_EVICTION_WATERMARK,
                 eviction_trigger=DEFAULT_EVICTION_TRIGGER,
                 time_threshold_ms=DEFAULT_TIME_THRESHOLD_MS,
                 max_requeue_count_when_expected_reads=DEFAULT_MAX_REQUEUE,
                 extend_ttl_of_recently_accessed=True, clock=_time.monotonic_ns,
                 entry_overhead_bytes=ENTRY_OVERHEAD_BYTES):
        if self._queue is not None:
            raise contract.already_initialised_error("EntryCacheManager")
        # Everything is checked before anything is set: a failed __init__
        # leaves the object uninitialised, not half-built.
        max_size = contract.check_max_size(max_size_bytes)
        watermark, trigger = contract.check_thresholds(eviction_watermark, eviction_trigger)
        threshold_ns = contract.check_time_threshold_ms(time_threshold_ms)
        contract.check_clock(clock)
        overhead = contract.check_entry_overhead(entry_overhead_bytes)
        queue = RemovalQueue(max_requeue_count_when_expected_reads,
                             extend_ttl_of_recently_accessed, clock=clock)
        self._max = max_size
        self._overhead = overhead
        self._watermark, self._trigger = watermark, trigger
        self._threshold_ns = threshold_ns
        self._time_threshold_ms = time_threshold_ms
        self._clock = clock
        self._caches = {}
        self._inserted_carry = 0
        self._recompute()
        self._queue = queue

    cdef inline RemovalQueue _q(self):
        """The queue, or NotInitialisedError."""
        if self._queue is None:
            raise contract.not_initialised_error("EntryCacheManager")
        return self._queue

    cdef int _recompute(self) except -1:
        self._trigger_bytes = contract.threshold_bytes(self._max, self._trigger)
        self._watermark_bytes = contract.threshold_bytes(self._max, self._watermark)
        return 0

    @property
    def max_size_bytes(self):
        """The limit on the bytes cached, payloads plus entry_overhead_bytes
        per entry.  Setting it only recomputes the thresholds (the next insert
        or pass evicts); 0 disables caching and the next pass empties the
        cache."""
        self._q()
        return self._max

    @max_size_bytes.setter
    def max_size_bytes(self, value):
        self._q()
        self._max = contract.check_max_size(value)
        self._recompute()

    @property
    def entry_overhead_bytes(self):
        """Bytes each cached entry counts beyond its payload (default
        ENTRY_OVERHEAD_BYTES, what an entry costs in memory)."""
        self._q()
        return self._overhead

    @property
    def eviction_watermark(self):
        """Size eviction frees down to this fraction of max_size_bytes."""
        self._q()
        return self._watermark

    @property
    def eviction_trigger(self):
        """Size eviction starts above this fraction of max_size_bytes."""
        self._q()
        return self._trigger

    @property
    def time_threshold_ms(self):
        """Entries older than this are expired by run_eviction (unless
        requeued)."""
        self._q()
        return self._time_threshold_ms

    @property
    def max_requeue_count_when_expected_reads(self):
        """The queue's requeue limit for entries with expected reads."""
        return self._q().max_requeue_count_when_expected_reads

    @max_requeue_count_when_expected_reads.setter
    def max_requeue_count_when_expected_reads(self, value):
        self._q().max_requeue_count_when_expected_reads = value

    @property
    def extend_ttl_of_recently_accessed(self):
        """Whether the queue requeues entries accessed since the last walk."""
        return self._q().extend_ttl_of_recently_accessed

    @extend_ttl_of_recently_accessed.setter
    def extend_ttl_of_recently_accessed(self, value):
        self._q().extend_ttl_of_recently_accessed = value

    def cache(self, name):
        """The EntryCache of topic ``name`` (a str), created on first use."""
        self._q()
        if type(name) is not str:
            raise contract.cache_name_error(name)
        c = self._caches.get(name)
        if c is None:
            c = EntryCache.__new__(EntryCache)
            (<EntryCache>c)._name = name
            (<EntryCache>c)._manager = self
            self._caches[name] = c
        return c

    @property
    def size(self):
        """Bytes cached in all caches (entry_overhead_bytes included)."""
        return self._q().q.bytes

    @property
    def average_entry_size(self):
        """Mean payload size (floor) of the entries inserted so far, None
        before any (the read path's estimate; no overhead counted)."""
        self._q()
        if not self._inserts:
            return None
        return (self._inserted_carry + self._inserted_bytes) // self._inserts

    def non_evictable(self):
        """(entries, bytes) cached with remaining expected reads."""
        return self._q().non_evictable()

    def stats(self):
        """A snapshot of the counters and gauges."""
        cdef plim_cq_t *q = &self._q().q
        return CacheStats(self._hits, self._misses, self._inserts, q.evicted_entries,
                          q.evicted_bytes, q.requeues, q.bytes, q.entries)

    def run_eviction(self):
        """One periodic pass: ``evict_before(clock() - time_threshold)``,
        then, when the size is above the trigger, ``evict_least_accessed``
        down to the watermark.  Returns the (entries, bytes) of both steps."""
        cdef RemovalQueue queue = self._q()
        cdef int64_t now = _read_clock(self._clock)
        cdef int64_t before
        if now < INT64_MIN + self._threshold_ns:
            before = INT64_MIN
        else:
            before = now - self._threshold_ns
        n, b = queue._walk_before(before)
        if queue.q.bytes > self._trigger_bytes:
            n2, b2 = self._evict_to_watermark()
            n += n2
            b = min(b + b2, MAX_ID)
        return n, b

    cdef tuple _evict_to_watermark(self):
        cdef int64_t free = self._queue.q.bytes - self._watermark_bytes
        if free <= 0:
            return 0, 0
        return self._queue._walk_size(free)

    def __reduce__(self):
        raise contract.copy_error("EntryCacheManager")

    def __reduce_ex__(self, protocol):
        raise contract.copy_error("EntryCacheManager")

    def __copy__(self):
        raise contract.copy_error("EntryCacheManager")

    def __deepcopy__(self, memo):
        raise contract.copy_error("EntryCacheManager")

    def __repr__(self):
        if self._queue is None:
            return "<EntryCacheManager uninitialised>"
        return (f"<EntryCacheManager max={self._max} size={self._queue.q.bytes} "
                f"entries={self._queue.q.entries} caches={len(self._caches)}>")
