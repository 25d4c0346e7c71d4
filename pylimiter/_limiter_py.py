"""Pure-Python implementation of pylimiter: the executable specification.

It mirrors the C core step by step (``csrc/plim_sem.c``): one critical
section guards the counter and the FIFO queue (a threading.Lock, taken
with ``with`` so that no interrupt can leave it held), queue processing stops at a
head that carries an ``is_cancelled`` check so that the check runs with no
lock held, and a waiter is woken in the section that decides its fate (a
thread through its lock, a task by joining its loop's wake batch), the
batch's runner being scheduled after the section is left.  It also mirrors the C binding's asyncio
machinery, so that the two wake tasks in the same order:

* A queued request's task parks on the request's ``_Waiter`` itself (it
  speaks the small part of the Future protocol asyncio.Task uses), not on a
  Future.
* Waiters that leave the queue are appended, in FIFO order, to their event
  loop's wake batch (``_LoopState``); one ``call_soon`` runs a whole batch.
* Each loop keeps one timer per semaphore, armed for the earliest deadline of
  its queued waiters (a deque of deadlines in arrival order, plus a heap for
  the ones that arrive out of order); it is re-armed lazily when it fires.

The C extension must be observably identical; ``tests/test_differential.py``
holds the two side by side.
"""

from __future__ import annotations

import _thread
import asyncio
import contextvars
import gc
import heapq
import os
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Generator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Optional

from ._common import (
    DONE,
    MAX_ACQUIRED,
    MAX_PERMITS,
    MAX_TIMEOUT_S,
    MSG_ALREADY_AWAITED,
    MSG_ANON_EXIT,
    MSG_INTERNAL_NOT_CONSTRUCTIBLE,
    MSG_PERMIT_NOT_CONSTRUCTIBLE,
    MSG_REQUEST_NOT_CONSTRUCTIBLE,
    MSG_REUSED,
    MSG_UPDATE_IN_PROGRESS,
    MSG_WAKE_CALLBACK_FAILED,
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
    LimitType,
    NoCopy,
    ReleasingRequest,
    SemaphoreStats,
    ask_cancelled,
    bucket_index,
    cancelled_error,
    check_done_callback,
    check_is_cancelled,
    check_limits,
    check_new_max,
    check_permits,
    check_timeout,
    closed_error,
    cumulative_buckets,
    left_queue_error,
    no_loop_error,
    overflow_error,
    permit_error,
    queue_full_error,
    reinit_error,
    same_callback,
    thrown_exception,
    timeout_zero_error,
    too_large_error,
    uninitialised_error,
    uninitialised_repr,
    warn_leaked_permit,
    warn_never_awaited,
)
from ._deferred import later as _later
from ._dual import DualMemoryLimiterBase, DualMemoryPermit

__all__ = [
    "AsyncDualMemoryLimiter",
    "AsyncSemaphore",
    "DualMemoryPermit",
    "LimitType",
    "SemaphorePermit",
]

_get_ident = threading.get_ident
_monotonic = time.monotonic
#: A blocking wait longer than this (about 292 years) waits this long, as
#: the C twin's PY_TIMEOUT_MAX: Lock.acquire refuses anything longer.
_LOCK_TIMEOUT_MAX = threading.TIMEOUT_MAX
# asyncio's C accelerated lookup: the loop running in this thread, or None.
_get_running_loop = asyncio.events._get_running_loop
_new = object.__new__
_sleep = time.sleep
_Context = contextvars.Context
_heappush = heapq.heappush
_heappop = heapq.heappop

#: How often a wake batch's runner is scheduled again at once when
#: call_soon(_threadsafe) raised (a signal handler's exception passes on the
#: first retry; a MemoryError that persists is left to later events).
_SCHEDULE_TRIES = 3
#: A blocking wait re-reads its request's state this often (seconds), so
#: that a wake-up lost to an interrupted releaser (issue 32, G2) costs a
#: delay, never a wait for ever.
_POLL_S = 0.5

#: What ``is_cancelled`` may be: a callable answering "give up?", or None.
IsCancelled = Optional[Callable[[], object]]
_Callback = Callable[[Any], object]


# The critical section.  Whoever changes a semaphore's state holds its
# *token*: the one item of the list ``_tok``.  It must survive a
# KeyboardInterrupt from a signal handler (which CPython runs only at a
# Python function's entry, after a call returns and at a backward jump,
# never between other bytecodes), and a finaliser the collector runs at
# those same points (on 3.12+ in whichever thread reaches one first).
#
# - The two uncontended fast paths (an await that fits, a release with
#   nothing to hand over), as the C core's lock-free paths try one CAS, take
#   it with `del tok[0]` -- a bytecode, not a call -- and give it back in the
#   `finally` of a `try` that starts right after, with no call in between:
#   nothing can run while they hold it.  If it is taken they go the slow way.
# - The slow paths (`with sem._cs, sem._hold:`) first take ``_cs``, a
#   threading.Lock (its __enter__ and __exit__ are C), which queues them,
#   then the token (_TokenHold).  A slow path interrupted after taking the
#   token but before it is given back -- its __enter__'s return, its
#   __exit__'s entry are points where a handler runs -- leaves it marked
#   ``owned``: the next slow path, in ``_cs`` and so after it, takes it
#   over.  The Lock itself is never lost: its `with` is C.
#
# A `with` on a Lock costs about 230 ns on 3.11 (two bound methods and an
# argument tuple), the token about 35 ns: the uncontended await+release
# took 3.5x asyncio.Semaphore's time with the Lock alone, 2.6x with the
# token.  A token taken with pop() -- a call -- could be lost to an
# interrupt right after it, and every thread then waited for it for ever
# (issue 32's signal storms); hence `del`, and no call in the fast paths'
# hold (a `lock.locked()` there let the 3.12 collector run a finaliser
# that released a permit, and that thread then waited for its own token).
# A finaliser or signal handler that calls into a semaphore while its own
# thread is inside one of its slow paths (at one of its calls, or before
# 3.12 at an allocation the collector counts) finds ``_cs`` -- an RLock, for
# this -- its own, and the token taken: the state is half changed.  What
# gives permits back or leaves the queue (release, a cancelled or dropped
# request) is then done by a thread of its own, which waits for the section
# to end (_later); anything else raises RuntimeError at once (_TokenHold).
# A Python-level trace or profile function that raises at a line of a fast
# path (its events fall between bytecodes that are otherwise never
# interrupted) can still lose the token.


class _TokenHold:
    """The slow paths' hold on a semaphore's token (``tok``, the list the
    fast paths take it from), entered inside ``_cs``.  A fast path holds it
    for a few bytecodes at most (with the GIL it never even holds it while
    another thread runs, but a free-threaded build or a tracer could), so
    wait for it, giving up the GIL; a slow path that lost it to an
    interrupt (it is in none of them now: we hold ``_cs``) left it marked
    ``owned``, so take it over."""

    __slots__ = ("cs", "owned", "tok")

    def __init__(self, cs: Any) -> None:
        self.cs = cs
        self.tok = [True]
        self.owned = False

    def __enter__(self) -> None:
        if self.owned:
            if _rlock_depth(self.cs) > 1:
                # Not a slow path that lost it: this thread's own, which a
                # finaliser or signal handler interrupted half way.
                raise _Reentered(MSG_REENTERED)
            return
        tok = self.tok
        tries = 0
        while True:
            try:
                del tok[0]
            except IndexError:
                _sleep(0 if tries < 1000 else 0.0001)
                tries += 1
            else:
                self.owned = True   # no call between the take and the mark
                return

    def __exit__(self, *exc: object) -> None:
        # Unmarked first, then given back: nothing runs in between.
        self.owned = False
        self.tok.append(True)


