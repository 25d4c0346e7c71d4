"""Issue 18, item 5: a BaseException (KeyboardInterrupt, SystemExit...) raised
by user code the limiter calls, at each place it calls it, on both twins:
whatever a callback raises, every grant reaches its waiter, the queue keeps
moving, and the exception propagates once the state is consistent.

User code the limiter calls: ``is_cancelled`` (at the call, and at the
queue's head from whichever call moves the queue: release, set_max_permits,
a waiter's cancel or timeout, an update's shrink), and the done-callbacks of
a queued request (a task's wake-up, or anybody's), run by the wake batch.
A check that raises counts as cancelled (its request fails with
PermitAcquireCancelledError, the exception as __cause__), as an Exception
from it always did.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from pylimiter import PermitAcquireCancelledError
from tests._helpers import check_invariant, settle

KINDS = [KeyboardInterrupt, SystemExit, GeneratorExit, asyncio.CancelledError]


class Check:
    """An is_cancelled that answers False until armed, then raises."""

    def __init__(self, exc_type=KeyboardInterrupt, raise_from_call=0):
        self.exc_type = exc_type
        self.armed = False
        self.calls = 0
        self.raise_from_call = raise_from_call   # or: armed at this call

    def __call__(self):
        self.calls += 1
        if self.armed or 0 < self.raise_from_call <= self.calls:
            raise self.exc_type("from is_cancelled")
        return False


def new_loop():
    loop = asyncio.new_event_loop()
    loop.set_exception_handler(lambda lp, ctx: loop.reported.append(ctx))
    loop.reported = []
    return loop


def run_rounds(loop, n=6):
    loop.run_until_complete(settle(n))


def outcome(task):
    if not task.done():
        return "pending"
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    if exc is not None:
        return type(exc)
    return task.result().permits


# ---- at the call ------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_first_check_raising_propagates_and_changes_nothing(mod, kind):
    sem = mod.AsyncSemaphore(3)
    check = Check(kind)
    check.armed = True
    p = sem.try_acquire(1)
    # acquire, driven as a coroutine (what a task does); then reused
    req = sem.acquire(1, is_cancelled=check)
    with pytest.raises(kind):
        req.send(None)
    with pytest.raises(RuntimeError):
        req.send(None)
    # update, grow
    req = sem.update(p, 2, is_cancelled=check)
    with pytest.raises(kind):
        req.send(None)
    # blocking twins
    with pytest.raises(kind):
        sem.acquire_blocking(1, is_cancelled=check)
    with pytest.raises(kind):
        sem.update_blocking(p, 3, is_cancelled=check)
    assert p.permits == 1 and sem.queue_size == 0
    check_invariant(sem, [p])
    sem.release(p)


# ---- at the queue's head ---------------------------------------------------


def queue_with_a_check(mod, loop, kind):
    """Two permits held; queued: A (1, with a check), B (1), C (2)."""
    sem = mod.AsyncSemaphore(2, timeout=None)
    held = sem.try_acquire(2)
    check = Check(kind)
    tasks = [loop.create_task(sem.acquire(1, is_cancelled=check)),
             loop.create_task(sem.acquire(1)),
             loop.create_task(sem.acquire(2))]
    run_rounds(loop)
    assert sem.queue_size == 3
    check.armed = True
    return sem, held, check, tasks


def assert_moved_on(loop, sem, tasks, kind):
    """A failed (its check raised), B got its permit, C waits for B's."""
    run_rounds(loop)
    a, b, c = tasks
    assert outcome(a) is PermitAcquireCancelledError
    assert type(a.exception().__cause__) is kind
    assert outcome(b) == 1 and outcome(c) == "pending"
    assert sem.queue_size == 1
    check_invariant(sem, [b.result()])
    sem.release(b.result())
    run_rounds(loop)
    assert outcome(c) == 2
    sem.release(c.result())
    check_invariant(sem, [])
    assert sem.stats().cancelled_total == 1


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_release_whose_head_check_raises(mod, kind):
    loop = new_loop()
    try:
        sem, held, check, tasks = queue_with_a_check(mod, loop, kind)
        with pytest.raises(kind):
            sem.release(held)
        assert check.calls == 2
        assert_moved_on(loop, sem, tasks, kind)
    finally:
        loop.close()


def test_set_max_permits_whose_head_check_raises(mod):
    loop = new_loop()
    try:
        sem, held, check, tasks = queue_with_a_check(mod, loop, KeyboardInterrupt)
        with pytest.raises(KeyboardInterrupt):
            sem.set_max_permits(4)
        assert sem.max_permits == 4
        run_rounds(loop)
        a, b, c = tasks
        assert outcome(a) is PermitAcquireCancelledError
        assert outcome(b) == 1 and outcome(c) == "pending"   # 2 held + 1, 1 left
        sem.release(held)
        run_rounds(loop)
        assert outcome(c) == 2
        check_invariant(sem, [b.result(), c.result()])
        sem.release(b.result())
        sem.release(c.result())
    finally:
        loop.close()


def test_update_shrink_whose_release_meets_a_raising_check(mod):
    loop = new_loop()
    try:
        sem, held, check, tasks = queue_with_a_check(mod, loop, KeyboardInterrupt)

        async def shrink():
            with pytest.raises(KeyboardInterrupt):
                await sem.update(held, 0)

        loop.run_until_complete(shrink())
        assert held.permits == 0          # the shrink itself happened
        assert_moved_on(loop, sem, tasks, KeyboardInterrupt)
    finally:
        loop.close()


