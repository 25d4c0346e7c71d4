"""Issue 32, G1 and G2: a wake-up is never lost to an exception raised while
it is being delivered, on both twins.

G1: whatever moves waiters out of the queue (release, set_max_permits,
close, an update's shrink, a waiter's cancel or timeout) has its loop run
them through ``loop.call_soon``/``call_soon_threadsafe``.  A BaseException
from that call (KeyboardInterrupt or SystemExit from a signal handler run
inside it, MemoryError allocating its Handle) must leave the books right:
the exception reaches the caller once the wake is scheduled anyway (or,
when the call keeps failing, once the batch is left pending, to be
scheduled by the next event of that loop), a granted waiter is never lost,
and one that times out never keeps permits.

G2 (pure twin): a blocking waiter granted by a ``release()`` that is
interrupted after the grant, while it wakes what it granted, still wakes,
with or without a timeout.

The MemoryError-at-every-allocation pass (``_testcapi.set_nomemory``) is in
``test_nomemory_*``: it runs on the C twin wherever _testcapi exists, and in
the Py_DEBUG tier (`make test-dbg`).
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time

import pytest

from tests._helpers import cs_held, release_all

KINDS = [KeyboardInterrupt, SystemExit, MemoryError]
#: Timeouts stretch on the Py_DEBUG tier's stress pass (a collection at
#: nearly every allocation, under ASan): set-up takes that much longer.
SLOW = 20 if os.environ.get("PYLIMITER_GC_THRESHOLD") else 1


class FlakyLoop(asyncio.SelectorEventLoop):
    """An event loop whose next ``fail`` schedulings of a pylimiter wake
    batch raise ``exc`` at the call's first line, as a signal handler run
    there would (the Handle is not queued)."""

    def __init__(self):
        super().__init__()
        self.fail = 0
        self.exc = KeyboardInterrupt
        self.raised = 0
        self.reported = []
        self.set_exception_handler(lambda loop, ctx: self.reported.append(ctx))

    def _maybe_fail(self, callback):
        owner = getattr(callback, "__self__", None)
        if self.fail and type(owner).__name__ == "_LoopState":
            self.fail -= 1
            self.raised += 1
            raise self.exc("injected into call_soon")

    def call_soon(self, callback, *args, context=None):
        self._maybe_fail(callback)
        return super().call_soon(callback, *args, context=context)

    def call_soon_threadsafe(self, callback, *args, context=None):
        self._maybe_fail(callback)
        return super().call_soon_threadsafe(callback, *args, context=context)


@pytest.fixture
def loop():
    lp = FlakyLoop()
    yield lp
    lp.fail = 0
    try:
        pending = [t for t in asyncio.all_tasks(lp) if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            lp.run_until_complete(asyncio.wait(pending, timeout=5))
    finally:
        lp.close()


def spin(loop, seconds=0.05):
    """Run the loop for a while (its waiters join, wakes land)."""
    loop.run_until_complete(asyncio.sleep(seconds))


def park(loop, sem, n, timeout=None):
    """n tasks, each waiting for 1 permit (then holding it)."""
    async def one():
        return await sem.acquire(1, timeout=timeout)
    tasks = [loop.create_task(one()) for _ in range(n)]
    spin(loop)
    assert sem.queue_size == n
    return tasks


def from_thread(fn):
    """Call fn in another thread (so the wake goes through
    call_soon_threadsafe); return what it raised, or None."""
    out = []

    def body():
        try:
            fn()
        except BaseException as exc:   # noqa: BLE001 - handed to the test
            out.append(exc)
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive()
    return out[0] if out else None


def on_loop(loop, fn):
    """Call fn from a callback on the loop (call_soon); return what it
    raised, or None."""
    out = []

    def body():
        try:
            fn()
        except BaseException as exc:   # noqa: BLE001 - handed to the test
            out.append(exc)
    loop.call_soon(body)
    spin(loop, 0)
    return out[0] if out else None


def finish(loop, tasks, seconds=5.0):
    """Run the loop until every task is done (bounded); return outcomes."""
    loop.run_until_complete(asyncio.wait(tasks, timeout=seconds))
    out = []
    for t in tasks:
        if not t.done():
            out.append("pending")
        elif t.cancelled():
            out.append("cancelled")
        elif t.exception() is not None:
            out.append(type(t.exception()).__name__)
        else:
            out.append(t.result())
    return out


TRIGGERS = ["release", "set_max_permits", "update_shrink", "async_exit"]


def trigger(mod, sem, held, how):
    """A call that grants the first parked waiter."""
    if how == "release":
        return lambda: sem.release(held)
    if how == "set_max_permits":
        return lambda: sem.set_max_permits(2)
    if how == "update_shrink":
        return lambda: sem.update(held, 0).send(None)
    return lambda: sem.__aexit__(None, None, None)


def _take(sem, how):
    if how == "async_exit":
        # `async with sem:` holds its permit anonymously.
        coro = sem.__aenter__().__await__()
        with pytest.raises(StopIteration):
            coro.send(None)
        return None
    return sem.try_acquire(1)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("how", TRIGGERS)
@pytest.mark.parametrize("where", ["thread", "loop"])
def test_first_wake_scheduling_raising_loses_no_grant(mod, loop, kind, how, where):
    sem = mod.AsyncSemaphore(1, 0, None)
    held = _take(sem, how)
    tasks = park(loop, sem, 2)
    loop.fail, loop.exc = 1, kind
    fn = trigger(mod, sem, held, how)
    if how == "update_shrink":
        shrink = fn

        def fn():
            with pytest.raises(StopIteration):
                shrink()
    raised = from_thread(fn) if where == "thread" else on_loop(loop, fn)
    assert loop.raised == 1
    # The caller learns of the interrupt, after the wake was scheduled anyway.
    assert type(raised) is kind
    spin(loop)
    first = tasks[0]
    assert first.done() and first.result().permits == 1
    assert sem.queue_size == 1
    sem.release(first.result())
    second = finish(loop, tasks)[1]
    assert second.permits == 1
    release_all(sem, [second] + ([held] if held is not None else []))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_close_whose_wake_scheduling_raises_fails_every_waiter(mod, loop, kind):
    sem = mod.AsyncSemaphore(1, 0, None)
    held = sem.try_acquire(1)
    tasks = park(loop, sem, 3)
    loop.fail, loop.exc = 1, kind
    assert type(from_thread(sem.close)) is kind
    assert finish(loop, tasks) == ["PermitAcquireAlreadyClosedError"] * 3
    release_all(sem, [held])


def _big_then_small(loop, sem, timeout=None):
    """A request for 2 at the head (1 of 2 permits is held), 1 behind it."""
    async def acquire(n):
        return await sem.acquire(n, timeout=timeout)
    big = loop.create_task(acquire(2))
    spin(loop, 0)
    small = loop.create_task(acquire(1))
    spin(loop, 0)
    assert sem.queue_size == 2
    return big, small


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_cancel_whose_wake_scheduling_raises(mod, loop, kind):
    """Cancelling the head (on the loop) lets the waiter behind it through;
    the wake of both goes through call_soon, which raises once."""
    sem = mod.AsyncSemaphore(2, 0, None)
    held = sem.try_acquire(1)
    big, small = _big_then_small(loop, sem)
    loop.fail, loop.exc = 1, kind
    assert type(on_loop(loop, big.cancel)) is kind
    out = finish(loop, [big, small])
    assert out[0] == "cancelled" and out[1].permits == 1
    release_all(sem, [held, out[1]])


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_timeout_whose_wake_scheduling_raises_keeps_no_permit(mod, loop, kind):
    """The head times out on the loop's timer, whose wake of it raises once:
    it fails with the timeout and holds nothing; the waiter behind it, which
    its leaving lets through, is granted and woken."""
    sem = mod.AsyncSemaphore(2, 0, None)
    held = sem.try_acquire(1)
    t_big, t_small = _big_then_small(loop, sem, timeout=0.05 * SLOW)
    loop.fail, loop.exc = 1, kind
    try:
        loop.run_until_complete(asyncio.sleep(0.3 * SLOW))
    except kind:   # from the timer's callback (asyncio lets these through)
        pass
    out = finish(loop, [t_big, t_small])
    assert out[0] == "PermitAcquireTimeoutError"
    assert out[1].permits == 1
    release_all(sem, [p for p in [held, out[1]] if p is not None])
    assert loop.raised == 1


@pytest.mark.parametrize("redrive", ["release", "cancel", "timer"])
def test_scheduling_that_keeps_failing_is_redone_by_the_next_event(mod, loop, redrive):
    """call_soon_threadsafe fails every time: the release raises and the
    batch stays pending; once the loop accepts callbacks again, the next
    event of that loop (another wake, the task's cancel, the loop's timer)
    delivers it, and no permit is lost or kept by a waiter that gave up."""
    sem = mod.AsyncSemaphore(2, 0, None)
    a = sem.try_acquire(1)
    b = sem.try_acquire(1)
    timeout = 0.2 * SLOW if redrive == "timer" else None
    tasks = park(loop, sem, 2, timeout=timeout)
    loop.fail, loop.exc = 10**6, MemoryError
    assert type(from_thread(lambda: sem.release(a))) is MemoryError
    spin(loop)
    assert not tasks[0].done()           # the wake is pending, not lost
    assert sem.queue_size == 1 and sem.acquired_permits == 2
    loop.fail = 0
    if redrive == "release":
        assert from_thread(lambda: sem.release(b)) is None
        out = finish(loop, tasks)
        assert [p.permits for p in out] == [1, 1]
        release_all(sem, out)
    elif redrive == "cancel":
        tasks[0].cancel()
        out = finish(loop, [tasks[0]])
        assert out == ["cancelled"]
        spin(loop)                       # its grant went on to the next waiter
        assert tasks[1].done() and tasks[1].result().permits == 1
        release_all(sem, [p for p in [b, tasks[1].result()] if p is not None])
    else:
        out = finish(loop, tasks, 3 * SLOW)
        assert out[0].permits == 1 and out[1] == "PermitAcquireTimeoutError"
        release_all(sem, [p for p in [b, out[0]] if p is not None])


def test_closed_loop_still_gives_grants_back(mod):
    """The one RuntimeError that drops a batch: its loop is closed."""
    lp = asyncio.new_event_loop()
    sem = mod.AsyncSemaphore(1, 0, None)
    held = sem.try_acquire(1)

    async def one():
        return await sem.acquire(1)
    task = lp.create_task(one())
    lp.run_until_complete(asyncio.sleep(0.01))
    lp.close()
    sem.release(held)
    assert sem.acquired_permits == 0 and sem.queue_size == 0
    del task
    gc.collect()


def test_runtime_error_of_an_open_loop_is_retried(mod, loop):
    sem = mod.AsyncSemaphore(1, 0, None)
    held = sem.try_acquire(1)
    tasks = park(loop, sem, 1)
    loop.fail, loop.exc = 1, RuntimeError
    assert type(from_thread(lambda: sem.release(held))) is RuntimeError
    out = finish(loop, tasks)
    assert out[0].permits == 1
    release_all(sem, out)


# ---- G2: a blocking waiter granted by an interrupted release ------------------


class _Interrupter:
    """A trace function that raises KeyboardInterrupt at the k-th line the
    pure twin runs once the releasing call has granted the queued waiter and
    dropped the semaphore's lock (the wake phase), as a signal handler
    would."""

    def __init__(self, sem, k):
        self.sem = sem
        self.k = k
        self.seen = 0
        self.fired = False

    def __call__(self, frame, event, arg):
        if self.fired or "_limiter_py" not in frame.f_code.co_filename:
            return None
        return self.local

    def local(self, frame, event, arg):
        # After the grant (the waiter left the queue) and the critical
        # section (it is free again).
        if event == "line" and not self.fired and self.sem.queue_size == 0 \
                and not cs_held(self.sem) and self.sem._tok:
            self.seen += 1
            if self.seen == self.k:
                self.fired = True
                raise KeyboardInterrupt("injected in the wake phase")
        return self.local


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_blocking_waiter_granted_by_an_interrupted_release_wakes(timeout):
    from pylimiter import _limiter_py as mod

    k = 1
    while True:
        sem = mod.AsyncSemaphore(1, 0, None)
        held = sem.acquire_blocking(1)
        got = []
        waiter = threading.Thread(
            target=lambda: got.append(sem.acquire_blocking(1, timeout=timeout)), daemon=True)
        waiter.start()
        deadline = time.monotonic() + 5
        while sem.queue_size == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        tracer = _Interrupter(sem, k)
        sys.settrace(tracer)
        try:
            sem.release(held)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        waiter.join(3)
        assert not waiter.is_alive(), f"interrupted at wake-phase line {k}: never woken"
        assert got and got[0].permits == 1
        release_all(sem, got)
        if not tracer.fired:
            break
        k += 1
    assert k > 1   # the wake phase has lines, and each one was interrupted


# ---- MemoryError at every allocation (C twin; the Py_DEBUG tier too) ---------

try:
    import _testcapi
except ImportError:   # pragma: no cover - CPython builds without test modules
    _testcapi = None
needs_nomemory = pytest.mark.skipif(
    _testcapi is None or not hasattr(_testcapi, "set_nomemory"),
    reason="_testcapi.set_nomemory is not available")

NOMEM_CALLS = ["release", "set_max_permits", "close"]
#: The waiters' timeout: the loop's timer is what schedules a batch whose
#: scheduling failed for good (nothing else happens on that loop here).
NOMEM_TIMEOUT = 0.1 * SLOW


def _allocating_check():
    """An is_cancelled that allocates (so that it can fail)."""
    return len([0] * 8) == 0


def _nomemory_round(c, how, start, stop, check):
    """One scenario: a held permit and two parked tasks (the first with an
    is_cancelled check, asked when it reaches the head, if ``check``), then ``how`` with
    allocations start..stop failing (stop 0: all from start on).  Returns
    whether the call raised MemoryError; checks that, once allocations work
    again, every waiter gets an outcome (granted, or failed holding
    nothing) and the books are right."""
    loop = asyncio.new_event_loop()
    # Not asyncio's debug mode (-X dev): its Handle records a traceback,
    # and CPython's own traceback code is not what is under test here.
    loop.set_debug(False)
    try:
        sem = c.AsyncSemaphore(3, 0, None)
        held = sem.try_acquire(3)

        async def one(is_cancelled):
            return await sem.acquire(1, timeout=NOMEM_TIMEOUT, is_cancelled=is_cancelled)
        tasks = [loop.create_task(one(_allocating_check if check else None)),
                 loop.create_task(one(None))]
        loop.run_until_complete(asyncio.sleep(0))
        assert sem.queue_size == 2
        call = {"release": lambda: sem.release(held),
                "set_max_permits": lambda: sem.set_max_permits(6),
                "close": sem.close}[how]
        raised = False
        # No collection meanwhile: the collector's own allocations under a
        # failing allocator are not under test (and can keep the test from
        # removing the hooks on a debug build).
        gc.disable()
        _testcapi.set_nomemory(start, stop)
        try:
            call()
        except MemoryError:
            raised = True
        finally:
            _testcapi.remove_mem_hooks()
            gc.enable()
        loop.run_until_complete(asyncio.wait(tasks, timeout=5))
        outcomes = []
        for t in tasks:
            assert t.done(), f"{how}: allocation {start} failing lost a task's wake-up"
            outcomes.append(t.exception() or t.result())
        names = [type(o).__name__ for o in outcomes]
        # `held` too: it holds 0 once released, 3 if the call failed first.
        live = [o for o in outcomes if type(o).__name__ == "SemaphorePermit"] + [held]
        gc.collect()
        assert sem.queue_size == 0
        assert sem.acquired_permits == sum(p.permits for p in live), names
        # A check that cannot be asked (MemoryError) counts as cancelled.
        allowed = {"close": {"PermitAcquireAlreadyClosedError", "PermitAcquireTimeoutError"},
                   }.get(how, {"SemaphorePermit", "PermitAcquireTimeoutError",
                               "PermitAcquireCancelledError"})
        assert set(names) <= allowed, names
        for p in live:
            sem.release(p)
        return raised
    finally:
        loop.close()


def _allocations(c, how, check):
    """How many allocations ``how`` makes in this scenario: the smallest n
    such that failing every allocation from the n-th on (numbered from 0)
    no longer makes the call raise."""
    for start in range(1000):
        if not _nomemory_round(c, how, start, 0, check):
            return start
    pytest.fail(f"{how} kept allocating for 1000 allocations")


@needs_nomemory
@pytest.mark.c_extension
@pytest.mark.parametrize("check", [False, True], ids=["plain", "checked-head"])
@pytest.mark.parametrize("how", NOMEM_CALLS)
def test_nomemory_at_each_allocation(how, check):
    """MemoryError at the n-th allocation of release/set_max_permits/close
    and only there, for every n the call makes: the books stay right and
    every waiter gets its outcome."""
    from pylimiter._impls import C

    n = _allocations(C.module, how, check)
    assert n > 0
    for start in range(n):
        _nomemory_round(C.module, how, start, start + 1, check)


@needs_nomemory
@pytest.mark.c_extension
@pytest.mark.parametrize("check", [False, True], ids=["plain", "checked-head"])
@pytest.mark.parametrize("how", NOMEM_CALLS)
def test_nomemory_from_each_allocation_on(how, check):
    """The same with every allocation failing from the n-th on, until the
    call returns: whatever the call could not schedule is delivered by the
    loop's own timer once memory is back."""
    from pylimiter._impls import C

    assert _allocations(C.module, how, check) > 0
