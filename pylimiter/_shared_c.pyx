# cython: language_level=3, embedsignature=True, binding=False, auto_pickle=False
"""C implementation of the host-wide limiter (issue 33): thin Cython
bindings over csrc/plim_shm.c.

The core owns the segment, the host's lock, the queue and the repairs; this
module owns the Python objects and the event-loop side of waking.  Rules:

* The uncontended acquire and release take no lock: one CAS on the pool's
  counter word (plim_shm_fast_take/_give, csrc/plim_shm_fast.h), run
  holding the GIL, which is what serializes them per attachment as the core
  requires.  acquire_blocking(n), try_acquire(n) and release(p) called
  positionally reach them through front doors of our own (the end of this
  file) that skip Cython's argument parsing; every other call, and every
  refusal, goes to the methods below.
* Every critical section runs holding the GIL, and the GIL is never taken
  inside one: the host's lock is taken with one CAS (plim_shm_trylock) and,
  only when that fails, waited for without the GIL (plim_shm_lock, bounded).
  So a thread of this process never waits for the GIL while it holds the
  host's lock, and other processes never wait on our GIL.
* A blocking acquire sleeps on its record's futex without the GIL; the
  deciding process wakes it.  An asyncio request parks on a Future; its loop
  watches a datagram socket of its own that the deciding process writes to
  directly, and an eventfd that this process's waker thread (C, no GIL)
  writes for loops without a socket, and that our own decisions write.
  The loop is woken, never polled.
* The segment is opened, validated and created by _shared_common (shared
  with the pure twin, _shared_py.py, the executable specification whose
  semantics this module follows step by step).
* Subinterpreters: importing this module in a subinterpreter raises
  ImportError before Cython's one-interpreter check runs, so a later import
  in the main interpreter still works (_binding/main_only.h, as the
  limiter's and the entry cache's extensions).
* __dealloc__ may run at interpreter shutdown, when the os module is gone:
  it closes its descriptors with libc's close, never through Python.
"""

cimport cython
from libc.stdint cimport int64_t, uint32_t, int32_t, uint64_t
from libc.stdlib cimport malloc, free

import asyncio as _asyncio
import os as _os
import time as _time

from . import _common as contract
from ._common import SemaphoreStats
from ._shared_common import SharedLimiterError, SharedDualMemoryLimiterBase
from . import _shared_common as sc

__all__ = [
    "SharedDualMemoryLimiter",
    "SharedLimiterError",
    "SharedSemaphore",
    "SharedSemaphorePermit",
]

# Main interpreter only: see _binding/main_only.h.
cdef extern from *:
    """
    #include "_binding/main_only.h"
    PLIM_MAIN_ONLY(_shared_c, "pylimiter._shared_c")
    #define PyInit__shared_c plim_cython_init__shared_c
    """

cdef extern from "<unistd.h>" nogil:
    int c_close "close"(int fd)

cdef extern from "plim_shm.h" nogil:
    int64_t PLIM_SHM_MAX_PERMITS
    uint32_t PLIM_SHM_NIL
    enum:
        PLIM_SHM_OK
        PLIM_SHM_EMPTY
        PLIM_SHM_OVERFLOW
        PLIM_SHM_QUEUED
        PLIM_SHM_FULL
        PLIM_SHM_TOO_LARGE
        PLIM_SHM_GONE
        PLIM_SHM_STUCK
        PLIM_SHM_CORRUPT
        PLIM_SHM_NOSLOT
        PLIM_SHM_TIMEDOUT
        PLIM_SHM_INTR
        PLIM_SHM_DECIDED
        PLIM_SHM_REMOVED
        PLIM_SHM_KEPT
        PLIM_SHM_GAVE_BACK
        PLIM_SHM_ERRNO
    enum:
        PLIM_SHM_R_FREE
        PLIM_SHM_R_QUEUED
        PLIM_SHM_R_GRANTED
        PLIM_SHM_R_CLOSED
        PLIM_SHM_R_TOO_LARGE
        PLIM_SHM_R_CANCELLED
        PLIM_SHM_R_REMOVED
    enum:
        PLIM_SHM_NBUCKETS
        PLIM_SHM_NLOOPS
    ctypedef struct plim_shm_t:
        int fd
        int lockfd
        uint32_t npools
        uint32_t maxp
        int32_t slot
        uint32_t gen
        int64_t lock_timeout_ns
        int crash
        int repairs
        int waker_running
    ctypedef struct plim_shm_stats_t:
        int64_t max, avail, qlen, acquired_total, timeout_total, queue_full_total
        int64_t cancelled_total, wait_ns, hwm
        int64_t buckets[16]
    int plim_shm_attach(plim_shm_t *h, int fd, int lockfd, size_t size, uint32_t npools,
                        uint32_t maxp, uint32_t nrec, int64_t max_queue)
    void plim_shm_unmap(plim_shm_t *h)
    int plim_shm_register(plim_shm_t *h, int32_t pid)
    void plim_shm_after_fork(plim_shm_t *h)
    int plim_shm_trylock(plim_shm_t *h)
    int plim_shm_lock(plim_shm_t *h)
    void plim_shm_unlock(plim_shm_t *h)
    int64_t plim_shm_max(plim_shm_t *h, uint32_t p)
    int64_t plim_shm_avail(plim_shm_t *h, uint32_t p)
    int64_t plim_shm_acquired(plim_shm_t *h, uint32_t p)
    int64_t plim_shm_qlen(plim_shm_t *h, uint32_t p)
    int64_t plim_shm_hwm(plim_shm_t *h, uint32_t p)
    int plim_shm_sweep_due(plim_shm_t *h)
    int plim_shm_any_dead(plim_shm_t *h)
    int plim_shm_peek(plim_shm_t *h, uint32_t rec, uint32_t ticket)
    int plim_shm_take_locked(plim_shm_t *h, uint32_t p, int64_t n)
    int plim_shm_enqueue_locked(plim_shm_t *h, uint32_t p, int64_t need, int64_t total,
                                uint32_t tag, uint32_t *rec, uint32_t *ticket, int64_t *limit)
    int plim_shm_give_back_locked(plim_shm_t *h, uint32_t p, int64_t n, uint32_t rec,
                                  uint32_t ticket)
    int plim_shm_collect_locked(plim_shm_t *h, uint32_t rec, uint32_t ticket, int *state,
                                int64_t *granted, int64_t *limit)
    int plim_shm_abandon_locked(plim_shm_t *h, uint32_t rec, uint32_t ticket, int timed_out)
    int plim_shm_set_max_locked(plim_shm_t *h, uint32_t p, int64_t max)
    void plim_shm_count_locked(plim_shm_t *h, uint32_t p, int which)
    int plim_shm_detach_locked(plim_shm_t *h)
    void plim_shm_release_slot(plim_shm_t *h, int32_t slot)
    int plim_shm_sweep_locked(plim_shm_t *h, int force)
    int plim_shm_stats_locked(plim_shm_t *h, uint32_t p, plim_shm_stats_t *out)
    int plim_shm_holders_locked(plim_shm_t *h, int32_t *pids, int64_t *held)
    int plim_shm_audit_locked(plim_shm_t *h, uint32_t p, int64_t out[6])
    int plim_shm_wait_rec(plim_shm_t *h, uint32_t rec, uint32_t ticket, int64_t deadline_ns)
    int plim_shm_wait_collect(plim_shm_t *h, uint32_t rec, uint32_t ticket, int64_t deadline_ns,
                              int *state, int64_t *granted, int64_t *limit)
    int plim_shm_loop_add(plim_shm_t *h, int bit)
    void plim_shm_loop_remove(plim_shm_t *h, int bit)
    int plim_shm_loop_direct(plim_shm_t *h, int bit)
    void plim_shm_loop_direct_close(plim_shm_t *h, int bit)
    int plim_shm_loop_drain(int fd, int is_socket)
    int plim_shm_waker_start(plim_shm_t *h)
    void plim_shm_waker_stop(plim_shm_t *h)
    int64_t plim_shm_now_ns()

# The uncontended paths, inline (csrc/plim_shm_fast.h): the lock-free
# take and give, run holding the GIL (which serializes them per handle, as
# plim_shm.h requires), and the lock's own fast path.
cdef extern from "plim_shm_fast.h" nogil:
    int plim_shm_trylock_inline(plim_shm_t *h)
    void plim_shm_unlock_inline(plim_shm_t *h)
    int plim_shm_fast_take(plim_shm_t *h, uint32_t p, int64_t n)
    int plim_shm_fast_give(plim_shm_t *h, uint32_t p, int64_t n)
    int64_t plim_shm_max_inline(plim_shm_t *h, uint32_t p)

