# cython: language_level=3, embedsignature=True, binding=False, auto_pickle=False
"""C implementation of pylimiter: thin Cython bindings over csrc/.

The core (csrc/plim_sem.c) owns the counter and the FIFO queue; this module
owns the Python objects and does the waking.  Rules that keep it sound:

* Every core call is made holding the GIL, and the core never calls back, so
  a thread holding the core's mutex also holds the GIL: no lock-order cycle
  between the two, and the mutex is never contended from Python.  The module
  relies on the GIL throughout (it is not declared free-threading
  compatible, so a free-threaded interpreter keeps the GIL on for it).
* Right after a core call returns, grants in its batch are applied to the
  permits (_apply) in plain C, before any Python code can run (and so before
  another thread could take the GIL and look at the permit).
* Each queued waiter holds one reference, taken at enqueue and dropped when
  it leaves the queue (woken from a batch, or removed by its own cancel).
* Waking happens after the core call.  A blocking thread is woken through
  its waiter's PyThread lock (from a pool: no allocation per wait).  An
  asyncio task parks on its request itself (no Future): requests that leave
  the queue are appended, FIFO, to their loop's wake batch (_LoopState),
  and one call_soon (call_soon_threadsafe from another thread) runs the
  whole batch.
* Timeouts: one timer per semaphore and loop, armed for the earliest
  deadline of the loop's queued waiters, re-armed when it fires.
* A failed request's exception is made once and raised once, by the C step
  function (_binding/await.h), with no traceback entry of ours; so are the
  CancelledError of a cancelled waiter (result(), which the task calls, and
  throw(), which it calls next) and what throw() is given: a Cython raise
  would add a frame and a traceback object, which the collector then
  tracks, to every cancel.
* binding=False: methods are plain C methods (as in a hand-written
  extension), so a call, or `async with`'s lookup of __aenter__/__aexit__,
  goes through no function-object layer.
* Misuse never reaches C with a bad pointer (issue 18): permits, requests
  and loop states cannot be made from Python (their tp_new refuses; the
  binding calls Cython's own directly); a semaphore made by __new__ alone
  refuses every call until __init__ has run; nothing is copied or pickled
  (auto_pickle off, and __reduce_ex__/__copy__/__deepcopy__ refuse); no
  deallocator runs Python code before its object has left the GC (see
  _binding/dealloc.h).
* A user callback (is_cancelled, a done-callback) that raises anything,
  KeyboardInterrupt included, never leaves a grant undelivered or the queue
  stopped: each loop over waiters finishes its work and raises the first
  such exception afterwards (``pending``).
* Nor does the loop's call_soon/call_soon_threadsafe (issue 32, G1): a wake
  batch is linked through its requests, so posting to it allocates nothing,
  and the one step that can fail, scheduling its runner, leaves the batch
  pending when it does and is retried (_LoopState.schedule).
* Main interpreter only (issue 32, G11): the module keeps process-wide C
  state; any other interpreter gets an ImportError (_binding/main_only.h).
* After os.fork() the child keeps the counts and empties the queue
  (_after_fork_in_child, at the end of this file).

The semantics are those of _limiter_py.py, the executable specification,
which has the same waiters, batches and timers in Python.
"""

cimport cython
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from cpython.exc cimport PyErr_SetObject
from libc.stdint cimport int64_t, uint64_t, INT64_MAX

import asyncio as _asyncio
import contextvars as _contextvars
import heapq as _heapq
import os as _os
import sys
import weakref as _weakref

# The contract shared with the pure twin: checks, messages and error
# constructors, called on argument and error paths only.
from . import _common as contract
from ._common import LimitType, SemaphoreStats
from ._dual import DualMemoryLimiterBase, DualMemoryPermit
from ._errors import PermitAcquireTimeoutError

__all__ = [
    "AsyncSemaphore",
    "SemaphorePermit",
    "AsyncDualMemoryLimiter",
    "DualMemoryPermit",
    "LimitType",
]

# Main interpreter only (issue 32, G11): see _binding/main_only.h.
cdef extern from *:
    """
    #include "_binding/main_only.h"
    PLIM_MAIN_ONLY(_limiter_c, "pylimiter._limiter_c")
    #define PyInit__limiter_c plim_cython_init__limiter_c
    """

cdef extern from "plim.h" nogil:
    int64_t PLIM_MAX_PERMITS
    int64_t PLIM_MAX_ACQUIRED
    enum:
        PLIM_OK
        PLIM_EMPTY
        PLIM_CLOSED
        PLIM_QUEUED
        PLIM_FULL
        PLIM_OVERFLOW
        PLIM_GONE
        PLIM_TOO_LARGE
    enum:
        PLIM_W_IDLE
        PLIM_W_QUEUED
        PLIM_W_GRANTED
        PLIM_W_CLOSED
        PLIM_W_TOO_LARGE
        PLIM_W_CANCELLED
        PLIM_W_REMOVED
    ctypedef struct plim_waiter_t:
        plim_waiter_t *done_next
        int64_t need
        int64_t total
        int64_t granted
        int has_check
        int state
    ctypedef struct plim_batch_t:
        plim_waiter_t *done_head
        plim_waiter_t *done_tail
        plim_waiter_t *check
    ctypedef struct plim_sem_t:
        pass
    int plim_sem_init(plim_sem_t *sem, int64_t max_permits, int64_t max_queue)
    void plim_sem_destroy(plim_sem_t *sem)
    void plim_batch_init(plim_batch_t *b)
    plim_waiter_t *plim_batch_pop(plim_batch_t *b)
    void plim_waiter_init(plim_waiter_t *w, int has_check)
    int64_t plim_available(plim_sem_t *sem)
    int64_t plim_acquired(plim_sem_t *sem)
    int64_t plim_max(plim_sem_t *sem)
    int64_t plim_queue_len(plim_sem_t *sem)
    int plim_closed(plim_sem_t *sem)
    int plim_try_acquire(plim_sem_t *sem, int64_t n)
    int plim_release(plim_sem_t *sem, int64_t n, plim_batch_t *b)
    int plim_enqueue(plim_sem_t *sem, plim_waiter_t *w, int64_t need, int64_t total)
    int plim_cancel(plim_sem_t *sem, plim_waiter_t *w, plim_batch_t *b)
    int plim_resume(plim_sem_t *sem, plim_waiter_t *w, int cancelled, plim_batch_t *b)
    int plim_release_growing(plim_sem_t *sem, int64_t n, plim_waiter_t *w, plim_batch_t *b)
    int plim_close(plim_sem_t *sem, plim_batch_t *b)
    int plim_set_max(plim_sem_t *sem, int64_t max, plim_batch_t *b)
    int plim_forget_waiters(plim_sem_t *sem, plim_batch_t *b)

# The same fast paths inline (plim_sem.c's exported ones are made of these):
# the uncontended acquire and release make no call into the core.
cdef extern from "plim_fast.h":
    void plim_batch_init_inline(plim_batch_t *b)
    int64_t plim_max_inline(plim_sem_t *sem)
    int plim_closed_inline(plim_sem_t *sem)
    int plim_try_acquire_inline(plim_sem_t *sem, int64_t n)
    int plim_release_inline(plim_sem_t *sem, int64_t n, plim_batch_t *b)

# What the binding needs below Cython's reach: pylimiter/_binding/, one header
# per concern, each opening with what it is for and its rules (the headers
# include what they use, so the order here is free).
cdef extern from "_binding/clock.h":
    int64_t plim_monotonic_ns() nogil

cdef extern from "_binding/compact_int.h":
    long long plim_as_longlong(object o, int *overflow) except? -1

# The request's await path (and, through it, stop_cache.h: one StopIteration
# reused for every finished await on 3.12-3.14).
cdef extern from "_binding/await.h":
    ctypedef PyObject *(*plim_advance_fn)(PyObject *self, int *status)
    enum:
        PLIM_STEP_YIELD
        PLIM_STEP_RETURN
        PLIM_STEP_RAISE
    int plim_install_request(PyObject *tp, plim_advance_fn fn) except -1
    int plim_install_done(PyObject *tp) except -1
    ctypedef PyObject *(*plim_outcome_fn)(PyObject *self, PyObject **args, Py_ssize_t nargs,
                                          int *status)
    int plim_install_outcomes(PyObject *tp, plim_outcome_fn result,
                              plim_outcome_fn thrw) except -1

