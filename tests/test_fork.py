"""Issue 32, G5/G6: the fork rule, on both twins.

A child process made by ``os.fork()`` starts with the parent's counts (the
permits held by the parent's objects, which the child has copies of, stay
taken until the child releases them) and an empty queue, as a
``threading.Semaphore`` does: permits released in the child go to the
child's own requests, never to waiters that exist only in the parent, and
the child's requests wait on the child's own event loop (on 3.10/3.11 the C
twin used to attach them to the parent's loop when that loop had been
running in the forking thread).  The parent is untouched.

Every child reports through its exit status, is reaped, and is killed if it
is not done in CHILD_TIMEOUT seconds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import traceback
import warnings

import pytest

from tests._helpers import check_invariant, release_all

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

CHILD_TIMEOUT = 10.0


def fork_and_check(child_body):
    """Run child_body() in a forked child; fail the test with the child's
    traceback if it raises or does not finish in CHILD_TIMEOUT."""
    r, w = os.pipe()
    with warnings.catch_warnings():
        # 3.12+: "this process is multi-threaded, use of fork() may lead
        # to deadlocks in the child": the point of some of these tests.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:   # the child: never returns into pytest
        code = 1
        try:
            os.close(r)
            child_body()
            code = 0
        except BaseException:   # noqa: BLE001 - reported to the parent
            os.write(w, traceback.format_exc().encode()[-4000:])
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + CHILD_TIMEOUT
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        pytest.fail(f"the child did not finish in {CHILD_TIMEOUT} s")
    with os.fdopen(r, "rb") as f:
        report = f.read().decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, report


def wait_queued(sem, n):
    deadline = time.monotonic() + 5
    while sem.queue_size < n:
        assert time.monotonic() < deadline
        time.sleep(0.001)


def test_child_has_the_counts_and_an_empty_queue(mod):
    sem = mod.AsyncSemaphore(2, 0, None)
    held = sem.acquire_blocking(1)
    got = []
    waiter = threading.Thread(target=lambda: got.append(sem.acquire_blocking(2, timeout=10)),
                              daemon=True)
    waiter.start()
    wait_queued(sem, 1)

    def child():
        assert sem.queue_size == 0
        assert sem.acquired_permits == 1 and sem.available_permits == 1
        assert held.permits == 1
        sem.release(held)       # to nobody: the parent's waiter is not here
        assert sem.acquired_permits == 0
        p = sem.acquire_blocking(2, timeout=1)
        assert p.permits == 2
        assert sem.try_acquire(1) is None
        sem.release(p)
        check_invariant(sem, [])

    fork_and_check(child)
    # The parent is untouched: its waiter is still queued and gets the
    # permits when the parent releases.
    assert sem.queue_size == 1 and sem.acquired_permits == 1
    sem.release(held)
    waiter.join(5)
    assert got and got[0].permits == 2
    release_all(sem, got)


def test_childs_asyncio_request_waits_on_the_childs_loop(mod):
    """The parent forks from a coroutine of a loop that has a task parked
    on the semaphore; the child runs a loop of its own, where a request
    that has to wait must park on that loop and be woken there."""
    sem = mod.AsyncSemaphore(1, 0, None)

    async def parent_main():
        held = await sem.acquire(1)
        parked = asyncio.ensure_future(sem.acquire(1))
        await asyncio.sleep(0.01)
        assert sem.queue_size == 1

        def child():
            assert sem.queue_size == 0 and sem.acquired_permits == 1

            async def child_main():
                waiting = asyncio.ensure_future(sem.acquire(1, timeout=5))
                await asyncio.sleep(0.01)
                assert sem.queue_size == 1 and not waiting.done()
                sem.release(held)
                p = await asyncio.wait_for(waiting, 5)
                assert p.permits == 1
                sem.release(p)
            lp = asyncio.new_event_loop()
            try:
                lp.run_until_complete(child_main())
            finally:
                lp.close()
            check_invariant(sem, [])

        fork_and_check(child)
        assert sem.queue_size == 1   # the parent's own task, still waiting
        sem.release(held)
        p = await asyncio.wait_for(parked, 5)
        sem.release(p)

    asyncio.run(parent_main())
    check_invariant(sem, [])


def test_child_of_a_queue_with_timed_asyncio_waiters(mod):
    """Timed waiters of the parent leave no timer behind that the child
    could trip over, and an update queued in the parent is no longer in
    progress in the child."""
    sem = mod.AsyncSemaphore(3, 0, 5.0)

    async def parent_main():
        p = await sem.acquire(2)
        filler = sem.try_acquire(1)
        grow = asyncio.ensure_future(sem.update(p, 3))
        big = asyncio.ensure_future(sem.acquire(3))
        await asyncio.sleep(0.01)
        assert sem.queue_size == 2

        def child():
            assert sem.queue_size == 0 and p.permits == 2
            sem.release(filler)
            q = asyncio.run(_grow(sem, p))
            assert q is p and p.permits == 3
            sem.release(p)
            check_invariant(sem, [])

        fork_and_check(child)
        # The parent is untouched: its update, then the big request.
        sem.release(filler)
        assert (await asyncio.wait_for(grow, 5)) is p and p.permits == 3
        sem.release(p)
        got = await asyncio.wait_for(big, 5)
        sem.release(got)

    asyncio.run(parent_main())
    check_invariant(sem, [])


async def _grow(sem, p):
    return await sem.update(p, 3, timeout=1)


def test_fork_while_other_threads_use_the_semaphore(mod):
    """Forks made while two threads hammer the semaphore: every child finds
    consistent books (nothing half-changed by a thread that does not exist
    there) and a working semaphore."""
    sem = mod.AsyncSemaphore(4, 0, None)
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            p = sem.acquire_blocking(1, timeout=5)
            sem.release(p)

    threads = [threading.Thread(target=hammer, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(10):
            def child():
                assert sem.queue_size == 0
                # Each hammer thread held at most one permit at the fork;
                # those permit objects belong to threads that do not exist.
                held = sem.acquired_permits
                assert 0 <= held <= 2
                p = sem.acquire_blocking(4 - held, timeout=1)
                sem.release(p)
                assert sem.acquired_permits == held
            fork_and_check(child)
    finally:
        stop.set()
        for t in threads:
            t.join(5)
    check_invariant(sem, [])