# A permit count that is an exact int small enough to be one digit (every
# count the uncontended paths see), read inline; -1 for anything else,
# which the full check (_count) then handles with its own errors.
cdef extern from *:
    """
    #if PY_VERSION_HEX < 0x030B0000
    #include <longintrepr.h>
    #endif
    static inline int64_t plim_shm_small_count(PyObject *o)
    {
        if (Py_TYPE(o) != &PyLong_Type)
            return -1;
    #if PY_VERSION_HEX >= 0x030C0000
        if (!PyUnstable_Long_IsCompact((PyLongObject *)o))
            return -1;
        Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)o);
        return v >= 0 ? (int64_t)v : -1;
    #else
        Py_ssize_t size = Py_SIZE(o);
        if (size == 1)
            return (int64_t)((PyLongObject *)o)->ob_digit[0];
        return size == 0 ? 0 : -1;
    #endif
    }
    """
    int64_t plim_shm_small_count(object o)

cdef extern from "Python.h":
    int PyErr_CheckSignals() except -1
    long long PyLong_AsLongLongAndOverflow(object o, int *overflow) except? -1

# The waiter states are the project's (plim.h, _common.W_*).
assert (contract.W_IDLE, contract.W_QUEUED, contract.W_GRANTED, contract.W_CLOSED,
        contract.W_TOO_LARGE, contract.W_CANCELLED, contract.W_REMOVED) == (
        PLIM_SHM_R_FREE, PLIM_SHM_R_QUEUED, PLIM_SHM_R_GRANTED, PLIM_SHM_R_CLOSED,
        PLIM_SHM_R_TOO_LARGE, PLIM_SHM_R_CANCELLED, PLIM_SHM_R_REMOVED)
assert PLIM_SHM_MAX_PERMITS == contract.MAX_PERMITS
assert len(contract.WAIT_BUCKETS) == PLIM_SHM_NBUCKETS

cdef object TIMEOUT_NOT_GIVEN = contract.TIMEOUT_NOT_GIVEN
cdef object _get_running_loop = _asyncio.events._get_running_loop
cdef int64_t UNBOUNDED_AVAILABLE = contract.UNBOUNDED_AVAILABLE
cdef double _MAX_TIMEOUT_S = contract.MAX_TIMEOUT_S
# How often a process looks for event loops closed under its waiters.
cdef int64_t _LOOP_CHECK_NS = 100_000_000

# _begin's refusals, decided under the host's lock and raised after it.
cdef enum:
    _E_OVERFLOW = 1
    _E_TIMEOUT_ZERO = 2
    _E_NO_LOOP = 3
    _E_TOO_LARGE = 4
    _E_FULL = 5
# An exhausted iterator: `await` on an object whose __await__ returns it
# completes with None, without allocating anything.
cdef object _EXHAUSTED = iter(())
next(_EXHAUSTED, None)


cdef class _Ready:
    """A completed awaitable (returns None)."""

    def __await__(self):
        return _EXHAUSTED


cdef _Ready _READY = _Ready()


# Registration numbers: a permit carries its attachment's, so one taken
# before a fork (or by another attachment) is told apart without an object.
cdef int64_t _next_reg = 0


cdef inline int64_t _new_reg() noexcept:
    global _next_reg
    _next_reg += 1
    return _next_reg


cdef object _error(_Seg seg, int st):
    """The exception of a core failure status."""
    if st == PLIM_SHM_STUCK:
        return sc.shared_error(seg.path, "the segment lock is held by a live process "
                               "that does not release it (stopped, or hostile bytes)")
    if st == PLIM_SHM_CORRUPT:
        return sc.shared_error(seg.path, "corrupt while in use (the repair did not hold)")
    if st == PLIM_SHM_NOSLOT:
        return sc.shared_error(seg.path, f"more than max_processes={seg.h.maxp} processes "
                               "are attached")
    if st == PLIM_SHM_ERRNO:
        err = _errno()
        return sc.shared_error(seg.path, _os.strerror(err), err)
    return sc.shared_error(seg.path, f"internal status {st}")


cdef extern from "errno.h":
    int errno


cdef int _errno() noexcept:
    return errno


# --------------------------------------------------------------------------
# One attachment: the mapping, this process's slot, its waiters and loops
# --------------------------------------------------------------------------

@cython.final
cdef class _LoopWake:
    """One event loop's wake-up fds and its waiters (this attachment's): an
    eventfd (the waker thread's, and this process's own decisions) and,
    when it could be bound, a datagram socket that other processes'
    decisions write to directly."""

    cdef _Seg seg
    cdef object loop
    cdef int bit
    cdef int fd
    cdef int sock       # -1: none (the waker serves this loop)
    cdef dict waiters   # in arrival order: woken in FIFO order

    def on_ready(self):
        """The eventfd's reader: drain it, wake the decided waiters."""
        plim_shm_loop_drain(self.fd, 0)
        self.recheck()

    def on_direct(self):
        """The socket's reader: drain it, wake the decided waiters.  A
        wake-up for nothing (another process's datagram, a record decided
        earlier) only costs the recheck."""
        plim_shm_loop_drain(self.sock, 1)
        self.recheck()

    cdef recheck(self):
        cdef _Waiter w
        for w in list(self.waiters):
            if w.removed or self.seg.peek(w) != PLIM_SHM_R_QUEUED:
                w.resolve()

    def shutdown(self):
        """On the loop's thread: stop reading, close the fds (unless a new
        loop took its bit meanwhile)."""
        try:
            if not self.loop.is_closed():
                self.loop.remove_reader(self.fd)
                if self.sock >= 0:
                    self.loop.remove_reader(self.sock)
        except Exception:
            pass
        if not any((<_LoopWake>x).bit == self.bit for x in self.seg.loops.values()):
            plim_shm_loop_remove(&self.seg.h, self.bit)
            plim_shm_loop_direct_close(&self.seg.h, self.bit)


@cython.final
cdef class _Waiter:
    """This process's side of one queued request (its record)."""

    cdef uint32_t rec
    cdef uint32_t ticket
    cdef int64_t n
    cdef object check
    cdef object loop
    cdef object fut
    cdef bint removed
    cdef int state
    cdef int64_t granted
    cdef int64_t limit
    cdef object timer
    cdef _LoopWake lw

    cdef resolve(self):
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(None)


