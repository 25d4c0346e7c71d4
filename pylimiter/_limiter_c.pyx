# cython: language_level=3, embedsignature=True
"""C implementation of pylimiter: thin Cython bindings over csrc/.

The core (csrc/plim_sem.c) owns the counter and the FIFO queue; this module
owns the Python objects and does the waking.  Rules that keep it sound:

* Every core call is made holding the GIL, and the core never calls back, so
  a thread holding the core's mutex also holds the GIL: no lock-order cycle
  between the two, and the mutex is never contended from Python.
* Right after a core call returns, grants in its batch are applied to the
  permits (_apply) in plain C, before any Python code can run (and so before
  another thread could take the GIL and look at the permit).
* Each queued waiter holds one reference, taken at enqueue and dropped when
  it leaves the queue (woken from a batch, or removed by its own cancel).
* Waking happens after the core call: futures on their own loop (directly if
  we are on the loop's thread, else call_soon_threadsafe, which wakes the
  loop at once), blocking threads through a per-waiter PyThread lock.

The semantics are those of _limiter_py.py, the executable specification.
"""

cimport cython
from cpython.ref cimport PyObject, Py_INCREF, Py_DECREF
from libc.stdint cimport int64_t, uint64_t

import asyncio as _asyncio

# The contract shared with the pure twin: checks, messages and error
# constructors, called on argument and error paths only.
from . import _common as contract
from ._common import TIMEOUT_NOT_GIVEN, LimitType, SemaphoreStats
from ._dual import DualMemoryLimiterBase, DualMemoryPermit

__all__ = [
    "AsyncSemaphore",
    "SemaphorePermit",
    "AsyncDualMemoryLimiter",
    "DualMemoryPermit",
    "LimitType",
]

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

cdef extern from "_plim_binding.h":
    ctypedef PyObject *(*plim_advance_fn)(PyObject *self, int *done)
    int64_t plim_monotonic_ns() nogil
    int plim_install_am_send(PyObject *tp, plim_advance_fn fn) except -1

cdef extern from "Python.h":
    ctypedef long long PY_TIMEOUT_T
    PY_TIMEOUT_T PY_TIMEOUT_MAX
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1
    int PyErr_CheckSignals() except -1

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

cdef object _get_running_loop = _asyncio.get_running_loop
cdef double[NBUCKETS] _BOUNDS
for _i, _b in enumerate(contract.WAIT_BUCKETS):
    _BOUNDS[_i] = _b


cdef inline int _bucket(double seconds) noexcept:
    cdef int i
    for i in range(NBUCKETS):
        if seconds <= _BOUNDS[i]:
            return i
    return NBUCKETS - 1


# --------------------------------------------------------------------------
# Permits and waiters
# --------------------------------------------------------------------------

@cython.freelist(64)
@cython.final
cdef class SemaphorePermit:
    """Permits held from one AsyncSemaphore.

    ``permits`` is what it holds now; ``update`` changes it in place and
    ``release`` sets it to 0.  Used as a context manager (``with``) it is
    released on exit.
    """

    cdef AsyncSemaphore _sem
    cdef int64_t _permits
    cdef _Waiter _pending
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


cdef inline SemaphorePermit _new_permit(AsyncSemaphore sem, int64_t n):
    cdef SemaphorePermit p = SemaphorePermit.__new__(SemaphorePermit)
    p._sem = sem
    p._permits = n
    return p


@cython.final
cdef class _Waiter:
    """One queued request: the plim_waiter_t node plus how to wake it."""

    cdef plim_waiter_t node
    cdef SemaphorePermit permit
    cdef object check
    cdef object cause
    cdef int64_t limit
    cdef int64_t enqueued_ns
    cdef object loop
    cdef object fut
    cdef unsigned long thread_id
    cdef PyThread_type_lock lock
    cdef bint blocking
    cdef bint applied
    cdef bint reverted

    def __dealloc__(self):
        if self.lock != NULL:
            PyThread_free_lock(self.lock)
            self.lock = NULL


# Byte offset of `node` inside a _Waiter, to get from a core node back to its
# object (the intrusive-list container_of).
cdef Py_ssize_t _NODE_OFFSET


cdef Py_ssize_t _node_offset():
    cdef _Waiter probe = _Waiter.__new__(_Waiter)
    return <char *>&probe.node - <char *><PyObject *>probe


_NODE_OFFSET = _node_offset()


cdef inline PyObject *_waiter_ptr(plim_waiter_t *n) noexcept:
    return <PyObject *>(<char *>n - _NODE_OFFSET)


# --------------------------------------------------------------------------
# The awaitable request
# --------------------------------------------------------------------------