class _Reentered(RuntimeError):
    """A semaphore called from a finaliser or signal handler while the same
    thread is inside one of its slow paths."""


MSG_REENTERED = (
    "pylimiter: a finaliser or a signal handler called the semaphore while its thread "
    "was inside the semaphore's critical section; there only a release, or a queued "
    "request's cancellation, may be done (another thread completes it as the section "
    "ends)")

if hasattr(_thread.RLock(), "_recursion_count"):
    def _rlock_depth(lock: Any) -> int:
        return int(lock._recursion_count())
else:   # 3.10: the count is only in the repr ("... owner=... count=2 at 0x...>")
    def _rlock_depth(lock: Any) -> int:
        r = repr(lock)
        i = r.find(" count=")
        return int(r[i + 7:r.index(" ", i + 7)]) if i >= 0 else 0


# ---- never-awaited requests, without a finaliser on the hot path ---------------
# A request collected before it was awaited, started or closed warns, as a
# never-awaited coroutine does.  A __del__ on every request cost the
# uncontended await about a sixth of its time (issue 32); instead each new
# request is noted in _fresh (a list append), and every so often -- when
# _LOOK_AT have piled up, and at the start of every garbage collection --
# the noted ones are looked at: those awaited meanwhile (nearly all) are
# forgotten, and only the others get a weak reference whose callback warns
# if they die unawaited.  So the warning comes at the next collection (or a
# few requests later), not always at the very moment the request dies.

#: Requests made and not looked at yet (strong references).
_fresh: list[_Request] = []
_fresh_append = _fresh.append
_LOOK_AT = 32
#: Requests that were still unawaited when looked at: weak reference ->
#: what the warning names (semaphore, permits, update?).
_escaped: dict[weakref.ref[_Request], tuple[AsyncSemaphore, int, bool]] = {}


def _look() -> None:
    """Sort the noted requests: forget those already awaited, started or
    closed; watch the others (weakly)."""
    fresh = _fresh
    while fresh:
        try:
            r = fresh.pop()
        except IndexError:   # another thread emptied it meanwhile
            return
        if r._stage == 0 and r._ref is None:
            ref = weakref.ref(r, _collected)
            _escaped[ref] = (r._sem, r._n, r._permit is not None)
            r._ref = ref


def _collected(ref: weakref.ref[_Request]) -> None:
    info = _escaped.pop(ref, None)
    if info is not None:
        warn_never_awaited(*info)


def _started(r: _Request) -> None:
    """A watched request was awaited, started or closed after all."""
    ref = r._ref
    if ref is not None:
        r._ref = None
        _escaped.pop(ref, None)


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start" and _fresh:
        _look()


gc.callbacks.append(_on_gc)


class SemaphorePermit(NoCopy):
    """Permits held from one AsyncSemaphore.

    ``permits`` is what it holds now; ``update`` changes it in place and
    ``release`` sets it to 0.  Used as a context manager (``with``) it is
    released on exit.  A permit garbage-collected while it still holds
    permits emits a ResourceWarning (the permits stay taken).
    """

    __slots__ = ("__weakref__", "_pending", "_permits", "_sem")

    _sem: AsyncSemaphore
    _permits: int
    _pending: _Waiter | None

    def __new__(cls, *args: object, **kwargs: object) -> SemaphorePermit:
        # Not __init__: no half-made object may reach __del__.
        raise TypeError(MSG_PERMIT_NOT_CONSTRUCTIBLE)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(MSG_PERMIT_NOT_CONSTRUCTIBLE)

    @property
    def permits(self) -> int:
        """The number of permits this object holds."""
        return self._permits

    def __enter__(self) -> SemaphorePermit:
        return self

    def __exit__(self, *exc: object) -> None:
        self._sem.release(self)

    def __repr__(self) -> str:
        return f"<SemaphorePermit permits={self._permits}>"

    def __del__(self) -> None:
        try:
            n = self._permits
        except AttributeError:   # made, then dropped by an interrupt before it was set up
            return
        if n:
            warn_leaked_permit(self._sem, n)


def _new_permit(sem: AsyncSemaphore, permits: int) -> SemaphorePermit:
    p: SemaphorePermit = _new(SemaphorePermit)
    p._sem = sem
    p._permits = permits
    p._pending = None
    return p


class _Waiter(NoCopy):
    """One queued request (the Python twin of plim_waiter_t).

    For asyncio it is also what the waiting task parks on: the part of the
    Future protocol asyncio.Task uses (``_asyncio_future_blocking``,
    ``_loop``, ``add_done_callback``, ``result``, ``cancel``).  It is "done"
    once its outcome is decided and it is in (or past) a wake batch.
    """

    __slots__ = (
        "_asyncio_future_blocking",
        "callbacks",
        "cancel_msg",
        "cause",
        "check",
        "deadline",
        "enqueued",
        "fired",
        "granted",
        "is_cancelled",
        "limit",
        "lock",
        "ls",
        "need",
        "permit",
        "posted",
        "reverted",
        "state",
        "total",
    )

    def __new__(cls, *args: object, **kwargs: object) -> _Waiter:
        raise TypeError(MSG_INTERNAL_NOT_CONSTRUCTIBLE.format(cls.__name__))

    def _init(self, permit: SemaphorePermit, check: IsCancelled) -> None:
        self.permit: SemaphorePermit | None = permit
        self.need = 0
        self.total = 0
        self.granted = 0
        self.state = W_IDLE
        self.check = check
        self.cause: BaseException | None = None
        self.limit = 0
        self.enqueued = 0.0
        self.deadline = 0.0
        self.ls: _LoopState | None = None
        self.lock: threading.Lock | None = None
        self.reverted = False
        self.posted = False
        self.fired = False
        self.is_cancelled = False
        self.cancel_msg: str | None = None
        self.callbacks: list[tuple[_Callback, Any]] = []
        self._asyncio_future_blocking = False

    # ---- the Future protocol, as far as asyncio.Task uses it ----------

    @property
    def _loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the waiting task runs on (asyncio's fallback for
        get_loop(); the C twin allocates nothing to answer it).  None for a
        blocking thread's waiter."""
        if self.ls is None:
            return None
        return self.ls.loop

    def add_done_callback(self, fn: _Callback, *, context: Any = None) -> None:
        """Call ``fn(self)`` (in ``context``) when the outcome is delivered."""
        if not callable(fn) or (context is not None and type(context) is not _Context):
            check_done_callback(fn, context)   # raises TypeError
        if self.fired and self.ls is not None:
            self.ls.loop.call_soon(fn, self, context=context)
        else:
            self.callbacks.append((fn, context))

    def remove_done_callback(self, fn: _Callback) -> int:
        """Remove every registration of ``fn``; return how many there were."""
        kept = [(f, c) for f, c in self.callbacks if not same_callback(f, fn)]
        removed = len(self.callbacks) - len(kept)
        self.callbacks = kept
        return removed

    def done(self) -> bool:
        """True once the outcome is decided (granted, failed or cancelled)."""
        return self.posted

    def cancelled(self) -> bool:
        """True if the waiting task cancelled it while it was queued."""
        return self.is_cancelled

    def result(self) -> None:
        """None once done (the request itself reads the outcome); raises
        CancelledError if the task cancelled it."""
        if self.is_cancelled:
            if self.cancel_msg is None:
                raise asyncio.CancelledError()
            raise asyncio.CancelledError(self.cancel_msg)
        if not self.posted:
            raise asyncio.InvalidStateError("Result is not ready.")

    def cancel(self, msg: str | None = None) -> bool:
        """Task.cancel() while the task is parked here: leave the queue and
        wake the task with CancelledError.  False once the outcome is
        already decided (the task then cancels itself when it resumes, and a
        grant goes back)."""
        if self.ls is None:
            return False
        return self.ls.sem._cancel_waiter(self, msg)

    def _fire(self) -> None:
        """Run the done-callbacks in order, each taken off the waiter just
        before it runs: if one raises, the others are still here to run."""
        self.fired = True
        callbacks = self.callbacks
        while callbacks:
            fn, ctx = callbacks.pop(0)
            if ctx is None:
                fn(self)
            else:
                ctx.run(fn, self)

    def __repr__(self) -> str:
        state = ("cancelled" if self.is_cancelled else "done" if self.posted
                 else "queued")
        return f"<pylimiter waiter need={self.need} {state}>"