@cython.final
cdef class _Seg:
    """An attachment of this process to a segment (shared by the pools of
    a dual limiter)."""

    cdef plim_shm_t h
    cdef readonly object path
    cdef readonly object name
    cdef int kind
    cdef int64_t max_queue
    cdef bint mapped
    cdef readonly bint closed
    cdef bint forked
    # The lock-free paths may run: open, registered in this process, and
    # not switched off (_set_lock_free, for tests and the benchmark).
    cdef bint fast
    cdef bint fast_off
    cdef bint direct_off    # no wake socket for new loops (tests, benchmark)
    cdef int64_t reg
    cdef dict waiters
    cdef dict loops
    cdef int64_t loops_checked_ns
    cdef int64_t anon[2]
    cdef object __weakref__

    def __cinit__(self):
        self.mapped = False
        self.closed = True
        self.forked = False
        self.fast = False
        self.fast_off = False
        self.direct_off = False
        self.h.fd = -1
        self.h.lockfd = -1
        self.waiters = {}
        self.loops = {}
        self.reg = _new_reg()

    cdef open(self, str name, int kind, tuple maxes, int64_t max_queue, int max_processes,
              directory):
        cdef int st
        opened = sc.open_segment(name, directory, sc.IMPL_C, kind, maxes,
                                 sc.pool_names(kind), max_queue, max_processes)
        self.path = opened.path
        self.name = name
        self.kind = kind
        self.max_queue = max_queue
        lay = opened.layout
        try:
            st = plim_shm_attach(&self.h, opened.fd, opened.lockfd, lay.size, lay.npools,
                                 lay.max_processes, lay.nrec, max_queue)
            if st != PLIM_SHM_OK:
                raise _error(self, st)
            self.mapped = True
            self._register()
        except BaseException:
            if self.mapped:
                plim_shm_unmap(&self.h)
                self.mapped = False
            _os.close(opened.lockfd)
            _os.close(opened.fd)
            self.h.fd = self.h.lockfd = -1
            raise
        opened.release_open()
        self.closed = False
        self.fast = True
        sc.track_fork(self)

    cdef _register(self):
        cdef int st
        cdef int32_t pid = _os.getpid()
        with nogil:
            st = plim_shm_register(&self.h, pid)
        if st != PLIM_SHM_OK:
            raise _error(self, st)
        self.reg = _new_reg()

    cdef int ensure(self) except -1:
        """A forked child registers at its first call (issue 33, point 7)."""
        if not self.forked or self.closed:
            return 0
        lockfd = sc.reopen_fd(self.h.fd)
        self.h.lockfd = lockfd
        try:
            sc.lock_open_byte(lockfd, self.path)
        except BaseException:
            _os.close(lockfd)
            self.h.lockfd = -1
            self.closed = True
            raise
        self.forked = False
        try:
            self._register()
        except BaseException:
            self.closed = True
            raise
        finally:
            sc.ofd_unlock(lockfd, sc.OPEN_BYTE)
        self.fast = not self.fast_off
        return 0

    def _after_fork_in_child(self):
        self.fast = False
        plim_shm_after_fork(&self.h)
        self.waiters = {}
        self.loops = {}
        self.anon[0] = self.anon[1] = 0
        self.reg = _new_reg()
        if not self.closed:
            self.forked = True

    cdef inline int lock(self) except -1:
        cdef int st
        if plim_shm_trylock_inline(&self.h):
            return 0
        with nogil:
            st = plim_shm_lock(&self.h)
        if st != PLIM_SHM_OK:
            raise _error(self, st)
        return 0

    cdef inline void unlock(self) noexcept:
        plim_shm_unlock_inline(&self.h)

    cdef inline int peek(self, _Waiter w) noexcept:
        return plim_shm_peek(&self.h, w.rec, w.ticket)

    cdef int sweep(self, bint force) except -1:
        if not force and not plim_shm_sweep_due(&self.h):
            return 0
        self.lock()
        plim_shm_sweep_locked(&self.h, force)
        self.unlock()
        return 0

    cdef int observe(self) except -1:
        """Before a count is read or a request is refused or queued: a
        process that died since the last sweep gives its permits back now
        (issue 33, point 6: "at once when the next operation finds it
        dead"), not at the next timed sweep."""
        if self.closed:
            return 0
        if self.loops:
            self.drop_closed_loops()
        if plim_shm_sweep_due(&self.h):
            return self.sweep(False)
        if not plim_shm_any_dead(&self.h):
            return 0
        return self.sweep(True)

    cdef int drop_closed_loops(self) except -1:
        """Waiters of an event loop that was closed while their tasks were
        parked (asyncio.run cancels them first; a loop closed by hand does
        not) will never run again: their requests leave the host's queue
        and a grant one got meanwhile goes back, instead of holding those
        permits until this process closes the semaphore or exits.  Looked
        at every _LOOP_CHECK_NS at most, from this process's calls."""
        cdef _LoopWake lw
        cdef _Waiter w
        cdef int64_t now = plim_shm_now_ns()
        if now - self.loops_checked_ns < _LOOP_CHECK_NS:
            return 0
        self.loops_checked_ns = now
        for lw in list(self.loops.values()):
            if not lw.loop.is_closed():
                continue
            for w in list(lw.waiters):
                self.abandon(w, False)
            lw.waiters.clear()
            self.drop_loop(lw)
        return 0

    cdef int abandon(self, _Waiter w, bint timed_out) except -1:
        """w's requester stops waiting: its queued request leaves the
        queue, a grant that raced with a cancel goes back (one that raced
        with a timeout stands: the caller collects it).  1 if it left."""
        cdef int st
        if w.removed or self.closed:
            return 0
        self.lock()
        st = plim_shm_abandon_locked(&self.h, w.rec, w.ticket, timed_out)
        self.unlock()
        if st != PLIM_SHM_REMOVED and st != PLIM_SHM_GAVE_BACK:
            return 0
        self.waiters.pop(w.rec, None)
        w.removed = True
        w.state = PLIM_SHM_R_REMOVED if st == PLIM_SHM_REMOVED else PLIM_SHM_R_CANCELLED
        return 1

    cdef _LoopWake loop_wake(self, loop):
        """The loop's eventfd reader, made on first use and kept while the
        loop lives (a wait registers nothing); the waker thread runs from
        the first one on.  At most 64 loops of this process at once: an
        idle or closed one gives its place up."""
        cdef _LoopWake lw = self.loops.get(loop)
        cdef int bit, st
        if lw is not None:
            return lw
        if len(self.loops) >= PLIM_SHM_NLOOPS:
            # Only what can be undone here and now: a closed loop, or an
            # idle one running in this thread (its bit may be reused at once).
            for x in list(self.loops.values()):
                if (<_LoopWake>x).loop.is_closed() or (
                        not (<_LoopWake>x).waiters and _get_running_loop() is (<_LoopWake>x).loop):
                    self.drop_loop(<_LoopWake>x)
            if len(self.loops) >= PLIM_SHM_NLOOPS:
                raise RuntimeError(
                    f"pylimiter: more than {PLIM_SHM_NLOOPS} event loops of this process "
                    "wait on one shared semaphore at once")
        used = {(<_LoopWake>x).bit for x in self.loops.values()}
        bit = 0
        while bit in used:
            bit += 1
        lw = _LoopWake.__new__(_LoopWake)
        lw.seg = self
        lw.loop = loop
        lw.bit = bit
        lw.waiters = {}
        lw.sock = -1
        lw.fd = plim_shm_loop_add(&self.h, bit)
        if lw.fd < 0:
            raise OSError(_errno(), "pylimiter: cannot create an eventfd")
        try:
            loop.add_reader(lw.fd, lw.on_ready)
            if not self.direct_off:
                # Its own socket, if the name can be had (else the waker).
                lw.sock = plim_shm_loop_direct(&self.h, bit)
                if lw.sock >= 0:
                    loop.add_reader(lw.sock, lw.on_direct)
        except BaseException:
            try:
                loop.remove_reader(lw.fd)
            except Exception:
                pass
            plim_shm_loop_remove(&self.h, bit)
            plim_shm_loop_direct_close(&self.h, bit)
            raise
        if not self.h.waker_running:
            st = plim_shm_waker_start(&self.h)
            if st != PLIM_SHM_OK:
                lw.shutdown()
                raise _error(self, st)
        self.loops[loop] = lw
        return lw

    cdef drop_loop(self, _LoopWake lw):
        if self.loops.get(lw.loop) is lw:
            del self.loops[lw.loop]
        try:
            if lw.loop.is_closed() or _get_running_loop() is lw.loop:
                lw.shutdown()
            else:
                lw.loop.call_soon_threadsafe(lw.shutdown)
        except RuntimeError:   # closed meanwhile
            plim_shm_loop_remove(&self.h, lw.bit)
            plim_shm_loop_direct_close(&self.h, lw.bit)

    cdef close(self):
        """Detach: this process's queued requests fail (closed), what it
        holds goes back, its slot is freed, then its slot lock."""
        cdef int32_t slot
        cdef _Waiter w
        cdef _LoopWake lw
        if self.closed:
            return
        # Closed first: a waiter of this process woken by the detach below
        # must read "closed", not "lost".
        self.closed = True
        self.fast = False
        if self.forked:
            sc.untrack_fork(self)
            return
        with nogil:
            plim_shm_waker_stop(&self.h)
        self.lock()
        plim_shm_detach_locked(&self.h)
        slot = self.h.slot
        self.unlock()
        plim_shm_release_slot(&self.h, slot)
        self.h.slot = -1
        waiters = list(self.waiters.values())
        self.waiters = {}
        for w in waiters:
            w.removed = True
            if w.state == PLIM_SHM_R_QUEUED:
                w.state = PLIM_SHM_R_CLOSED
            if w.fut is not None and w.loop is not None:
                try:
                    w.loop.call_soon_threadsafe(_resolve_waiter, w)
                except RuntimeError:
                    pass
        for lw in list(self.loops.values()):
            self.drop_loop(lw)
        sc.untrack_fork(self)

    def __dealloc__(self):
        cdef int b
        cdef bint got
        if self.mapped:
            if not self.closed and not self.forked and self.h.slot >= 0:
                # Collected while attached: detach (what it holds goes back).
                plim_shm_waker_stop(&self.h)
                got = plim_shm_trylock(&self.h)
                if not got:
                    # Without the GIL: a thread of ours that took the lock
                    # without it may be waiting for the GIL to go on.
                    with nogil:
                        got = plim_shm_lock(&self.h) == PLIM_SHM_OK
                if got:
                    plim_shm_detach_locked(&self.h)
                    plim_shm_unlock(&self.h)
                plim_shm_release_slot(&self.h, self.h.slot)
            else:
                plim_shm_waker_stop(&self.h)
            for b in range(PLIM_SHM_NLOOPS):
                plim_shm_loop_remove(&self.h, b)
            plim_shm_unmap(&self.h)
        if self.h.lockfd >= 0:
            c_close(self.h.lockfd)
            self.h.lockfd = -1
        if self.h.fd >= 0:
            c_close(self.h.fd)
            self.h.fd = -1


def _resolve_waiter(_Waiter w):
    w.resolve()


# --------------------------------------------------------------------------
# Permits and requests
# --------------------------------------------------------------------------

