"""Issue 18, item 8: the twins do the same thing for the same input.

* A blocking wait accepts every timeout an asyncio wait accepts: inf, 1e10,
  an int too large for a float (the pure twin's Lock.acquire raised
  OverflowError for these; the C twin waited).
* A request is a coroutine on both twins: ``asyncio.create_task(
  sem.acquire())`` works (it raised TypeError on the pure twin), and so do
  ``create_task`` of an update, of ``async with sem``'s entry and of a dual
  limiter's request.
(The exception types of every call are compared side by side in
tests/test_hostile.py and the C-vs-pure machines.)
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
import time

import pytest

from pylimiter import LimitType, PermitAcquireTimeoutError
from tests._helpers import check_invariant, settle

HUGE = [math.inf, 1e10, 2**70, 1e308]


@pytest.mark.parametrize("timeout", HUGE, ids=repr)
def test_blocking_waits_accept_huge_timeouts(mod, timeout):
    sem = mod.AsyncSemaphore(2)
    held = sem.try_acquire(2)
    got = {}

    def acquire():
        got["p"] = sem.acquire_blocking(1, timeout=timeout)
        got["q"] = sem.update_blocking(got["p"], 2, timeout=timeout)

    th = threading.Thread(target=acquire)
    th.start()
    while sem.queue_size == 0:
        th.join(0.001)
    sem.update_blocking(held, 1, timeout=timeout)     # shrinks: room for one
    while sem.queue_size == 0 or "p" not in got:
        th.join(0.001)
    sem.release(held)                                 # room for the update
    th.join(10)
    assert got["q"] is got["p"] and got["p"].permits == 2
    check_invariant(sem, [got["p"]])
    sem.release(got["p"])


@pytest.mark.parametrize("timeout", HUGE, ids=repr)
def test_async_waits_accept_huge_timeouts(mod, timeout, arun):
    sem = mod.AsyncSemaphore(1, timeout=timeout)

    async def main():
        held = await sem.acquire(1)
        t = asyncio.ensure_future(sem.acquire(1, timeout=timeout))
        u = asyncio.ensure_future(sem.acquire(1))      # the semaphore's default
        await settle()
        assert sem.queue_size == 2
        sem.release(held)
        p = await t
        sem.release(p)
        q = await u
        sem.release(q)

    arun(main())
    check_invariant(sem, [])


def test_timeouts_too_small_to_wait_still_time_out(mod):
    sem = mod.AsyncSemaphore(1)
    held = sem.try_acquire(1)
    for t in (1e-300, 5e-324, 0.0):
        with pytest.raises(PermitAcquireTimeoutError):
            sem.acquire_blocking(1, timeout=t)
    sem.release(held)
    check_invariant(sem, [])


def test_create_task_of_requests(mod, arun):
    sem = mod.AsyncSemaphore(3, timeout=None)
    dual = mod.AsyncDualMemoryLimiter(10, 10)

    async def main():
        p = await asyncio.create_task(sem.acquire(2))           # at once
        assert p.permits == 2
        t = asyncio.create_task(sem.acquire(2))                 # queued
        await settle()
        assert sem.queue_size == 1 and not t.done()
        u = asyncio.create_task(sem.update(p, 1))               # shrink: at once
        assert (await u) is p and p.permits == 1
        q = await t
        assert q.permits == 2
        # Cancelled while queued: leaves the queue, takes nothing.
        c = asyncio.create_task(sem.acquire(3))
        await settle()
        c.cancel()
        with pytest.raises(asyncio.CancelledError):
            await c
        assert sem.queue_size == 0
        # `async with sem`'s entry holds one for the semaphore itself.
        sem.release(q)
        assert (await asyncio.create_task(sem.__aenter__())) is None
        assert sem.acquired_permits == 2
        await sem.__aexit__(None, None, None)
        d = await asyncio.create_task(dual.acquire(4, LimitType.HEAP_MEMORY))
        assert d.permits == 4
        d2 = await asyncio.create_task(dual.update(d, 6))
        assert d2 is d and d.permits == 6
        dual.release(d)
        sem.release(p)

    arun(main())
    check_invariant(sem, [])


def test_a_request_driven_twice_or_after_await_refuses_alike(mod, arun):
    sem = mod.AsyncSemaphore(1)

    async def main():
        r = sem.acquire(1)
        p = await r
        with pytest.raises(RuntimeError):
            r.__await__()
        with pytest.raises(RuntimeError):
            r.send(None)
        r.close()                       # a no-op once done
        with pytest.raises(ValueError):
            r.throw(ValueError("x"))
        sem.release(p)
        r2 = sem.acquire(1)
        r2.close()                      # closed before it ran: never will
        with pytest.raises(RuntimeError):
            await r2
        r3 = sem.acquire(1)
        with pytest.raises(KeyError):
            r3.throw(KeyError)
        with pytest.raises(RuntimeError):
            r3.send(None)

    arun(main())
    check_invariant(sem, [])


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="POSIX signals")
@pytest.mark.parametrize("timeout", [math.inf, 1e10], ids=repr)
def test_blocking_wait_resumed_after_a_signal_keeps_its_huge_timeout(mod, timeout):
    # A signal whose handler returns interrupts the wait, which resumes
    # with what is left of its timeout.  The C twin's deadline for inf
    # overflowed int64 (found by UBSan in the Py_DEBUG tier): it resumed
    # with no time left and timed out at once.
    sem = mod.AsyncSemaphore(1)
    held = sem.try_acquire(1)
    hits = []
    main = threading.main_thread().ident
    assert threading.get_ident() == main

    def interrupt_then_release():
        for _ in range(3):
            time.sleep(0.05)
            signal.pthread_kill(main, signal.SIGUSR1)   # to the waiting thread
        time.sleep(0.05)
        sem.release(held)

    old = signal.signal(signal.SIGUSR1, lambda *a: hits.append(1))
    helper = threading.Thread(target=interrupt_then_release)
    try:
        helper.start()
        p = sem.acquire_blocking(1, timeout=timeout)
    finally:
        helper.join()
        signal.signal(signal.SIGUSR1, old)
    assert len(hits) == 3 and p.permits == 1
    sem.release(p)
    check_invariant(sem, [])
