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
    _NO_TIMEOUT,
    MAX_ACQUIRED,
    MAX_PERMITS,
    UNBOUNDED_AVAILABLE,
    WAIT_BUCKETS,
    ask_cancelled as _ask,
    SemaphoreStats,
    bucket_index,
    check_is_cancelled,
    check_permits,
    check_timeout,
    cumulative_buckets,
)
from ._common import LimitType
from ._dual import DualMemoryLimiterBase, DualMemoryPermit
from ._errors import (
    PermitAcquireAlreadyClosedError,
    PermitAcquireCancelledError,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
)

__all__ = [
    "AsyncSemaphore",
    "SemaphorePermit",
    "AsyncDualMemoryLimiter",
    "DualMemoryPermit",
    "LimitType",
]

# Waiter states, as in plim.h.
_IDLE, _QUEUED, _GRANTED, _CLOSED, _TOO_LARGE, _CANCELLED, _REMOVED = range(7)

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
        raise TypeError("pylimiter: permits are created by a semaphore")

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
        self.state = _IDLE
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
            raise RuntimeError("pylimiter: this request was already awaited")
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
        if type(max_permits) is bool or not isinstance(max_permits, int):
            raise TypeError("pylimiter: max_permits must be an int")
        if type(max_queue_size) is bool or not isinstance(max_queue_size, int):
            raise TypeError("pylimiter: max_queue_size must be an int")
        if max_permits > MAX_PERMITS:
            raise ValueError(
                f"pylimiter: max_permits={max_permits} exceeds {MAX_PERMITS}"
            )
        self._timeout = check_timeout(timeout, None)
        self._max = int(max_permits)
        self._bounded = self._max > 0
        self._avail = self._max if self._bounded else 0
        self._max_queue = int(max_queue_size)
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
        if type(permit) is not SemaphorePermit:
            raise TypeError(
                f"pylimiter: expected a SemaphorePermit, not {type(permit).__name__}"
            )
        if permit._sem is not self:
            raise TypeError("pylimiter: the permit belongs to another semaphore")

    # ---- public API ---------------------------------------------------

    def acquire(self, permits: int, *, timeout=_NO_TIMEOUT, is_cancelled=None):
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
            raise PermitAcquireAlreadyClosedError("pylimiter: semaphore is closed")
        return _Request(self, None, n, t, is_cancelled)

    def update(self, permit, new_permits: int, *, timeout=_NO_TIMEOUT,
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

    def acquire_blocking(self, permits: int, *, timeout=_NO_TIMEOUT,
                         is_cancelled=None) -> SemaphorePermit:
        """Blocking twin of ``acquire`` for threads."""
        n = check_permits(permits, self._max, self._bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return self._run_blocking(None, n, t, is_cancelled)

    def update_blocking(self, permit, new_permits: int, *, timeout=_NO_TIMEOUT,
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
                raise PermitAcquireAlreadyClosedError("pylimiter: semaphore is closed")
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
            if pending is not None and pending.state == _QUEUED:
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
                self._leave_locked(w, _CLOSED)
                done.append(w)
        self._wake_all(done)

    def set_max_permits(self, max_permits: int) -> None:
        """Change the limit of a bounded semaphore (must stay > 0).  Raising
        it grants waiters that now fit; lowering it below what is held makes
        available_permits negative; queued requests that can never fit fail
        with ValueError."""
        if type(max_permits) is bool or not isinstance(max_permits, int):
            raise TypeError("pylimiter: max_permits must be an int")
        if not self._bounded:
            raise ValueError("pylimiter: cannot set a limit on an unbounded semaphore")
        if max_permits <= 0:
            raise ValueError(f"pylimiter: max_permits must be > 0, got {max_permits}")
        if max_permits > MAX_PERMITS:
            raise ValueError(f"pylimiter: max_permits={max_permits} exceeds {MAX_PERMITS}")
        done: list = []
        with self._lock:
            self._avail += max_permits - self._max
            self._max = max_permits
            for w in list(self._queue):
                if w.total > max_permits:
                    del self._queue[w]
                    w.limit = max_permits
                    self._leave_locked(w, _TOO_LARGE)
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
                raise OverflowError("pylimiter: too many permits outstanding")
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
        self._leave_locked(w, _GRANTED)
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
            cancelled, cause = _ask(check.check)
            with self._lock:
                if self._queue and next(iter(self._queue)) is check:
                    if cancelled:
                        del self._queue[check]
                        check.cause = cause
                        self._cancelled_total += 1
                        self._leave_locked(check, _CANCELLED)
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
            if w.state == _GRANTED and not w.reverted:
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
            if w.state == _QUEUED:
                was_head = next(iter(self._queue)) is w
                del self._queue[w]
                self._leave_locked(w, _REMOVED)
                if timed_out:
                    self._timeout_total += 1
                else:
                    self._cancelled_total += 1
                if was_head:
                    check = self._process_locked(None, done)
            elif w.state == _GRANTED and not timed_out:
                self._cancelled_total += 1
                if not w.reverted:
                    w.reverted = True
                    w.permit._permits -= w.granted
                    self._avail += w.granted
                    check = self._process_locked(None, done)
        self._settle(check, done)

    def _begin(self, permit, n, timeout, is_cancelled, make_waiter):
        """Shared start of every acquire/update: returns the permit when done
        at once, or a queued _Waiter.  Raises on immediate failure."""
        cancelled, cause = False, None
        if is_cancelled is not None and self._bounded:
            cancelled, cause = _ask(is_cancelled)
        done: list = []
        check = None
        is_update = permit is not None
        with self._lock:
            if not is_update:
                permit = SemaphorePermit._new(self, 0)
            else:
                if permit._pending is not None:
                    raise RuntimeError("pylimiter: permit already has an update in progress")
                cur = permit._permits
                if n <= cur:
                    # Shrinking is a release: after close too, no check.
                    permit._permits = n
                    if n < cur:
                        self._avail += cur - n
                        check = self._process_locked(None, done)
                    w = None
                    n = -1
            if n >= 0:
                need = n - permit._permits
                if self._closed:
                    raise PermitAcquireAlreadyClosedError("pylimiter: semaphore is closed")
                if cancelled:
                    self._cancelled_total += 1
                    raise PermitAcquireCancelledError(
                        "pylimiter: request cancelled") from cause
                if self._fits_now_locked(need):
                    self._take_locked(permit, need)
                    return permit
                if timeout == 0:
                    self._timeout_total += 1
                    raise PermitAcquireTimeoutError(
                        "pylimiter: permits not available and timeout=0")
                if self._max_queue > 0 and len(self._queue) >= self._max_queue:
                    self._queue_full_total += 1
                    raise PermitAcquireQueueFullError(
                        f"pylimiter: queue is full ({self._max_queue} waiting)")
                w = make_waiter(permit, is_cancelled)
                w.need = need
                w.total = n
                w.state = _QUEUED
                w.enqueued = _monotonic()
                if is_update:
                    permit._pending = w
                self._queue[w] = None
        if w is None:
            self._settle(check, done)
            return permit
        return w

    def _finish(self, w: _Waiter) -> SemaphorePermit:
        state = w.state
        if state == _GRANTED:
            return w.permit
        if state == _CLOSED:
            raise PermitAcquireAlreadyClosedError("pylimiter: semaphore was closed")
        if state == _TOO_LARGE:
            raise ValueError(
                f"Requested permits={w.total} is larger than max_permits={w.limit}"
            )
        if state == _CANCELLED:
            raise PermitAcquireCancelledError("pylimiter: request cancelled") from w.cause
        raise PermitAcquireTimeoutError("pylimiter: timed out waiting for permits")

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
        if w.state == _REMOVED and not w.fut.done():
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
            if w.state != _REMOVED:
                w.lock.acquire()  # a wake-up is on its way: wait it out
            raise
        if not woken:
            self._abandon(w, timed_out=True)
            if w.state != _REMOVED:
                w.lock.acquire()
        return self._finish(w)


class AsyncDualMemoryLimiter(DualMemoryLimiterBase):
    __doc__ = DualMemoryLimiterBase.__doc__
    _semaphore_class = AsyncSemaphore