@cython.final
@cython.freelist(256)
@cython.no_gc
cdef class SharedSemaphorePermit:
    """Permits held from a SharedSemaphore by this process.

    ``permits`` is what it holds now; ``update`` changes it in place and
    ``release`` sets it to 0.  Used as a context manager it is released on
    exit.  Only the process that acquired it can release or update it.
    """

    # Only `_sem` is an object, and a semaphore never refers to its permits:
    # a permit closes no cycle, so it stays out of the GC (no_gc) and is
    # recycled from a freelist (the uncontended acquire allocates nothing).
    cdef SharedSemaphore _sem
    cdef int64_t _permits
    cdef int64_t _reg              # the attachment's registration number
    cdef bint _pending             # an update of it is queued: its record
    cdef uint32_t _pend_rec
    cdef uint32_t _pend_ticket
    cdef object __weakref__

    def __init__(self, *args, **kwargs):
        raise TypeError(contract.MSG_PERMIT_NOT_CONSTRUCTIBLE)

    @property
    def permits(self):
        """The number of permits this object holds (0 once its semaphore
        is closed here: close() gave them back)."""
        if self._sem._seg.closed:
            return 0
        return self._permits

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._sem.release(self)

    def __repr__(self):
        return f"<SharedSemaphorePermit permits={self._permits}>"

    def __copy__(self):
        raise contract.no_copy_error(self)

    def __deepcopy__(self, memo):
        raise contract.no_copy_error(self)

    def __reduce__(self):
        raise contract.no_copy_error(self)

    def __reduce_ex__(self, protocol):
        raise contract.no_copy_error(self)


cdef inline SharedSemaphorePermit _new_permit(SharedSemaphore sem, int64_t n):
    cdef SharedSemaphorePermit p = SharedSemaphorePermit.__new__(SharedSemaphorePermit)
    p._sem = sem
    p._permits = n
    p._reg = sem._seg.reg
    p._pending = False
    return p


@cython.final
cdef class _SharedRequest:
    """What ``acquire``/``update`` return: awaitable once (it joins the
    host's queue when first awaited), an async context manager that releases
    the permit on exit, and a coroutine (``asyncio.create_task`` takes it)."""

    cdef SharedSemaphore _sem
    cdef SharedSemaphorePermit _permit
    cdef int64_t _n
    cdef object _timeout
    cdef object _is_cancelled
    cdef int _stage
    cdef object _result
    cdef object _gen

    def __init__(self, *args, **kwargs):
        raise TypeError(contract.MSG_REQUEST_NOT_CONSTRUCTIBLE)

    def __await__(self):
        if self._stage:
            raise RuntimeError(contract.MSG_ALREADY_AWAITED)
        self._stage = 1
        g = self._gen = self._run()
        return g

    def send(self, value):
        """Coroutine protocol: advance the request."""
        if self._stage == 2:
            raise RuntimeError(contract.MSG_REUSED)
        g = self._gen
        if g is None:
            self._stage = 1
            g = self._gen = self._run()
        return g.send(None)

    def throw(self, typ, val=None, tb=None):
        """Coroutine protocol: the awaiting task is cancelled or interrupted."""
        g = self._gen
        self._stage = 2
        try:
            exc = contract.thrown_exception(typ, val, tb)
        except BaseException:
            if g is not None:
                g.close()
            raise
        if g is None:
            raise exc
        return g.throw(exc)

    def close(self):
        """Coroutine protocol: the awaiting coroutine is closed."""
        g = self._gen
        self._stage = 2
        if g is not None:
            g.close()

    def _run(self):
        try:
            p = yield from self._sem._acquire_async(self._permit, self._n, self._timeout,
                                                    self._is_cancelled)
            self._result = p
            return p
        finally:
            self._stage = 2

    def __aenter__(self):
        return self

    def __aexit__(self, exc_type, exc, tb):
        if self._result is not None:
            self._sem.release(self._result)
        return _READY

    def __repr__(self):
        return f"<pylimiter shared request for {self._n} permit(s)>"

    def __reduce_ex__(self, protocol):
        raise contract.no_copy_error(self)


cdef _SharedRequest _new_request(SharedSemaphore sem, SharedSemaphorePermit permit, int64_t n,
                                 timeout, is_cancelled):
    cdef _SharedRequest r = _SharedRequest.__new__(_SharedRequest)
    r._sem = sem
    r._permit = permit
    r._n = n
    r._timeout = timeout
    r._is_cancelled = is_cancelled
    r._stage = 0
    return r


@cython.final
@cython.freelist(64)
cdef class _AnonEnter:
    """What ``async with sem:`` awaits: one permit held by the semaphore.
    One per block, from a freelist: a semaphore that kept one would form a
    cycle with it, and only the cyclic GC would then close a dropped
    semaphore's descriptors."""

    cdef SharedSemaphore sem

    def __await__(self):
        cdef SharedSemaphore sem = self.sem
        cdef _Seg seg = sem._seg
        cdef int st
        if seg.forked:
            seg.ensure()
        if seg.fast and plim_shm_fast_take(&seg.h, sem._p, 1) == PLIM_SHM_OK:
            seg.anon[sem._p] += 1
            return _EXHAUSTED
        if seg.closed:
            raise contract.closed_error()
        seg.lock()
        st = plim_shm_take_locked(&seg.h, sem._p, 1)
        seg.unlock()
        if st == PLIM_SHM_OK:
            seg.anon[sem._p] += 1
            return _EXHAUSTED
        if st == PLIM_SHM_OVERFLOW:
            raise contract.overflow_error()
        return sem._anon_wait()


def _reopen(cls, args, kwargs):
    return cls(*args, **kwargs)


# --------------------------------------------------------------------------
# The semaphore
# --------------------------------------------------------------------------

