"""Pure-Python twin of the host-wide limiter (issue 33): the executable
specification of ``_shared_c`` and of csrc/plim_shm.c.

State lives in the segment file (layout: ``_shared_common``), mapped
MAP_SHARED.  The twins differ only in how a process locks the state while it
changes it: here an OFD write lock on one byte of the file (``MUTEX_BYTE``),
which the kernel drops when its holder dies, plus a ``dirty`` word in the
header set for the length of every critical section; the C twin uses a futex
word and takes it over from a dead holder.  Either way, a process that finds
the previous holder died inside its critical section repairs the segment:
every derived field (the pools' available counts, the queues' links and
lengths, the free list) is rebuilt from the facts (the live slots' held
permits and the records' states), which each critical section writes in an
order that keeps them true at every step (csrc/plim_shm.c, "Who repairs
what").  A process that dies outside a critical section is found by its
slot's OFD lock being gone, by a sweep (at once by a process that reads the
host's numbers or would be refused or queued -- any_dead --, and at most every
250 ms by one that waits), and repaired the same way.

Waiting polls, at most every 10 ms (5 ms here): a blocking thread waits on
an Event with that timeout and rereads its record's state; an event loop
with waiters polls its records from a ``call_later`` callback.  A grant made
by this process to its own waiter is delivered at once (Event.set, or the
loop's call_soon_threadsafe).
"""

from __future__ import annotations

import _thread
import asyncio
import fcntl
import mmap
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from ._common import (
    DONE,
    MAX_ACQUIRED,
    MAX_PERMITS,
    MAX_TIMEOUT_S,
    MSG_ALREADY_AWAITED,
    MSG_ANON_EXIT,
    MSG_PERMIT_NOT_CONSTRUCTIBLE,
    MSG_REQUEST_NOT_CONSTRUCTIBLE,
    MSG_REUSED,
    MSG_UPDATE_IN_PROGRESS,
    TIMEOUT_NOT_GIVEN,
    UNBOUNDED_AVAILABLE,
    W_CANCELLED,
    W_CLOSED,
    W_GRANTED,
    W_IDLE,
    W_QUEUED,
    W_REMOVED,
    W_TOO_LARGE,
    WAIT_BUCKETS,
    NoCopy,
    ReleasingRequest,
    SemaphoreStats,
    ask_cancelled,
    bucket_index,
    cancelled_error,
    check_is_cancelled,
    check_new_max,
    check_permits,
    check_timeout,
    closed_error,
    cumulative_buckets,
    left_queue_error,
    no_copy_error,
    no_loop_error,
    overflow_error,
    permit_error,
    queue_full_error,
    thrown_exception,
    timeout_zero_error,
    too_large_error,
    uninitialised_error,
    uninitialised_repr,
)
from ._deferred import later
from ._shared_common import (
    H_BUMP,
    H_DIRTY,
    H_FREE,
    H_SEQ,
    H_SWEEP,
    H_TICKET,
    IMPL_PY,
    KIND_DUAL,
    KIND_SEM,
    LOCK_BASE,
    MSG_FOREIGN_PROCESS_PERMIT,
    MSG_REQUEST_LOST,
    MUTEX_BYTE,
    NIL,
    OPEN_BYTE,
    P_ACQ_TOTAL,
    P_AVAIL,
    P_BUCKETS,
    P_CANCEL_TOTAL,
    P_FULL_TOTAL,
    P_HEAD,
    P_HWM,
    P_MAX,
    P_QLEN,
    P_TAIL,
    P_TIMEOUT_TOTAL,
    P_WAIT_NS,
    R_ENQ_NS,
    R_GRANTED,
    R_LIMIT,
    R_NEED,
    R_NEXT,
    R_OWNER,
    R_OWNER_GEN,
    R_POOL,
    R_PREV,
    R_SEQ,
    R_STATE,
    R_TAG,
    R_TICKET,
    R_TOTAL,
    S_GEN,
    S_HELD,
    S_LOOPMASK,
    S_PID,
    S_STATE,
    S_WAKE,
    SLOT_FREE,
    SLOT_LIVE,
    UNLOCK_MUTEX,
    SharedDualMemoryLimiterBase,
    SharedLimiterError,
    check_name,
    check_platform,
    check_settings,
    lock_open_byte,
    ofd_held,
    ofd_trylock,
    ofd_unlock,
    open_segment,
    pool_names,
    reopen_fd,
    shared_error,
    track_fork,
    unlink_segment,
    untrack_fork,
)

__all__ = [
    "SharedDualMemoryLimiter",
    "SharedLimiterError",
    "SharedSemaphore",
    "SharedSemaphorePermit",
]

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")
_monotonic_ns = time.monotonic_ns
_get_running_loop = asyncio.events._get_running_loop
_new = object.__new__

#: How often a waiter of this twin rereads its request (the issue: <= 10 ms).
POLL_S = 0.005
#: How often a process looks for event loops closed under its waiters.
LOOP_CHECK_S = 0.1
#: How often dead processes are looked for, host-wide (any process may).
SWEEP_NS = 250_000_000
#: Repairs one operation may run before it calls the segment corrupt.
MAX_REPAIRS = 3

IsCancelled = Optional[Callable[[], object]]
_T = TypeVar("_T")
_allocate_lock = _thread.allocate_lock

class _Sections(threading.local):
    #: How many critical sections (of any segment) this thread is inside.
    depth = 0


_sections = _Sections()

MSG_REENTERED = (
    "pylimiter: a finaliser or a signal handler called the host-wide limiter while its "
    "thread was inside the limiter's critical section; there only a release, or a queued "
    "request's cancellation, may be done (it completes as the section ends)")


class _Corrupt(Exception):
    """A walk found the segment inconsistent (a repair follows)."""


class _Waiter:
    """This process's side of one queued request (its record)."""

    __slots__ = ("check", "event", "fut", "limit", "loop", "n", "permit", "rec", "removed",
                 "state", "ticket", "granted", "timer")

    def __init__(self, n: int, check: IsCancelled, blocking: bool) -> None:
        # Made by the caller before the request can queue, so that an
        # interrupt anywhere after finds it to take it out of the queue
        # (before, one between the queueing and the return of the waiter
        # left a request nobody would collect: its grant was lost).  _begin
        # fills in the rest.
        self.rec = NIL
        self.ticket = 0
        # Set by _begin before the request can queue (None only until then).
        self.permit: SharedSemaphorePermit = None  # type: ignore[assignment]
        self.n = n
        self.check = check
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        # A blocking waiter's wake-up: a lock held until signalled.  Not an
        # Event: Event.set() takes the Event's own lock, which the waiting
        # thread holds around its wait -- where a finaliser or signal
        # handler that grants this very request runs set() and waits for
        # ever.  A lock's release never waits.
        self.event: Any = None
        if blocking:
            self.event = _allocate_lock()
            self.event.acquire()
        self.fut: Optional[asyncio.Future[None]] = None
        self.removed = False      # this process took it out of the queue
        self.state = W_QUEUED     # the outcome once collected
        self.granted = 0
        self.limit = 0
        self.timer: Optional[asyncio.TimerHandle] = None

    def signal(self) -> None:
        """Wake whoever waits on it (any thread)."""
        ev = self.event
        if ev is not None:
            try:
                ev.release()
            except RuntimeError:   # signalled already
                pass
            return
        fut, loop = self.fut, self.loop
        if fut is None or loop is None:
            return
        try:
            loop.call_soon_threadsafe(_resolve, fut)
        except RuntimeError:   # the loop is closed: nobody waits any more
            pass