cdef extern from "_binding/permit_alloc.h":
    int plim_install_permit_alloc(object permit_type, object plain_sem_type,
                                  Py_ssize_t count_offset, Py_ssize_t sem_offset,
                                  Py_ssize_t pending_offset) except -1
    object plim_permit_new(object sem, int64_t n)

cdef extern from "_binding/dealloc.h":
    int plim_install_deallocs(PyObject *permit_type,
                              int (*leaked)(PyObject *, int64_t) except -1,
                              PyObject *request_type, Py_ssize_t result_offset,
                              Py_ssize_t lock_offset, void (*give_lock)(void *) noexcept) except -1
    void plim_leak_check(PyObject *permit_type, int on)
    void plim_install_forgotten(Py_ssize_t stage_offset, Py_ssize_t blocking_offset,
                                Py_ssize_t update_offset, Py_ssize_t n_offset,
                                Py_ssize_t sem_offset,
                                int (*forgotten)(PyObject *, int64_t, int) except -1)

cdef extern from "_binding/no_new.h":
    int plim_forbid_new(object type, object msg) except -1

cdef extern from "_binding/specials.h":
    int plim_speed_special(object type, const char *name) except -1

cdef extern from "Python.h":
    ctypedef long long PY_TIMEOUT_T
    PY_TIMEOUT_T PY_TIMEOUT_MAX
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1
    int PyErr_CheckSignals() except -1
    int PyContext_Enter(object ctx) except -1
    int PyContext_Exit(object ctx) except -1
    void PyErr_WriteUnraisable(object obj)
    void PyObject_GC_UnTrack(void *op)

cdef extern from "pythread.h":
    ctypedef void *PyThread_type_lock
    PyThread_type_lock PyThread_allocate_lock()
    void PyThread_free_lock(PyThread_type_lock lock)
    int PyThread_acquire_lock(PyThread_type_lock lock, int waitflag) nogil
    int PyThread_acquire_lock_timed(PyThread_type_lock lock, PY_TIMEOUT_T us,
                                    int intr_flag) nogil
    void PyThread_release_lock(PyThread_type_lock lock) nogil
    unsigned long PyThread_get_thread_ident()
    enum:
        PY_LOCK_FAILURE
        PY_LOCK_ACQUIRED
        PY_LOCK_INTR

cdef enum:
    NBUCKETS = 16
assert len(contract.WAIT_BUCKETS) == NBUCKETS
# The twin and _common name the waiter states by plim_wstate_t's values.
assert (contract.W_IDLE, contract.W_QUEUED, contract.W_GRANTED, contract.W_CLOSED,
        contract.W_TOO_LARGE, contract.W_CANCELLED, contract.W_REMOVED) == (
        PLIM_W_IDLE, PLIM_W_QUEUED, PLIM_W_GRANTED, PLIM_W_CLOSED,
        PLIM_W_TOO_LARGE, PLIM_W_CANCELLED, PLIM_W_REMOVED)
assert contract.MAX_ACQUIRED == PLIM_MAX_ACQUIRED

cdef object TIMEOUT_NOT_GIVEN = contract.TIMEOUT_NOT_GIVEN
# asyncio's C accelerated lookup: the loop running in this thread, or None.
cdef object _get_running_loop = _asyncio.events._get_running_loop
# On 3.10/3.11 that lookup makes a getpid() system call (0.5-0.7 us on a
# VM), once per parked task and per wake batch.  For asyncio's own loops a
# loop state can answer "is my loop the one running in this thread?" from
# BaseEventLoop._thread_id, which run_forever() sets to the running thread
# and clears on exit (and no other loop can run in that thread meanwhile).
# 3.12+ keeps the running loop in the thread state: no system call, no need.
cdef bint _LOOKUP_IS_SLOW = sys.version_info < (3, 12)
cdef object _BaseEventLoop = _asyncio.BaseEventLoop
cdef object _CancelledError = _asyncio.CancelledError
cdef object _InvalidStateError = _asyncio.InvalidStateError
cdef object _Context = _contextvars.Context
cdef object _heappush = _heapq.heappush
cdef object _heappop = _heapq.heappop
cdef double[NBUCKETS] _BOUNDS
for _i, _b in enumerate(contract.WAIT_BUCKETS):
    _BOUNDS[_i] = _b

# Deadlines further out than this (about 31 years) are treated as this far.
cdef double _MAX_TIMEOUT_S = contract.MAX_TIMEOUT_S


cdef inline int _bucket(double seconds) noexcept:
    cdef int i
    for i in range(NBUCKETS):
        if seconds <= _BOUNDS[i]:
            return i
    return NBUCKETS - 1


# --------------------------------------------------------------------------
# Locks for blocking waits: a pool, so that a wait allocates none.  A lock in
# the pool is always held; waiting is acquiring it again, waking is releasing
# it, and the woken thread holds it again when it hands it back.
# --------------------------------------------------------------------------

cdef enum:
    LOCK_POOL = 64
cdef PyThread_type_lock _lock_pool[LOCK_POOL]
cdef int _lock_count = 0


cdef PyThread_type_lock _take_lock() except NULL:
    global _lock_count
    cdef PyThread_type_lock lock
    if _lock_count > 0:
        _lock_count -= 1
        return _lock_pool[_lock_count]
    lock = PyThread_allocate_lock()
    if lock == NULL:
        raise MemoryError()
    PyThread_acquire_lock(lock, 1)
    return lock


cdef void _give_lock(void *lock) noexcept:
    global _lock_count
    # Held again whatever happened (a no-op when it is, as it should be).
    PyThread_acquire_lock(lock, 0)
    if _lock_count < LOCK_POOL:
        _lock_pool[_lock_count] = lock
        _lock_count += 1
    else:
        PyThread_free_lock(lock)


# --------------------------------------------------------------------------
# Permits and waiters
# --------------------------------------------------------------------------

@cython.final
cdef class SemaphorePermit:
    """Permits held from one AsyncSemaphore.

    ``permits`` is what it holds now; ``update`` changes it in place and
    ``release`` sets it to 0.  Used as a context manager (``with``) it is
    released on exit.  A permit garbage-collected while it still holds
    permits emits a ResourceWarning (the permits stay taken).
    """

    cdef AsyncSemaphore _sem
    cdef int64_t _permits
    cdef _Request _pending
    cdef object __weakref__

    def __init__(self, *args, **kwargs):
        raise TypeError(contract.MSG_PERMIT_NOT_CONSTRUCTIBLE)

    @property
    def permits(self):
        """The number of permits this object holds."""
        return self._permits

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._sem.release(self)

    def __repr__(self):
        return f"<SemaphorePermit permits={self._permits}>"

    # A copy would be a second live permit for the same permits.
    def __copy__(self):
        raise contract.no_copy_error(self)

    def __deepcopy__(self, memo):
        raise contract.no_copy_error(self)

    def __reduce__(self):
        raise contract.no_copy_error(self)

    def __reduce_ex__(self, protocol):
        raise contract.no_copy_error(self)


cdef int _warn_leaked(PyObject *sem, int64_t n) except -1:
    # From the permit's deallocator (plim_permit_dealloc), after the permit
    # is gone: it gets the semaphore, which names it in the message.  An
    # exception (-W error) is left set for the hook, which reports it as
    # unraisable (PyErr_WriteUnraisable needs it set: Py_DEBUG asserts so).
    contract.warn_leaked_permit(<object>sem, n)
    return 0


cdef int _warn_forgotten(PyObject *sem, int64_t n, int is_update) except -1:
    # From the request's deallocator (plim_request_dealloc), after the
    # request is gone; an exception is left set for the hook (as above).
    contract.warn_never_awaited(<object>sem, n, is_update)
    return 0


cdef inline SemaphorePermit _new_permit(AsyncSemaphore sem, int64_t n):
    # plim_permit_new (_binding/permit_alloc.h): from the binding's
    # freelist, and GC-tracked only where it may close a cycle.
    return <SemaphorePermit>plim_permit_new(sem, n)