cdef class SharedSemaphore:
    """A weighted, strictly FIFO semaphore shared by every process of the
    host that opens ``name``: one budget, one queue, one set of numbers.

    The first open creates the segment ``pylimiter-<uid>-<name>`` in
    ``directory`` (default ``$PYLIMITER_SHM_DIR``, else ``/dev/shm``) with
    ``max_permits`` (<= 0: unbounded), ``max_queue_size`` (<= 0: unbounded,
    up to 65536 requests) and ``max_processes``; later opens attach and must
    pass the same settings (ValueError).  ``timeout`` is this process's
    default wait (seconds, None: for ever).  The API is AsyncSemaphore's,
    host-wide; ``close()`` detaches this process, ``holders()`` lists the
    attached processes, and a process that dies gives back what it held.
    Pickled (for a spawned child), it reopens the segment by name.
    """

    cdef _Seg _seg
    cdef uint32_t _p
    cdef object _timeout
    cdef bint _ready
    cdef bint _owner
    cdef object _args
    cdef object _kwargs
    cdef object __weakref__

    def __cinit__(self, *args, **kwargs):
        self._ready = False

    def __init__(self, name, max_permits=256 << 20, max_queue_size=10000, timeout=25.0, *,
                 directory=None, max_processes=256):
        if self._ready:
            raise RuntimeError("pylimiter: SharedSemaphore is already initialised")
        name = sc.check_name(name)
        (m,), q, procs = sc.check_settings((max_permits,), ("max_permits",), max_queue_size,
                                           max_processes)
        t = contract.check_timeout(timeout, None)
        sc.check_platform("SharedSemaphore")
        cdef _Seg seg = _Seg.__new__(_Seg)
        seg.open(name, sc.KIND_SEM, (m,), q, procs, directory)
        self._bind(seg, 0, t, True)
        self._args = (name, max_permits, max_queue_size, timeout)
        self._kwargs = {"directory": directory, "max_processes": max_processes}

    cdef _bind(self, _Seg seg, uint32_t p, timeout, bint owner):
        self._seg = seg
        self._p = p
        self._timeout = timeout
        self._owner = owner
        self._ready = True

    unlink = staticmethod(sc.unlink_segment)

    def __copy__(self):
        raise contract.no_copy_error(self)

    def __deepcopy__(self, memo):
        raise contract.no_copy_error(self)

    def __reduce__(self):
        if not self._ready or not self._owner:
            raise contract.no_copy_error(self)
        return (_reopen, (type(self), self._args, self._kwargs))

    def __reduce_ex__(self, protocol):
        return self.__reduce__()

    cdef inline _Seg _s(self):
        return _seg_of(self)

    cdef _Seg _fresh(self):
        cdef _Seg seg = self._s()
        seg.observe()
        return seg

    # ---- properties -------------------------------------------------------

    @property
    def name(self):
        """The segment's name."""
        return self._s().name

    @property
    def path(self):
        """The segment file's path."""
        return self._s().path

    @property
    def max_permits(self):
        """The host's limit, as last set by any process (<= 0: unbounded)."""
        return plim_shm_max(&self._s().h, self._p)

    @property
    def available_permits(self):
        """max_permits - acquired_permits, host-wide (negative after the
        limit was lowered); ``2**63 - 1`` when unbounded."""
        cdef _Seg seg = self._fresh()
        if plim_shm_max(&seg.h, self._p) <= 0:
            return UNBOUNDED_AVAILABLE
        return plim_shm_avail(&seg.h, self._p)

    @property
    def acquired_permits(self):
        """Permits held now by every process of the host."""
        return plim_shm_acquired(&self._fresh().h, self._p)

    @property
    def peak_acquired_permits(self):
        """The most permits held at once host-wide since the segment was
        created (or re-initialised): a high-water mark kept in the segment."""
        return plim_shm_hwm(&self._s().h, self._p)

    @property
    def queue_size(self):
        """Requests waiting in the host's queue."""
        return plim_shm_qlen(&self._fresh().h, self._p)

    @property
    def max_queue_size(self):
        """The queue bound the segment was created with (<= 0: unbounded)."""
        return self._s().max_queue

    @property
    def closed(self):
        """True after this process's close()."""
        return self._s().closed

    def locked(self):
        """True when ``acquire(1)`` could not be granted at once here: fewer
        than one permit available host-wide, requests queued, or closed."""
        cdef _Seg seg = self._fresh()
        if seg.closed:
            return True
        if plim_shm_max(&seg.h, self._p) <= 0:
            return False
        return plim_shm_qlen(&seg.h, self._p) > 0 or plim_shm_avail(&seg.h, self._p) < 1

    def __repr__(self):
        if not self._ready:
            return contract.uninitialised_repr(self)
        cdef _Seg seg = self._seg
        return (f"<SharedSemaphore {seg.name!r} max_permits={plim_shm_max(&seg.h, self._p)} "
                f"acquired={plim_shm_acquired(&seg.h, self._p)} "
                f"queued={plim_shm_qlen(&seg.h, self._p)}{' closed' if seg.closed else ''}>")

    def stats(self):
        """A snapshot of the host's gauges, counters and wait histogram."""
        cdef _Seg seg = self._fresh()
        cdef plim_shm_stats_t s
        if seg.closed:
            plim_shm_stats_locked(&seg.h, self._p, &s)
        else:
            seg.lock()
            plim_shm_stats_locked(&seg.h, self._p, &s)
            seg.unlock()
        counts = [s.buckets[i] for i in range(PLIM_SHM_NBUCKETS)]
        acquired = s.max - s.avail if s.max > 0 else -s.avail
        return SemaphoreStats(
            max_permits=s.max,
            acquired_permits=acquired,
            available_permits=s.avail if s.max > 0 else UNBOUNDED_AVAILABLE,
            queue_size=s.qlen,
            max_queue_size=seg.max_queue,
            acquired_total=s.acquired_total,
            timeout_total=s.timeout_total,
            queue_full_total=s.queue_full_total,
            cancelled_total=s.cancelled_total,
            wait_seconds_sum=s.wait_ns / 1e9,
            wait_seconds_count=sum(counts),
            wait_seconds_buckets=contract.cumulative_buckets(counts),
        )

    def holders(self):
        """``{pid: permits held}`` for every live attached process, idle ones
        with 0, this one included (after a sweep for dead ones)."""
        return {pid: held[self._p] for pid, held in _holders(self._s()).items()}

    def _audit(self):
        """Tests: the books of this pool, read in one critical section after
        a sweep (see the pure twin's _audit)."""
        cdef _Seg seg = self._s()
        cdef int64_t out[6]
        if seg.closed:
            raise contract.closed_error()
        seg.lock()
        plim_shm_sweep_locked(&seg.h, 1)
        plim_shm_audit_locked(&seg.h, self._p, out)
        seg.unlock()
        return {"acquired": out[0], "held": out[1], "granted": out[2], "qlen": out[3],
                "queued": out[4], "linked": out[5]}

    def _crash_after(self, int n):
        """Tests: SIGKILL this process at the n-th crash point it passes."""
        self._s().h.crash = n

    def _set_lock_timeout(self, double seconds):
        """Tests: the bound on waiting for a live holder of the host's lock."""
        self._s().h.lock_timeout_ns = <int64_t>(seconds * 1e9)

    def _set_direct_wake(self, bint on):
        """Tests and the benchmark: whether event loops of this attachment
        that start waiting from now on get a wake socket of their own (the
        one-hop hand-off); off, other processes wake them through this
        process's waker thread, as before they had one."""
        self._s().direct_off = not on

    def _set_lock_free(self, bint on):
        """Tests and the benchmark: whether this attachment (every pool of
        it) may use the lock-free paths; off, every operation takes the
        host's lock, as before they existed."""
        cdef _Seg seg = self._s()
        seg.fast_off = not on
        seg.fast = on and not seg.closed and not seg.forked

    # ---- the algorithm ---------------------------------------------------------

    def try_acquire(self, n=1):
        """Take ``n`` permits now if they fit and nobody queues anywhere on
        the host; else None.  Never waits, never overtakes."""
        cdef _Seg seg = self._s()
        cdef int64_t k = _count(self, seg, n, None)
        cdef int st
        if seg.fast and k > 0 and plim_shm_fast_take(&seg.h, self._p, k) == PLIM_SHM_OK:
            return _new_permit(self, k)
        if seg.closed:
            raise contract.closed_error()
        seg.lock()
        st = plim_shm_take_locked(&seg.h, self._p, k)
        if st == PLIM_SHM_EMPTY and (plim_shm_sweep_due(&seg.h) or
                                     plim_shm_any_dead(&seg.h)):
            # Refused: a dead process may hold what is missing.
            plim_shm_sweep_locked(&seg.h, 1)
            st = plim_shm_take_locked(&seg.h, self._p, k)
        seg.unlock()
        if st == PLIM_SHM_OK:
            return _new_permit(self, k)
        if st == PLIM_SHM_OVERFLOW:
            raise contract.overflow_error()
        return None

    def release(self, permit):
        """Give back everything ``permit`` holds and set it to 0.  Releasing
        again is a no-op, and so is a release after close() (close gave the
        permits back)."""
        cdef SharedSemaphorePermit p
        cdef int64_t n
        cdef _Seg seg
        if type(permit) is SharedSemaphorePermit and \
                (<SharedSemaphorePermit>permit)._sem is self:
            # The uncontended path: one CAS (a permit of ours is ours to
            # give back only in the attachment that took it: _reg).
            p = <SharedSemaphorePermit>permit
            seg = self._seg
            n = p._permits
            if n > 0 and seg.fast and p._reg == seg.reg and not p._pending and \
                    plim_shm_fast_give(&seg.h, self._p, n) == PLIM_SHM_OK:
                p._permits = 0
                return
        p = _own_permit(self, permit)
        n = p._permits
        if n == 0:
            return
        seg = self._seg
        if seg.closed or p._reg != seg.reg:
            p._permits = 0
            return
        seg.lock()
        # Read again: the lock may have let the GIL go, and another thread
        # release the same permit meanwhile (it would count twice).
        n = p._permits
        if n == 0:
            seg.unlock()
            return
        p._permits = 0
        if p._pending:
            plim_shm_give_back_locked(&seg.h, self._p, n, p._pend_rec, p._pend_ticket)
        else:
            plim_shm_give_back_locked(&seg.h, self._p, n, PLIM_SHM_NIL, 0)
        seg.unlock()

    cdef bint _shrink(self, _Seg seg, SharedSemaphorePermit permit, int64_t n) except -1:
        if permit._pending:
            raise RuntimeError(contract.MSG_UPDATE_IN_PROGRESS)
        if seg.closed:
            permit._permits = 0   # close() gave them back: growing is refused
        cdef int64_t cur = permit._permits
        if n > cur:
            return False
        if n == cur:
            return True
        if seg.fast and plim_shm_fast_give(&seg.h, self._p, cur - n) == PLIM_SHM_OK:
            permit._permits = n
            return True
        seg.lock()
        cur = permit._permits   # again: see release
        if n < cur:
            permit._permits = n
            plim_shm_give_back_locked(&seg.h, self._p, cur - n, PLIM_SHM_NIL, 0)
        seg.unlock()
        return True

    cdef object _begin(self, SharedSemaphorePermit permit, bint is_update, int64_t n, timeout,
                       is_cancelled, bint blocking):
        """The start of every acquire/update of `permit` (a new one, holding
        0, for an acquire): None when done at once, or a queued _Waiter.
        Raises on immediate failure."""
        cdef _Seg seg = self._s()
        cdef int64_t m = plim_shm_max(&seg.h, self._p)
        cdef int64_t need, limit = 0
        cdef uint32_t rec = 0, ticket = 0, tag = 0
        cdef int st
        cdef _LoopWake lw = None
        cdef _Waiter w
        cancelled, cause = False, None
        if is_cancelled is not None and m > 0:
            cancelled, cause = contract.ask_cancelled(is_cancelled)
        if is_update and self._shrink(seg, permit, n):
            return None
        loop = None if blocking else _get_running_loop()
        if seg.closed:
            raise contract.closed_error()
        if seg.loops:
            seg.drop_closed_loops()
        seg.sweep(False)
        # acquire(0) is granted at once, as AsyncSemaphore's (a new permit
        # holds 0 >= n); an update reaches here only to grow.
        if permit._pending or (permit._permits >= n and n > 0):
            raise RuntimeError(contract.MSG_UPDATE_IN_PROGRESS)
        need = n - permit._permits
        # Only C runs while this process holds the host's lock.  Python code
        # there -- a call into Python, or before 3.12 an allocation the
        # collector counts -- could run a finaliser or a signal handler, and
        # one that gave a permit back (a queue is waiting, so through the
        # lock) waited for the lock its own thread held.  So the waiter is
        # made before the lock, and the errors after it.
        cdef int err = 0
        cdef int64_t qcap = 0
        cdef bint may_queue = timeout != 0 and (blocking or loop is not None)
        if may_queue:
            w = _Waiter.__new__(_Waiter)
        seg.lock()
        if cancelled:
            plim_shm_count_locked(&seg.h, self._p, 3)
            seg.unlock()
            raise contract.cancelled_error(cause)
        st = plim_shm_take_locked(&seg.h, self._p, need)
        if st == PLIM_SHM_EMPTY and loop is not None and may_queue:
            # It has to queue on an event loop: the loop's eventfd (and the
            # waker thread) first, made outside the lock, then look again.
            seg.unlock()
            lw = seg.loop_wake(loop)
            tag = lw.bit + 1
            seg.lock()
            st = plim_shm_take_locked(&seg.h, self._p, need)
        if st == PLIM_SHM_EMPTY and plim_shm_any_dead(&seg.h):
            # Refused: a process that died since the last sweep may hold
            # what is missing; its permits come back before we queue.
            plim_shm_sweep_locked(&seg.h, 1)
            st = plim_shm_take_locked(&seg.h, self._p, need)
        if st == PLIM_SHM_OK:
            seg.unlock()
            permit._permits += need
            return None
        if st == PLIM_SHM_OVERFLOW:
            err = _E_OVERFLOW
        elif timeout == 0:
            plim_shm_count_locked(&seg.h, self._p, 1)
            err = _E_TIMEOUT_ZERO
        elif not may_queue:
            err = _E_NO_LOOP
        else:
            st = plim_shm_enqueue_locked(&seg.h, self._p, need, n, tag, &rec, &ticket, &limit)
            if st == PLIM_SHM_OK:
                # A lock-free release gave them back meanwhile: taken.
                seg.unlock()
                permit._permits += need
                return None
            if st == PLIM_SHM_TOO_LARGE:
                err = _E_TOO_LARGE
            elif st == PLIM_SHM_FULL:
                plim_shm_count_locked(&seg.h, self._p, 2)
                qcap = seg.max_queue if seg.max_queue > 0 else plim_shm_qlen(&seg.h, self._p)
                err = _E_FULL
        if err:
            seg.unlock()
            if err == _E_OVERFLOW:
                raise contract.overflow_error()
            if err == _E_TIMEOUT_ZERO:
                raise contract.timeout_zero_error()
            if err == _E_NO_LOOP:
                raise contract.no_loop_error()
            if err == _E_TOO_LARGE:
                raise contract.too_large_error(n, limit)
            raise contract.queue_full_error(qcap)
        w.rec = rec
        w.ticket = ticket
        w.n = n
        w.check = is_cancelled
        w.loop = loop
        w.state = PLIM_SHM_R_QUEUED
        w.lw = lw
        if permit._permits:
            permit._pending = True
            permit._pend_rec = rec
            permit._pend_ticket = ticket
        seg.unlock()
        # In the process's tables after the unlock (a record's waiter is
        # looked up with the GIL, which this thread has held since): a stale
        # entry a store replaced could run a finaliser as it goes.
        if lw is not None:
            lw.waiters[w] = None
        seg.waiters[rec] = w
        return w

    cdef void _settled(self, _Waiter w, SharedSemaphorePermit permit, int state,
                       int64_t granted, int64_t limit) noexcept:
        """Apply a collected outcome to the waiter and the permit."""
        w.state = state
        if state == PLIM_SHM_R_GRANTED:
            permit._permits += granted
            w.granted = granted
        elif state == PLIM_SHM_R_TOO_LARGE:
            w.limit = limit

    cdef int _collect(self, _Waiter w, SharedSemaphorePermit permit) except -1:
        """The outcome of w's record (a grant moves into this process's held
        permits); the record is freed.  1: still queued (wait again)."""
        cdef _Seg seg = self._seg
        cdef int state = 0, st
        cdef int64_t granted = 0, limit = 0
        seg.waiters.pop(w.rec, None)
        permit._pending = False
        if w.removed or seg.closed:
            return 0
        seg.lock()
        st = plim_shm_collect_locked(&seg.h, w.rec, w.ticket, &state, &granted, &limit)
        seg.unlock()
        if st == PLIM_SHM_QUEUED:
            seg.waiters[w.rec] = w
            return 1   # hostile bytes put it back: wait again
        if st != PLIM_SHM_OK:
            w.state = -1
            return 0
        self._settled(w, permit, state, granted, limit)
        return 0

    cdef _abandon(self, _Waiter w, SharedSemaphorePermit permit, bint timed_out):
        """The requester stops waiting: a queued request leaves the queue; a
        grant that raced with a cancel goes back, one that raced with a
        timeout stands (the caller collects it)."""
        if self._seg.abandon(w, timed_out):
            permit._pending = False

    cdef object _finish(self, _Waiter w, SharedSemaphorePermit permit, timeout):
        """The outcome, once w left the queue: the permit, or the error."""
        cdef _Seg seg = self._seg
        st = w.state
        if st == PLIM_SHM_R_QUEUED and seg.closed:
            st = PLIM_SHM_R_CLOSED   # woken by this process's close()
        if st == PLIM_SHM_R_GRANTED:
            if w.check is not None:
                cancelled, cause = contract.ask_cancelled(w.check)
                if cancelled:
                    self._cancel_grant(w, permit)
                    raise contract.cancelled_error(cause)
            return permit
        if st == -1:
            raise sc.shared_error(seg.path, sc.MSG_REQUEST_LOST[len("pylimiter: "):])
        raise contract.left_queue_error(st, w.n, w.limit, None, timeout)

    cdef _cancel_grant(self, _Waiter w, SharedSemaphorePermit permit):
        cdef _Seg seg = self._seg
        cdef int64_t g = w.granted
        permit._permits -= g
        if seg.closed:
            return
        seg.lock()
        plim_shm_count_locked(&seg.h, self._p, 3)
        plim_shm_give_back_locked(&seg.h, self._p, g, PLIM_SHM_NIL, 0)
        seg.unlock()

    def _acquire_async(self, SharedSemaphorePermit permit, int64_t n, timeout, is_cancelled):
        cdef bint is_update = permit is not None
        if permit is None:
            permit = _new_permit(self, 0)
        r = self._begin(permit, is_update, n, timeout, is_cancelled, False)
        if r is None:
            return permit
        cdef _Waiter w = <_Waiter>r
        cdef _Seg seg = self._seg
        cdef _LoopWake lw = w.lw
        loop = w.loop
        try:
            # In the try: call_later runs Python code, where a signal
            # handler's KeyboardInterrupt would have left the request queued
            # with nobody to collect it.
            if timeout is not None:
                w.timer = loop.call_later(min(timeout, _MAX_TIMEOUT_S), self._on_timeout, w,
                                          permit)
            while True:
                while not w.removed and not seg.closed and seg.peek(w) == PLIM_SHM_R_QUEUED:
                    fut = w.fut = loop.create_future()
                    if seg.peek(w) != PLIM_SHM_R_QUEUED or w.removed:
                        break   # decided meanwhile
                    yield from fut
                if w.removed or seg.closed or not self._collect(w, permit):
                    break
        except BaseException:
            self._abandon(w, permit, False)
            raise
        finally:
            w.fut = None
            if w.timer is not None:
                w.timer.cancel()
            lw.waiters.pop(w, None)
        return self._finish(w, permit, timeout)

    def _on_timeout(self, _Waiter w, SharedSemaphorePermit permit):
        self._abandon(w, permit, True)
        w.resolve()

    def _anon_wait(self):
        """`async with sem:` when the permit is not free at once."""
        p = yield from self._acquire_async(None, 1, self._timeout, None)
        cdef _Seg seg = self._seg
        seg.anon[self._p] += (<SharedSemaphorePermit>p)._permits
        (<SharedSemaphorePermit>p)._permits = 0

    cdef object _run_blocking(self, SharedSemaphorePermit permit, int64_t n, timeout,
                              is_cancelled):
        cdef bint is_update = permit is not None
        if permit is None:
            permit = _new_permit(self, 0)
        r = self._begin(permit, is_update, n, timeout, is_cancelled, True)
        if r is None:
            return permit
        cdef _Waiter w = <_Waiter>r
        cdef _Seg seg = self._seg
        cdef int64_t deadline = -1, granted = 0, limit = 0
        cdef int st, state = 0
        if timeout is not None:
            deadline = plim_shm_now_ns() + <int64_t>(min(timeout, _MAX_TIMEOUT_S) * 1e9)
        try:
            while True:
                # Waits and collects without the GIL: the hand-off's latency.
                with nogil:
                    st = plim_shm_wait_collect(&seg.h, w.rec, w.ticket, deadline, &state,
                                               &granted, &limit)
                if st == PLIM_SHM_INTR:
                    PyErr_CheckSignals()
                    continue
                if st == PLIM_SHM_TIMEDOUT:
                    self._abandon(w, permit, True)
                    if w.removed:
                        break
                    continue   # granted meanwhile: collect it
                if seg.closed:
                    break
                if st == PLIM_SHM_DECIDED:
                    seg.waiters.pop(w.rec, None)
                    permit._pending = False
                    self._settled(w, permit, state, granted, limit)
                    break
                if st == PLIM_SHM_GONE:
                    seg.waiters.pop(w.rec, None)
                    permit._pending = False
                    w.state = -1
                    break
                raise _error(seg, st)
        except BaseException:
            self._abandon(w, permit, False)
            raise
        return self._finish(w, permit, timeout)

    # ---- public API -------------------------------------------------------------

    def acquire(self, n=1, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None, permits=None):
        """Return an awaitable of a new SharedSemaphorePermit holding ``n``
        permits (``permits=`` is accepted as AsyncSemaphore's spelling).

        The request joins the host's queue when first awaited.  It fails with
        PermitAcquireTimeoutError, PermitAcquireQueueFullError,
        PermitAcquireAlreadyClosedError or PermitAcquireCancelledError.
        ``async with sem.acquire(n) as p:`` releases p on exit.
        """
        cdef _Seg seg = self._s()
        cdef int64_t k = _count(self, seg, n, permits)
        t = self._timeout if timeout is TIMEOUT_NOT_GIVEN else \
            contract.check_timeout(timeout, self._timeout)
        if is_cancelled is not None:
            contract.check_is_cancelled(is_cancelled)
        if seg.closed:
            raise contract.closed_error()
        return _new_request(self, None, k, t, is_cancelled)

    def acquire_blocking(self, n=1, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None,
                         permits=None):
        """Blocking twin of ``acquire`` for threads (the GIL is released
        while waiting)."""
        cdef _Seg seg = _seg_of(self)
        cdef int64_t k
        cdef int st
        if seg.fast and is_cancelled is None and permits is None and \
                timeout is TIMEOUT_NOT_GIVEN:
            # The uncontended path: one CAS, no lock, no waiter.
            k = plim_shm_small_count(n)
            if k > 0 and plim_shm_fast_take(&seg.h, self._p, k) == PLIM_SHM_OK:
                return _new_permit(self, k)
        k = _count(self, seg, n, permits)
        if timeout is TIMEOUT_NOT_GIVEN:
            t = self._timeout
        else:
            t = contract.check_timeout(timeout, self._timeout)
        if is_cancelled is None and not seg.closed:
            # One critical section, no waiter.
            seg.lock()
            st = plim_shm_take_locked(&seg.h, self._p, k)
            seg.unlock()
            if st == PLIM_SHM_OK:
                return _new_permit(self, k)
        elif is_cancelled is not None:
            contract.check_is_cancelled(is_cancelled)
        return self._run_blocking(None, k, t, is_cancelled)

    def update(self, permit, new_permits, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None):
        """Return an awaitable that changes ``permit`` to ``new_permits`` in
        place and returns it.  Shrinking completes at once; growing queues
        for the difference, and on failure the permit keeps what it had."""
        cdef _Seg seg = self._s()
        cdef SharedSemaphorePermit p = _own_permit(self, permit)
        cdef int64_t m = plim_shm_max(&seg.h, self._p)
        n = contract.check_permits(new_permits, m, m > 0)
        t = contract.check_timeout(timeout, self._timeout)
        contract.check_is_cancelled(is_cancelled)
        return _new_request(self, p, n, t, is_cancelled)

    def update_blocking(self, permit, new_permits, *, timeout=TIMEOUT_NOT_GIVEN,
                        is_cancelled=None):
        """Blocking twin of ``update``."""
        cdef _Seg seg = self._s()
        cdef SharedSemaphorePermit p = _own_permit(self, permit)
        cdef int64_t m = plim_shm_max(&seg.h, self._p)
        n = contract.check_permits(new_permits, m, m > 0)
        t = contract.check_timeout(timeout, self._timeout)
        contract.check_is_cancelled(is_cancelled)
        return self._run_blocking(p, n, t, is_cancelled)

    def set_max_permits(self, max_permits):
        """Change the host's limit, live, for every process: ``> 0`` bounds
        it (queued requests larger than it fail with ValueError, waiters that
        now fit are granted); ``<= 0`` makes it unbounded."""
        cdef int64_t m = contract.check_new_max(max_permits)
        cdef _Seg seg = self._s()
        cdef int st
        if seg.closed:
            raise contract.closed_error()
        seg.lock()
        st = plim_shm_set_max_locked(&seg.h, self._p, m)
        seg.unlock()
        if st == PLIM_SHM_STUCK:
            raise sc.shared_error(seg.path, "a live process stays inside a lock-free step "
                                  "and does not go on (stopped, or hostile bytes); the "
                                  "limit is unchanged")
        if st == PLIM_SHM_CORRUPT:
            raise _error(seg, st)

    def __aenter__(self):
        """``async with sem:`` takes one permit (as asyncio.Semaphore)."""
        if not self._ready:
            raise contract.uninitialised_error(self)
        cdef _AnonEnter e = _AnonEnter.__new__(_AnonEnter)
        e.sem = self
        return e

    def __aexit__(self, exc_type, exc, tb):
        cdef _Seg seg = self._s()
        if seg.anon[self._p] <= 0:
            raise RuntimeError(contract.MSG_ANON_EXIT)
        seg.anon[self._p] -= 1
        if seg.fast and plim_shm_fast_give(&seg.h, self._p, 1) == PLIM_SHM_OK:
            return _READY
        if not seg.closed:
            seg.lock()
            plim_shm_give_back_locked(&seg.h, self._p, 1, PLIM_SHM_NIL, 0)
            seg.unlock()
        return _READY

    def close(self):
        """Detach this process (idempotent): its queued requests fail with
        PermitAcquireAlreadyClosedError, and so do later acquires here; the
        permits it holds go back to the host's budget."""
        self._s().close()