class _LoopState(NoCopy):
    """What one semaphore keeps per event loop while the loop has waiters:
    the pending wake batch and the one timeout timer.  Dropped when idle.

    Thread rules: ``batch`` and ``nq`` change under the semaphore's lock (any
    thread may wake a loop's waiters); the deadlines and the timer are only
    touched on the loop's own thread (enqueue, timer, batch runner).
    """

    __slots__ = (
        "batch",
        "deadlines",
        "late",
        "loop",
        "nq",
        "scheduled",
        "sem",
        "seq",
        "timer",
        "timer_at",
    )

    def __new__(cls, *args: object, **kwargs: object) -> _LoopState:
        raise TypeError(MSG_INTERNAL_NOT_CONSTRUCTIBLE.format(cls.__name__))

    def _init(self, sem: AsyncSemaphore, loop: asyncio.AbstractEventLoop) -> None:
        self.sem = sem
        self.loop = loop
        self.batch: list[_Waiter] | None = None   # the wake batch; None: empty
        self.scheduled = False                     # a runner is on its way for it
        self.nq = 0                                    # queued waiters of this loop
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0
        self.deadlines: deque[_Waiter] = deque()       # non-decreasing deadlines
        self.late: list[tuple[float, int, _Waiter]] = []   # heap: out-of-order ones
        self.seq = 0

    def _claim(self) -> bool:
        """Under the lock: True if a batch is pending with no runner on its
        way, which the caller is now to schedule."""
        with self.sem._cs, self.sem._hold:
            if self.batch is None or self.scheduled:
                return False
            self.scheduled = True
            return True

    def schedule(self) -> None:
        """Make sure a runner is scheduled for the pending batch.

        Any BaseException from call_soon/call_soon_threadsafe (a
        KeyboardInterrupt from a signal handler run inside it, a MemoryError
        allocating its Handle) leaves the batch pending and unscheduled, so
        the call is tried again at once, up to _SCHEDULE_TRIES times; the
        first such exception is raised once the runner is scheduled (or the
        tries are spent: then the next post to this loop, a cancel of one of
        the batch's tasks or this loop's timer schedules it).  Only a closed
        loop drops the batch (its grants go back: nobody will take them).
        An interrupt that lands after the Handle was queued makes a second
        runner, which finds the batch empty: harmless."""
        loop = self.loop
        pending: BaseException | None = None
        tries = 0
        while True:
            claimed = False
            try:
                claimed = self._claim()
                if not claimed:
                    break
                if _get_running_loop() is loop:
                    loop.call_soon(self.run)
                else:
                    loop.call_soon_threadsafe(self.run)
                claimed = False
            except BaseException as exc:
                if claimed:
                    with self.sem._cs, self.sem._hold:
                        self.scheduled = False
                if pending is None:
                    pending = exc
                if isinstance(exc, RuntimeError) and _is_closed(loop):
                    if pending is exc:
                        pending = None
                    self.sem._drop_batch(self)
                    break
                tries += 1
                if tries >= _SCHEDULE_TRIES:
                    break
        if pending is not None:
            raise pending

    def run(self) -> None:
        """The batch runner: deliver each outcome in FIFO order.  A
        callback's exception goes to the loop's exception handler and the
        waiter's other callbacks still run; SystemExit/KeyboardInterrupt
        (from a callback or the handler) propagate at once, as from any
        asyncio callback, and what is left of the batch runs next time."""
        sem = self.sem
        with sem._cs, sem._hold:
            batch = self.batch
            self.batch = None
            self.scheduled = False
        if batch is None:
            self.tidy()
            return
        i = 0
        try:
            while i < len(batch):
                w = batch[i]
                try:
                    w._fire()
                except (SystemExit, KeyboardInterrupt):
                    raise
                except BaseException as exc:
                    self.loop.call_exception_handler({
                        "message": MSG_WAKE_CALLBACK_FAILED,
                        "exception": exc,
                        "future": w,
                    })
                    continue   # the same waiter: its remaining callbacks
                i += 1
        except BaseException:
            sem._repost(self, batch[i:] if batch[i].callbacks else batch[i + 1:])
            raise
        self.tidy()

    def add_deadline(self, w: _Waiter) -> None:
        """Track a queued waiter's deadline; arm the timer if it is the
        earliest."""
        d = w.deadline
        dq = self.deadlines
        if not dq or dq[-1].deadline <= d:
            dq.append(w)
        else:
            self.seq += 1
            _heappush(self.late, (d, self.seq, w))
        if self.timer is None or d < self.timer_at:
            self.arm(d)

    def arm(self, deadline: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = deadline
        self.timer = self.loop.call_later(max(0.0, deadline - _monotonic()),
                                          self.on_timer)

    def on_timer(self) -> None:
        """Time out every queued waiter whose deadline has passed, then
        re-arm for the earliest one left."""
        self.timer = None
        pending: BaseException | None = None
        if self.batch is not None and not self.scheduled:
            try:   # a batch whose scheduling failed (G1): on its way now
                self.schedule()
            except BaseException as exc:
                pending = exc
        now = _monotonic()
        expired = []
        dq = self.deadlines
        while dq and dq[0].deadline <= now:
            w = dq.popleft()
            if w.state == W_QUEUED:
                expired.append(w)
        late = self.late
        if late and late[0][0] <= now:
            while late and late[0][0] <= now:
                w = _heappop(late)[2]
                if w.state == W_QUEUED:
                    expired.append(w)
            expired.sort(key=_deadline_of)   # stable: arrival order on ties
        if expired:
            try:
                self.sem._expire(expired)
            except BaseException as exc:   # a check's; every one expired
                if pending is None:
                    pending = exc
        self.prune()
        earliest = [x for x in (dq[0].deadline if dq else None,
                                late[0][0] if late else None) if x is not None]
        if earliest:
            self.arm(min(earliest))
        self.tidy()
        if pending is not None:
            raise pending

    def prune(self) -> None:
        """Drop deadlines of waiters that already left the queue."""
        dq = self.deadlines
        while dq and dq[0].state != W_QUEUED:
            dq.popleft()
        late = self.late
        while late and late[0][2].state != W_QUEUED:
            _heappop(late)

    def tidy(self) -> None:
        """On the loop's thread: forget stale deadlines; when no waiter of
        this loop is queued or pending, cancel the timer and drop the state."""
        self.prune()
        sem = self.sem
        with sem._cs, sem._hold:
            if self.nq or self.batch is not None:
                return
            if sem._loops.get(self.loop) is self:
                del sem._loops[self.loop]
        self.deadlines.clear()
        self.late.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _deadline_of(w: _Waiter) -> float:
    return w.deadline


def _is_closed(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether a RuntimeError from call_soon means "the loop is closed"."""
    try:
        return bool(loop.is_closed())
    except BaseException:
        return False


class _Request(NoCopy, ReleasingRequest[SemaphorePermit]):
    """What ``acquire``/``update`` return: awaitable once (it joins the queue
    when first awaited), and an async context manager that releases the
    permit on exit.

    It is also a coroutine (``send``/``throw``/``close``), as the C twin's
    request is, so ``asyncio.create_task(sem.acquire())`` works.  Stages, as
    the C twin's: 0 made, 1 awaited or started, 2 done."""

    __slots__ = (
        "__weakref__",
        "_gen",
        "_is_cancelled",
        "_mode",
        "_n",
        "_permit",
        "_ref",
        "_result",
        "_sem",
        "_stage",
        "_timeout",
    )

    _sem: AsyncSemaphore
    _permit: SemaphorePermit | None
    _n: int
    _timeout: float | None
    _is_cancelled: IsCancelled
    _stage: int
    _result: SemaphorePermit | None
    _gen: Generator[Any, None, SemaphorePermit | None] | None
    #: 0 awaited; 1 `async with request` (keeps the result for the exit);
    #: 2 `async with sem:` (the semaphore holds the permit).
    _mode: int
    _ref: weakref.ref[_Request] | None   # watched as possibly never awaited

    def __new__(cls, *args: object, **kwargs: object) -> _Request:
        raise TypeError(MSG_REQUEST_NOT_CONSTRUCTIBLE)

    def __await__(self) -> Generator[Any, None, SemaphorePermit]:
        if self._stage:
            raise RuntimeError(MSG_ALREADY_AWAITED)
        self._stage = 1
        if self._ref is not None:
            _started(self)
        g = self._gen = self._run()
        return g   # type: ignore[return-value]

    if TYPE_CHECKING:
        async def __aenter__(self) -> SemaphorePermit: ...
    else:
        def __aenter__(self):
            if self._mode == 0:
                self._mode = 1
            return self

    # ---- the coroutine protocol ------------------------------------------

    def send(self, value: object) -> Any:
        """Coroutine protocol: advance the request."""
        if self._stage == 2:
            raise RuntimeError(MSG_REUSED)
        g = self._gen
        if g is None:
            self._stage = 1
            _started(self)
            g = self._gen = self._run()
        return g.send(None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Coroutine protocol: the awaiting task is cancelled or interrupted.
        A queued request leaves the queue; a grant that raced with it goes
        back; the exception propagates."""
        g = self._gen
        self._stage = 2
        self._is_cancelled = None   # as at the end of _run
        _started(self)
        try:
            exc = thrown_exception(typ, val, tb)
        except BaseException:   # not an exception: stop waiting all the same
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
        self._is_cancelled = None   # as at the end of _run
        _started(self)
        if g is not None:
            g.close()

    def _run(self) -> Generator[Any, None, SemaphorePermit | None]:
        sem = self._sem
        try:
            if self._permit is None and self._is_cancelled is None:
                # plim_try_acquire, inline: nobody queues (bounded) and it
                # fits.  The permit is made first: past the first count
                # below, nothing calls out (no signal handler runs) until
                # the permit holds what was counted.
                n = self._n
                p: SemaphorePermit = _new(SemaphorePermit)
                p._sem = sem
                p._permits = 0
                p._pending = None
                tok = sem._tok
                try:
                    del tok[0]   # the token (see _TokenHold): a bytecode, so no interrupt
                except IndexError:
                    pass   # somebody has it: the slow path below
                else:
                    try:
                        avail = sem._avail
                        if not sem._closed and (
                            (not sem._queue and avail >= n) if sem._bounded
                            else avail - n >= -MAX_ACQUIRED
                        ):
                            sem._avail = avail - n
                            p._permits = n
                            sem._acquired_total += 1
                            sem._wait_counts[0] += 1
                            n = -1
                    finally:
                        tok.append(True)
                if n < 0:
                    if self._mode:
                        return self._granted(p)
                    return p
            p = yield from sem._acquire_slow(self._permit, self._n, self._timeout,
                                             self._is_cancelled)
            return self._granted(p)
        finally:
            self._stage = 2
            self._permit = None   # an update's permit: no longer needed here
            # _fresh may keep this request a while (see _look): it must not
            # keep the caller's is_cancelled -- a connection's bound method,
            # often -- and so the connection alive after the request ended.
            self._is_cancelled = None

    def _granted(self, p: SemaphorePermit) -> SemaphorePermit | None:
        if self._mode == 2:
            # `async with sem:`: the semaphore holds the permit.
            sem = self._sem
            with sem._cs, sem._hold:
                sem._anon += p._permits
                p._permits = 0
            return None
        if self._mode == 1:
            self._result = p   # for the exit of `async with request`
        return p

    def _release_result(self, permit: SemaphorePermit) -> None:
        self._sem.release(permit)


def _new_request(sem: AsyncSemaphore, permit: SemaphorePermit | None, n: int,
                 timeout: float | None, is_cancelled: IsCancelled,
                 mode: int = 0) -> _Request:
    r: _Request = _new(_Request)
    r._sem = sem
    r._permit = permit
    r._n = n
    r._timeout = timeout
    r._is_cancelled = is_cancelled
    r._stage = 0
    r._result = None
    r._gen = None
    r._mode = mode
    r._ref = None
    if not mode:
        _fresh_append(r)
        if len(_fresh) >= _LOOK_AT:
            _look()
    return r


class AsyncSemaphore(NoCopy):
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

    def __new__(cls, *args: Any, **kwargs: Any) -> AsyncSemaphore:
        # Not ready until __init__ has run to its end: every method and
        # property of a semaphore made by __new__ alone (or by a subclass
        # that skips __init__) raises, as the C twin's.  An instance
        # attribute, not a class one, so attribute reads stay specialised.
        self = super().__new__(cls)
        self._ready = False
        self._lim = -1   # acquire's fast check fails until ready (and once closed)
        return self

    def _unready(self) -> RuntimeError:
        return uninitialised_error(self)

    def __init__(
        self,
        max_permits: int,
        max_queue_size: int = 10000,
        timeout: float | None = 25.0,
    ) -> None:
        max_permits, max_queue_size = check_limits(max_permits, max_queue_size)
        if getattr(self, "_ready", False):
            # A second __init__ would forget what is held and queued.
            raise reinit_error(self)
        self._timeout = check_timeout(timeout, None)
        self._max = max_permits
        self._bounded = self._max > 0
        self._avail = self._max if self._bounded else 0
        self._max_queue = max_queue_size
        self._queue: OrderedDict[_Waiter, None] = OrderedDict()
        self._closed = False
        self._cs = _thread.RLock()    # `with self._cs:`: the critical section
        self._hold = _TokenHold(self._cs)   # and the state's token (see _TokenHold)
        self._tok = self._hold.tok
        # The largest request acquire() takes without a closer look: any
        # other is checked (and refused or converted) by check_permits; -1
        # while not ready and once closed.
        self._lim = self._max if self._bounded else MAX_PERMITS
        self._anon = 0   # permits held by `async with sem:` blocks
        self._loops: dict[asyncio.AbstractEventLoop, _LoopState] = {}
        self._acquired_total = 0
        self._timeout_total = 0
        self._queue_full_total = 0
        self._cancelled_total = 0
        self._wait_sum = 0.0
        self._wait_counts = [0] * len(WAIT_BUCKETS)
        self._ready = True
        _SEMAPHORES.add(self)   # for the fork rule (_after_fork_in_child)

    # ---- properties ---------------------------------------------------

    @property
    def max_permits(self) -> int:
        """The limit last set (<= 0: unbounded)."""
        if not self._ready:
            raise self._unready()
        return self._max

    @property
    def available_permits(self) -> int:
        """max_permits - acquired_permits (negative after lowering the limit);
        ``2**63 - 1`` when unbounded."""
        if not self._ready:
            raise self._unready()
        return self._avail if self._bounded else UNBOUNDED_AVAILABLE

    @property
    def acquired_permits(self) -> int:
        """Permits held now (granted and not released)."""
        if not self._ready:
            raise self._unready()
        return self._max - self._avail if self._bounded else -self._avail

    @property
    def queue_size(self) -> int:
        """Requests waiting in the queue."""
        if not self._ready:
            raise self._unready()
        return len(self._queue)

    @property
    def max_queue_size(self) -> int:
        """The configured queue bound (<= 0: unbounded)."""
        if not self._ready:
            raise self._unready()
        return self._max_queue

    @property
    def closed(self) -> bool:
        """True after close()."""
        if not self._ready:
            raise self._unready()
        return self._closed

    def locked(self) -> bool:
        """True when ``acquire(1)`` could not be granted at once: fewer than
        one permit is available, requests are queued (no barging), or the
        semaphore is closed.  As asyncio.Semaphore.locked(); a snapshot."""
        if not self._ready:
            raise self._unready()
        return self._closed or (self._bounded and (bool(self._queue) or self._avail < 1))

    def __repr__(self) -> str:
        if not getattr(self, "_ready", False):
            return uninitialised_repr(self)
        return (
            f"<AsyncSemaphore max_permits={self._max} "
            f"acquired={self.acquired_permits} queued={len(self._queue)}"
            f"{' closed' if self._closed else ''}>"
        )

    # ---- public API ---------------------------------------------------

    def acquire(self, permits: int = 1, *, timeout: float | None = TIMEOUT_NOT_GIVEN,
                is_cancelled: IsCancelled = None) -> _Request:
        """Return an awaitable of a new SemaphorePermit holding ``permits``.

        The request joins the queue when first awaited.  It fails with
        PermitAcquireTimeoutError, PermitAcquireQueueFullError,
        PermitAcquireAlreadyClosedError or PermitAcquireCancelledError.
        ``async with sem.acquire(n) as p:`` releases p on exit.
        """
        lim = self._lim
        if type(permits) is not int or not 0 <= permits <= lim:
            if not self._ready:
                raise self._unready()
            permits = check_permits(permits, self._max, self._bounded)
            lim = -1   # closed?  Asked after the other arguments' checks.
        if timeout is TIMEOUT_NOT_GIVEN:
            timeout = self._timeout
        else:
            timeout = check_timeout(timeout, self._timeout)
        if is_cancelled is not None:
            check_is_cancelled(is_cancelled)
        if lim < 0 and self._closed:
            raise closed_error()
        # _new_request, inline (the uncontended await's hot path).
        r: _Request = _new(_Request)
        r._sem = self
        r._permit = None
        r._n = permits
        r._timeout = timeout
        r._is_cancelled = is_cancelled
        r._stage = 0
        r._result = None
        r._gen = None
        r._mode = 0
        r._ref = None
        _fresh_append(r)
        if len(_fresh) >= _LOOK_AT:
            _look()
        return r

    def update(self, permit: SemaphorePermit, new_permits: int, *,
               timeout: float | None = TIMEOUT_NOT_GIVEN,
               is_cancelled: IsCancelled = None) -> _Request:
        """Return an awaitable that changes ``permit`` to ``new_permits`` in
        place and returns it.  Shrinking completes at once (even after close);
        growing queues for the difference like an acquire, and on failure the
        permit keeps what it had."""
        self._check_permit(permit)
        n = check_permits(new_permits, self._max, self._bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return _new_request(self, permit, n, t, is_cancelled)

    def acquire_blocking(self, permits: int = 1, *,
                         timeout: float | None = TIMEOUT_NOT_GIVEN,
                         is_cancelled: IsCancelled = None) -> SemaphorePermit:
        """Blocking twin of ``acquire`` for threads; the GIL is released while
        waiting."""
        if not self._ready:
            raise self._unready()
        n = check_permits(permits, self._max, self._bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return self._run_blocking(None, n, t, is_cancelled)

    def update_blocking(self, permit: SemaphorePermit, new_permits: int, *,
                        timeout: float | None = TIMEOUT_NOT_GIVEN,
                        is_cancelled: IsCancelled = None) -> SemaphorePermit:
        """Blocking twin of ``update`` for threads."""
        self._check_permit(permit)
        n = check_permits(new_permits, self._max, self._bounded)
        t = check_timeout(timeout, self._timeout)
        check_is_cancelled(is_cancelled)
        return self._run_blocking(permit, n, t, is_cancelled)

    def try_acquire(self, permits: int = 1) -> SemaphorePermit | None:
        """Take ``permits`` now if they fit and nobody queues; else None.
        Never waits and never overtakes queued requests."""
        if not self._ready:
            raise self._unready()
        n = check_permits(permits, self._max, self._bounded)
        with self._cs, self._hold:
            if self._closed:
                raise closed_error()
            if not self._fits_now_locked(n):
                return None
            permit = _new_permit(self, 0)
            self._take_locked(permit, n)
            return permit

    def release(self, permit: SemaphorePermit) -> None:
        """Give back everything ``permit`` holds and set it to 0.
        Releasing again is a no-op; works after close."""
        if type(permit) is not SemaphorePermit or permit._sem is not self:
            raise permit_error(permit, SemaphorePermit)
        tok = self._tok
        try:
            del tok[0]   # the token (see _TokenHold): a bytecode, so no interrupt
        except IndexError:   # somebody has it
            self._release_slow(permit)
            return
        try:
            n = permit._permits
            if n == 0:
                return
            if permit._pending is None and not self._queue:
                # plim_release's fast CAS: nothing to hand over.
                permit._permits = 0
                self._avail += n
                return
        finally:
            tok.append(True)
        self._release_slow(permit)

    def _release_slow(self, permit: SemaphorePermit) -> None:
        done: list[_Waiter] = []
        try:
            with self._cs, self._hold:
                n = permit._permits
                if n == 0:
                    return
                permit._permits = 0
                pending = permit._pending
                if pending is not None and pending.state == W_QUEUED:
                    # Its update now has to take the whole new size.
                    pending.need += n
                self._avail += n
                if not self._queue:
                    return
                try:
                    check = self._process_locked(None, done)
                except BaseException:
                    self._serve_anyway(done)
                    raise
        except _Reentered:
            _later(self._release_slow, permit)
            return
        self._settle(check, done)

    if TYPE_CHECKING:
        async def __aenter__(self) -> None:
            """``async with sem:`` takes one permit (as asyncio.Semaphore)."""

        async def __aexit__(self, exc_type: type[BaseException] | None,
                            exc: BaseException | None,
                            tb: TracebackType | None) -> None: ...
    else:
        def __aenter__(self):
            """``async with sem:`` takes one permit (as asyncio.Semaphore)."""
            if not self._ready:
                raise self._unready()
            return _new_request(self, None, 1, self._timeout, None, 2)

        def __aexit__(self, exc_type, exc, tb):
            if not self._ready:
                raise self._unready()
            try:
                self._anon_exit()
            except _Reentered:
                # A dropped coroutine closed inside a section of ours.
                _later(self._anon_exit)
            return DONE

    def _anon_exit(self) -> None:
        # One section: between two, an interrupt lost the permit.
        self._return_permits(1, True)

    def close(self) -> None:
        """Close (idempotent): queued requests fail with
        PermitAcquireAlreadyClosedError, and so do later acquires."""
        if not self._ready:
            raise self._unready()
        done: list[_Waiter] = []
        with self._cs, self._hold:
            self._closed = True
            self._lim = -1
            while self._queue:
                w, _ = self._queue.popitem(last=False)
                self._leave_locked(w, W_CLOSED)
                done.append(w)
        self._wake_all(done)

    def set_max_permits(self, max_permits: int) -> None:
        """Change the limit, live.  ``max_permits > 0`` bounds the semaphore
        (an unbounded one too): what is held carries over, so
        available_permits may go negative, and queued requests larger than
        the new limit fail with ValueError; raising it grants waiters that
        now fit.  ``max_permits <= 0`` makes it unbounded: every queued
        request is granted at once."""
        m = check_new_max(max_permits)
        if not self._ready:
            raise self._unready()
        done: list[_Waiter] = []
        with self._cs, self._hold:
            old_limit = self._max if self._bounded else 0
            self._avail += (max(0, m)) - old_limit
            self._max = m
            self._bounded = m > 0
            if not self._closed:
                self._lim = m if m > 0 else MAX_PERMITS
            try:
                self._evict_too_large_locked(done)
                check = self._process_locked(None, done)
            except BaseException:
                # Interrupted: the rest is done before it propagates (a
                # request left queued that can never fit would stop the
                # queue for good).
                try:
                    self._evict_too_large_locked(done)
                except BaseException:
                    pass
                self._serve_anyway(done)
                raise
        self._settle(check, done)

    def _evict_too_large_locked(self, done: list[_Waiter]) -> None:
        """Every queued request larger than the (bounded) limit leaves the
        queue, failed.  Each one's fate is decided (and it is woken) before
        it is unlinked, so one that an interrupt left between the two is
        unlinked by the next run."""
        q = self._queue
        for w in list(q):
            if w.state != W_QUEUED:
                done.append(w)   # its batch, if any, is scheduled with the rest
                del q[w]
            elif self._bounded and w.total > self._max:
                w.limit = self._max
                self._leave_locked(w, W_TOO_LARGE)
                done.append(w)
                del q[w]

    def stats(self) -> SemaphoreStats:
        """A snapshot of gauges, counters and the wait-time histogram."""
        if not self._ready:
            raise self._unready()
        with self._cs, self._hold:
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

    def _forget_waiters(self) -> None:
        """In a child process after fork(): empty the queue, keep the
        counts (see _after_fork_in_child).  The forgotten requests are not
        woken: their threads do not exist here, and their loops are the
        parent's.  A fresh critical section: the forking thread holds the
        old one."""
        self._cs = _thread.RLock()
        self._hold = _TokenHold(self._cs)   # a thread of the parent's may have held it
        self._tok = self._hold.tok
        for w in self._queue:
            w.state = W_REMOVED
            p = w.permit
            if p is not None and p._pending is w:
                p._pending = None
        self._queue.clear()
        self._loops = {}

    def _check_permit(self, permit: object) -> None:
        if type(permit) is not SemaphorePermit or permit._sem is not self:
            raise permit_error(permit, SemaphorePermit)

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

    def _leave_locked(self, w: _Waiter, state: int, post: bool = True,
                      woken: bool = False) -> None:
        """A waiter leaves the queue for good (the caller unlinked it).

        It is woken here, in the same critical section that decides its
        fate (G2): a blocking thread through its lock, an asyncio task by
        joining its loop's wake batch (``post``; not when its own task is
        the one leaving), so that nothing which interrupts the caller after
        the lock is dropped can lose the wake-up.  Scheduling the batch's
        runner is left to the caller, after the lock (``_wake_all``).
        ``woken``: the caller has set the state and woken it already."""
        if not woken:
            w.state = state
            lock = w.lock
            if lock is not None:
                lock.release()
            elif post and w.ls is not None and not w.posted:
                w.posted = True
                ls = w.ls
                if ls.batch is None:
                    ls.batch = [w]
                else:
                    ls.batch.append(w)
        if w.ls is not None:
            w.ls.nq -= 1
        p = w.permit
        if p is not None and p._pending is w:
            p._pending = None
        # it is asked no more; what the check holds (a connection, often)
        # must not live on with a waiter that a timer heap or a late
        # reference still keeps
        w.check = None

    def _process_locked(self, checked: _Waiter | None,
                        done: list[_Waiter]) -> _Waiter | None:
        """Grant heads while they fit; stop at a head with a check that has
        not been answered (returned: the caller asks it with no lock held).
        Unbounded, grant without asking, as long as nothing overflows."""
        q = self._queue
        now = None
        h = None
        asked = checked
        try:
            while q:
                h = next(iter(q))
                if self._bounded:
                    if h.check is not None and h is not checked:
                        return h
                    if self._avail < h.need:
                        break
                elif h.need - self._avail > MAX_ACQUIRED:
                    break
                if now is None:
                    now = _monotonic()
                # From the unlink to the wake-up nothing here calls out, so
                # no signal handler runs in between and an interrupt cannot
                # lose the grant (G2): _grant_locked's and _leave_locked's
                # first steps, inline.
                need = h.need
                del q[h]
                self._avail -= need
                h.granted = need
                h.permit._permits += need   # type: ignore[union-attr]
                h.state = W_GRANTED
                lock = h.lock
                if lock is not None:
                    lock.release()
                elif h.ls is not None and not h.posted:
                    h.posted = True
                    ls = h.ls
                    if ls.batch is None:
                        ls.batch = [h]
                    else:
                        ls.batch.append(h)
                done.append(h)
                self._leave_locked(h, W_GRANTED, woken=True)
                self._record_wait_locked(max(0.0, now - h.enqueued))
                checked = None
        except BaseException:
            # Interrupted (a signal handler's KeyboardInterrupt, at a call):
            # the job is finished before it propagates -- the heads that fit
            # are granted, and as the callers' _settle will not run, the
            # tasks granted so far have their loops' batches scheduled here.
            # A head whose state says granted was woken already (nothing
            # calls out between the two).
            if h is not None and h.state == W_GRANTED and h not in done:
                done.append(h)
            self._serve_anyway(done, asked)
            raise
        return None

    def _return_permits(self, n: int, anon: bool = False) -> None:
        """Give ``n`` permits held by no permit object (``anon``: that
        ``async with sem:`` took) back to the pool."""
        try:
            with self._cs, self._hold:
                if anon:
                    if self._anon <= 0:
                        raise RuntimeError(MSG_ANON_EXIT)
                    self._anon -= n
                self._avail += n   # no call since the line above: one step
                if not self._queue:
                    return
                done: list[_Waiter] = []
                try:
                    check = self._process_locked(None, done)
                except BaseException:
                    self._serve_anyway(done)
                    raise
        except _Reentered:
            _later(self._return_permits, n, anon)
            return
        self._settle(check, done)

    def _serve_anyway(self, done: list[_Waiter], checked: _Waiter | None = None) -> None:
        """In a section an interrupt stopped after it gave permits back (in
        _process_locked, or at its entry, which its own handler does not
        cover): serve the heads that fit and schedule their wakes, as the
        section would have (before, an interrupt at that entry left them
        queued with the permits free: nobody was served until the next
        release).  Heads with a check still to ask (other than ``checked``)
        are left to the next release or their timeout: the check is the
        user's code, not run under the lock.  Anything raised here is
        dropped: the first interrupt is the one that propagates."""
        try:
            self._process_locked(checked, done)
        except BaseException:
            pass
        try:
            self._wake_all(done)
        except BaseException:
            pass

    def _settle(self, check: _Waiter | None, done: list[_Waiter]) -> None:
        """Answer pending checks outside the lock, then wake what left the
        queue.  A check that raises something other than an Exception
        (KeyboardInterrupt, SystemExit...) counts as cancelled too, so the
        queue moves on; that exception is raised once every waiter is woken.
        Whatever interrupts the checks, the waiters already in ``done`` are
        woken before it propagates."""
        pending: BaseException | None = None
        try:
            while check is not None:
                fn = check.check
                cancelled, cause = False, None
                try:
                    # None: it left the queue meanwhile (_leave_locked
                    # dropped its check); the head test below moves on
                    if fn is not None:
                        cancelled, cause = ask_cancelled(fn)
                except BaseException as exc:
                    cancelled, cause = True, exc
                    if pending is None:
                        pending = exc
                with self._cs, self._hold:
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
        except BaseException as exc:
            if pending is None:
                pending = exc
            if not isinstance(exc, _Reentered):
                try:
                    with self._cs, self._hold:
                        self._serve_anyway(done)
                except BaseException:
                    pass
        try:
            self._wake_all(done)
        except BaseException as exc:
            if pending is None:
                pending = exc
        if pending is not None:
            raise pending

    def _wake_all(self, done: list[_Waiter]) -> None:
        """Schedule the wake batches that the waiters in ``done`` joined
        when they left the queue (blocking threads were woken then).  Every
        batch is tried even if one raises (an interrupt, a revert's check on
        a closed loop); the first such exception is raised after.  An
        interrupt inside this loop tries the waiter it hit once more."""
        pending: BaseException | None = None
        i = 0
        n = len(done)
        retried = -1
        while i < n:
            try:
                while i < n:
                    ls = done[i].ls
                    if ls is not None and ls.batch is not None and not ls.scheduled:
                        ls.schedule()
                    i += 1
            except BaseException as exc:
                if pending is None:
                    pending = exc
                if retried == i:
                    i += 1
                else:
                    retried = i
        if pending is not None:
            raise pending

    def _repost(self, ls: _LoopState, rest: list[_Waiter]) -> None:
        """Put the undelivered rest of a batch back in front (its runner was
        interrupted by SystemExit/KeyboardInterrupt)."""
        if not rest:
            return
        with self._cs, self._hold:
            if ls.batch is None:
                ls.batch = rest
            else:
                ls.batch[:0] = rest
        ls.schedule()

    def _drop_batch(self, ls: _LoopState) -> None:
        """The batch's loop is closed: give back grants nobody will take,
        and forget the loop if nothing of it is left."""
        with self._cs, self._hold:
            batch = ls.batch or []
            ls.batch = None
            ls.scheduled = False
        pending: BaseException | None = None
        for w in batch:
            try:
                self._revert(w)
            except BaseException as exc:   # a check's, after the revert
                if pending is None:
                    pending = exc
        ls.tidy()
        if pending is not None:
            raise pending

    def _revert(self, w: _Waiter) -> None:
        """Give back a grant that its requester will never take."""
        done: list[_Waiter] = []
        check = None
        try:
            with self._cs, self._hold:
                if w.state == W_GRANTED and not w.reverted:
                    check = self._give_back_locked(w, done)
        except _Reentered:
            _later(self._revert, w)
            return
        self._settle(check, done)

    def _give_back_locked(self, w: _Waiter, done: list[_Waiter]) -> _Waiter | None:
        assert w.permit is not None
        w.reverted = True
        w.permit._permits -= w.granted
        self._avail += w.granted
        try:
            return self._process_locked(None, done)
        except BaseException:
            self._serve_anyway(done)
            raise

    def _abandon(self, w: _Waiter, timed_out: bool, post: bool = False) -> None:
        """The requester stops waiting (timeout, task cancel, interrupt).
        A queued request leaves the queue (``post``: and is woken first); a
        grant that raced with a cancel goes back; a grant that raced with a
        timeout stands."""
        done: list[_Waiter] = []
        check = None
        try:
            with self._cs, self._hold:
                if w.state == W_QUEUED:
                    q = self._queue
                    if w in q:
                        was_head = next(iter(q)) is w
                        del q[w]
                    else:
                        # Unlinked by a run of this that an interrupt cut
                        # short (the next head may not have been served).
                        was_head = True
                    if post:
                        done.append(w)
                    try:
                        self._leave_locked(w, W_REMOVED, post)
                        if timed_out:
                            self._timeout_total += 1
                        else:
                            self._cancelled_total += 1
                        if was_head:
                            check = self._process_locked(None, done)
                    except BaseException:
                        if was_head:
                            self._serve_anyway(done)
                        raise
                elif w.state == W_GRANTED and not timed_out and not w.reverted:
                    self._cancelled_total += 1
                    check = self._give_back_locked(w, done)
        except _Reentered:
            _later(self._abandon, w, timed_out, post)
            return
        self._settle(check, done)

    def _cancel_waiter(self, w: _Waiter, msg: str | None) -> bool:
        ls = w.ls
        assert ls is not None
        if w.posted:
            # Decided, and in (or past) a wake batch: if scheduling that
            # batch failed earlier (G1), this is the task's own way out.
            if ls.batch is not None and not ls.scheduled:
                ls.schedule()
            return False
        try:
            self._abandon(w, False)
        finally:   # the task is woken whatever a check raised meanwhile
            w.is_cancelled = True
            w.cancel_msg = msg
            with self._cs, self._hold:
                if not w.posted:
                    w.posted = True
                    if ls.batch is None:
                        ls.batch = [w]
                    else:
                        ls.batch.append(w)
            ls.schedule()
        return True

    def _expire(self, expired: list[_Waiter]) -> None:
        """The loop's timer: these waiters' deadlines have passed."""
        pending: BaseException | None = None
        for w in expired:
            try:
                self._abandon(w, True, post=True)
            except BaseException as exc:   # a check's; the others expire too
                if pending is None:
                    pending = exc
        if pending is not None:
            raise pending

    def _shrink(self, permit: SemaphorePermit, n: int) -> bool:
        """Set ``permit`` to ``n`` if that is no more than it holds (a
        release: after close too, no check) and return True; False when
        ``n`` would grow it."""
        done: list[_Waiter] = []
        check = None
        with self._cs, self._hold:
            if permit._pending is not None:
                raise RuntimeError(MSG_UPDATE_IN_PROGRESS)
            cur = permit._permits
            if n > cur:
                return False
            permit._permits = n
            if n < cur:
                self._avail += cur - n
                try:
                    check = self._process_locked(None, done)
                except BaseException:
                    self._serve_anyway(done)
                    raise
        self._settle(check, done)
        return True

    def _begin(self, permit: SemaphorePermit | None, n: int,
               timeout: float | None, is_cancelled: IsCancelled,
               blocking: bool, box: list[Any]) -> SemaphorePermit | _Waiter:
        """Shared start of every acquire/update: returns the permit when done
        at once, or a queued _Waiter, also put in ``box[0]`` as it queues.
        Raises on immediate failure.  The caller holds the box from before
        the call, so that an interrupt between the queueing and the caller's
        own hold on the waiter (the section's exit, this return) finds it to
        take it out of the queue: before, that request stayed queued with
        nobody to collect it, and took its grant with it."""
        cancelled, cause = False, None
        if is_cancelled is not None and self._bounded:
            cancelled, cause = ask_cancelled(is_cancelled)
        is_update = permit is not None
        if permit is not None and self._shrink(permit, n):
            return permit
        loop = None if blocking else _get_running_loop()
        with self._cs, self._hold:
            if permit is None:
                permit = _new_permit(self, 0)
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
            if not blocking and loop is None:
                raise no_loop_error()
            if self._bounded and n > self._max:
                raise too_large_error(n, self._max)
            if self._max_queue > 0 and len(self._queue) >= self._max_queue:
                self._queue_full_total += 1
                raise queue_full_error(self._max_queue)
            w = _new(_Waiter)
            w._init(permit, is_cancelled)
            if loop is None:
                w.lock = threading.Lock()
                w.lock.acquire()
            else:
                ls = self._loops.get(loop)
                if ls is None:
                    ls = self._loops[loop] = _new(_LoopState)
                    ls._init(self, loop)
                w.ls = ls
                ls.nq += 1
            w.need = need
            w.total = n
            w.state = W_QUEUED
            w.enqueued = _monotonic()
            if is_update:
                permit._pending = w
            box[0] = w   # no call between: boxed exactly when queued
            self._queue[w] = None
        return w

    def _finish(self, w: _Waiter, timeout: float | None) -> SemaphorePermit:
        if w.state == W_GRANTED:
            p = w.permit
            assert p is not None
            w.permit = None   # a stale deadline entry must not keep it alive
            return p
        raise left_queue_error(w.state, w.total, w.limit, w.cause, timeout)

    def _acquire_slow(self, permit: SemaphorePermit | None, n: int,
                      timeout: float | None, is_cancelled: IsCancelled
                      ) -> Generator[Any, None, SemaphorePermit]:
        box: list[Any] = [None]
        try:
            r = self._begin(permit, n, timeout, is_cancelled, False, box)
            # The waiter holds the check while it queues.  This frame must
            # not: a cancel's exception keeps the frame in a cycle with its
            # traceback until the next collection, and the check with it (a
            # connection).
            del is_cancelled
            if type(r) is SemaphorePermit:
                return r
            w: _Waiter = r   # type: ignore[assignment]
            assert w.ls is not None
            if timeout is not None:
                w.deadline = w.enqueued + min(timeout, MAX_TIMEOUT_S)
                w.ls.add_deadline(w)
            while not w.posted:
                w._asyncio_future_blocking = True
                yield w
        except BaseException:
            if box[0] is not None:
                self._abandon(box[0], False)
            raise
        return self._finish(w, timeout)

    def _run_blocking(self, permit: SemaphorePermit | None, n: int,
                      timeout: float | None,
                      is_cancelled: IsCancelled) -> SemaphorePermit:
        box: list[Any] = [None]
        try:
            r = self._begin(permit, n, timeout, is_cancelled, True, box)
            if type(r) is SemaphorePermit:
                return r
            w: _Waiter = r   # type: ignore[assignment]
            if not _wait_blocking(w, timeout):
                self._abandon(w, timed_out=True)   # a grant that raced with it stands
        except BaseException:
            # A grant that raced with the interrupt goes back.  The lock is
            # this waiter's own, so a wake-up still on its way is harmless.
            if box[0] is not None:
                self._abandon(box[0], timed_out=False)
            raise
        return self._finish(w, timeout)


def _wait_blocking(w: _Waiter, timeout: float | None) -> bool:
    """Wait until ``w`` leaves the queue (True) or ``timeout`` seconds pass
    (False).  Its waker releases ``w.lock`` as it decides, under the
    semaphore's lock; the wait is cut in slices of _POLL_S that re-read the
    state all the same, so a wake-up that an interrupt took from the waker
    delays this thread by a slice at most (issue 32, G2)."""
    lock = w.lock
    assert lock is not None
    if timeout is None:
        while not lock.acquire(timeout=_POLL_S):
            if w.state != W_QUEUED:
                break
        return True
    deadline = _monotonic() + timeout
    while True:
        left = deadline - _monotonic()
        if left <= 0:
            return w.state != W_QUEUED
        if lock.acquire(timeout=min(left, _POLL_S, _LOCK_TIMEOUT_MAX)):
            return True
        if w.state != W_QUEUED:
            return True


class AsyncDualMemoryLimiter(DualMemoryLimiterBase[AsyncSemaphore]):
    __doc__ = DualMemoryLimiterBase.__doc__
    _semaphore_class = AsyncSemaphore


# ---- the fork rule (issue 32, G5/G6) ------------------------------------------
# A child process starts with the parent's counts (the permits held by the
# parent's objects, which the child has copies of, stay taken until the
# child releases them) and an empty queue, as a threading.Semaphore does:
# permits released in the child go to the child's own requests, never to
# waiters that exist only in the parent.  Each semaphore's critical section
# is taken around the fork, so that no other thread is half-way through changing its
# state when the child's copy is made.

_SEMAPHORES: weakref.WeakSet[AsyncSemaphore] = weakref.WeakSet()
_held_at_fork: list[AsyncSemaphore] = []
#: How long the fork waits for one semaphore's critical section (its holders
#: never wait for anything but the GIL; this bounds only a fork made,
#: absurdly, from a finaliser that ran inside one of its critical sections).
_FORK_LOCK_WAIT_S = 1.0


def _before_fork() -> None:
    for sem in list(_SEMAPHORES):
        if sem._cs.acquire(timeout=_FORK_LOCK_WAIT_S):
            _held_at_fork.append(sem)
            # A fast path that holds the token (only possible without the
            # GIL or under a tracer) finishes first, bounded as above.
            deadline = _monotonic() + _FORK_LOCK_WAIT_S
            while not sem._tok and not sem._hold.owned and _monotonic() < deadline:
                _sleep(0)


def _after_fork_in_parent() -> None:
    while _held_at_fork:
        _held_at_fork.pop()._cs.release()


def _after_fork_in_child() -> None:
    _held_at_fork.clear()
    for sem in list(_SEMAPHORES):
        sem._forget_waiters()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