cdef inline SemaphorePermit _probe_permit(AsyncSemaphore sem, int64_t n):
    cdef SemaphorePermit p = SemaphorePermit.__new__(SemaphorePermit)
    p._sem = sem
    p._permits = n
    return p


cdef inline object _call_in(object ctx, object fn, object arg):
    if ctx is None:
        fn(arg)
        return
    PyContext_Enter(ctx)
    try:
        fn(arg)
    finally:
        PyContext_Exit(ctx)


# Byte offset of `node` inside a _Request, to get from a core node back to
# its object (the intrusive-list container_of).
cdef Py_ssize_t _NODE_OFFSET


cdef Py_ssize_t _node_offset():
    cdef _Request probe = _Request.__new__(_Request)
    return <char *>&probe.node - <char *><PyObject *>probe


_NODE_OFFSET = _node_offset()


cdef inline PyObject *_waiter_ptr(plim_waiter_t *n) noexcept:
    return <PyObject *>(<char *>n - _NODE_OFFSET)


def _deadline_key(_Request w):
    return w.deadline_ns


cdef enum:
    # How often a wake batch's runner is scheduled again at once when
    # call_soon(_threadsafe) raised (a signal handler's exception passes on
    # the first retry; a MemoryError that persists is left to later events).
    SCHEDULE_TRIES = 3


# --------------------------------------------------------------------------
# Per loop: the wake batch and the timeout timer
# --------------------------------------------------------------------------

@cython.final
cdef class _LoopState:
    """What one semaphore keeps per event loop while the loop has waiters:
    the pending wake batch and the one timeout timer.  Dropped when idle.

    The batch is an intrusive list of requests (``bhead``..``btail``,
    linked through ``_Request.bnext``), so that posting a request to it
    allocates nothing: the only step of a wake that can fail is the
    ``call_soon``/``call_soon_threadsafe`` that schedules the runner
    (issue 32, G1), and ``scheduled`` says whether that step succeeded.

    The batch and ``nq`` may change on any thread (under the GIL); the
    deadlines and the timer only on the loop's own thread (enqueue, timer,
    batch runner).
    """

    cdef AsyncSemaphore sem
    cdef object loop
    cdef _Request bhead          # the wake batch, FIFO; None: empty
    cdef _Request btail
    cdef bint scheduled          # a runner is on the loop's way for the batch
    cdef Py_ssize_t nq           # queued waiters of this loop
    cdef object timer
    cdef int64_t timer_at
    cdef list dl                 # deadlines in arrival order (non-decreasing)...
    cdef Py_ssize_t dl_head      # ...consumed from here
    cdef list late               # heap (deadline, seq, waiter): out-of-order ones
    cdef int64_t seq
    cdef object run_cb
    cdef object timer_cb
    cdef bint knows_thread        # `loop` is an asyncio BaseEventLoop (3.10/3.11)

    def __cinit__(self, AsyncSemaphore sem, loop):
        self.sem = sem
        self.loop = loop
        self.dl = []
        self.late = []
        self.run_cb = self.run
        self.timer_cb = self.on_timer
        self.knows_thread = _LOOKUP_IS_SLOW and isinstance(loop, _BaseEventLoop)

    cdef bint running_here(self) except -1:
        """True when this state's loop is the one running in this thread."""
        if self.knows_thread:
            tid = self.loop._thread_id
            return tid is not None and <unsigned long>tid == PyThread_get_thread_ident()
        return _get_running_loop() is self.loop

    cdef schedule(self):
        """Make sure a runner is scheduled for the pending batch.

        Any BaseException from call_soon/call_soon_threadsafe (a
        KeyboardInterrupt from a signal handler run inside it, a MemoryError
        allocating its Handle) leaves the batch pending and unscheduled, so
        the call is tried again at once, up to SCHEDULE_TRIES times; the
        first such exception is raised once the runner is scheduled (or the
        tries are spent: then the next post to this loop, a cancel of one of
        the batch's tasks or this loop's timer schedules it).  Only a closed
        loop drops the batch (its grants go back: nobody will take them).
        A duplicate runner (an interrupt after the Handle was queued) finds
        the batch empty or delivers it early: both are harmless."""
        cdef int tries = 0
        pending = None
        loop = self.loop
        while self.bhead is not None and not self.scheduled:
            self.scheduled = True
            try:
                if self.running_here():
                    loop.call_soon(self.run_cb)
                else:
                    loop.call_soon_threadsafe(self.run_cb)
            except BaseException as exc:
                self.scheduled = False
                if pending is None:
                    pending = exc
                if isinstance(exc, RuntimeError):
                    try:
                        closed = loop.is_closed()
                    except BaseException:
                        closed = False
                    if closed:
                        # Nobody will take these: give the grants back.
                        if pending is exc:
                            pending = None
                        self.sem._drop_batch(self)
                        break
                tries += 1
                if tries >= SCHEDULE_TRIES:
                    break
        if pending is not None:
            raise pending

    cdef push_front(self, _Request first, _Request last):
        """Put the undelivered chain first..last back in front of the
        batch (its runner was interrupted) and schedule it."""
        last.bnext = self.bhead
        self.bhead = first
        if self.btail is None:
            self.btail = last
        self.schedule()

    def run(self):
        """The batch runner: deliver each outcome in FIFO order.  A
        callback's exception goes to the loop's exception handler and the
        request's other callbacks still run; SystemExit/KeyboardInterrupt
        (from a callback or the handler) propagate at once, as from any
        asyncio callback, and what is left of the batch runs next time."""
        cdef _Request w = self.bhead
        cdef _Request tail = self.btail
        cdef _Request nxt
        self.scheduled = False
        self.bhead = self.btail = None
        if w is None:
            self.tidy()
            return
        try:
            while w is not None:
                try:
                    w._fire()
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self.loop.call_exception_handler({
                        "message": contract.MSG_WAKE_CALLBACK_FAILED,
                        "exception": exc,
                        "future": w,
                    })
                    continue   # the same request: its remaining callbacks
                nxt = w.bnext
                w.bnext = None
                w = nxt
        except BaseException:
            if not w.has_callbacks():
                nxt = w.bnext
                w.bnext = None
                w = nxt
            if w is not None:
                self.push_front(w, tail)
            raise
        self.tidy()

    cdef add_deadline(self, _Request w):
        """Track a queued waiter's deadline; arm the timer if it is the
        earliest."""
        cdef int64_t d = w.deadline_ns
        cdef Py_ssize_t n = len(self.dl)
        if n == self.dl_head or (<_Request>self.dl[n - 1]).deadline_ns <= d:
            self.dl.append(w)
        else:
            self.seq += 1
            _heappush(self.late, (d, self.seq, w))
        if self.timer is None or d < self.timer_at:
            self.arm(d)

    cdef arm(self, int64_t deadline):
        cdef double delay
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = deadline
        delay = (deadline - plim_monotonic_ns()) / 1e9
        self.timer = self.loop.call_later(delay if delay > 0 else 0.0, self.timer_cb)

    def on_timer(self):
        """Time out every queued waiter whose deadline has passed, then
        re-arm for the earliest one left."""
        cdef int64_t now = plim_monotonic_ns()
        cdef _Request w
        self.timer = None
        pending = None
        if self.bhead is not None and not self.scheduled:
            try:   # a batch whose scheduling failed (G1): on its way now
                self.schedule()
            except BaseException as exc:
                pending = exc
        expired = []
        dl = self.dl
        while self.dl_head < len(dl):
            w = <_Request>dl[self.dl_head]
            if w.deadline_ns > now:
                break
            dl[self.dl_head] = None
            self.dl_head += 1
            if w.node.state == PLIM_W_QUEUED:
                expired.append(w)
        late = self.late
        if late and late[0][0] <= now:
            while late and late[0][0] <= now:
                w = <_Request>_heappop(late)[2]
                if w.node.state == PLIM_W_QUEUED:
                    expired.append(w)
            expired.sort(key=_deadline_key)   # stable: arrival order on ties
        if expired:
            try:
                self.sem._expire(expired)
            except BaseException as exc:   # a check's; every one expired
                if pending is None:
                    pending = exc
        self.prune()
        dl = self.dl   # prune may have started a fresh list
        if self.dl_head < len(dl):
            d = (<_Request>dl[self.dl_head]).deadline_ns
            if late and late[0][0] < d:
                d = late[0][0]
            self.arm(d)
        elif late:
            self.arm(late[0][0])
        self.tidy()
        if pending is not None:
            raise pending

    def __reduce_ex__(self, protocol):
        raise contract.no_copy_error(self)

    def __copy__(self):
        raise contract.no_copy_error(self)

    def __deepcopy__(self, memo):
        raise contract.no_copy_error(self)

    cdef prune(self):
        """Drop deadlines of waiters that already left the queue."""
        dl = self.dl
        while self.dl_head < len(dl) and (<_Request>dl[self.dl_head]).node.state != PLIM_W_QUEUED:
            dl[self.dl_head] = None
            self.dl_head += 1
        if self.dl_head == len(dl):
            if self.dl_head:
                self.dl = []
                self.dl_head = 0
        elif self.dl_head > 32 and 2 * self.dl_head >= len(dl):
            del dl[:self.dl_head]
            self.dl_head = 0
        late = self.late
        while late and (<_Request>late[0][2]).node.state != PLIM_W_QUEUED:
            _heappop(late)

    cdef tidy(self):
        """On the loop's thread: forget stale deadlines; when no waiter of
        this loop is queued or pending, cancel the timer and drop the state."""
        self.prune()
        if self.nq or self.bhead is not None:
            return
        sem = self.sem
        if sem._loops.get(self.loop) is self:
            del sem._loops[self.loop]
        if sem._ls is self:
            sem._ls = None
        self.dl = []
        self.dl_head = 0
        self.late = []
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