cdef inline _Seg _seg_of(SharedSemaphore sem):
    """The semaphore's attachment (a forked child registers first)."""
    if not sem._ready:
        raise contract.uninitialised_error(sem)
    cdef _Seg seg = sem._seg
    if seg.forked:
        seg.ensure()
    return seg


cdef inline int64_t _count(SharedSemaphore sem, _Seg seg, n, permits) except -1:
    """A permit count argument as an int64 (the common case without a
    Python-level comparison), or check_permits' error."""
    cdef int64_t k, m
    cdef int overflow = 0
    if permits is not None:
        if n != 1 and n is not permits:
            raise TypeError("pylimiter: pass the number of permits once (n or permits=)")
        n = permits
    m = plim_shm_max_inline(&seg.h, sem._p)
    if type(n) is int:
        k = PyLong_AsLongLongAndOverflow(n, &overflow)
        if overflow == 0 and 0 <= k <= (m if m > 0 else PLIM_SHM_MAX_PERMITS):
            return k
    return contract.check_permits(n, m, m > 0)


cdef inline SharedSemaphorePermit _own_permit(SharedSemaphore sem, permit):
    """`permit` as one of this semaphore's, taken by this attachment (or
    holding nothing); TypeError otherwise."""
    if type(permit) is not SharedSemaphorePermit or \
            (<SharedSemaphorePermit>permit)._sem is not sem:
        raise contract.permit_error(permit, SharedSemaphorePermit)
    cdef SharedSemaphorePermit p = <SharedSemaphorePermit>permit
    if p._reg != sem._seg.reg and p._permits:
        raise TypeError(sc.MSG_FOREIGN_PROCESS_PERMIT)
    return p