def _sat_i64(v: int) -> int:
    """``v`` in int64's range: a sum over hostile values (a held count
    another process set to INT64_MAX) saturates, as the C twin's sat_add."""
    if -(1 << 63) <= v < (1 << 63):
        return v
    return -(1 << 63) if v < 0 else (1 << 63) - 1


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Seg:
    """One attachment of this process to a segment: the mapping, this
    process's slot, its locks and its local waiters.  Shared by the pools
    of a dual limiter."""

    def __init__(self, name: str, kind: int, maxes: tuple[int, ...], max_queue: int,
                 max_processes: int, directory: object) -> None:
        self.name = name
        self.kind = kind
        self.npools = len(maxes)
        self.max_queue = max_queue
        self.closed = False
        self.forked = False
        self._states: Optional[struct.Struct] = None
        self.slot = -1
        self.gen = 0
        self.reg: object = object()    # this registration; permits carry it
        # Threads of this process, before the file lock.  An RLock for its
        # owner: a finaliser or a signal handler run by this thread inside a
        # section (at any call or allocation there) must not wait for it.
        self.tlock = threading.RLock()
        self.waiters: dict[int, _Waiter] = {}
        self.loop_waiters: dict[asyncio.AbstractEventLoop, dict[_Waiter, None]] = {}
        #: loop -> [when its poll last ran (monotonic s), the poll's number]
        self.pollers: dict[asyncio.AbstractEventLoop, list[float]] = {}
        self.loops_checked = 0.0        # drop_closed_loops
        self.anon = [0] * self.npools   # permits held by `async with sem:`
        self.crash = 0                  # tests: die at the crash-th crash point
        self.lock_timeout = 10.0        # s: the bound on a live holder of the lock
        self.mm: Optional[mmap.mmap] = None
        self.fd = self.lockfd = -1
        opened = open_segment(name, directory, IMPL_PY, kind, maxes, pool_names(kind),
                              max_queue, max_processes)
        self.path = opened.path
        self.fd, self.lockfd, lay = opened.fd, opened.lockfd, opened.layout
        self.lay = lay
        self.maxp = lay.max_processes
        self.nrec = lay.nrec
        try:
            self.mm = mmap.mmap(self.fd, lay.size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
            self._register()
        except BaseException:
            self._drop_fds()
            raise
        finally:
            if self.lockfd >= 0:
                ofd_unlock(self.lockfd, OPEN_BYTE)
        track_fork(self)

    # ---- raw fields ------------------------------------------------------

    def u32(self, off: int) -> int:
        v: int = _U32.unpack_from(self.mm, off)[0]   # type: ignore[arg-type]
        return v

    def set_u32(self, off: int, v: int) -> None:
        _U32.pack_into(self.mm, off, v & 0xFFFFFFFF)   # type: ignore[arg-type]

    def i64(self, off: int) -> int:
        v: int = _I64.unpack_from(self.mm, off)[0]   # type: ignore[arg-type]
        return v

    def set_i64(self, off: int, v: int) -> None:
        _I64.pack_into(self.mm, off, _sat_i64(v))   # type: ignore[arg-type]

    def store_held(self, off: int, v: int, permit: Any, permits: int) -> None:
        """This process's held count at ``off`` := ``v`` and
        ``permit._permits`` := ``permits``, as one step for an interrupt:
        CPython runs a signal handler at a Python function's entry and after
        a C call returns, and between these two stores there is neither
        (the host's count and the permit object's must change together: an
        interrupt between them left permits that the host counted and no
        permit held, for the process's life, or the reverse, to be given
        back twice)."""
        v = _sat_i64(v)
        permit._permits = permits
        _I64.pack_into(self.mm, off, v)   # type: ignore[arg-type]

    def store_anon(self, off: int, v: int, p: int) -> None:
        """store_held for a permit of ``async with sem:`` (pool p), which
        the semaphore holds: one fewer of them."""
        v = _sat_i64(v)
        self.anon[p] -= 1
        _I64.pack_into(self.mm, off, v)   # type: ignore[arg-type]

    def add_i64(self, off: int, d: int) -> None:
        v = self.i64(off) + d
        if not -(1 << 63) <= v < (1 << 63):   # hostile values: wrap as C does
            v = (v + (1 << 63)) % (1 << 64) - (1 << 63)
        self.set_i64(off, v)

    def pool(self, p: int) -> int:
        return self.lay.pool(p)

    def crash_point(self) -> None:
        """Tests (``_crash_after``): SIGKILL this process at the n-th crash
        point passed, a place between two stores of a critical section."""
        if self.crash:
            self.crash -= 1
            if not self.crash:
                os.kill(os.getpid(), signal.SIGKILL)

    def slotoff(self, s: int) -> int:
        return self.lay.slot(s)

    def rec(self, r: int) -> int:
        return self.lay.rec(r)

    # ---- the lock ---------------------------------------------------------

    def lock(self) -> None:
        """Take the host's file lock, in run_locked (which holds this
        process's thread lock around it, and drops the file lock whatever
        happens here).  A dirty mark left by the previous holder means it
        died (or was interrupted) inside its section: repair first."""
        if not ofd_trylock(self.lockfd, MUTEX_BYTE):
            self._lock_slow()
        if self.u32(H_DIRTY):
            self.set_u32(H_DIRTY, 1)
            self.repair_locked()
        self.set_u32(H_DIRTY, 1)

    def _lock_slow(self) -> None:
        """Wait for the file lock, polling (a dead holder's lock is dropped
        by the kernel; a live one that keeps it past lock_timeout, stopped
        or stuck, makes this fail instead of hang)."""
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.00005
        while not ofd_trylock(self.lockfd, MUTEX_BYTE):
            if time.monotonic() > deadline:
                raise shared_error(self.path, "the segment lock is held by a live process "
                                              "that does not release it (stopped, or "
                                              "hostile)")
            time.sleep(delay)
            delay = min(delay * 2, 0.002)

    def inside(self) -> bool:
        """Whether this thread is inside a section (of any segment), or holds
        this segment's thread lock: a finaliser or signal handler runs here."""
        return bool(_sections.depth) or \
            self.tlock._is_owned()   # type: ignore[attr-defined]

    def defer_or_run(self, fn: Callable[..., object], *args: object) -> bool:
        """For what a finaliser or a signal handler may do -- give permits
        back, leave the queue --: False, to be done now; or, in a thread that
        is inside a section (the handler or finaliser ran there: the section
        is half done, and this thread holds its locks), True: ``fn(*args)``
        runs in pylimiter's worker thread (_deferred), which waits for the
        locks as any other thread would.  Inside another segment's section
        too: taking a second segment's locks there could wait for a process
        that waits for ours."""
        if not self.inside():
            return False
        later(fn, *args)
        return True

    def run_locked(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in a critical section.  ``fn`` raises only when
        interrupted; it returns the errors it decides on."""
        if self.tlock._is_owned():   # type: ignore[attr-defined]
            raise RuntimeError(MSG_REENTERED)
        fd = self.lockfd
        # A `with`: no interrupt lands between the take and the block (after
        # a bare acquire() one could, and keep the lock for good).
        with self.tlock:
            _sections.depth += 1
            try:
                done = False
                try:
                    # Inside the try: an interrupt that lands once the file
                    # lock is taken (after the call that took it returned)
                    # still reaches the finally below.
                    self.lock()
                    out = fn(*args)
                    done = True
                except struct.error:
                    # A value of another process's writing that no field may
                    # hold: the segment is corrupt, not this call's input.
                    raise shared_error(self.path,
                                       "corrupt while in use (a value out of range)") from None
                finally:
                    try:
                        if done:
                            self.set_u32(H_DIRTY, 0)
                        # else: interrupted midway: the dirty mark stays, and
                        # the next holder repairs.
                    finally:
                        # One C call, its arguments ready: no signal handler
                        # runs between here and the system call, so an
                        # interrupt cannot leave the host's lock held.
                        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, UNLOCK_MUTEX)
                return out
            finally:
                _sections.depth -= 1

    # ---- registration ------------------------------------------------------

    def _register(self) -> None:
        """Claim a free slot (the open lock is held): its OFD lock first, so
        nobody sees it LIVE without the lock, then the slot itself."""
        def claim() -> Optional[int]:
            self.sweep_locked(force=True)
            for s in range(self.maxp):
                base = self.slotoff(s)
                if self.u32(base + S_STATE) != SLOT_FREE:
                    continue
                if ofd_held(self.fd, LOCK_BASE + s):
                    continue   # registering, or a hostile state word: not ours
                if not ofd_trylock(self.lockfd, LOCK_BASE + s):
                    continue
                gen = (self.u32(base + S_GEN) + 1) & 0xFFFFFFFF
                self.set_u32(base + S_GEN, gen)
                _I32.pack_into(self.mm, base + S_PID, os.getpid())   # type: ignore[arg-type]
                for p in range(2):
                    self.set_i64(base + S_HELD + 8 * p, 0)
                self.set_u32(base + S_WAKE, 0)
                _U64.pack_into(self.mm, base + S_LOOPMASK, 0)   # type: ignore[arg-type]
                self.set_u32(base + S_STATE, SLOT_LIVE)   # the commit
                self.slot, self.gen = s, gen
                return s
            return None

        # The slot is ours before any other attached process could look.
        s = self.run_locked(claim)
        if s is None:
            raise shared_error(self.path, f"more than max_processes={self.maxp} processes "
                                          "are attached")
        self.reg = object()

    def ensure(self) -> None:
        """A forked child registers at its first call (issue 33, point 7)."""
        if self.forked and not self.closed:
            self._reregister()

    def _reregister(self) -> None:
        with self.tlock:
            if not self.forked:
                return
            lockfd = reopen_fd(self.fd)
            self.lockfd = lockfd
            try:
                lock_open_byte(lockfd, self.path)
            except BaseException:
                os.close(lockfd)
                self.lockfd = -1
                raise
            self.forked = False
        try:
            self._register()
        except BaseException:
            self.closed = True
            raise
        finally:
            ofd_unlock(self.lockfd, OPEN_BYTE)

    def _after_fork_in_child(self) -> None:
        # The parent's slot lock lives in a file description we share: drop
        # our reference, or the parent would look alive after its death.
        self.tlock = threading.RLock()
        if self.lockfd >= 0:
            try:
                os.close(self.lockfd)
            except OSError:
                pass
            self.lockfd = -1
        self.waiters = {}
        self.loop_waiters = {}
        self.pollers = {}
        self.anon = [0] * self.npools
        self.slot = -1
        self.reg = object()
        if not self.closed:
            self.forked = True

    def registered(self) -> bool:
        return self.slot >= 0 and not self.forked and not self.closed

    # ---- liveness and repair ------------------------------------------------

    def alive(self, s: int) -> bool:
        if s == self.slot and self.registered():
            return True
        return ofd_held(self.fd, LOCK_BASE + s)

    def sweep_due(self) -> bool:
        now = _monotonic_ns()
        last = self.i64(H_SWEEP)
        return not (last <= now < last + SWEEP_NS)

    def sweep(self) -> None:
        """Look for dead processes if nobody has for SWEEP_NS; repair if one
        is found."""
        if self.sweep_due():
            wakes = self.run_locked(self.sweep_locked)
            self.wake(wakes)

    def any_dead(self) -> bool:
        """plim_shm_any_dead: a slot taken but not locked by its process,
        asked without the lock (a slot is taken only once its lock is held,
        and freed before the lock is let go).  One struct read for every
        slot's state, then one fcntl per other taken slot."""
        st = self._states
        if st is None:
            offs = [self.slotoff(s) + S_STATE for s in range(self.maxp)]
            st = self._states = struct.Struct(
                "<I" + "".join(f"{b - a - 4}xI" for a, b in zip(offs, offs[1:])))
        states = st.unpack_from(self.mm, self.slotoff(0) + S_STATE)   # type: ignore[arg-type]
        for s, state in enumerate(states):
            if state != SLOT_FREE and not self.alive(s):
                return True
        return False

    def observe(self) -> None:
        """Before a count is read: a process that died since the last sweep
        gives back what it held now (issue 33, point 6: "at once when the
        next operation finds it dead"), not at the next timed sweep.  Not
        from a finaliser or signal handler inside a section: the next call
        will."""
        if self.inside():
            return
        if self.loop_waiters:
            self.drop_closed_loops()
        if self.sweep_due():
            self.sweep()
        elif self.any_dead():
            self.wake(self.run_locked(self.sweep_locked, True))
        elif self.u32(H_DIRTY):
            # A section under way, or one an interrupt stopped midway in a
            # live process: taking the lock repairs the latter (lock()).
            self.wake(self.run_locked(self.sweep_locked, False))

    def drop_closed_loops(self) -> None:
        """Waiters of an event loop that was closed while their tasks were
        parked (asyncio.run cancels them first; a loop closed by hand does
        not) will never run again: their requests leave the host's queue
        and a grant one got meanwhile goes back, instead of holding those
        permits until this process closes the semaphore or exits.  Looked
        at every LOOP_CHECK_S at most, from this process's calls."""
        now = time.monotonic()
        if now - self.loops_checked < LOOP_CHECK_S:
            return
        self.loops_checked = now
        for loop, ws in list(self.loop_waiters.items()):
            if not loop.is_closed():
                continue
            for w in list(ws):
                w.permit._sem._abandon(w, False)
            ws.clear()
            self.loop_waiters.pop(loop, None)
            self.pollers.pop(loop, None)

    def sweep_locked(self, force: bool = False) -> list[int]:
        if not force and not self.sweep_due():
            return []
        self.set_i64(H_SWEEP, _monotonic_ns())
        if self.any_dead():
            return self.repair_locked()
        return []

    def repair_locked(self) -> list[int]:
        """Rebuild every derived field from the facts; return the records
        whose owners should look at them (all decided ones)."""
        maxp, nrec = self.maxp, self.nrec
        alive = [False] * maxp
        gens = [0] * maxp
        held = [0] * self.npools
        for s in range(maxp):
            base = self.slotoff(s)
            gens[s] = self.u32(base + S_GEN)
            if self.alive(s):
                alive[s] = True
                if self.u32(base + S_STATE) != SLOT_LIVE:
                    self.set_u32(base + S_STATE, SLOT_LIVE)
                for p in range(self.npools):
                    h = self.i64(base + S_HELD + 8 * p)
                    if not 0 <= h <= MAX_ACQUIRED:
                        h = min(max(h, 0), MAX_ACQUIRED)
                        self.set_i64(base + S_HELD + 8 * p, h)
                    held[p] += h
            elif self.u32(base + S_STATE) != SLOT_FREE or any(
                    self.i64(base + S_HELD + 8 * p) for p in range(2)):
                # A dead process: everything it held goes back.
                gens[s] = (gens[s] + 1) & 0xFFFFFFFF
                self.set_u32(base + S_GEN, gens[s])
                for p in range(2):
                    self.set_i64(base + S_HELD + 8 * p, 0)
                self.set_u32(base + S_STATE, SLOT_FREE)
        bump = min(self.u32(H_BUMP), nrec)
        self.set_u32(H_BUMP, bump)
        queued: list[list[tuple[int, int]]] = [[] for _ in range(self.npools)]
        granted = [0] * self.npools
        free: list[int] = []
        decided: list[int] = []
        for r in range(bump):
            base = self.rec(r)
            st = self.u32(base + R_STATE)
            if st == W_IDLE:
                free.append(r)
                continue
            owner = self.u32(base + R_OWNER)
            pool = self.u32(base + R_POOL)
            need = self.i64(base + R_NEED)
            total = self.i64(base + R_TOTAL)
            g = self.i64(base + R_GRANTED)
            ok = (W_QUEUED <= st <= W_REMOVED and owner < maxp and alive[owner]
                  and self.u32(base + R_OWNER_GEN) == gens[owner] and pool < self.npools
                  and 0 <= need <= MAX_PERMITS and 0 <= total <= MAX_PERMITS
                  and 0 <= g <= MAX_PERMITS)
            if not ok:
                self.set_u32(base + R_STATE, W_IDLE)
                free.append(r)
                continue
            if st == W_QUEUED:
                queued[pool].append((self.u64(base + R_SEQ), r))
            else:
                if st == W_GRANTED:
                    granted[pool] += g
                decided.append(r)
        for p in range(self.npools):
            pb = self.pool(p)
            order = [r for _, r in sorted(queued[p])]
            prev = NIL
            for r in order:
                base = self.rec(r)
                self.set_u32(base + R_PREV, prev)
                self.set_u32(base + R_NEXT, NIL)
                if prev != NIL:
                    self.set_u32(self.rec(prev) + R_NEXT, r)
                prev = r
            self.set_u32(pb + P_HEAD, order[0] if order else NIL)
            self.set_u32(pb + P_TAIL, prev)
            self.set_i64(pb + P_QLEN, len(order))
            m = self.i64(pb + P_MAX)
            if m > MAX_PERMITS:
                m = MAX_PERMITS
                self.set_i64(pb + P_MAX, m)
            acquired = min(held[p] + granted[p], 2 * MAX_ACQUIRED)
            self.set_i64(pb + P_AVAIL, (m if m > 0 else 0) - acquired)
        nxt = NIL
        for r in reversed(free):
            self.set_u32(self.rec(r) + R_NEXT, nxt)
            nxt = r
        self.set_u32(H_FREE, nxt)
        for p in range(self.npools):
            try:
                decided += self.process_locked(p, repairs=MAX_REPAIRS)
            except _Corrupt:   # pragma: no cover - just rebuilt
                pass
        return decided

    def u64(self, off: int) -> int:
        v: int = _U64.unpack_from(self.mm, off)[0]   # type: ignore[arg-type]
        return v

    def fix(self, repairs: int) -> int:
        """A walk found an inconsistency: repair, or give up after a few."""
        if repairs >= MAX_REPAIRS:
            raise shared_error(self.path, "corrupt while in use (the repair did not hold)")
        self.repair_locked()
        return repairs + 1

    # ---- the queue (mirrors plim_shm.c) --------------------------------------

    def valid_rec(self, r: int) -> bool:
        return r < self.nrec

    def unlink_rec(self, p: int, r: int) -> None:
        """Take record r out of pool p's queue (its state already says it
        left: the state is the fact, the links are derived)."""
        base = self.rec(r)
        prev, nxt = self.u32(base + R_PREV), self.u32(base + R_NEXT)
        if (prev != NIL and not self.valid_rec(prev)) or (nxt != NIL and not self.valid_rec(nxt)):
            raise _Corrupt
        pb = self.pool(p)
        if prev == NIL:
            if self.u32(pb + P_HEAD) != r:
                raise _Corrupt
            self.set_u32(pb + P_HEAD, nxt)
        else:
            if self.u32(self.rec(prev) + R_NEXT) != r:
                raise _Corrupt
            self.set_u32(self.rec(prev) + R_NEXT, nxt)
        if nxt == NIL:
            if self.u32(pb + P_TAIL) != r:
                raise _Corrupt
            self.set_u32(pb + P_TAIL, prev)
        else:
            if self.u32(self.rec(nxt) + R_PREV) != r:
                raise _Corrupt
            self.set_u32(self.rec(nxt) + R_PREV, prev)
        self.set_u32(base + R_PREV, NIL)
        self.set_u32(base + R_NEXT, NIL)
        self.add_i64(pb + P_QLEN, -1)

    def link_tail(self, p: int, r: int) -> None:
        pb = self.pool(p)
        tail = self.u32(pb + P_TAIL)
        if tail != NIL and not self.valid_rec(tail):
            raise _Corrupt
        base = self.rec(r)
        self.set_u32(base + R_PREV, tail)
        self.set_u32(base + R_NEXT, NIL)
        if tail == NIL:
            self.set_u32(pb + P_HEAD, r)
        else:
            self.set_u32(self.rec(tail) + R_NEXT, r)
        self.set_u32(pb + P_TAIL, r)
        self.add_i64(pb + P_QLEN, 1)

    def alloc_locked(self) -> int:
        """A free record, or NIL."""
        for _ in range(2):
            r = self.u32(H_FREE)
            if r == NIL:
                break
            if self.valid_rec(r) and self.u32(self.rec(r) + R_STATE) == W_IDLE:
                self.set_u32(H_FREE, self.u32(self.rec(r) + R_NEXT))
                return r
            self.repair_locked()   # a corrupt free list: rebuild it
        b = self.u32(H_BUMP)
        if b < self.nrec:
            self.set_u32(H_BUMP, b + 1)
            return b
        return NIL

    def free_locked(self, r: int) -> None:
        base = self.rec(r)
        self.set_u32(base + R_STATE, W_IDLE)   # the commit: a fact
        self.set_u32(base + R_NEXT, self.u32(H_FREE))
        self.set_u32(H_FREE, r)

    def record_grant(self, p: int, wait_ns: int) -> None:
        pb = self.pool(p)
        self.add_i64(pb + P_ACQ_TOTAL, 1)
        self.add_i64(pb + P_WAIT_NS, max(0, wait_ns))
        self.add_i64(pb + P_BUCKETS + 8 * bucket_index(max(0, wait_ns) / 1e9), 1)
        acquired = self.acquired(p)
        if acquired > self.i64(pb + P_HWM):
            self.set_i64(pb + P_HWM, acquired)

    def acquired(self, p: int) -> int:
        pb = self.pool(p)
        m = self.i64(pb + P_MAX)
        avail = self.i64(pb + P_AVAIL)
        return m - avail if m > 0 else -avail

    def process_locked(self, p: int, repairs: int = 0) -> list[int]:
        """Grant the heads of pool p's queue while they fit; fail heads
        larger than a bounded limit.  Returns the records decided."""
        pb = self.pool(p)
        out: list[int] = []
        now = _monotonic_ns()
        steps = 0
        while True:
            steps += 1
            if steps > self.nrec + 2:
                repairs = self.fix(repairs)   # a cycle
                steps = 0
                continue
            h = self.u32(pb + P_HEAD)
            if h == NIL:
                return out
            base = self.rec(h)
            if (not self.valid_rec(h) or self.u32(base + R_STATE) != W_QUEUED
                    or self.u32(base + R_POOL) != p):
                repairs = self.fix(repairs)
                continue
            need = self.i64(base + R_NEED)
            m = self.i64(pb + P_MAX)
            avail = self.i64(pb + P_AVAIL)
            if m > 0:
                if self.i64(base + R_TOTAL) > m:
                    self.set_i64(base + R_LIMIT, m)
                    self.set_u32(base + R_STATE, W_TOO_LARGE)
                else:
                    if avail < need:
                        return out
                    self.set_i64(base + R_GRANTED, need)     # before the commit
                    self.crash_point()
                    self.set_u32(base + R_STATE, W_GRANTED)   # the commit
                    self.crash_point()
                    self.set_i64(pb + P_AVAIL, avail - need)
            else:
                if need - avail > MAX_ACQUIRED:
                    return out
                self.set_i64(base + R_GRANTED, need)
                self.set_u32(base + R_STATE, W_GRANTED)
                self.set_i64(pb + P_AVAIL, avail - need)
            self.crash_point()
            try:
                self.unlink_rec(p, h)
            except _Corrupt:
                repairs = self.fix(repairs)
            if self.u32(base + R_STATE) == W_GRANTED:
                self.record_grant(p, now - self.i64(base + R_ENQ_NS))
            out.append(h)

    # ---- waking ----------------------------------------------------------------

    def wake(self, recs: list[int]) -> None:
        """After the lock is dropped: wake this process's waiters among the
        decided records (other processes' waiters poll their records)."""
        waiters = self.waiters
        for r in recs:
            w = waiters.get(r)
            if w is not None:
                w.signal()

    def peek(self, w: _Waiter) -> int:
        """A waiter's record state, read without the lock (a snapshot)."""
        base = self.rec(w.rec)
        if (self.u32(base + R_TICKET) != w.ticket or self.u32(base + R_OWNER) != self.slot):
            return -1   # no longer ours: collect() says what happened
        return self.u32(base + R_STATE)

    # ---- closing ---------------------------------------------------------------

    def close(self) -> None:
        """Detach: this process's queued requests fail (closed), what it
        holds goes back, its slot is freed, then its slot lock."""
        if self.closed:
            return
        # Closed first: a waiter of this process that sees its record leave
        # must read "closed", not "lost".
        self.closed = True
        if self.forked:
            # A child that never registered: nothing of it is in the segment.
            self._drop_fds()
            untrack_fork(self)
            return

        def detach() -> list[int]:
            slot = self.slot
            decided: list[int] = []
            for r, w in list(self.waiters.items()):
                base = self.rec(r)
                if (self.u32(base + R_TICKET) == w.ticket and self.u32(base + R_OWNER) == slot
                        and self.u32(base + R_STATE) == W_QUEUED):
                    p = self.u32(base + R_POOL)
                    self.set_u32(base + R_STATE, W_CLOSED)
                    try:
                        self.unlink_rec(p if p < self.npools else 0, r)
                    except _Corrupt:
                        self.repair_locked()
            sb = self.slotoff(slot)
            for p in range(self.npools):
                h = self.i64(sb + S_HELD + 8 * p)
                self.set_i64(sb + S_HELD + 8 * p, 0)
                self.crash_point()
                if 0 < h <= MAX_ACQUIRED:
                    self.add_i64(self.pool(p) + P_AVAIL, h)
            # Grants made to us and not yet collected go back too.
            for r, w in list(self.waiters.items()):
                base = self.rec(r)
                if (self.u32(base + R_TICKET) == w.ticket
                        and self.u32(base + R_OWNER) == slot):
                    if self.u32(base + R_STATE) == W_GRANTED:
                        g = self.i64(base + R_GRANTED)
                        p = self.u32(base + R_POOL)
                        if p < self.npools and 0 <= g <= MAX_PERMITS:
                            self.add_i64(self.pool(p) + P_AVAIL, g)
                    w.state = self.u32(base + R_STATE)
                    if w.state == W_GRANTED:
                        w.state = W_CLOSED
                    self.free_locked(r)
            self.set_u32(sb + S_GEN, (self.u32(sb + S_GEN) + 1) & 0xFFFFFFFF)
            self.set_u32(sb + S_STATE, SLOT_FREE)
            for p in range(self.npools):
                decided += self.process_locked(p)
            return decided

        decided = self.run_locked(detach)
        waiters = list(self.waiters.values())
        self.waiters = {}
        for w in waiters:
            w.removed = True
            if w.state == W_QUEUED:
                w.state = W_CLOSED
            w.signal()
        del decided   # other processes' waiters poll their records
        try:
            ofd_unlock(self.lockfd, LOCK_BASE + self.slot)
        except OSError:
            pass
        self._drop_fds()
        untrack_fork(self)

    def _drop_fds(self) -> None:
        for attr in ("lockfd", "fd"):
            fd = getattr(self, attr)
            if fd >= 0:
                setattr(self, attr, -1)
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __del__(self) -> None:
        # A collected attachment detaches (its permits go back); inside a
        # section (collected there), by the worker, as a release would be.
        try:
            if not self.closed and self.mm is not None and self.slot >= 0:
                if self.inside():
                    later(self.close)
                else:
                    self.close()
        except Exception:
            pass


# ---- permits and requests ---------------------------------------------------------


class SharedSemaphorePermit(NoCopy):
    """Permits held from a SharedSemaphore by this process.

    ``permits`` is what it holds now; ``update`` changes it in place and
    ``release`` sets it to 0.  Used as a context manager it is released on
    exit.  Only the process that acquired it can release or update it.
    """

    __slots__ = ("__weakref__", "_pending", "_permits", "_reg", "_sem")

    _sem: SharedSemaphore
    _permits: int
    _pending: Optional[_Waiter]
    _reg: object

    def __new__(cls, *args: object, **kwargs: object) -> SharedSemaphorePermit:
        raise TypeError(MSG_PERMIT_NOT_CONSTRUCTIBLE)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(MSG_PERMIT_NOT_CONSTRUCTIBLE)

    @property
    def permits(self) -> int:
        """The number of permits this object holds (0 once its semaphore
        is closed here: close() gave them back)."""
        if self._sem._seg.closed:
            return 0
        return self._permits

    def __enter__(self) -> SharedSemaphorePermit:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sem.release(self)

    def __repr__(self) -> str:
        return f"<SharedSemaphorePermit permits={self._permits}>"


def _new_permit(sem: SharedSemaphore) -> SharedSemaphorePermit:
    p: SharedSemaphorePermit = _new(SharedSemaphorePermit)
    p._sem = sem
    p._permits = 0
    p._pending = None
    p._reg = sem._seg.reg
    return p


class _SharedRequest(NoCopy, ReleasingRequest[SharedSemaphorePermit]):
    """What ``acquire``/``update`` return: awaitable once (it joins the
    host's queue when first awaited), an async context manager that releases
    the permit on exit, and a coroutine (``asyncio.create_task`` takes it)."""

    __slots__ = ("_anon", "_gen", "_is_cancelled", "_n", "_permit", "_result", "_sem",
                 "_stage", "_timeout")

    _sem: SharedSemaphore
    _permit: Optional[SharedSemaphorePermit]
    _n: int
    _timeout: Optional[float]
    _is_cancelled: IsCancelled
    _stage: int
    _result: Optional[SharedSemaphorePermit]
    _gen: Optional[Generator[Any, None, Optional[SharedSemaphorePermit]]]
    _anon: bool

    def __new__(cls, *args: object, **kwargs: object) -> _SharedRequest:
        raise TypeError(MSG_REQUEST_NOT_CONSTRUCTIBLE)

    def __await__(self) -> Generator[Any, None, SharedSemaphorePermit]:
        if self._stage:
            raise RuntimeError(MSG_ALREADY_AWAITED)
        self._stage = 1
        g = self._gen = self._run()
        return g   # type: ignore[return-value]

    def send(self, value: object) -> Any:
        """Coroutine protocol: advance the request."""
        if self._stage == 2:
            raise RuntimeError(MSG_REUSED)
        g = self._gen
        if g is None:
            self._stage = 1
            g = self._gen = self._run()
        return g.send(None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Coroutine protocol: the awaiting task is cancelled or interrupted."""
        g = self._gen
        self._stage = 2
        try:
            exc = thrown_exception(typ, val, tb)
        except BaseException:
            if g is not None:
                g.close()
            raise
        if g is None:
            raise exc
        return g.throw(exc)

    def close(self) -> None:
        """Coroutine protocol: the awaiting coroutine is closed."""
        g = self._gen
        self._stage = 2
        if g is not None:
            g.close()

    def _run(self) -> Generator[Any, None, Optional[SharedSemaphorePermit]]:
        try:
            p = yield from self._sem._acquire_async(self._permit, self._n, self._timeout,
                                                    self._is_cancelled)
            if self._anon:
                sem = self._sem
                with sem._seg.tlock:
                    sem._seg.anon[sem._p] += p._permits
                    p._permits = 0
                return None
            self._result = p
            return p
        finally:
            self._stage = 2

    def _release_result(self, permit: SharedSemaphorePermit) -> None:
        self._sem.release(permit)


def _new_request(sem: SharedSemaphore, permit: Optional[SharedSemaphorePermit], n: int,
                 timeout: Optional[float], is_cancelled: IsCancelled) -> _SharedRequest:
    r: _SharedRequest = _new(_SharedRequest)
    r._sem = sem
    r._permit = permit
    r._n = n
    r._timeout = timeout
    r._is_cancelled = is_cancelled
    r._stage = 0
    r._result = None
    r._gen = None
    r._anon = False
    return r


def _reopen(cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return cls(*args, **kwargs)


class SharedSemaphore:
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

    _seg: _Seg
    _p: int
    _pb: int
    _timeout: Optional[float]
    _ready: bool
    _owner: bool

    def __new__(cls, *args: Any, **kwargs: Any) -> SharedSemaphore:
        self = super().__new__(cls)
        self._ready = False
        return self

    def __init__(self, name: str, max_permits: int = 256 << 20, max_queue_size: int = 10000,
                 timeout: Optional[float] = 25.0, *, directory: Any = None,
                 max_processes: int = 256) -> None:
        if getattr(self, "_ready", False):
            raise RuntimeError("pylimiter: SharedSemaphore is already initialised")
        name = check_name(name)
        (m,), q, procs = check_settings((max_permits,), ("max_permits",), max_queue_size,
                                        max_processes)
        t = check_timeout(timeout, None)
        check_platform("SharedSemaphore")
        seg = _Seg(name, KIND_SEM, (m,), q, procs, directory)
        self._bind(seg, 0, t, True)
        self._args = (name, max_permits, max_queue_size, timeout)
        self._kwargs = {"directory": directory, "max_processes": max_processes}

    def _bind(self, seg: _Seg, p: int, timeout: Optional[float], owner: bool) -> None:
        self._seg = seg
        self._p = p
        self._pb = seg.pool(p)
        self._timeout = timeout
        self._owner = owner
        self._ready = True

    @classmethod
    def _pool_view(cls, seg: _Seg, p: int, timeout: Optional[float]) -> SharedSemaphore:
        self = cls.__new__(cls)
        self._bind(seg, p, timeout, False)
        return self

    unlink = staticmethod(unlink_segment)

    def __copy__(self) -> Any:
        raise no_copy_error(self)

    def __deepcopy__(self, memo: object) -> Any:
        raise no_copy_error(self)

    def __reduce__(self) -> Any:
        if not getattr(self, "_ready", False) or not self._owner:
            raise no_copy_error(self)
        return (_reopen, (type(self), self._args, self._kwargs))

    def _s(self) -> _Seg:
        if not self._ready:
            raise uninitialised_error(self)
        seg = self._seg
        if seg.forked:
            seg.ensure()
        return seg

    # ---- properties -------------------------------------------------------

    @property
    def name(self) -> str:
        """The segment's name."""
        return self._s().name

    @property
    def path(self) -> str:
        """The segment file's path."""
        return self._s().path

    def _fresh(self) -> _Seg:
        seg = self._s()
        if not seg.closed:
            seg.observe()
        return seg

    @property
    def max_permits(self) -> int:
        """The host's limit, as last set by any process (<= 0: unbounded)."""
        seg = self._s()
        return seg.i64(self._pb + P_MAX)

    @property
    def available_permits(self) -> int:
        """max_permits - acquired_permits, host-wide (negative after the
        limit was lowered); ``2**63 - 1`` when unbounded."""
        seg = self._fresh()
        if seg.i64(self._pb + P_MAX) <= 0:
            return UNBOUNDED_AVAILABLE
        return seg.i64(self._pb + P_AVAIL)

    @property
    def acquired_permits(self) -> int:
        """Permits held now by every process of the host."""
        seg = self._fresh()
        return seg.acquired(self._p)

    @property
    def peak_acquired_permits(self) -> int:
        """The most permits held at once host-wide since the segment was
        created (or re-initialised): a high-water mark kept in the segment."""
        return self._s().i64(self._pb + P_HWM)

    @property
    def queue_size(self) -> int:
        """Requests waiting in the host's queue."""
        seg = self._fresh()
        return max(0, seg.i64(self._pb + P_QLEN))

    @property
    def max_queue_size(self) -> int:
        """The queue bound the segment was created with (<= 0: unbounded)."""
        return self._s().max_queue

    @property
    def closed(self) -> bool:
        """True after this process's close()."""
        return self._s().closed

    def locked(self) -> bool:
        """True when ``acquire(1)`` could not be granted at once here: fewer
        than one permit available host-wide, requests queued, or closed."""
        seg = self._fresh()
        if seg.closed:
            return True
        if seg.i64(self._pb + P_MAX) <= 0:
            return False
        return seg.i64(self._pb + P_QLEN) > 0 or seg.i64(self._pb + P_AVAIL) < 1

    def __repr__(self) -> str:
        if not getattr(self, "_ready", False):
            return uninitialised_repr(self)
        seg = self._seg
        return (f"<SharedSemaphore {seg.name!r} max_permits={seg.i64(self._pb + P_MAX)} "
                f"acquired={seg.acquired(self._p)} queued={seg.i64(self._pb + P_QLEN)}"
                f"{' closed' if seg.closed else ''}>")

    def stats(self) -> SemaphoreStats:
        """A snapshot of the host's gauges, counters and wait histogram."""
        seg = self._fresh()
        pb = self._pb

        def snap() -> SemaphoreStats:
            m = seg.i64(pb + P_MAX)
            counts = [max(0, seg.i64(pb + P_BUCKETS + 8 * i)) for i in range(len(WAIT_BUCKETS))]
            return SemaphoreStats(
                max_permits=m,
                acquired_permits=seg.acquired(self._p),
                available_permits=seg.i64(pb + P_AVAIL) if m > 0 else UNBOUNDED_AVAILABLE,
                queue_size=max(0, seg.i64(pb + P_QLEN)),
                max_queue_size=seg.max_queue,
                acquired_total=seg.i64(pb + P_ACQ_TOTAL),
                timeout_total=seg.i64(pb + P_TIMEOUT_TOTAL),
                queue_full_total=seg.i64(pb + P_FULL_TOTAL),
                cancelled_total=seg.i64(pb + P_CANCEL_TOTAL),
                wait_seconds_sum=seg.i64(pb + P_WAIT_NS) / 1e9,
                wait_seconds_count=sum(counts),
                wait_seconds_buckets=cumulative_buckets(counts),
            )

        if seg.closed:
            return snap()
        return seg.run_locked(snap)

    def holders(self) -> dict[int, int]:
        """``{pid: permits held}`` for every live attached process, idle ones
        with 0, this one included (after a sweep for dead ones)."""
        return {pid: held[self._p] for pid, held in _holders(self._s()).items()}

    def _audit(self) -> dict[str, int]:
        """Tests: the books of this pool, read in one critical section after
        a sweep: ``acquired`` (from the available count) must equal ``held``
        (by live processes) + ``granted`` (decided, not yet collected), and
        ``qlen`` the ``queued`` records and the ``linked`` ones."""
        return _audit(self._s(), self._p)

    def _crash_after(self, n: int) -> None:
        """Tests: SIGKILL this process at the n-th crash point it passes."""
        self._s().crash = n

    def _set_lock_timeout(self, seconds: float) -> None:
        """Tests: the bound on waiting for a live holder of the host's lock."""
        self._s().lock_timeout = seconds

    # ---- the algorithm --------------------------------------------------------

    def _check_permit(self, permit: object) -> SharedSemaphorePermit:
        if type(permit) is not SharedSemaphorePermit or permit._sem is not self:
            raise permit_error(permit, SharedSemaphorePermit)
        if permit._reg is not self._seg.reg and permit._permits:
            raise TypeError(MSG_FOREIGN_PROCESS_PERMIT)
        return permit

    def _limits(self, seg: _Seg) -> tuple[int, bool]:
        m = seg.i64(self._pb + P_MAX)
        return m, m > 0

    def _take_locked(self, seg: _Seg, need: int, permit: SharedSemaphorePermit) -> None:
        """This process takes ``need`` more permits, into ``permit``."""
        pb = self._pb
        seg.add_i64(pb + P_AVAIL, -need)
        seg.crash_point()
        sb = seg.slotoff(seg.slot) + S_HELD + 8 * self._p
        seg.store_held(sb, seg.i64(sb) + need, permit, permit._permits + need)
        seg.record_grant(self._p, 0)

    def _fits_locked(self, seg: _Seg, need: int) -> Any:
        """True, False, or an error (overflow)."""
        pb = self._pb
        m = seg.i64(pb + P_MAX)
        avail = seg.i64(pb + P_AVAIL)
        if m <= 0:
            if need - avail > MAX_ACQUIRED:
                return overflow_error()
            return True
        return need == 0 or (seg.i64(pb + P_QLEN) == 0 and seg.u32(pb + P_HEAD) == NIL
                             and avail >= need)

    def _give_back_locked(self, seg: _Seg, n: int, pending: Optional[_Waiter],
                          permit: Optional[SharedSemaphorePermit] = None,
                          permits: int = 0) -> list[int]:
        """This process returns n permits it holds: ``permit``'s, which
        keeps ``permits``, or (None) one that ``async with sem:`` took."""
        sb = seg.slotoff(seg.slot) + S_HELD + 8 * self._p
        held = seg.i64(sb)
        n = min(n, max(held, 0))   # never more than the segment says we hold
        if permit is None:
            seg.store_anon(sb, held - n, self._p)
        else:
            seg.store_held(sb, held - n, permit, permits)
        seg.crash_point()
        if pending is not None and not pending.removed:
            base = seg.rec(pending.rec)
            if (seg.u32(base + R_TICKET) == pending.ticket
                    and seg.u32(base + R_STATE) == W_QUEUED):
                seg.add_i64(base + R_NEED, n)   # the update now takes the whole size
        seg.add_i64(self._pb + P_AVAIL, n)
        return seg.process_locked(self._p)

    def try_acquire(self, n: int = 1) -> Optional[SharedSemaphorePermit]:
        """Take ``n`` permits now if they fit and nobody queues anywhere on
        the host; else None.  Never waits, never overtakes."""
        seg = self._s()
        m, bounded = self._limits(seg)
        n = check_permits(n, m, bounded)
        if seg.closed:
            raise closed_error()

        def take() -> Any:
            fits = self._fits_locked(seg, n)
            if fits is False and (seg.sweep_due() or seg.any_dead()):
                # Refused: a dead process may hold what is missing.
                seg.wake(seg.sweep_locked(True))
                fits = self._fits_locked(seg, n)
            if fits is not True:
                return fits
            self._take_locked(seg, n, p)
            return None

        p = _new_permit(self)
        err = seg.run_locked(take)
        if err is False:
            return None
        if err is not None:
            raise err
        return p

    def release(self, permit: SharedSemaphorePermit) -> None:
        """Give back everything ``permit`` holds and set it to 0.  Releasing
        again is a no-op, and so is a release after close() (close gave the
        permits back)."""
        permit = self._check_permit(permit)
        n = permit._permits
        if n == 0:
            return
        seg = self._seg
        if seg.closed or permit._reg is not seg.reg:
            permit._permits = 0
            return
        if seg.defer_or_run(self.release, permit):
            return

        def give() -> list[int]:
            # Read here: another thread may have released it meanwhile.
            n = permit._permits
            if n == 0:
                return []
            return self._give_back_locked(seg, n, permit._pending, permit, 0)

        seg.wake(seg.run_locked(give))

    def _shrink(self, seg: _Seg, permit: SharedSemaphorePermit, n: int) -> bool:
        if permit._pending is not None:
            raise RuntimeError(MSG_UPDATE_IN_PROGRESS)
        if seg.closed:
            permit._permits = 0   # close() gave them back: growing is refused
        cur = permit._permits
        if n > cur:
            return False
        if n == cur:
            return True

        def give() -> list[int]:
            # Read here: another thread may have released it meanwhile.
            cur = permit._permits
            if n >= cur:
                return []
            return self._give_back_locked(seg, cur - n, None, permit, n)

        seg.wake(seg.run_locked(give))
        return True

    def _begin(self, permit: Optional[SharedSemaphorePermit], n: int, timeout: Optional[float],
               is_cancelled: IsCancelled, w: _Waiter) -> Any:
        """The start of every acquire/update: the permit when done at once,
        or ``w``, queued.  Raises on immediate failure."""
        blocking = w.event is not None
        seg = self._s()
        m, bounded = self._limits(seg)
        cancelled, cause = False, None
        if is_cancelled is not None and bounded:
            cancelled, cause = ask_cancelled(is_cancelled)
        if permit is not None and self._shrink(seg, permit, n):
            return permit
        loop = None if blocking else _get_running_loop()
        if seg.closed:
            raise closed_error()
        if permit is None:
            permit = _new_permit(self)
        w.permit = permit
        w.loop = loop
        if seg.loop_waiters:
            seg.drop_closed_loops()
        seg.sweep()
        p = self._p
        pb = self._pb

        def begin() -> Any:
            # acquire(0) is granted at once, as AsyncSemaphore's (a new
            # permit holds 0 >= n); an update reaches here only to grow.
            if permit._pending is not None or (permit._permits >= n and n > 0):
                return RuntimeError(MSG_UPDATE_IN_PROGRESS)
            need = n - permit._permits
            if cancelled:
                seg.add_i64(pb + P_CANCEL_TOTAL, 1)
                return cancelled_error(cause)
            fits = self._fits_locked(seg, need)
            if fits is False and seg.any_dead():
                # Refused: a process that died since the last sweep may hold
                # what is missing; its permits come back before we queue.
                seg.wake(seg.sweep_locked(True))
                fits = self._fits_locked(seg, need)
            if fits is True:
                self._take_locked(seg, need, permit)
                return permit
            if fits is not False:
                return fits
            if timeout == 0:
                seg.add_i64(pb + P_TIMEOUT_TOTAL, 1)
                return timeout_zero_error()
            if not blocking and loop is None:
                return no_loop_error()
            cur_max = seg.i64(pb + P_MAX)
            if cur_max > 0 and n > cur_max:
                return too_large_error(n, cur_max)
            q = seg.max_queue
            if (q > 0 and seg.i64(pb + P_QLEN) >= q) or (r := seg.alloc_locked()) == NIL:
                seg.add_i64(pb + P_FULL_TOTAL, 1)
                return queue_full_error(q if q > 0 else seg.i64(pb + P_QLEN))
            base = seg.rec(r)
            ticket = (seg.u32(H_TICKET) + 1) & 0xFFFFFFFF
            w.ticket = ticket   # before the record can be ours: _abandon checks it
            w.rec = r
            seg.set_u32(H_TICKET, ticket)
            seq = (seg.u64(H_SEQ) + 1) & 0xFFFFFFFFFFFFFFFF
            _U64.pack_into(seg.mm, H_SEQ, seq)   # type: ignore[arg-type]
            seg.set_u32(base + R_OWNER, seg.slot)
            seg.set_u32(base + R_OWNER_GEN, seg.gen)
            seg.set_u32(base + R_TICKET, ticket)
            seg.set_u32(base + R_POOL, p)
            seg.set_u32(base + R_TAG, 0 if loop is None else 1)
            seg.set_i64(base + R_NEED, need)
            seg.set_i64(base + R_TOTAL, n)
            seg.set_i64(base + R_GRANTED, 0)
            seg.set_i64(base + R_LIMIT, 0)
            _U64.pack_into(seg.mm, base + R_SEQ, seq)   # type: ignore[arg-type]
            seg.set_i64(base + R_ENQ_NS, _monotonic_ns())
            seg.crash_point()
            try:
                seg.link_tail(p, r)
            except _Corrupt:
                seg.set_u32(base + R_STATE, W_QUEUED)
                seg.repair_locked()   # links rebuilt from the states, ours included
            else:
                seg.set_u32(base + R_STATE, W_QUEUED)   # the commit
            seg.waiters[r] = w
            if permit._permits:
                permit._pending = w
            return w

        out = seg.run_locked(begin)
        if isinstance(out, BaseException):
            raise out
        return out

    def _collect(self, w: _Waiter) -> list[int]:
        """Under the lock: take the outcome of w's record (a grant moves into
        this process's held permits), free the record."""
        seg = self._seg
        seg.waiters.pop(w.rec, None)
        permit = w.permit
        if permit._pending is w:
            permit._pending = None
        if w.removed:
            return []
        base = seg.rec(w.rec)
        if (seg.u32(base + R_TICKET) != w.ticket or seg.u32(base + R_OWNER) != seg.slot
                or seg.u32(base + R_OWNER_GEN) != seg.gen):
            w.state = -1
            return []
        st = seg.u32(base + R_STATE)
        if st == W_QUEUED:
            raise AssertionError("collect of a queued request")   # pragma: no cover
        w.state = st
        g = seg.i64(base + R_GRANTED)
        if st == W_TOO_LARGE:
            w.limit = seg.i64(base + R_LIMIT)
        # The record first, then held: between the two stores the grant is
        # counted by neither (a death there drops held anyway), never by both.
        seg.free_locked(w.rec)
        if st == W_GRANTED:
            if not 0 <= g <= MAX_PERMITS:
                w.state = -1
                return []
            seg.crash_point()
            sb = seg.slotoff(seg.slot) + S_HELD + 8 * self._p
            seg.store_held(sb, seg.i64(sb) + g, permit, permit._permits + g)
            w.granted = g
        return []

    def _abandon(self, w: _Waiter, timed_out: bool) -> None:
        """The requester stops waiting: a queued request leaves the queue; a
        grant that raced with a cancel goes back, one that raced with a
        timeout stands (the caller collects it)."""
        seg = self._seg
        if w.removed or seg.closed or w.rec == NIL:   # NIL: it never queued
            return
        if seg.defer_or_run(self._abandon, w, timed_out):
            return
        pb = self._pb

        def abandon() -> list[int]:
            base = seg.rec(w.rec)
            mine = (seg.u32(base + R_TICKET) == w.ticket and seg.u32(base + R_OWNER) == seg.slot)
            if not mine:
                return []
            st = seg.u32(base + R_STATE)
            if st == W_QUEUED:
                was_head = seg.u32(pb + P_HEAD) == w.rec
                seg.set_u32(base + R_STATE, W_REMOVED)
                try:
                    seg.unlink_rec(self._p, w.rec)
                except _Corrupt:
                    seg.repair_locked()
                seg.free_locked(w.rec)
                seg.waiters.pop(w.rec, None)
                w.removed = True
                w.state = W_REMOVED
                if w.permit._pending is w:
                    w.permit._pending = None
                seg.add_i64(pb + (P_TIMEOUT_TOTAL if timed_out else P_CANCEL_TOTAL), 1)
                return seg.process_locked(self._p) if was_head else []
            if st == W_GRANTED and not timed_out:
                g = seg.i64(base + R_GRANTED)
                seg.free_locked(w.rec)
                seg.waiters.pop(w.rec, None)
                w.removed = True
                w.state = W_CANCELLED
                if w.permit._pending is w:
                    w.permit._pending = None
                seg.add_i64(pb + P_CANCEL_TOTAL, 1)
                if 0 <= g <= MAX_PERMITS:
                    seg.add_i64(pb + P_AVAIL, g)
                return seg.process_locked(self._p)
            return []

        seg.wake(seg.run_locked(abandon))

    def _finish(self, w: _Waiter, timeout: Optional[float]) -> SharedSemaphorePermit:
        """The outcome, once w left the queue: the permit, or the error."""
        seg = self._seg
        if not w.removed and not seg.closed:
            seg.wake(seg.run_locked(self._collect, w))
        st = w.state
        if st == W_QUEUED and seg.closed:
            st = W_CLOSED   # woken by this process's close()
        if st == W_GRANTED:
            if w.check is not None:
                cancelled, cause = ask_cancelled(w.check)
                if cancelled:
                    self._cancel_grant(w)
                    raise cancelled_error(cause)
            return w.permit
        if st == -1:
            raise shared_error(seg.path, MSG_REQUEST_LOST[len("pylimiter: "):])
        if st == W_CLOSED and seg.closed:
            raise left_queue_error(W_CLOSED, w.n, 0, None, timeout)
        raise left_queue_error(st, w.n, w.limit, None, timeout)

    def _cancel_grant(self, w: _Waiter) -> None:
        """is_cancelled said yes after the grant: the granted permits go back."""
        seg = self._seg
        g = w.granted
        permit = w.permit
        pb = self._pb

        def give() -> list[int]:
            seg.add_i64(pb + P_CANCEL_TOTAL, 1)
            return self._give_back_locked(seg, g, None, permit, permit._permits - g)

        if not seg.closed:
            seg.wake(seg.run_locked(give))
        else:
            permit._permits -= g

    def _acquire_async(self, permit: Optional[SharedSemaphorePermit], n: int,
                       timeout: Optional[float], is_cancelled: IsCancelled
                       ) -> Generator[Any, None, SharedSemaphorePermit]:
        w = _Waiter(n, is_cancelled, False)
        loop = None
        try:
            r = self._begin(permit, n, timeout, is_cancelled, w)
            if r is not w:
                return r   # type: ignore[no-any-return]
            seg = self._seg
            loop = w.loop
            assert loop is not None
            if timeout is not None:
                w.timer = loop.call_later(min(timeout, MAX_TIMEOUT_S), self._on_timeout, w)
            seg.loop_waiters.setdefault(loop, {})[w] = None   # FIFO order
            self._ensure_poller(loop)
            while not w.removed and not seg.closed and seg.peek(w) == W_QUEUED:
                fut = w.fut = loop.create_future()
                if seg.peek(w) != W_QUEUED or w.removed:   # decided meanwhile
                    break
                yield from fut
        except BaseException:
            self._abandon(w, False)
            raise
        finally:
            w.fut = None
            if w.timer is not None:
                w.timer.cancel()
            if loop is not None:
                ws = self._seg.loop_waiters.get(loop)
                if ws is not None:
                    ws.pop(w, None)
        return self._finish(w, timeout)

    def _on_timeout(self, w: _Waiter) -> None:
        self._abandon(w, True)
        w.signal()

    def _ensure_poller(self, loop: asyncio.AbstractEventLoop) -> None:
        seg = self._seg
        st = seg.pollers.get(loop)
        # A poll that has not run for 20 periods may be gone: an interrupt
        # at its entry (before its finally could schedule the next) stopped
        # the loop with it.  Start a new one; the old one, if it was only
        # late, stops when it sees it is not the current one.
        if st is not None and time.monotonic() - st[0] < 20 * POLL_S:
            return
        num = 0.0 if st is None else st[1] + 1
        seg.pollers[loop] = [time.monotonic(), num]
        loop.call_later(POLL_S, _poll, seg, loop, num)

    def _run_blocking(self, permit: Optional[SharedSemaphorePermit], n: int,
                      timeout: Optional[float], is_cancelled: IsCancelled
                      ) -> SharedSemaphorePermit:
        w = _Waiter(n, is_cancelled, True)
        ev = w.event
        try:
            r = self._begin(permit, n, timeout, is_cancelled, w)
            if r is not w:
                return r   # type: ignore[no-any-return]
            seg = self._seg
            deadline = None if timeout is None else \
                time.monotonic() + min(timeout, MAX_TIMEOUT_S)
            while not w.removed and not seg.closed and seg.peek(w) == W_QUEUED:
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._abandon(w, True)
                        break
                    ev.acquire(True, min(left, POLL_S))
                else:
                    ev.acquire(True, POLL_S)
                if seg.sweep_due() and not seg.closed:
                    seg.sweep()
        except BaseException:
            self._abandon(w, False)
            raise
        return self._finish(w, timeout)

    # ---- public API -------------------------------------------------------------

    def acquire(self, n: int = 1, *, timeout: Optional[float] = TIMEOUT_NOT_GIVEN,
                is_cancelled: IsCancelled = None, permits: Optional[int] = None
                ) -> _SharedRequest:
        """Return an awaitable of a new SharedSemaphorePermit holding ``n``
        permits (``permits=`` is accepted as AsyncSemaphore's spelling).

        The request joins the host's queue when first awaited.  It fails with
        PermitAcquireTimeoutError, PermitAcquireQueueFullError,
        PermitAcquireAlreadyClosedError or PermitAcquireCancelledError.
        ``async with sem.acquire(n) as p:`` releases p on exit.
        """
        seg = self._s()
        n = _pick_n(n, permits)
        m, bounded = self._limits(seg)
        n = check_permits(n, m, bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        if seg.closed:
            raise closed_error()
        return _new_request(self, None, n, t, is_cancelled)

    def acquire_blocking(self, n: int = 1, *, timeout: Optional[float] = TIMEOUT_NOT_GIVEN,
                         is_cancelled: IsCancelled = None, permits: Optional[int] = None
                         ) -> SharedSemaphorePermit:
        """Blocking twin of ``acquire`` for threads (the GIL is released
        while waiting)."""
        seg = self._s()
        n = _pick_n(n, permits)
        m, bounded = self._limits(seg)
        n = check_permits(n, m, bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return self._run_blocking(None, n, t, is_cancelled)

    def update(self, permit: SharedSemaphorePermit, new_permits: int, *,
               timeout: Optional[float] = TIMEOUT_NOT_GIVEN,
               is_cancelled: IsCancelled = None) -> _SharedRequest:
        """Return an awaitable that changes ``permit`` to ``new_permits`` in
        place and returns it.  Shrinking completes at once; growing queues
        for the difference, and on failure the permit keeps what it had."""
        seg = self._s()
        self._check_permit(permit)
        m, bounded = self._limits(seg)
        n = check_permits(new_permits, m, bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return _new_request(self, permit, n, t, is_cancelled)

    def update_blocking(self, permit: SharedSemaphorePermit, new_permits: int, *,
                        timeout: Optional[float] = TIMEOUT_NOT_GIVEN,
                        is_cancelled: IsCancelled = None) -> SharedSemaphorePermit:
        """Blocking twin of ``update``."""
        seg = self._s()
        self._check_permit(permit)
        m, bounded = self._limits(seg)
        n = check_permits(new_permits, m, bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return self._run_blocking(permit, n, t, is_cancelled)

    def set_max_permits(self, max_permits: int) -> None:
        """Change the host's limit, live, for every process: ``> 0`` bounds
        it (queued requests larger than it fail with ValueError, waiters that
        now fit are granted); ``<= 0`` makes it unbounded."""
        m = check_new_max(max_permits)
        seg = self._s()
        if seg.closed:
            raise closed_error()
        pb = self._pb

        def set_max() -> list[int]:
            old = seg.i64(pb + P_MAX)
            seg.set_i64(pb + P_MAX, m)   # the fact; avail follows
            seg.crash_point()
            seg.add_i64(pb + P_AVAIL, max(0, m) - max(0, old))
            return seg.process_locked(self._p)

        seg.wake(seg.run_locked(set_max))

    if TYPE_CHECKING:
        async def __aenter__(self) -> None:
            """``async with sem:`` takes one permit (as asyncio.Semaphore)."""

        async def __aexit__(self, exc_type: Optional[type[BaseException]],
                            exc: Optional[BaseException],
                            tb: Optional[TracebackType]) -> None: ...
    else:
        def __aenter__(self):
            """``async with sem:`` takes one permit (as asyncio.Semaphore)."""
            seg = self._s()
            if seg.closed:
                raise closed_error()
            r = _new_request(self, None, 1, self._timeout, None)
            r._anon = True
            return r

        def __aexit__(self, exc_type, exc, tb):
            seg = self._s()
            if not seg.defer_or_run(self._anon_exit, seg):
                self._anon_exit(seg)
            return DONE

    def _anon_exit(self, seg: _Seg) -> None:
        p = self._p
        if seg.closed:
            with seg.tlock:
                if seg.anon[p] <= 0:
                    raise RuntimeError(MSG_ANON_EXIT)
                seg.anon[p] -= 1
            return

        def give() -> Any:
            if seg.anon[p] <= 0:
                return RuntimeError(MSG_ANON_EXIT)
            return self._give_back_locked(seg, 1, None)

        out = seg.run_locked(give)
        if isinstance(out, RuntimeError):
            raise out
        seg.wake(out)

    def close(self) -> None:
        """Detach this process (idempotent): its queued requests fail with
        PermitAcquireAlreadyClosedError, and so do later acquires here; the
        permits it holds go back to the host's budget."""
        self._s().close()


def _pick_n(n: Any, permits: Any) -> Any:
    if permits is None:
        return n
    if n != 1 and n is not permits:
        raise TypeError("pylimiter: pass the number of permits once (n or permits=)")
    return permits


def _poll(seg: _Seg, loop: asyncio.AbstractEventLoop, num: float) -> None:
    """An event loop's poll of its waiters' records (every POLL_S while it
    has any); sweeps for dead processes when one is due.  The next poll is
    scheduled whatever happens here (an interrupt from a signal handler
    stops the loop, which may be run again)."""
    again = True
    try:
        st = seg.pollers.get(loop)
        if st is None or st[1] != num:
            again = False   # a newer poll replaced this one
            return
        st[0] = time.monotonic()
        ws = seg.loop_waiters.get(loop)
        if not ws or seg.closed:
            del seg.pollers[loop]
            again = False
            return
        for w in list(ws):
            if w.removed or seg.peek(w) != W_QUEUED:
                fut = w.fut
                if fut is not None and not fut.done():
                    fut.set_result(None)
        if seg.sweep_due():
            try:
                seg.sweep()
            except SharedLimiterError:
                pass
    finally:
        if again:
            try:
                loop.call_later(POLL_S, _poll, seg, loop, num)
            except RuntimeError:   # the loop is closed
                seg.pollers.pop(loop, None)


def _audit(seg: _Seg, p: int) -> dict[str, int]:
    if seg.closed:
        raise closed_error()
    seg.wake(seg.run_locked(seg.sweep_locked, True))

    def read() -> dict[str, int]:
        held = granted = queued = linked = 0
        for s in range(seg.maxp):
            base = seg.slotoff(s)
            if seg.u32(base + S_STATE) == SLOT_LIVE:
                held += seg.i64(base + S_HELD + 8 * p)
        for r in range(min(seg.u32(H_BUMP), seg.nrec)):
            base = seg.rec(r)
            if seg.u32(base + R_POOL) != p:
                continue
            st = seg.u32(base + R_STATE)
            if st == W_GRANTED:
                granted += seg.i64(base + R_GRANTED)
            elif st == W_QUEUED:
                queued += 1
        r = seg.u32(seg.pool(p) + P_HEAD)
        while r != NIL and linked <= seg.nrec:
            linked += 1
            r = seg.u32(seg.rec(r) + R_NEXT)
        return {"acquired": seg.acquired(p), "held": held, "granted": granted,
                "qlen": seg.i64(seg.pool(p) + P_QLEN), "queued": queued, "linked": linked}

    return seg.run_locked(read)


def _holders(seg: _Seg) -> dict[int, list[int]]:
    """{pid: [held per pool]} of the live attached processes."""
    if seg.closed:
        raise closed_error()
    seg.wake(seg.run_locked(seg.sweep_locked, True))

    def read() -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for s in range(seg.maxp):
            base = seg.slotoff(s)
            if seg.u32(base + S_STATE) != SLOT_LIVE:
                continue
            pid = _I32.unpack_from(seg.mm, base + S_PID)[0]   # type: ignore[arg-type]
            held = out.setdefault(pid, [0] * seg.npools)
            for p in range(seg.npools):
                held[p] += max(0, seg.i64(base + S_HELD + 8 * p))
        return out

    return seg.run_locked(read)


class SharedDualMemoryLimiter(SharedDualMemoryLimiterBase):
    __doc__ = SharedDualMemoryLimiterBase.__doc__
    _semaphore_class = SharedSemaphore

    def _open(self, name: str, maxes: tuple[int, int], max_queue: int, max_processes: int,
              directory: Any, timeout: Optional[float]) -> tuple[Any, SharedSemaphore,
                                                                 SharedSemaphore]:
        seg = _Seg(name, KIND_DUAL, maxes, max_queue, max_processes, directory)
        return (seg, SharedSemaphore._pool_view(seg, 0, timeout),
                SharedSemaphore._pool_view(seg, 1, timeout))

    def _holders(self) -> dict[int, list[int]]:
        return _holders(self._seg)