# --------------------------------------------------------------------------
# The awaitables
# --------------------------------------------------------------------------

@cython.final
cdef class _Done:
    """An awaitable that is already complete (with None): what ``__aexit__``
    returns when the exit only releases, so no coroutine is created."""

    def __await__(self):
        return self

    def __iter__(self):
        return self

    def __next__(self):
        raise StopIteration

    def __repr__(self):
        return "<pylimiter completed awaitable>"


plim_install_done(<PyObject *>_Done)
cdef _Done _DONE = _Done()


cdef enum RequestStage:
    STAGE_CREATED = 0    # returned by acquire/update, not awaited yet
    STAGE_AWAITED = 1    # __await__ called; nothing asked of the core yet
    STAGE_WAITING = 2    # queued: the task is parked on the waiter
    STAGE_DONE = 3       # granted, failed, or abandoned: never again


@cython.freelist(256)
@cython.final
cdef class _Request:
    """What ``acquire``/``update`` return: awaitable once (it joins the queue
    when first awaited), and an async context manager that releases the
    permit on exit.

    Queued, it is its own waiter (the plim_waiter_t node is embedded), so a
    parked task costs one object.  For asyncio it is also what the waiting
    task parks on: the part of the Future protocol asyncio.Task uses
    (``_asyncio_future_blocking``, ``_loop``, ``add_done_callback``,
    ``result``, ``cancel``); it is "done" once its outcome is decided and it
    is in (or past) a wake batch.  A blocking wait queues a bare _Request
    too (``blocking``), woken through its pooled lock.
    """

    cdef plim_waiter_t node
    cdef SemaphorePermit permit    # to update, or (acquire) made by _begin; the result
    cdef object check              # is_cancelled, or None
    cdef object cause              # check's exception, or the task's cancel message
    cdef _LoopState ls             # asyncio: the loop's state; None when blocking
    cdef _Request bnext            # the next request in its loop's wake batch
    cdef AsyncSemaphore _sem
    cdef object _timeout
    cdef object cb                 # the first done-callback and its context
    cdef object ctx
    cdef list more_cbs             # any further (fn, context) pairs
    cdef PyThread_type_lock lock   # blocking only (returned by the dealloc hook)
    cdef int64_t _n
    cdef int64_t limit
    cdef int64_t enqueued_ns
    cdef int64_t deadline_ns
    cdef RequestStage _stage
    cdef int fblocking             # _asyncio_future_blocking: 0 None, 1 False, 2 True
    cdef bint blocking
    cdef bint applied
    cdef bint reverted
    cdef bint posted
    cdef bint fired
    cdef bint is_cancelled
    cdef bint is_update
    cdef bint ok                   # granted: `permit` is the result
    cdef bint _anon                # `async with sem:`: the semaphore holds it

    @property
    def _asyncio_future_blocking(self):
        """None until the request is queued, so that asyncio.isfuture() is
        false for a request (ensure_future and gather wrap it in a Task);
        True when a task is to park on it."""
        if self.fblocking == 0:
            return None
        return self.fblocking == 2

    @_asyncio_future_blocking.setter
    def _asyncio_future_blocking(self, value):
        self.fblocking = 2 if value else 1

    @property
    def _loop(self):
        """The event loop the waiting task runs on.  An attribute, not
        get_loop(): asyncio falls back to it, and reading it allocates no
        bound method per parked task.  None while the request is not (and
        never was) queued for a loop."""
        if self.ls is None:
            return None
        return self.ls.loop

    def add_done_callback(self, fn, *, context=None):
        """Call ``fn(self)`` (in ``context``) when the outcome is delivered."""
        if not callable(fn) or (context is not None and type(context) is not _Context):
            contract.check_done_callback(fn, context)   # raises TypeError
        if self.fired and self.ls is not None:
            self.ls.loop.call_soon(fn, self, context=context)
        elif self.cb is None and self.more_cbs is None:
            self.cb = fn
            self.ctx = context
        else:
            if self.more_cbs is None:
                self.more_cbs = []
            self.more_cbs.append((fn, context))

    def remove_done_callback(self, fn):
        """Remove every registration of ``fn``; return how many there were."""
        cdef int removed = 0
        if self.cb is not None and contract.same_callback(self.cb, fn):
            self.cb = None
            self.ctx = None
            removed += 1
        if self.more_cbs is not None:
            kept = [(f, c) for f, c in self.more_cbs if not contract.same_callback(f, fn)]
            removed += len(self.more_cbs) - len(kept)
            self.more_cbs = kept
        return removed

    def done(self):
        """True once the outcome is decided (granted, failed or cancelled)."""
        return self.posted

    def cancelled(self):
        """True if the waiting task cancelled it while it was queued."""
        return self.is_cancelled

    # result() and throw(): _request_result and _request_throw below,
    # raised from C (await.h).

    cdef object _outcome(self, int *status):
        status[0] = PLIM_STEP_RAISE
        if self.is_cancelled:
            if self.cause is None:
                return _CancelledError()
            return _CancelledError(self.cause)
        if not self.posted:
            return _InvalidStateError("Result is not ready.")
        status[0] = PLIM_STEP_RETURN
        return None

    def cancel(self, msg=None):
        """Task.cancel() while the task is parked here: leave the queue and
        wake the task with CancelledError.  False once the outcome is
        already decided (the task then cancels itself when it resumes, and a
        grant goes back)."""
        if self.ls is None:
            return False
        return self.ls.sem._cancel_waiter(self, msg)

    cdef _fire(self):
        """Run the done-callbacks in order, each taken off the request just
        before it runs: if one raises, the others are still here to run."""
        self.fired = True
        while True:
            if self.cb is not None:
                fn = self.cb
                ctx = self.ctx
                self.cb = None
                self.ctx = None
            elif self.more_cbs:
                fn, ctx = self.more_cbs.pop(0)
            else:
                self.more_cbs = None
                return
            _call_in(ctx, fn, self)

    cdef bint has_callbacks(self):
        return self.cb is not None or bool(self.more_cbs)

    def __repr__(self):
        state = ("cancelled" if self.is_cancelled else "done" if self.posted
                 else "queued" if self._stage == STAGE_WAITING else "not queued")
        return f"<pylimiter request permits={self._n} {state}>"

    # A copy would be a second request for the same queue slot and permit.
    def __copy__(self):
        raise contract.no_copy_error(self)

    def __deepcopy__(self, memo):
        raise contract.no_copy_error(self)

    def __reduce__(self):
        raise contract.no_copy_error(self)

    def __reduce_ex__(self, protocol):
        raise contract.no_copy_error(self)

    def __await__(self):
        if self._stage != STAGE_CREATED:
            raise RuntimeError(contract.MSG_ALREADY_AWAITED)
        self._stage = STAGE_AWAITED
        return self

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        """Coroutine protocol: advance the request."""
        cdef int status = PLIM_STEP_YIELD
        v = self._advance(&status)
        if status == PLIM_STEP_YIELD:
            return v
        if status == PLIM_STEP_RETURN:
            raise StopIteration(v)
        raise v

    def close(self):
        """Coroutine protocol: the awaiting coroutine is closed."""
        self._stop_waiting()

    cdef _stop_waiting(self):
        if self._stage == STAGE_WAITING:
            self._stage = STAGE_DONE
            self._sem._abandon(self, False, False)
        else:
            self._stage = STAGE_DONE

    cdef object _granted(self, SemaphorePermit p):
        if self._anon:
            self._sem._anon += p._permits
            p._permits = 0
            return None
        self.permit = p
        self.ok = True
        return p

    cdef object _advance(self, int *status):
        cdef AsyncSemaphore sem = self._sem
        cdef double t
        if self._stage <= STAGE_AWAITED:
            # STAGE_CREATED too: asyncio sees send/throw/close and drives the
            # request as a coroutine (create_task, gather) without __await__.
            self._stage = STAGE_WAITING
            if not self.is_update and self.check is None:
                # plim_try_acquire: no waiter, no lock, no clock.
                if plim_try_acquire_inline(&sem._sem, self._n) == PLIM_OK:
                    sem._acquired_total += 1
                    sem._wait_counts[0] += 1
                    self._stage = STAGE_DONE
                    status[0] = PLIM_STEP_RETURN
                    return self._granted(_new_permit(sem, self._n))
            try:
                r = sem._begin(self, self.permit, self._n, self._timeout, self.check)
            except BaseException:
                # is_cancelled raised (KeyboardInterrupt...), or a shrink's
                # settle did after the shrink: not queued, and never will be.
                self._stage = STAGE_DONE
                raise
            if r is self:
                if self._timeout is not None:
                    t = self._timeout
                    if t > _MAX_TIMEOUT_S:
                        t = _MAX_TIMEOUT_S
                    self.deadline_ns = self.enqueued_ns + <int64_t>(t * 1e9)
                    self.ls.add_deadline(self)
                self.fblocking = 2
                return self
            self._stage = STAGE_DONE
            if type(r) is SemaphorePermit:
                status[0] = PLIM_STEP_RETURN
                return self._granted(<SemaphorePermit>r)
            status[0] = PLIM_STEP_RAISE
            return r
        if self._stage == STAGE_WAITING:
            if not self.posted:
                self.fblocking = 2
                return self
            self._stage = STAGE_DONE
            if self.node.state == PLIM_W_GRANTED:
                status[0] = PLIM_STEP_RETURN
                return self._granted(self.permit)
            status[0] = PLIM_STEP_RAISE
            if self.node.state == PLIM_W_REMOVED:
                return contract.timed_out_error(self._timeout)
            return contract.left_queue_error(self.node.state, self.node.total, self.limit,
                                             self.cause, self._timeout)
        raise RuntimeError(contract.MSG_REUSED)

    def __aenter__(self):
        return self

    def __aexit__(self, exc_type, exc, tb):
        if self.ok:
            self._sem._release(self.permit)
        return _DONE


