"""Pure-Python implementation of pylimiter: the executable specification.

It mirrors the C core step by step (``csrc/plim_sem.c``): one lock guards the
counter and the FIFO queue, queue processing stops at a head that carries an
``is_cancelled`` check so that the check runs with no lock held, and waking
happens after the lock is dropped.  The C extension must be observably
identical; ``tests/test_differential.py`` holds the two side by side.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from typing import Callable, Optional

from ._common import (
    TIMEOUT_NOT_GIVEN,
    MAX_ACQUIRED,
    MSG_ALREADY_AWAITED,
    MSG_PERMIT_NOT_CONSTRUCTIBLE,
    MSG_UPDATE_IN_PROGRESS,
    UNBOUNDED_AVAILABLE,
    W_CANCELLED,
    W_CLOSED,
    W_GRANTED,
    W_IDLE,
    W_QUEUED,
    W_REMOVED,
    W_TOO_LARGE,
    WAIT_BUCKETS,
    LimitType,
    SemaphoreStats,
    ask_cancelled,
    bucket_index,
    cancelled_error,
    check_is_cancelled,
    check_limits,
    check_new_max,
    permit_error,
    check_permits,
    check_timeout,
    closed_error,
    cumulative_buckets,
    left_queue_error,
    overflow_error,
    queue_full_error,
    timeout_zero_error,
)
from ._dual import DualMemoryLimiterBase, DualMemoryPermit

__all__ = [
    "AsyncSemaphore",
    "SemaphorePermit",
    "AsyncDualMemoryLimiter",
    "DualMemoryPermit",
    "LimitType",
]

_get_ident = threading.get_ident
_monotonic = time.monotonic


class SemaphorePermit:
    """Permits held from one AsyncSemaphore.

    ``permits`` is what it holds now; ``update`` changes it in place and
    ``release`` sets it to 0.  Used as a context manager (``with``) it is
    released on exit.
    """

    __slots__ = ("_sem", "_permits", "_pending", "__weakref__")

    def __init__(self, *args, **kwargs):
        raise TypeError(MSG_PERMIT_NOT_CONSTRUCTIBLE)

    @classmethod
    def _new(cls, sem: "AsyncSemaphore", permits: int) -> "SemaphorePermit":
        self = object.__new__(cls)
        self._sem = sem
        self._permits = permits
        self._pending = None
        return self

    @property
    def permits(self) -> int:
        """The number of permits this object holds."""
        return self._permits

    def __enter__(self) -> "SemaphorePermit":
        return self

    def __exit__(self, *exc) -> None:
        self._sem.release(self)

    def __repr__(self) -> str:
        return f"<SemaphorePermit permits={self._permits}>"


class _Waiter:
    """One queued request (the Python twin of plim_waiter_t)."""

    __slots__ = (
        "permit",
        "need",
        "total",
        "granted",
        "state",
        "check",
        "cause",
        "limit",
        "enqueued",
        "loop",
        "fut",
        "thread_id",
        "lock",
        "reverted",
    )

    def __init__(self, permit, check):
        self.permit = permit
        self.need = 0
        self.total = 0
        self.granted = 0
        self.state = W_IDLE
        self.check = check
        self.cause = None
        self.limit = 0
        self.enqueued = 0.0
        self.loop = None
        self.fut = None
        self.thread_id = 0
        self.lock = None
        self.reverted = False


class _Request:
    """What ``acquire``/``update`` return: awaitable once, and an async
    context manager that releases the permit on exit."""

    __slots__ = ("_sem", "_permit", "_permits", "_timeout", "_is_cancelled",
                 "_awaited", "_result")

    def __init__(self, sem, permit, permits, timeout, is_cancelled):
        self._sem = sem
        self._permit = permit
        self._permits = permits
        self._timeout = timeout
        self._is_cancelled = is_cancelled
        self._awaited = False
        self._result = None

    def __await__(self):
        if self._awaited:
            raise RuntimeError(MSG_ALREADY_AWAITED)
        self._awaited = True
        return self._sem._run_async(
            self._permit, self._permits, self._timeout, self._is_cancelled
        ).__await__()

    async def __aenter__(self):
        self._result = await self
        return self._result

    async def __aexit__(self, *exc):
        if self._result is not None:
            self._sem.release(self._result)
        return None


class AsyncSemaphore:
    """A weighted, strictly FIFO semaphore for asyncio tasks and threads.

    ``max_permits <= 0`` makes it unbounded (everything is granted at once,
    usage is still counted); ``max_queue_size <= 0`` makes the queue
    unbounded; ``timeout`` (seconds, ``None`` for ever) is the default wait
    for a queued request, measured from when it joins the queue.
    """

    def __init__(
        self,
        max_permits: int,
        max_queue_size: int = 10000,
        timeout: Optional[float] = 25.0,
    ):
        max_permits, max_queue_size = check_limits(max_permits, max_queue_size)
        self._timeout = check_timeout(timeout, None)
        self._max = max_permits
        self._bounded = self._max > 0
        self._avail = self._max if self._bounded else 0
        self._max_queue = max_queue_size
        self._queue: OrderedDict[_Waiter, None] = OrderedDict()
        self._closed = False
        self._lock = threading.Lock()
        self._acquired_total = 0
        self._timeout_total = 0
        self._queue_full_total = 0
        self._cancelled_total = 0
        self._wait_sum = 0.0
        self._wait_counts = [0] * len(WAIT_BUCKETS)

    # ---- properties ---------------------------------------------------

    @property
    def max_permits(self) -> int:
        """The configured limit (<= 0: unbounded)."""
        return self._max

    @property
    def available_permits(self) -> int:
        """max_permits - acquired_permits (negative after lowering the limit);
        ``2**63 - 1`` when unbounded."""
        return self._avail if self._bounded else UNBOUNDED_AVAILABLE

    @property
    def acquired_permits(self) -> int:
        """Permits held now (granted and not released)."""
        return self._max - self._avail if self._bounded else -self._avail

    @property
    def queue_size(self) -> int:
        """Requests waiting in the queue."""
        return len(self._queue)

    @property
    def max_queue_size(self) -> int:
        """The configured queue bound (<= 0: unbounded)."""
        return self._max_queue

    @property
    def closed(self) -> bool:
        """True after close()."""
        return self._closed

    def __repr__(self) -> str:
        return (
            f"<AsyncSemaphore max_permits={self._max} "
            f"acquired={self.acquired_permits} queued={len(self._queue)}"
            f"{' closed' if self._closed else ''}>"
        )

    # ---- argument checks (at the call site) ---------------------------

    def _check_permit(self, permit) -> None:
        if type(permit) is not SemaphorePermit or permit._sem is not self:
            raise permit_error(permit, SemaphorePermit)

    # ---- public API ---------------------------------------------------

    def acquire(self, permits: int, *, timeout=TIMEOUT_NOT_GIVEN, is_cancelled=None):
        """Return an awaitable of a new SemaphorePermit holding ``permits``.

        The request joins the queue when first awaited.  It fails with
        PermitAcquireTimeoutError, PermitAcquireQueueFullError,
        PermitAcquireAlreadyClosedError or PermitAcquireCancelledError.
        ``async with sem.acquire(n) as p:`` releases p on exit.
        """
        n = check_permits(permits, self._max, self._bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        if self._closed:
            raise closed_error()
        return _Request(self, None, n, t, is_cancelled)

    def update(self, permit, new_permits: int, *, timeout=TIMEOUT_NOT_GIVEN,
               is_cancelled=None):
        """Return an awaitable that changes ``permit`` to ``new_permits`` in
        place and returns it.  Shrinking completes at once (even after close);
        growing queues for the difference like an acquire, and on failure the
        permit keeps what it had."""
        self._check_permit(permit)
        n = check_permits(new_permits, self._max, self._bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return _Request(self, permit, n, t, is_cancelled)

    def acquire_blocking(self, permits: int, *, timeout=TIMEOUT_NOT_GIVEN,
                         is_cancelled=None) -> SemaphorePermit:
        """Blocking twin of ``acquire`` for threads."""
        n = check_permits(permits, self._max, self._bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return self._run_blocking(None, n, t, is_cancelled)

    def update_blocking(self, permit, new_permits: int, *, timeout=TIMEOUT_NOT_GIVEN,
                        is_cancelled=None) -> SemaphorePermit:
        """Blocking twin of ``update`` for threads."""
        self._check_permit(permit)
        n = check_permits(new_permits, self._max, self._bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return self._run_blocking(permit, n, t, is_cancelled)

    def try_acquire(self, permits: int) -> Optional[SemaphorePermit]:
        """Take ``permits`` now if they fit and nobody queues; else None.
        Never waits and never overtakes queued requests."""
        n = check_permits(permits, self._max, self._bounded)
        with self._lock:
            if self._closed:
                raise closed_error()
            if not self._fits_now_locked(n):
                return None
            permit = SemaphorePermit._new(self, 0)
            self._take_locked(permit, n)
            return permit

    def release(self, permit) -> None:
        """Give back everything ``permit`` holds and set it to 0.
        Releasing again is a no-op; works after close."""
        self._check_permit(permit)
        done: list = []
        with self._lock:
            n = permit._permits
            if n == 0:
                return
            permit._permits = 0
            pending = permit._pending
            if pending is not None and pending.state == W_QUEUED:
                # Its update now has to take the whole new size.
                pending.need += n
            self._avail += n
            check = self._process_locked(None, done)
        self._settle(check, done)

    def close(self) -> None:
        """Close (idempotent): queued requests fail with
        PermitAcquireAlreadyClosedError, and so do later acquires."""
        done: list = []
        with self._lock:
            self._closed = True
            while self._queue:
                w, _ = self._queue.popitem(last=False)
                self._leave_locked(w, W_CLOSED)
                done.append(w)
        self._wake_all(done)

    def set_max_permits(self, max_permits: int) -> None:
        """Change the limit of a bounded semaphore (must stay > 0).  Raising
        it grants waiters that now fit; lowering it below what is held makes
        available_permits negative; queued requests that can never fit fail
        with ValueError."""
        max_permits = check_new_max(max_permits, self._bounded)
        done: list = []
        with self._lock:
            self._avail += max_permits - self._max
            self._max = max_permits
            for w in list(self._queue):
                if w.total > max_permits:
                    del self._queue[w]
                    w.limit = max_permits
                    self._leave_locked(w, W_TOO_LARGE)
                    done.append(w)
            check = self._process_locked(None, done)
        self._settle(check, done)

    def stats(self) -> SemaphoreStats:
        """A snapshot of gauges, counters and the wait-time histogram."""
        with self._lock:
            count = sum(self._wait_counts)
            return SemaphoreStats(
                max_permits=self._max,
                acquired_permits=self.acquired_permits,
                available_permits=self.available_permits,
                queue_size=len(self._queue),
                max_queue_size=self._max_queue,
                acquired_total=self._acquired_total,
                timeout_total=self._timeout_total,
                queue_full_total=self._queue_full_total,
                cancelled_total=self._cancelled_total,
                wait_seconds_sum=self._wait_sum,
                wait_seconds_count=count,
                wait_seconds_buckets=cumulative_buckets(self._wait_counts),
            )

    # ---- the algorithm (mirrors plim_sem.c) -----------------------------

    def _fits_now_locked(self, need: int) -> bool:
        if not self._bounded:
            if need - self._avail > MAX_ACQUIRED:
                raise overflow_error()
            return True
        # A zero request takes nothing, so it cannot overtake anyone.
        return need == 0 or (not self._queue and self._avail >= need)

    def _record_wait_locked(self, seconds: float) -> None:
        self._acquired_total += 1
        self._wait_sum += seconds
        self._wait_counts[bucket_index(seconds)] += 1

    def _take_locked(self, permit: SemaphorePermit, need: int) -> None:
        """Immediate grant."""
        self._avail -= need
        permit._permits += need
        self._record_wait_locked(0.0)

    def _leave_locked(self, w: _Waiter, state: int) -> None:
        w.state = state
        if w.permit._pending is w:
            w.permit._pending = None

    def _grant_locked(self, w: _Waiter, now: float) -> None:
        self._avail -= w.need
        w.granted = w.need
        w.permit._permits += w.need
        self._leave_locked(w, W_GRANTED)
        self._record_wait_locked(max(0.0, now - w.enqueued))

    def _process_locked(self, checked, done) -> Optional[_Waiter]:
        """Grant heads while they fit; stop at a head with a check that has
        not been answered (returned: the caller asks it with no lock held)."""
        q = self._queue
        now = None
        while q:
            h = next(iter(q))
            if h.check is not None and h is not checked:
                return h
            if self._avail < h.need:
                break
            del q[h]
            if now is None:
                now = _monotonic()
            self._grant_locked(h, now)
            done.append(h)
            checked = None
        return None

    def _settle(self, check, done) -> None:
        """Answer pending checks outside the lock, then wake what left the queue."""
        while check is not None:
            cancelled, cause = ask_cancelled(check.check)
            with self._lock:
                if self._queue and next(iter(self._queue)) is check:
                    if cancelled:
                        del self._queue[check]
                        check.cause = cause
                        self._cancelled_total += 1
                        self._leave_locked(check, W_CANCELLED)
                        done.append(check)
                        check = self._process_locked(None, done)
                    else:
                        check = self._process_locked(check, done)
                else:
                    check = self._process_locked(None, done)
        self._wake_all(done)

    def _wake_all(self, done) -> None:
        me = _get_ident()
        for w in done:
            if w.lock is not None:
                w.lock.release()
            elif w.thread_id == me:
                self._set_result(w)
            else:
                try:
                    w.loop.call_soon_threadsafe(self._set_result, w)
                except RuntimeError:  # its loop is closed: nobody will take it
                    self._revert(w)

    def _set_result(self, w: _Waiter) -> None:
        fut = w.fut
        if not fut.done():
            try:
                fut.set_result(None)
            except RuntimeError:
                self._revert(w)

    def _revert(self, w: _Waiter) -> None:
        """Give back a grant that its requester will never take."""
        done: list = []
        check = None
        with self._lock:
            if w.state == W_GRANTED and not w.reverted:
                w.reverted = True
                w.permit._permits -= w.granted
                self._avail += w.granted
                check = self._process_locked(None, done)
        self._settle(check, done)

    def _abandon(self, w: _Waiter, timed_out: bool) -> None:
        """The requester stops waiting (timeout, task cancel, interrupt).
        A queued request leaves the queue; a grant that raced with a cancel
        goes back; a grant that raced with a timeout stands."""
        done: list = []
        check = None
        with self._lock:
            if w.state == W_QUEUED:
                was_head = next(iter(self._queue)) is w
                del self._queue[w]
                self._leave_locked(w, W_REMOVED)
                if timed_out:
                    self._timeout_total += 1
                else:
                    self._cancelled_total += 1
                if was_head:
                    check = self._process_locked(None, done)
            elif w.state == W_GRANTED and not timed_out:
                self._cancelled_total += 1
                if not w.reverted:
                    w.reverted = True
                    w.permit._permits -= w.granted
                    self._avail += w.granted
                    check = self._process_locked(None, done)
        self._settle(check, done)

    def _shrink(self, permit: SemaphorePermit, n: int) -> bool:
        """Set ``permit`` to ``n`` if that is no more than it holds (a
        release: after close too, no check) and return True; False when
        ``n`` would grow it."""
        done: list = []
        check = None
        with self._lock:
            if permit._pending is not None:
                raise RuntimeError(MSG_UPDATE_IN_PROGRESS)
            cur = permit._permits
            if n > cur:
                return False
            permit._permits = n
            if n < cur:
                self._avail += cur - n
                check = self._process_locked(None, done)
        self._settle(check, done)
        return True

    def _begin(self, permit, n, timeout, is_cancelled, make_waiter):
        """Shared start of every acquire/update: returns the permit when done
        at once, or a queued _Waiter.  Raises on immediate failure."""
        cancelled, cause = False, None
        if is_cancelled is not None and self._bounded:
            cancelled, cause = ask_cancelled(is_cancelled)
        is_update = permit is not None
        if is_update and self._shrink(permit, n):
            return permit
        with self._lock:
            if not is_update:
                permit = SemaphorePermit._new(self, 0)
            elif permit._pending is not None or permit._permits >= n:
                # Another thread's update of this permit ran since _shrink.
                raise RuntimeError(MSG_UPDATE_IN_PROGRESS)
            need = n - permit._permits
            if self._closed:
                raise closed_error()
            if cancelled:
                self._cancelled_total += 1
                raise cancelled_error(cause)
            if self._fits_now_locked(need):
                self._take_locked(permit, need)
                return permit
            if timeout == 0:
                self._timeout_total += 1
                raise timeout_zero_error()
            if self._max_queue > 0 and len(self._queue) >= self._max_queue:
                self._queue_full_total += 1
                raise queue_full_error(self._max_queue)
            w = make_waiter(permit, is_cancelled)
            w.need = need
            w.total = n
            w.state = W_QUEUED
            w.enqueued = _monotonic()
            if is_update:
                permit._pending = w
            self._queue[w] = None
        return w

    def _finish(self, w: _Waiter) -> SemaphorePermit:
        if w.state == W_GRANTED:
            return w.permit
        raise left_queue_error(w.state, w.total, w.limit, w.cause)

    async def _run_async(self, permit, n, timeout, is_cancelled):
        def make_waiter(p, check):
            w = _Waiter(p, check)
            loop = asyncio.get_running_loop()
            w.loop = loop
            w.fut = loop.create_future()
            w.thread_id = _get_ident()
            return w

        r = self._begin(permit, n, timeout, is_cancelled, make_waiter)
        if type(r) is SemaphorePermit:
            return r
        w = r
        timer = None
        if timeout is not None:
            timer = w.loop.call_later(timeout, self._on_timeout, w)
        try:
            await w.fut
        except BaseException:
            self._abandon(w, timed_out=False)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return self._finish(w)

    def _on_timeout(self, w: _Waiter) -> None:
        self._abandon(w, timed_out=True)
        if w.state == W_REMOVED and not w.fut.done():
            w.fut.set_result(None)

    def _run_blocking(self, permit, n, timeout, is_cancelled):
        def make_waiter(p, check):
            w = _Waiter(p, check)
            w.lock = threading.Lock()
            w.lock.acquire()
            return w

        r = self._begin(permit, n, timeout, is_cancelled, make_waiter)
        if type(r) is SemaphorePermit:
            return r
        w = r
        try:
            woken = w.lock.acquire(timeout=-1 if timeout is None else timeout)
        except BaseException:
            self._abandon(w, timed_out=False)
            if w.state != W_REMOVED:
                w.lock.acquire()  # a wake-up is on its way: wait it out
            raise
        if not woken:
            self._abandon(w, timed_out=True)
            if w.state != W_REMOVED:
                w.lock.acquire()
        return self._finish(w)


class AsyncDualMemoryLimiter(DualMemoryLimiterBase):
    __doc__ = DualMemoryLimiterBase.__doc__
    _semaphore_class = AsyncSemaphore