cdef SharedSemaphore _pool_view(_Seg seg, uint32_t p, timeout):
    cdef SharedSemaphore s = SharedSemaphore.__new__(SharedSemaphore)
    s._bind(seg, p, timeout, False)
    return s


cdef dict _holders(_Seg seg):
    """{pid: [held per pool]} of the live attached processes."""
    cdef int32_t *pids
    cdef int64_t *held
    cdef int n, i
    cdef uint32_t p
    cdef uint32_t npools = seg.h.npools
    if seg.closed:
        raise contract.closed_error()
    pids = <int32_t *>malloc(seg.h.maxp * sizeof(int32_t))
    held = <int64_t *>malloc(seg.h.maxp * npools * sizeof(int64_t))
    if pids == NULL or held == NULL:
        free(pids)
        free(held)
        raise MemoryError()
    try:
        seg.lock()
        plim_shm_sweep_locked(&seg.h, 1)
        n = plim_shm_holders_locked(&seg.h, pids, held)
        seg.unlock()
        out = {}
        for i in range(n):
            row = out.setdefault(pids[i], [0] * npools)
            for p in range(npools):
                row[p] += held[i * npools + p]
        return out
    finally:
        free(pids)
        free(held)


class SharedDualMemoryLimiter(SharedDualMemoryLimiterBase):
    __doc__ = SharedDualMemoryLimiterBase.__doc__
    _semaphore_class = SharedSemaphore

    def _open(self, name, maxes, max_queue, max_processes, directory, timeout):
        seg = _Seg.__new__(_Seg)
        (<_Seg>seg).open(name, sc.KIND_DUAL, maxes, max_queue, max_processes, directory)
        return seg, _pool_view(seg, 0, timeout), _pool_view(seg, 1, timeout)

    def _holders(self):
        return _holders(self._seg)