cdef object _request_advance(object self, int *status):
    return (<_Request>self)._advance(status)


plim_install_request(<PyObject *>_Request, <plim_advance_fn>_request_advance)


cdef object _request_result(object self, PyObject **args, Py_ssize_t nargs, int *status):
    return (<_Request>self)._outcome(status)


cdef object _request_throw(object self, PyObject **args, Py_ssize_t nargs, int *status):
    (<_Request>self)._stop_waiting()
    status[0] = PLIM_STEP_RAISE
    return contract.thrown_exception(<object>args[0], <object>args[1] if nargs > 1 else None,
                                     <object>args[2] if nargs > 2 else None)


plim_install_outcomes(<PyObject *>_Request, <plim_outcome_fn>_request_result,
                      <plim_outcome_fn>_request_throw)


cdef inline _Request _new_request(AsyncSemaphore sem, SemaphorePermit permit, int64_t n,
                                  object timeout, object is_cancelled):
    cdef _Request r = _Request.__new__(_Request)
    r._sem = sem
    if permit is not None:
        r.permit = permit
        r.is_update = True
    r._n = n
    r._timeout = timeout
    r.check = is_cancelled
    return r


# --------------------------------------------------------------------------
# The semaphore
# --------------------------------------------------------------------------

cdef class AsyncSemaphore:
    """A weighted, strictly FIFO semaphore for asyncio tasks and threads.

    ``max_permits <= 0`` makes it unbounded (everything is granted at once,
    usage is still counted); ``max_queue_size <= 0`` makes the queue
    unbounded; ``timeout`` (seconds, ``None`` for ever) is the default wait
    for a queued request, measured from when it joins the queue.
    ``set_max_permits`` changes the limit live, to or from unbounded too.

    After ``os.fork()`` the child's semaphore has the parent's counts (the
    permits held by the parent's permits, of which the child has copies,
    stay taken until the child releases them) and an empty queue, as a
    ``threading.Semaphore``: permits released in the child go to the
    child's own requests, never to the parent's waiters, which are not
    woken in the child (their threads do not exist there, and their event
    loops are the parent's).
    """

    cdef plim_sem_t _sem
    cdef bint _ready
    cdef bint _bounded
    cdef int64_t _max_queue
    cdef object _max_queue_cfg    # as configured (may be any int <= 0)
    cdef object _max_cfg          # as last set (any int; <= 0: unbounded)
    cdef object _timeout
    cdef int64_t _anon            # permits held by `async with sem:` blocks
    cdef _LoopState _ls           # the loop state used last (also in _loops)
    cdef dict _loops              # loop -> _LoopState, while it has waiters
    cdef int64_t _acquired_total
    cdef int64_t _timeout_total
    cdef int64_t _queue_full_total
    cdef int64_t _cancelled_total
    cdef double _wait_sum
    cdef int64_t _wait_counts[NBUCKETS]
    cdef object __weakref__

    def __init__(self, max_permits, max_queue_size=10000, timeout=25.0):
        max_permits, max_queue_size = contract.check_limits(max_permits, max_queue_size)
        if self._ready:
            # A second __init__ would forget what is held and queued.
            raise contract.reinit_error(self)
        self._timeout = contract.check_timeout(timeout, None)
        mq = max(min(max_queue_size, 2**62), -1)
        mp = max(max_permits, -1)
        self._bounded = mp > 0
        self._max_queue = mq
        self._max_queue_cfg = max_queue_size
        self._max_cfg = max_permits
        self._loops = {}
        if plim_sem_init(&self._sem, mp, mq) != PLIM_OK:
            raise MemoryError("pylimiter: cannot initialise the semaphore")
        self._ready = True
        _SEMAPHORES.add(self)   # for the fork rule (_after_fork_in_child)

    def __dealloc__(self):
        if self._ready:
            plim_sem_destroy(&self._sem)

    cdef inline int _ok(self) except -1:
        # Made by __new__ alone (or a subclass that skipped __init__): the
        # core struct is zeroes, whose counter would read 2**60 held.
        if not self._ready:
            raise contract.uninitialised_error(self)
        return 0

    # A copy would share (or, deep, fork) the core's counter and queue.
    def __copy__(self):
        raise contract.no_copy_error(self)

    def __deepcopy__(self, memo):
        raise contract.no_copy_error(self)

    def __reduce__(self):
        raise contract.no_copy_error(self)

    def __reduce_ex__(self, protocol):
        raise contract.no_copy_error(self)

    # ---- properties --------------------------------------------------------

    @property
    def max_permits(self):
        """The limit last set (<= 0: unbounded)."""
        self._ok()
        return self._max_cfg

    @property
    def available_permits(self):
        """max_permits - acquired_permits (negative after lowering the limit);
        ``2**63 - 1`` when unbounded."""
        self._ok()
        if self._bounded:
            return plim_available(&self._sem)
        return contract.UNBOUNDED_AVAILABLE

    @property
    def acquired_permits(self):
        """Permits held now (granted and not released)."""
        self._ok()
        return plim_acquired(&self._sem)

    @property
    def queue_size(self):
        """Requests waiting in the queue."""
        self._ok()
        return plim_queue_len(&self._sem)

    @property
    def max_queue_size(self):
        """The configured queue bound (<= 0: unbounded)."""
        self._ok()
        return self._max_queue_cfg

    @property
    def closed(self):
        """True after close()."""
        self._ok()
        return plim_closed(&self._sem) != 0

    def locked(self):
        """True when ``acquire(1)`` could not be granted at once: fewer than
        one permit is available, requests are queued (no barging), or the
        semaphore is closed.  As asyncio.Semaphore.locked(); a snapshot."""
        self._ok()
        if plim_closed(&self._sem):
            return True
        return self._bounded and (plim_queue_len(&self._sem) > 0
                                  or plim_available(&self._sem) < 1)

    def __repr__(self):
        if not self._ready:
            return contract.uninitialised_repr(self)
        return (
            f"<AsyncSemaphore max_permits={self._max_cfg} "
            f"acquired={plim_acquired(&self._sem)} "
            f"queued={plim_queue_len(&self._sem)}"
            f"{' closed' if plim_closed(&self._sem) else ''}>"
        )

    # ---- argument checks -----------------------------------------------------

    cdef inline int64_t _check_n(self, object permits) except -1:
        cdef int overflow = 0
        cdef long long v
        if type(permits) is int:
            v = plim_as_longlong(permits, &overflow)
            if not overflow and 0 <= v <= PLIM_MAX_PERMITS:
                if not self._bounded or v <= plim_max_inline(&self._sem):
                    return v
        # Rare: let the shared checker pick the right exception and message.
        return contract.check_permits(permits, self._max_cfg, self._bounded)

    cdef inline _check_permit(self, object permit):
        if type(permit) is not SemaphorePermit or (<SemaphorePermit>permit)._sem is not self:
            raise contract.permit_error(permit, SemaphorePermit)

    cdef inline object _resolve_timeout(self, object timeout):
        if timeout is TIMEOUT_NOT_GIVEN:
            return self._timeout
        return contract.check_timeout(timeout, self._timeout)

    # ---- public API ------------------------------------------------------------

    def acquire(self, permits=1, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None):
        """Return an awaitable of a new SemaphorePermit holding ``permits``.

        The request joins the queue when first awaited.  It fails with
        PermitAcquireTimeoutError, PermitAcquireQueueFullError,
        PermitAcquireAlreadyClosedError or PermitAcquireCancelledError.
        ``async with sem.acquire(n) as p:`` releases p on exit.
        """
        self._ok()
        cdef int64_t n = self._check_n(permits)
        t = self._resolve_timeout(timeout)
        if is_cancelled is not None:
            contract.check_is_cancelled(is_cancelled)
        if plim_closed_inline(&self._sem):
            raise contract.closed_error()
        return _new_request(self, None, n, t, is_cancelled)

    def update(self, permit, new_permits, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None):
        """Return an awaitable that changes ``permit`` to ``new_permits`` in
        place and returns it.  Shrinking completes at once (even after close);
        growing queues for the difference like an acquire, and on failure the
        permit keeps what it had."""
        self._check_permit(permit)
        cdef int64_t n = self._check_n(new_permits)
        t = self._resolve_timeout(timeout)
        contract.check_is_cancelled(is_cancelled)
        return _new_request(self, permit, n, t, is_cancelled)

    def acquire_blocking(self, permits=1, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None):
        """Blocking twin of ``acquire`` for threads; the GIL is released while
        waiting."""
        self._ok()
        cdef int64_t n = self._check_n(permits)
        t = self._resolve_timeout(timeout)
        if is_cancelled is None:
            if plim_try_acquire_inline(&self._sem, n) == PLIM_OK:
                self._acquired_total += 1
                self._wait_counts[0] += 1
                return _new_permit(self, n)
        else:
            contract.check_is_cancelled(is_cancelled)
        return self._run_blocking(None, n, t, is_cancelled)

    def update_blocking(self, permit, new_permits, *, timeout=TIMEOUT_NOT_GIVEN,
                        is_cancelled=None):
        """Blocking twin of ``update`` for threads."""
        self._check_permit(permit)
        cdef int64_t n = self._check_n(new_permits)
        t = self._resolve_timeout(timeout)
        contract.check_is_cancelled(is_cancelled)
        return self._run_blocking(permit, n, t, is_cancelled)

    def try_acquire(self, permits=1):
        """Take ``permits`` now if they fit and nobody queues; else None.
        Never waits and never overtakes queued requests."""
        self._ok()
        cdef int64_t n = self._check_n(permits)
        cdef int rc = plim_try_acquire_inline(&self._sem, n)
        if rc == PLIM_OK:
            self._acquired_total += 1
            self._wait_counts[0] += 1
            return _new_permit(self, n)
        if rc == PLIM_CLOSED:
            raise contract.closed_error()
        if rc == PLIM_OVERFLOW:
            raise contract.overflow_error()
        return None

    def release(self, permit):
        """Give back everything ``permit`` holds and set it to 0.
        Releasing again is a no-op; works after close."""
        if type(permit) is not SemaphorePermit or (<SemaphorePermit>permit)._sem is not self:
            self._check_permit(permit)
        self._release(<SemaphorePermit>permit)

    cdef inline _release(self, SemaphorePermit p):
        cdef plim_batch_t b
        cdef int64_t n = p._permits
        if n == 0:
            return
        p._permits = 0
        plim_batch_init_inline(&b)
        if p._pending is not None and p._pending.node.state == PLIM_W_QUEUED:
            # Its update now has to take the whole new size.
            plim_release_growing(&self._sem, n, &p._pending.node, &b)
        else:
            plim_release_inline(&self._sem, n, &b)
        if b.done_head != NULL or b.check != NULL:
            self._settle(&b)

    def __aenter__(self):
        """``async with sem:`` takes one permit (as asyncio.Semaphore)."""
        self._ok()
        cdef _Request r = _new_request(self, None, 1, self._timeout, None)
        r._anon = True
        return r

    def __aexit__(self, exc_type, exc, tb):
        cdef plim_batch_t b
        self._ok()
        if self._anon <= 0:
            raise RuntimeError(contract.MSG_ANON_EXIT)
        self._anon -= 1
        plim_batch_init_inline(&b)
        plim_release_inline(&self._sem, 1, &b)
        if b.done_head != NULL or b.check != NULL:
            self._settle(&b)
        return _DONE

    def close(self):
        """Close (idempotent): queued requests fail with
        PermitAcquireAlreadyClosedError, and so do later acquires."""
        cdef plim_batch_t b
        self._ok()
        plim_batch_init(&b)
        plim_close(&self._sem, &b)
        self._settle(&b)

    def set_max_permits(self, max_permits):
        """Change the limit, live.  ``max_permits > 0`` bounds the semaphore
        (an unbounded one too): what is held carries over, so
        available_permits may go negative, and queued requests larger than
        the new limit fail with ValueError; raising it grants waiters that
        now fit.  ``max_permits <= 0`` makes it unbounded: every queued
        request is granted at once."""
        cdef plim_batch_t b
        m = contract.check_new_max(max_permits)
        self._ok()
        plim_batch_init(&b)
        plim_set_max(&self._sem, max(m, -1), &b)
        self._bounded = m > 0
        self._max_cfg = m
        self._settle(&b)

    def stats(self):
        """A snapshot of gauges, counters and the wait-time histogram."""
        self._ok()
        counts = [self._wait_counts[i] for i in range(NBUCKETS)]
        return SemaphoreStats(
            max_permits=self.max_permits,
            acquired_permits=self.acquired_permits,
            available_permits=self.available_permits,
            queue_size=self.queue_size,
            max_queue_size=self._max_queue_cfg,
            acquired_total=self._acquired_total,
            timeout_total=self._timeout_total,
            queue_full_total=self._queue_full_total,
            cancelled_total=self._cancelled_total,
            wait_seconds_sum=self._wait_sum,
            wait_seconds_count=sum(counts),
            wait_seconds_buckets=contract.cumulative_buckets(counts),
        )

    # ---- slow paths ------------------------------------------------------------

    cdef void _apply(self, plim_batch_t *b) noexcept:
        """Record what left the queue in a batch: plain C, no Python code, so
        nothing can observe a granted waiter whose permit is not updated."""
        cdef plim_waiter_t *node = b.done_head
        cdef _Request w
        cdef int64_t now = 0
        cdef double wait
        while node != NULL:
            w = <_Request>_waiter_ptr(node)
            if not w.applied:
                w.applied = True
                if w.ls is not None:
                    w.ls.nq -= 1
                if node.state == PLIM_W_GRANTED:
                    if now == 0:
                        now = plim_monotonic_ns()
                    w.permit._permits += node.granted
                    wait = (now - w.enqueued_ns) / 1e9 if now > w.enqueued_ns else 0.0
                    self._acquired_total += 1
                    self._wait_sum += wait
                    self._wait_counts[_bucket(wait)] += 1
                elif node.state == PLIM_W_TOO_LARGE:
                    w.limit = plim_max(&self._sem)
                elif node.state == PLIM_W_CANCELLED:
                    self._cancelled_total += 1
                if w.permit._pending is w:
                    w.permit._pending = None
            node = node.done_next

    cdef _settle(self, plim_batch_t *b):
        """Apply a batch, answer pending checks with no lock held, then wake
        every waiter that left the queue.  A check that raises something
        other than an Exception (KeyboardInterrupt, SystemExit...) counts
        as cancelled too, so the queue moves on; that exception is raised
        once every waiter is woken."""
        cdef _Request w
        cdef plim_waiter_t *node
        pending = None
        self._apply(b)
        while b.check != NULL:
            w = <_Request>_waiter_ptr(b.check)   # our reference keeps it alive
            try:
                cancelled, cause = contract.ask_cancelled(w.check)
            except BaseException as exc:
                cancelled, cause = True, exc
                if pending is None:
                    pending = exc
            if cancelled:
                w.cause = cause
            plim_resume(&self._sem, &w.node, cancelled, b)
            self._apply(b)
        node = plim_batch_pop(b)
        while node != NULL:
            w = <_Request>_waiter_ptr(node)
            Py_DECREF(w)   # the queue's reference; `w` holds one now
            if w.blocking:
                PyThread_release_lock(w.lock)
            elif not w.posted:
                try:
                    self._post(w)
                except BaseException as exc:   # a revert's check (closed loop)
                    if pending is None:
                        pending = exc
            node = plim_batch_pop(b)
        if pending is not None:
            raise pending

    cdef _post(self, _Request w):
        """Append w to its loop's wake batch (no allocation: the batch is
        linked through the requests) and make sure a runner is scheduled."""
        cdef _LoopState ls
        if w.posted:
            return
        w.posted = True
        ls = w.ls
        w.bnext = None
        if ls.btail is None:
            ls.bhead = w
        else:
            ls.btail.bnext = w
        ls.btail = w
        if not ls.scheduled:
            ls.schedule()

    cdef _drop_batch(self, _LoopState ls):
        """The batch's loop is closed: give back grants nobody will take,
        and forget the loop if nothing of it is left."""
        cdef _Request w = ls.bhead
        cdef _Request nxt
        ls.bhead = ls.btail = None
        pending = None
        while w is not None:
            nxt = w.bnext
            w.bnext = None
            try:
                self._revert(w)
            except BaseException as exc:   # a check's, after the revert
                if pending is None:
                    pending = exc
            w = nxt
        ls.tidy()
        if pending is not None:
            raise pending

    cdef _give_back(self, _Request w):
        """Return a grant that its requester will never take."""
        cdef plim_batch_t b
        if w.reverted:
            return
        w.reverted = True
        w.permit._permits -= w.node.granted
        plim_batch_init(&b)
        plim_release(&self._sem, w.node.granted, &b)
        if b.done_head != NULL or b.check != NULL:
            self._settle(&b)

    cdef _revert(self, _Request w):
        if w.node.state == PLIM_W_GRANTED:
            self._give_back(w)

    cdef _abandon(self, _Request w, bint timed_out, bint post):
        """The requester stops waiting (timeout, task cancel, interrupt).
        A queued request leaves the queue (``post``: and is woken first); a
        grant that raced with a cancel goes back; a grant that raced with a
        timeout stands."""
        cdef plim_batch_t b
        plim_batch_init(&b)
        if plim_cancel(&self._sem, &w.node, &b) == PLIM_OK:
            if w.ls is not None:
                w.ls.nq -= 1
            if w.permit._pending is w:
                w.permit._pending = None
            if timed_out:
                self._timeout_total += 1
            else:
                self._cancelled_total += 1
            Py_DECREF(w)   # the queue's reference; the caller still holds one
            try:
                if post:
                    self._post(w)
            finally:
                self._settle(&b)
        elif w.node.state == PLIM_W_GRANTED and not timed_out and not w.reverted:
            self._cancelled_total += 1
            self._give_back(w)

    cdef _cancel_waiter(self, _Request w, object msg):
        if w.posted:
            # Decided, and in (or past) a wake batch: if scheduling that
            # batch failed earlier (G1), this is the task's own way out.
            if not w.ls.scheduled and w.ls.bhead is not None:
                w.ls.schedule()
            return False
        try:
            self._abandon(w, False, False)
        finally:   # the task is woken whatever a check raised meanwhile
            w.is_cancelled = True
            w.cause = msg
            self._post(w)
        return True

    cdef _expire(self, list expired):
        """The loop's timer: these waiters' deadlines have passed."""
        pending = None
        for w in expired:
            try:
                self._abandon(<_Request>w, True, True)
            except BaseException as exc:   # a check's; the others expire too
                if pending is None:
                    pending = exc
        if pending is not None:
            raise pending

    cdef _forget_waiters(self):
        """In a child process after fork(): empty the queue, keep the
        counts (see _after_fork_in_child).  The forgotten requests are not
        woken: their threads do not exist here, and their loops are the
        parent's."""
        cdef plim_batch_t b
        cdef plim_waiter_t *node
        cdef _Request w
        plim_batch_init(&b)
        plim_forget_waiters(&self._sem, &b)
        node = plim_batch_pop(&b)
        while node != NULL:
            w = <_Request>_waiter_ptr(node)
            w.applied = True
            if w.permit is not None and w.permit._pending is w:
                w.permit._pending = None
            Py_DECREF(w)   # the queue's reference
            node = plim_batch_pop(&b)
        # A loop state names a loop of the parent (on 3.10/3.11 one whose
        # _thread_id may even equal this thread's): the child's requests
        # find their own loop afresh.
        self._loops = {}
        self._ls = None

    cdef _LoopState _loop_state(self, object loop):
        cdef _LoopState ls = self._ls
        if ls is not None and ls.loop is loop:
            return ls
        ls = self._loops.get(loop)
        if ls is None:
            ls = _LoopState.__new__(_LoopState, self, loop)
            self._loops[loop] = ls
        self._ls = ls
        return ls

    cdef object _begin(self, _Request w, SemaphorePermit permit, int64_t n, object timeout,
                       object is_cancelled):
        """Shared start of every acquire/update: returns the permit when done
        at once, w itself once queued (the asyncio request, or a blocking
        thread's), or the exception of an immediate failure (to be raised
        once, by the caller)."""
        cdef plim_batch_t b
        cdef int64_t cur, need
        cdef int rc
        cancelled = False
        cause = None
        if is_cancelled is not None and self._bounded:
            cancelled, cause = contract.ask_cancelled(is_cancelled)
        is_update = permit is not None
        if not is_update:
            permit = _new_permit(self, 0)
        else:
            if permit._pending is not None:
                return RuntimeError(contract.MSG_UPDATE_IN_PROGRESS)
            cur = permit._permits
            if n <= cur:
                # Shrinking is a release: after close too, no check.
                permit._permits = n
                if n < cur:
                    plim_batch_init(&b)
                    plim_release(&self._sem, cur - n, &b)
                    self._settle(&b)
                return permit
        need = n - permit._permits
        if plim_closed(&self._sem):
            return contract.closed_error()
        if cancelled:
            self._cancelled_total += 1
            return contract.cancelled_error(cause)
        rc = plim_try_acquire(&self._sem, need)
        if rc == PLIM_OK:
            permit._permits += need
            self._acquired_total += 1
            self._wait_counts[0] += 1
            return permit
        if rc == PLIM_OVERFLOW:
            return contract.overflow_error()
        if rc == PLIM_CLOSED:
            return contract.closed_error()
        if timeout is not None and timeout == 0:
            self._timeout_total += 1
            return contract.timeout_zero_error()
        loop = None
        if w.blocking:
            if w.lock == NULL:
                w.lock = _take_lock()
        elif self._ls is not None and self._ls.knows_thread and self._ls.running_here():
            loop = self._ls.loop   # the common case, without a system call
        else:
            loop = _get_running_loop()
            if loop is None:
                return contract.no_loop_error()
        w.permit = permit
        w.check = is_cancelled
        plim_waiter_init(&w.node, is_cancelled is not None)
        w.enqueued_ns = plim_monotonic_ns()
        rc = plim_enqueue(&self._sem, &w.node, need, n)
        if rc == PLIM_QUEUED:
            Py_INCREF(w)   # held by the queue until the waiter leaves it
            if loop is not None:
                # Safe after the enqueue: the GIL keeps every other thread
                # out of Python (and so away from w) until we return.
                w.ls = self._loop_state(loop)
                w.ls.nq += 1
            if is_update:
                permit._pending = w
            return w
        if rc == PLIM_OK:
            permit._permits += w.node.granted
            self._acquired_total += 1
            self._wait_counts[0] += 1
            return permit
        if rc == PLIM_FULL:
            self._queue_full_total += 1
            return contract.queue_full_error(self._max_queue)
        if rc == PLIM_CLOSED:
            return contract.closed_error()
        if rc == PLIM_TOO_LARGE:
            return contract.too_large_error(n, plim_max(&self._sem))
        return contract.overflow_error()

    cdef object _run_blocking(self, SemaphorePermit permit, int64_t n, object timeout,
                              object is_cancelled):
        cdef _Request w = _Request.__new__(_Request)
        cdef int rc
        cdef PY_TIMEOUT_T us
        cdef int64_t deadline = 0
        cdef int64_t now
        cdef double t
        w.blocking = True
        r = self._begin(w, permit, n, timeout, is_cancelled)
        if r is not w:
            if type(r) is SemaphorePermit:
                return r
            raise r
        if timeout is None:
            us = -1
        else:
            # Saturating, in integers: (double)PY_TIMEOUT_MAX rounds up past
            # it, and us * 1000 overflowed int64 for inf (UBSan), which made
            # a wait resumed after a signal time out at once.
            t = <double>timeout * 1e6
            us = PY_TIMEOUT_MAX if t >= <double>PY_TIMEOUT_MAX else <PY_TIMEOUT_T>t
            now = plim_monotonic_ns()
            deadline = INT64_MAX if us >= (INT64_MAX - now) // 1000 else now + us * 1000
        while True:
            with nogil:
                rc = PyThread_acquire_lock_timed(w.lock, us, 1)
            if rc == PY_LOCK_ACQUIRED:
                break
            if rc == PY_LOCK_INTR:
                try:
                    PyErr_CheckSignals()
                except BaseException:
                    try:
                        self._abandon(w, False, False)
                    finally:
                        if w.node.state != PLIM_W_REMOVED:
                            with nogil:   # its wake-up is on the way: wait it out
                                PyThread_acquire_lock_timed(w.lock, -1, 0)
                    raise
                if timeout is not None:
                    us = max(<PY_TIMEOUT_T>0, (deadline - plim_monotonic_ns()) // 1000)
                continue
            try:
                self._abandon(w, True, False)
            finally:
                if w.node.state != PLIM_W_REMOVED:
                    with nogil:
                        PyThread_acquire_lock_timed(w.lock, -1, 0)
            break
        if w.node.state == PLIM_W_GRANTED:
            return w.permit
        raise contract.left_queue_error(w.node.state, w.node.total, w.limit, w.cause, timeout)


class AsyncDualMemoryLimiter(DualMemoryLimiterBase):
    __doc__ = DualMemoryLimiterBase.__doc__
    _semaphore_class = AsyncSemaphore


# --------------------------------------------------------------------------
# The fork rule (issue 32, G5/G6): a child process starts with the parent's
# counts (the permits held by the parent's objects, which the child has
# copies of, stay taken until the child releases them) and an empty queue,
# as a threading.Semaphore does: permits released in the child go to the
# child's own requests, never to waiters that exist only in the parent.
# The forking thread holds the GIL, and every core call is made holding it,
# so no core mutex is held at the fork.
# --------------------------------------------------------------------------

cdef object _SEMAPHORES = _weakref.WeakSet()


def _after_fork_in_child():
    for sem in list(_SEMAPHORES):
        (<AsyncSemaphore>sem)._forget_waiters()


if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------
# The permit's allocation (_binding/permit_alloc.h) and the deallocation
# hooks (_binding/dealloc.h) need the offsets of fields; Cython will not take
# the address of an object field, so those are found by looking for a known
# value in a probe object.
# --------------------------------------------------------------------------

cdef Py_ssize_t _offset_of(object obj, object value) except -1:
    cdef char *base = <char *><PyObject *>obj
    cdef Py_ssize_t off
    cdef Py_ssize_t size = type(obj).__basicsize__
    for off in range(sizeof(PyObject), size - sizeof(void *) + 1, sizeof(void *)):
        if (<PyObject **>(base + off))[0] == <PyObject *>value:
            return off
    raise RuntimeError("pylimiter: field not found in its object")


cdef _install_deallocs():
    cdef AsyncSemaphore probe_sem = AsyncSemaphore(1)
    cdef SemaphorePermit probe = _probe_permit(probe_sem, 0)
    cdef _Request req = _new_request(probe_sem, None, 0, None, None)
    req.permit = probe
    probe._pending = req
    plim_install_permit_alloc(SemaphorePermit, AsyncSemaphore,
                              <char *>&probe._permits - <char *><PyObject *>probe,
                              _offset_of(probe, probe_sem), _offset_of(probe, req))
    probe._pending = None
    # Made by Cython's tp_new, so tracked; a permit of a plain AsyncSemaphore
    # must not be, for plim_permit_dealloc (which untracks only the others).
    PyObject_GC_UnTrack(<PyObject *>probe)
    plim_install_deallocs(<PyObject *>SemaphorePermit, _warn_leaked,
                          <PyObject *>_Request, _offset_of(req, probe),
                          <char *>&req.lock - <char *><PyObject *>req, _give_lock)
    req.permit = None
    if sizeof(RequestStage) != sizeof(int) or <int>STAGE_CREATED != 0:
        raise RuntimeError("pylimiter: the request's stage is not an int starting at 0")
    plim_install_forgotten(<char *>&req._stage - <char *><PyObject *>req,
                           <char *>&req.blocking - <char *><PyObject *>req,
                           <char *>&req.is_update - <char *><PyObject *>req,
                           <char *>&req._n - <char *><PyObject *>req,
                           _offset_of(req, probe_sem), _warn_forgotten)
    req._stage = STAGE_DONE   # the probe was never awaited, by design


_install_deallocs()
# Before 3.14: `async with` and `with` bind these without a method object.
plim_speed_special(_Request, b"__aenter__")
plim_speed_special(_Request, b"__aexit__")
plim_speed_special(AsyncSemaphore, b"__aenter__")
plim_speed_special(AsyncSemaphore, b"__aexit__")
plim_speed_special(SemaphorePermit, b"__enter__")
plim_speed_special(SemaphorePermit, b"__exit__")
# Last: every object the module needed to make at import is made.
plim_forbid_new(SemaphorePermit, contract.MSG_PERMIT_NOT_CONSTRUCTIBLE)
plim_forbid_new(_Request, contract.MSG_REQUEST_NOT_CONSTRUCTIBLE)
plim_forbid_new(_LoopState, contract.MSG_INTERNAL_NOT_CONSTRUCTIBLE.format("_LoopState"))


def _leak_check(bint on):
    """Switch the leaked-permit check on or off (it is on; off only to
    measure what it costs, in one process)."""
    plim_leak_check(<PyObject *>SemaphorePermit, on)