cdef enum RequestStage:
    STAGE_CREATED = 0    # returned by acquire/update, not awaited yet
    STAGE_AWAITED = 1    # __await__ called; nothing asked of the core yet
    STAGE_WAITING = 2    # queued: the task waits on the waiter's future
    STAGE_DONE = 3       # granted, failed, or abandoned: never again


@cython.freelist(64)
@cython.final
cdef class _Request:
    """What ``acquire``/``update`` return: awaitable once, and an async
    context manager that releases the permit on exit."""

    cdef AsyncSemaphore _sem
    cdef SemaphorePermit _permit   # the permit to update; None for acquire
    cdef int64_t _n
    cdef object _timeout
    cdef object _is_cancelled
    cdef RequestStage _stage
    cdef _Waiter _waiter
    cdef object _timer
    cdef SemaphorePermit _result

    def __await__(self):
        if self._stage != STAGE_CREATED:
            raise RuntimeError(contract.MSG_ALREADY_AWAITED)
        self._stage = STAGE_AWAITED
        return self

    def __iter__(self):
        return self

    def __next__(self):
        cdef int done = 0
        v = self._advance(&done)
        if done:
            raise StopIteration(v)
        return v

    def send(self, value):
        """Coroutine protocol: advance the request."""
        return self.__next__()

    def throw(self, typ, val=None, tb=None):
        """Coroutine protocol: the awaiting task is cancelled or interrupted.
        A queued request leaves the queue; a grant that raced with it goes
        back; the exception propagates."""
        self._stop_waiting()
        if isinstance(typ, BaseException):
            exc = typ
        elif isinstance(val, BaseException):
            exc = val
        elif val is None:
            exc = typ()
        else:
            exc = typ(val)
        if tb is not None:
            exc = exc.with_traceback(tb)
        raise exc

    def close(self):
        """Coroutine protocol: the awaiting coroutine is closed."""
        self._stop_waiting()

    cdef _cancel_timer(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    cdef _stop_waiting(self):
        if self._stage == STAGE_WAITING and self._waiter is not None:
            self._stage = STAGE_DONE
            self._cancel_timer()
            self._sem._abandon(self._waiter, False)
        else:
            self._stage = STAGE_DONE

    cdef object _advance(self, int *done):
        cdef AsyncSemaphore sem = self._sem
        cdef SemaphorePermit p
        cdef int rc
        cdef _Waiter w
        if self._stage <= STAGE_AWAITED:
            # STAGE_CREATED too: asyncio sees send/throw/close and drives the
            # request as a coroutine (create_task, gather) without __await__.
            self._stage = STAGE_WAITING
            if self._permit is None and self._is_cancelled is None:
                # Fast path: no future, no waiter, no lock.
                rc = plim_try_acquire(&sem._sem, self._n)
                if rc == PLIM_OK:
                    sem._acquired_total += 1
                    sem._wait_counts[0] += 1
                    self._stage = STAGE_DONE
                    p = _new_permit(sem, self._n)
                    self._result = p
                    done[0] = 1
                    return p
            r = sem._begin(self._permit, self._n, self._timeout, self._is_cancelled,
                           False)
            if type(r) is SemaphorePermit:
                self._stage = STAGE_DONE
                self._result = <SemaphorePermit>r
                done[0] = 1
                return r
            w = <_Waiter>r
            self._waiter = w
            if self._timeout is not None:
                self._timer = w.loop.call_later(self._timeout, sem._on_timeout, w)
            w.fut._asyncio_future_blocking = True
            return w.fut
        if self._stage == STAGE_WAITING:
            w = self._waiter
            if not w.fut.done():
                w.fut._asyncio_future_blocking = True
                return w.fut
            self._stage = STAGE_DONE
            self._cancel_timer()
            p = sem._finish(w)
            self._result = p
            done[0] = 1
            return p
        raise RuntimeError("pylimiter: cannot reuse an already awaited request")

    def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        if self._result is not None:
            self._sem.release(self._result)


cdef object _request_advance(object self, int *done):
    return (<_Request>self)._advance(done)


plim_install_am_send(<PyObject *>_Request, <plim_advance_fn>_request_advance)


# --------------------------------------------------------------------------
# The semaphore
# --------------------------------------------------------------------------

cdef class AsyncSemaphore:
    """A weighted, strictly FIFO semaphore for asyncio tasks and threads.

    ``max_permits <= 0`` makes it unbounded (everything is granted at once,
    usage is still counted); ``max_queue_size <= 0`` makes the queue
    unbounded; ``timeout`` (seconds, ``None`` for ever) is the default wait
    for a queued request, measured from when it joins the queue.
    """

    cdef plim_sem_t _sem
    cdef bint _ready
    cdef bint _bounded
    cdef int64_t _max_queue
    cdef object _max_queue_cfg    # as configured (may be any int <= 0)
    cdef object _max_cfg          # as configured, for unbounded semaphores
    cdef object _timeout
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
            raise RuntimeError("pylimiter: AsyncSemaphore is already initialised")
        self._timeout = contract.check_timeout(timeout, None)
        mq = max(min(max_queue_size, 2**62), -1)
        mp = max(max_permits, -1)
        self._bounded = mp > 0
        self._max_queue = mq
        self._max_queue_cfg = max_queue_size
        self._max_cfg = max_permits
        if plim_sem_init(&self._sem, mp, mq) != PLIM_OK:
            raise MemoryError("pylimiter: cannot initialise the semaphore")
        self._ready = True

    def __dealloc__(self):
        if self._ready:
            plim_sem_destroy(&self._sem)

    # ---- properties --------------------------------------------------------

    @property
    def max_permits(self):
        """The configured limit (<= 0: unbounded)."""
        if self._bounded:
            return plim_max(&self._sem)
        return self._max_cfg

    @property
    def available_permits(self):
        """max_permits - acquired_permits (negative after lowering the limit);
        ``2**63 - 1`` when unbounded."""
        if self._bounded:
            return plim_available(&self._sem)
        return contract.UNBOUNDED_AVAILABLE

    @property
    def acquired_permits(self):
        """Permits held now (granted and not released)."""
        return plim_acquired(&self._sem)

    @property
    def queue_size(self):
        """Requests waiting in the queue."""
        return plim_queue_len(&self._sem)

    @property
    def max_queue_size(self):
        """The configured queue bound (<= 0: unbounded)."""
        return self._max_queue_cfg

    @property
    def closed(self):
        """True after close()."""
        return plim_closed(&self._sem) != 0

    def __repr__(self):
        return (
            f"<AsyncSemaphore max_permits={self.max_permits} "
            f"acquired={plim_acquired(&self._sem)} "
            f"queued={plim_queue_len(&self._sem)}"
            f"{' closed' if plim_closed(&self._sem) else ''}>"
        )

    # ---- argument checks -----------------------------------------------------

    cdef inline int64_t _check_n(self, object permits) except -1:
        cdef int overflow = 0
        cdef long long v
        if type(permits) is int:
            v = PyLong_AsLongLongAndOverflow(permits, &overflow)
            if not overflow and 0 <= v <= PLIM_MAX_PERMITS:
                if not self._bounded or v <= plim_max(&self._sem):
                    return v
        # Rare: let the shared checker pick the right exception and message.
        return contract.check_permits(permits, plim_max(&self._sem), self._bounded)

    cdef inline _check_permit(self, object permit):
        if type(permit) is not SemaphorePermit or (<SemaphorePermit>permit)._sem is not self:
            raise contract.permit_error(permit, SemaphorePermit)

    cdef inline object _resolve_timeout(self, object timeout):
        if timeout is TIMEOUT_NOT_GIVEN:
            return self._timeout
        return contract.check_timeout(timeout, self._timeout)

    # ---- public API ------------------------------------------------------------

    def acquire(self, permits, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None):
        """Return an awaitable of a new SemaphorePermit holding ``permits``.

        The request joins the queue when first awaited.  It fails with
        PermitAcquireTimeoutError, PermitAcquireQueueFullError,
        PermitAcquireAlreadyClosedError or PermitAcquireCancelledError.
        ``async with sem.acquire(n) as p:`` releases p on exit.
        """
        cdef int64_t n = self._check_n(permits)
        cdef _Request r
        t = self._resolve_timeout(timeout)
        if is_cancelled is not None:
            contract.check_is_cancelled(is_cancelled)
        if plim_closed(&self._sem):
            raise contract.closed_error()
        r = _Request.__new__(_Request)
        r._sem = self
        r._n = n
        r._timeout = t
        r._is_cancelled = is_cancelled
        return r

    def update(self, permit, new_permits, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None):
        """Return an awaitable that changes ``permit`` to ``new_permits`` in
        place and returns it.  Shrinking completes at once (even after close);
        growing queues for the difference like an acquire, and on failure the
        permit keeps what it had."""
        self._check_permit(permit)
        cdef int64_t n = self._check_n(new_permits)
        cdef _Request r
        t = self._resolve_timeout(timeout)
        contract.check_is_cancelled(is_cancelled)
        r = _Request.__new__(_Request)
        r._sem = self
        r._permit = permit
        r._n = n
        r._timeout = t
        r._is_cancelled = is_cancelled
        return r

    def acquire_blocking(self, permits, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None):
        """Blocking twin of ``acquire`` for threads; the GIL is released while
        waiting."""
        cdef int64_t n = self._check_n(permits)
        t = self._resolve_timeout(timeout)
        if is_cancelled is None:
            if plim_try_acquire(&self._sem, n) == PLIM_OK:
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

    def try_acquire(self, permits):
        """Take ``permits`` now if they fit and nobody queues; else None.
        Never waits and never overtakes queued requests."""
        cdef int64_t n = self._check_n(permits)
        cdef int rc = plim_try_acquire(&self._sem, n)
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
        cdef plim_batch_t b
        cdef SemaphorePermit p
        if type(permit) is not SemaphorePermit or (<SemaphorePermit>permit)._sem is not self:
            self._check_permit(permit)
        p = <SemaphorePermit>permit
        cdef int64_t n = p._permits
        if n == 0:
            return
        p._permits = 0
        plim_batch_init(&b)
        if p._pending is not None and p._pending.node.state == PLIM_W_QUEUED:
            # Its update now has to take the whole new size.
            plim_release_growing(&self._sem, n, &p._pending.node, &b)
        else:
            plim_release(&self._sem, n, &b)
        if b.done_head != NULL or b.check != NULL:
            self._settle(&b)

    def close(self):
        """Close (idempotent): queued requests fail with
        PermitAcquireAlreadyClosedError, and so do later acquires."""
        cdef plim_batch_t b
        plim_batch_init(&b)
        plim_close(&self._sem, &b)
        self._settle(&b)

    def set_max_permits(self, max_permits):
        """Change the limit of a bounded semaphore (must stay > 0).  Raising
        it grants waiters that now fit; lowering it below what is held makes
        available_permits negative; queued requests that can never fit fail
        with ValueError."""
        cdef plim_batch_t b
        max_permits = contract.check_new_max(max_permits, self._bounded)
        plim_batch_init(&b)
        plim_set_max(&self._sem, max_permits, &b)
        self._settle(&b)

    def stats(self):
        """A snapshot of gauges, counters and the wait-time histogram."""
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
        cdef _Waiter w
        cdef int64_t now = 0
        cdef double wait
        while node != NULL:
            w = <_Waiter>_waiter_ptr(node)
            if not w.applied:
                w.applied = True
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
        every waiter that left the queue."""
        cdef _Waiter w
        cdef plim_waiter_t *node
        self._apply(b)
        while b.check != NULL:
            w = <_Waiter>_waiter_ptr(b.check)   # our reference keeps it alive
            cancelled, cause = contract.ask_cancelled(w.check)
            if cancelled:
                w.cause = cause
            plim_resume(&self._sem, &w.node, cancelled, b)
            self._apply(b)
        if b.done_head == NULL:
            return
        done = []
        node = plim_batch_pop(b)
        while node != NULL:
            w = <_Waiter>_waiter_ptr(node)
            done.append(w)
            Py_DECREF(w)   # the queue's reference; `done` holds one now
            node = plim_batch_pop(b)
        self._wake_all(done)

    cdef _wake_all(self, list done):
        cdef unsigned long me = PyThread_get_thread_ident()
        cdef _Waiter w
        for w in done:
            if w.blocking:
                PyThread_release_lock(w.lock)
            elif w.thread_id == me:
                self._deliver(w)
            else:
                try:
                    w.loop.call_soon_threadsafe(self._set_result, w)
                except RuntimeError:   # its loop is closed: nobody will take it
                    self._revert(w)

    def _set_result(self, _Waiter w):
        self._deliver(w)

    cdef _deliver(self, _Waiter w):
        fut = w.fut
        if not fut.done():
            try:
                fut.set_result(None)
            except RuntimeError:   # its loop is closed: nobody will take it
                self._revert(w)

    cdef _give_back(self, _Waiter w):
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

    cdef _revert(self, _Waiter w):
        if w.node.state == PLIM_W_GRANTED:
            self._give_back(w)

    cdef _abandon(self, _Waiter w, bint timed_out):
        """The requester stops waiting (timeout, task cancel, interrupt).
        A queued request leaves the queue; a grant that raced with a cancel
        goes back; a grant that raced with a timeout stands."""
        cdef plim_batch_t b
        plim_batch_init(&b)
        if plim_cancel(&self._sem, &w.node, &b) == PLIM_OK:
            if w.permit._pending is w:
                w.permit._pending = None
            if timed_out:
                self._timeout_total += 1
            else:
                self._cancelled_total += 1
            Py_DECREF(w)   # the queue's reference; the caller still holds one
            self._settle(&b)
        elif w.node.state == PLIM_W_GRANTED and not timed_out:
            self._cancelled_total += 1
            self._give_back(w)

    def _on_timeout(self, _Waiter w):
        self._abandon(w, True)
        if w.node.state == PLIM_W_REMOVED and not w.fut.done():
            w.fut.set_result(None)

    cdef object _begin(self, SemaphorePermit permit, int64_t n, object timeout,
                       object is_cancelled, bint blocking):
        """Shared start of every acquire/update: returns the permit when done
        at once, or a queued _Waiter.  Raises on immediate failure."""
        cdef plim_batch_t b
        cdef int64_t cur, need
        cdef int rc
        cdef _Waiter w
        cancelled = False
        cause = None
        if is_cancelled is not None and self._bounded:
            cancelled, cause = contract.ask_cancelled(is_cancelled)
        is_update = permit is not None
        if not is_update:
            permit = _new_permit(self, 0)
        else:
            if permit._pending is not None:
                raise RuntimeError(contract.MSG_UPDATE_IN_PROGRESS)
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
            raise contract.closed_error()
        if cancelled:
            self._cancelled_total += 1
            raise contract.cancelled_error(cause)
        rc = plim_try_acquire(&self._sem, need)
        if rc == PLIM_OK:
            permit._permits += need
            self._acquired_total += 1
            self._wait_counts[0] += 1
            return permit
        if rc == PLIM_OVERFLOW:
            raise contract.overflow_error()
        if rc == PLIM_CLOSED:
            raise contract.closed_error()
        if timeout is not None and timeout == 0:
            self._timeout_total += 1
            raise contract.timeout_zero_error()
        w = _Waiter.__new__(_Waiter)
        w.permit = permit
        w.check = is_cancelled
        plim_waiter_init(&w.node, is_cancelled is not None)
        if blocking:
            w.blocking = True
            w.lock = PyThread_allocate_lock()
            if w.lock == NULL:
                raise MemoryError()
            PyThread_acquire_lock(w.lock, 1)
        else:
            loop = _get_running_loop()
            w.loop = loop
            w.fut = loop.create_future()
            w.thread_id = PyThread_get_thread_ident()
        w.enqueued_ns = plim_monotonic_ns()
        rc = plim_enqueue(&self._sem, &w.node, need, n)
        if rc == PLIM_QUEUED:
            Py_INCREF(w)   # held by the queue until the waiter leaves it
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
            raise contract.queue_full_error(self._max_queue)
        if rc == PLIM_CLOSED:
            raise contract.closed_error()
        raise contract.overflow_error()

    cdef SemaphorePermit _finish(self, _Waiter w):
        if w.node.state == PLIM_W_GRANTED:
            return w.permit
        raise contract.left_queue_error(w.node.state, w.node.total, w.limit, w.cause)

    cdef object _run_blocking(self, SemaphorePermit permit, int64_t n, object timeout,
                              object is_cancelled):
        cdef _Waiter w
        cdef int rc
        cdef PY_TIMEOUT_T us
        cdef int64_t deadline = 0
        r = self._begin(permit, n, timeout, is_cancelled, True)
        if type(r) is SemaphorePermit:
            return r
        w = <_Waiter>r
        if timeout is None:
            us = -1
        else:
            us = <PY_TIMEOUT_T>min(<double>timeout * 1e6, <double>PY_TIMEOUT_MAX)
            deadline = plim_monotonic_ns() + us * 1000
        while True:
            with nogil:
                rc = PyThread_acquire_lock_timed(w.lock, us, 1)
            if rc == PY_LOCK_ACQUIRED:
                break
            if rc == PY_LOCK_INTR:
                try:
                    PyErr_CheckSignals()
                except BaseException:
                    self._abandon(w, False)
                    if w.node.state != PLIM_W_REMOVED:
                        with nogil:   # its wake-up is on the way: wait it out
                            PyThread_acquire_lock_timed(w.lock, -1, 0)
                    raise
                if timeout is not None:
                    us = max(<PY_TIMEOUT_T>0, (deadline - plim_monotonic_ns()) // 1000)
                continue
            self._abandon(w, True)
            if w.node.state != PLIM_W_REMOVED:
                with nogil:
                    PyThread_acquire_lock_timed(w.lock, -1, 0)
            break
        return self._finish(w)


class AsyncDualMemoryLimiter(DualMemoryLimiterBase):
    __doc__ = DualMemoryLimiterBase.__doc__
    _semaphore_class = AsyncSemaphore