# --------------------------------------------------------------------------
# Front doors of the uncontended calls
# --------------------------------------------------------------------------
# acquire_blocking(n), try_acquire(n) and release(permit) called with their
# positional argument only are served by a METH_FASTCALL function of our
# own that tries the lock-free path first and hands every other call (and
# every refusal) to Cython's method unchanged: Cython's argument parsing of
# four parameters (keyword-only defaults taken and dropped) was a sixth of
# the uncontended pair.  The replacement is a plain method descriptor with
# the same name and docstring, so the methods look and bind as before.

cdef extern from *:
    """
    typedef PyObject *(*plim_shm_fastkw_fn)(PyObject *, PyObject *const *, Py_ssize_t,
                                            PyObject *);
    /* Cython's: a permit (new reference), Py_None for "not done", NULL with
     * an error set. */
    static PyObject *(*plim_shm_front_take)(PyObject *sem, int64_t n) = NULL;
    /* Cython's: 1 done, 0 not done (nothing raised). */
    static int (*plim_shm_front_give)(PyObject *sem, PyObject *permit) = NULL;
    static plim_shm_fastkw_fn plim_shm_orig_acquire_blocking = NULL;
    static plim_shm_fastkw_fn plim_shm_orig_try_acquire = NULL;
    static plim_shm_fastkw_fn plim_shm_orig_release = NULL;

    static void plim_shm_set_fronts(void *take, void *give)
    {
        plim_shm_front_take = (PyObject *(*)(PyObject *, int64_t))take;
        plim_shm_front_give = (int (*)(PyObject *, PyObject *))give;
    }

    #define PLIM_SHM_NOKW(kw) ((kw) == NULL || PyTuple_GET_SIZE(kw) == 0)

    static PyObject *plim_shm_take_front(PyObject *self, PyObject *const *args,
                                         Py_ssize_t nargs, PyObject *kwnames,
                                         plim_shm_fastkw_fn orig)
    {
        if (nargs <= 1 && PLIM_SHM_NOKW(kwnames)) {
            int64_t n = nargs ? plim_shm_small_count(args[0]) : 1;
            if (n > 0) {
                PyObject *r = plim_shm_front_take(self, n);
                if (r != Py_None)
                    return r;   /* the permit, or NULL: its error */
                Py_DECREF(r);
            }
        }
        return orig(self, args, nargs, kwnames);
    }

    static PyObject *plim_shm_acquire_blocking_front(PyObject *self, PyObject *const *args,
                                                     Py_ssize_t nargs, PyObject *kwnames)
    {
        return plim_shm_take_front(self, args, nargs, kwnames,
                                   plim_shm_orig_acquire_blocking);
    }

    static PyObject *plim_shm_try_acquire_front(PyObject *self, PyObject *const *args,
                                                Py_ssize_t nargs, PyObject *kwnames)
    {
        return plim_shm_take_front(self, args, nargs, kwnames, plim_shm_orig_try_acquire);
    }

    static PyObject *plim_shm_release_front(PyObject *self, PyObject *const *args,
                                            Py_ssize_t nargs, PyObject *kwnames)
    {
        if (nargs == 1 && PLIM_SHM_NOKW(kwnames) && plim_shm_front_give(self, args[0]))
            Py_RETURN_NONE;
        return plim_shm_orig_release(self, args, nargs, kwnames);
    }

    static PyMethodDef plim_shm_front_defs[3] = {
        {NULL, (PyCFunction)(void (*)(void))plim_shm_acquire_blocking_front,
         METH_FASTCALL | METH_KEYWORDS, NULL},
        {NULL, (PyCFunction)(void (*)(void))plim_shm_try_acquire_front,
         METH_FASTCALL | METH_KEYWORDS, NULL},
        {NULL, (PyCFunction)(void (*)(void))plim_shm_release_front,
         METH_FASTCALL | METH_KEYWORDS, NULL},
    };

    /* plim_shm_install_front: method `name` of `type` (Cython's, a
     * METH_FASTCALL | METH_KEYWORDS method descriptor) becomes front door i.
     * 0 done, 1 left alone (another calling convention: a build without
     * vectorcall), -1 error. */
    static int plim_shm_install_front(PyObject *type, const char *name, int i)
    {
        PyTypeObject *tp = (PyTypeObject *)type;
        plim_shm_fastkw_fn *orig = i == 0 ? &plim_shm_orig_acquire_blocking
                                   : i == 1 ? &plim_shm_orig_try_acquire
                                            : &plim_shm_orig_release;
        PyObject *m = PyDict_GetItemString(tp->tp_dict, name);   /* borrowed */
        if (m == NULL || !Py_IS_TYPE(m, &PyMethodDescr_Type))
            return 1;
        PyMethodDef *od = ((PyMethodDescrObject *)m)->d_method;
        if (od->ml_flags != (METH_FASTCALL | METH_KEYWORDS))
            return 1;
        *orig = (plim_shm_fastkw_fn)(void (*)(void))od->ml_meth;
        plim_shm_front_defs[i].ml_name = od->ml_name;
        plim_shm_front_defs[i].ml_doc = od->ml_doc;
        PyObject *d = PyDescr_NewMethod(tp, &plim_shm_front_defs[i]);
        if (d == NULL)
            return -1;
        int rc = PyDict_SetItemString(tp->tp_dict, name, d);
        Py_DECREF(d);
        if (rc < 0)
            return -1;
        PyType_Modified(tp);
        return 0;
    }
    """
    void plim_shm_set_fronts(void *take, void *give)
    int plim_shm_install_front(object type, const char *name, int i) except -1


cdef object _front_take(SharedSemaphore sem, int64_t n):
    """acquire_blocking(n) / try_acquire(n) in one CAS, or None."""
    if sem._ready and sem._seg.fast and \
            plim_shm_fast_take(&sem._seg.h, sem._p, n) == PLIM_SHM_OK:
        return _new_permit(sem, n)
    return None


cdef int _front_give(SharedSemaphore sem, object permit) noexcept:
    """release(permit) in one CAS: 1, or 0 (nothing done)."""
    if type(permit) is not SharedSemaphorePermit:
        return 0
    if (<SharedSemaphorePermit>permit)._sem is not sem:
        return 0   # not ours (and then sem may be uninitialised)
    cdef int64_t n = (<SharedSemaphorePermit>permit)._permits
    if n > 0 and sem._seg.fast and (<SharedSemaphorePermit>permit)._reg == sem._seg.reg and \
            not (<SharedSemaphorePermit>permit)._pending and \
            plim_shm_fast_give(&sem._seg.h, sem._p, n) == PLIM_SHM_OK:
        (<SharedSemaphorePermit>permit)._permits = 0
        return 1
    return 0


plim_shm_set_fronts(<void *>_front_take, <void *>_front_give)
plim_shm_install_front(SharedSemaphore, b"acquire_blocking", 0)
plim_shm_install_front(SharedSemaphore, b"try_acquire", 1)
plim_shm_install_front(SharedSemaphore, b"release", 2)