def test_cancelling_the_head_whose_successor_check_raises(mod):
    # Task.cancel() on the head: it leaves the queue, the next head's check
    # runs and raises from cancel(); the cancelled task is woken all the same.
    loop = new_loop()
    try:
        sem = mod.AsyncSemaphore(2, timeout=None)
        held = sem.try_acquire(1)
        check = Check()
        head = loop.create_task(sem.acquire(2))
        a = loop.create_task(sem.acquire(1, is_cancelled=check))
        b = loop.create_task(sem.acquire(1))
        run_rounds(loop)
        check.armed = True
        with pytest.raises(KeyboardInterrupt):
            head.cancel()
        run_rounds(loop)
        assert outcome(head) == "cancelled"
        assert outcome(a) is PermitAcquireCancelledError
        assert outcome(b) == 1
        check_invariant(sem, [held, b.result()])
        sem.release(held)
        sem.release(b.result())
    finally:
        loop.close()


def test_timeout_of_the_head_whose_successor_check_raises(mod):
    # The loop's timer expires the head; the next head's check raises out of
    # the loop.  Every expired waiter expired, the rest were served.
    loop = new_loop()
    try:
        sem = mod.AsyncSemaphore(2, timeout=None)
        held = sem.try_acquire(1)
        check = Check(raise_from_call=2)   # asked when it joins, then at the head
        heads = [loop.create_task(sem.acquire(2, timeout=0.05)) for _ in range(2)]
        a = loop.create_task(sem.acquire(1, is_cancelled=check))
        b = loop.create_task(sem.acquire(1))
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(5))
        assert check.calls == 2
        run_rounds(loop)
        from pylimiter import PermitAcquireTimeoutError
        assert [outcome(h) for h in heads] == [PermitAcquireTimeoutError] * 2
        assert outcome(a) is PermitAcquireCancelledError
        assert outcome(b) == 1
        assert sem.queue_size == 0
        check_invariant(sem, [held, b.result()])
        sem.release(held)
        sem.release(b.result())
    finally:
        loop.close()


def test_blocking_waiters_behind_a_raising_check(mod):
    sem = mod.AsyncSemaphore(2, timeout=None)
    held = sem.try_acquire(2)
    check = Check()
    results = {}

    def waiter(name, **kw):
        try:
            results[name] = sem.acquire_blocking(1, **kw)
        except BaseException as exc:   # noqa: BLE001 - recorded and checked
            results[name] = exc

    t1 = threading.Thread(target=waiter, args=("a",), kwargs={"is_cancelled": check})
    t1.start()
    while sem.queue_size < 1:
        t1.join(0.001)
    t2 = threading.Thread(target=waiter, args=("b",))
    t2.start()
    while sem.queue_size < 2:
        t2.join(0.001)
    check.armed = True
    with pytest.raises(KeyboardInterrupt):
        sem.release(held)
    t1.join(10)
    t2.join(10)
    assert isinstance(results["a"], PermitAcquireCancelledError)
    assert results["b"].permits == 1
    check_invariant(sem, [results["b"]])
    sem.release(results["b"])


# ---- done-callbacks ------------------------------------------------------------


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit], ids=lambda k: k.__name__)
def test_wake_callback_raising_interrupt_delivers_the_rest_next_run(mod, kind):
    loop = new_loop()
    try:
        sem = mod.AsyncSemaphore(2, timeout=None)
        held = sem.try_acquire(2)
        a = loop.create_task(sem.acquire(1))
        b = loop.create_task(sem.acquire(1))
        run_rounds(loop)
        ran = []

        def interrupt(w):
            ran.append("interrupt")
            raise kind("from a wake callback")

        a._fut_waiter.add_done_callback(interrupt)
        a._fut_waiter.add_done_callback(lambda w: ran.append("after"))
        sem.release(held)           # one batch: A then B
        with pytest.raises(kind):
            run_rounds(loop)
        run_rounds(loop)            # the loop goes on: the rest is delivered
        assert ran == ["interrupt", "after"]
        assert outcome(a) == 1 and outcome(b) == 1
        check_invariant(sem, [a.result(), b.result()])
        sem.release(a.result())
        sem.release(b.result())
    finally:
        loop.close()


def test_wake_callback_raising_an_exception_loses_no_other_callback(mod):
    loop = new_loop()
    try:
        sem = mod.AsyncSemaphore(1, timeout=None)
        held = sem.try_acquire(1)
        a = loop.create_task(sem.acquire(1))
        run_rounds(loop)
        ran = []

        def boom(w):
            raise KeyError("boom")

        a._fut_waiter.add_done_callback(boom)
        a._fut_waiter.add_done_callback(lambda w: ran.append("after"))
        sem.release(held)
        run_rounds(loop)
        assert ran == ["after"]
        assert [type(c["exception"]) for c in loop.reported] == [KeyError]
        assert outcome(a) == 1
        sem.release(a.result())
    finally:
        loop.close()


def test_exception_handler_raising_interrupt_delivers_the_rest_next_run(mod):
    loop = asyncio.new_event_loop()
    calls = []

    def handler(lp, ctx):
        calls.append(ctx)
        if len(calls) == 1:
            raise KeyboardInterrupt("from the exception handler")

    loop.set_exception_handler(handler)
    try:
        sem = mod.AsyncSemaphore(2, timeout=None)
        held = sem.try_acquire(2)
        a = loop.create_task(sem.acquire(1))
        b = loop.create_task(sem.acquire(1))
        run_rounds(loop)
        ran = []
        a._fut_waiter.add_done_callback(lambda w: {}["missing"])
        a._fut_waiter.add_done_callback(lambda w: ran.append("after"))
        sem.release(held)
        with pytest.raises(KeyboardInterrupt):
            run_rounds(loop)
        run_rounds(loop)
        assert ran == ["after"] and len(calls) == 1
        assert outcome(a) == 1 and outcome(b) == 1
        sem.release(a.result())
        sem.release(b.result())
        check_invariant(sem, [])
    finally:
        loop.close()
