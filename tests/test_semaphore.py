"""Semantics of AsyncSemaphore, pinned one by one (both implementations)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pylimiter import (
    PermitAcquireAlreadyClosedError,
    PermitAcquireCancelledError,
    PermitAcquireError,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
)
from tests._helpers import check_invariant, run


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


# ---- counting and the fast path --------------------------------------------


def test_try_acquire_many_unavailable(make_sem):
    sem = make_sem(10)
    a = sem.try_acquire(7)
    assert a.permits == 7
    assert sem.try_acquire(4) is None
    assert sem.available_permits == 3
    b = sem.try_acquire(3)
    assert sem.available_permits == 0
    check_invariant(sem, [a, b])
    sem.release(a)
    sem.release(b)
    check_invariant(sem, [])


def test_acquire_when_available(make_sem):
    sem = make_sem(5)

    async def main():
        p = await sem.acquire(5)
        assert p.permits == 5 and sem.acquired_permits == 5
        sem.release(p)
        assert p.permits == 0

    run(main())
    check_invariant(sem, [])


def test_release_twice_is_noop(make_sem):
    sem = make_sem(3)
    p = sem.try_acquire(2)
    sem.release(p)
    sem.release(p)
    assert sem.available_permits == 3 and p.permits == 0


def test_acquire_zero_returns_empty_permit_even_with_queue(make_sem):
    sem = make_sem(2)

    async def main():
        held = await sem.acquire(2)
        waiter = asyncio.ensure_future(sem.acquire(1))
        await settle()
        assert sem.queue_size == 1
        z = await sem.acquire(0)
        assert z.permits == 0 and sem.queue_size == 1
        assert sem.try_acquire(0).permits == 0
        sem.release(held)
        p = await waiter
        check_invariant(sem, [p, z])
        sem.release(p)

    run(main())


def test_permit_context_managers(make_sem):
    sem = make_sem(4)
    with sem.acquire_blocking(3) as p:
        assert sem.acquired_permits == 3
    assert p.permits == 0 and sem.acquired_permits == 0

    async def main():
        async with sem.acquire(4) as q:
            assert q.permits == 4 and sem.available_permits == 0
        assert q.permits == 0 and sem.available_permits == 4

    run(main())


def test_permit_is_not_constructible_and_read_only(mod, make_sem):
    with pytest.raises(TypeError):
        mod.SemaphorePermit()
    sem = make_sem(3)
    p = sem.try_acquire(1)
    with pytest.raises(AttributeError):
        p.permits = 3
    assert repr(p) == "<SemaphorePermit permits=1>"
    sem.release(p)


# ---- argument errors, synchronous ------------------------------------------


def test_argument_errors_are_synchronous(make_sem):
    sem = make_sem(10)
    other = make_sem(10)
    with pytest.raises(ValueError, match=r"^Invalid negative permits value: -1$"):
        sem.acquire(-1)
    with pytest.raises(ValueError, match=r"^Requested permits=11 is larger than max_permits=10$"):
        sem.acquire(11)
    with pytest.raises(ValueError, match=r"^Requested permits=11 is larger than max_permits=10$"):
        sem.acquire_blocking(11)
    with pytest.raises(ValueError, match=r"^Invalid negative permits value: -1$"):
        sem.try_acquire(-1)
    for bad in (1.0, True, "1", None):
        with pytest.raises(TypeError):
            sem.acquire(bad)
        with pytest.raises(TypeError):
            sem.try_acquire(bad)
    with pytest.raises(ValueError):
        sem.acquire(1, timeout=-1)
    with pytest.raises(TypeError):
        sem.acquire(1, is_cancelled=5)
    p = sem.try_acquire(1)
    q = other.try_acquire(1)
    with pytest.raises(TypeError):
        sem.update(q, 2)
    with pytest.raises(TypeError):
        sem.update("permit", 2)
    with pytest.raises(TypeError):
        sem.release(q)
    with pytest.raises(TypeError):
        sem.release(None)
    with pytest.raises(ValueError, match=r"^Requested permits=11 is larger than max_permits=10$"):
        sem.update(p, 11)
    with pytest.raises(ValueError, match=r"^Invalid negative permits value: -2$"):
        sem.update_blocking(p, -2)
    with pytest.raises(OverflowError):
        make_sem(0).try_acquire(2**70)
    # Nothing was queued or taken by the failed calls.
    assert sem.queue_size == 0
    check_invariant(sem, [p])
    sem.release(p)
    other.release(q)


def test_constructor_errors(mod):
    with pytest.raises(TypeError):
        mod.AsyncSemaphore(1.5)
    with pytest.raises(TypeError):
        mod.AsyncSemaphore(True)
    with pytest.raises(ValueError):
        mod.AsyncSemaphore(10, timeout=-1)
    with pytest.raises(ValueError):
        mod.AsyncSemaphore(2**62)


# ---- unbounded ----------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -5])
def test_unbounded_grants_everything_and_counts_usage(make_sem, limit):
    sem = make_sem(limit, timeout=0.01)

    async def main():
        ps = [await sem.acquire(10**9, is_cancelled=lambda: True) for _ in range(3)]
        ps.append(sem.acquire_blocking(5, timeout=0))
        ps.append(sem.try_acquire(7))
        assert sem.queue_size == 0
        assert sem.max_permits == limit
        assert sem.available_permits == 2**63 - 1
        assert sem.acquired_permits == 3 * 10**9 + 12
        check_invariant(sem, ps)
        await sem.update(ps[0], 10**12)
        assert sem.acquired_permits == 10**12 + 2 * 10**9 + 12
        for p in ps:
            sem.release(p)
        check_invariant(sem, [])

    run(main())
    # Not an error any more: the limit can be switched on live.
    sem.set_max_permits(10)
    assert (sem.max_permits, sem.available_permits) == (10, 10)


# ---- queueing: FIFO, no barging, join at first await -------------------------


def test_fifo_order_across_tasks(make_sem):
    sem = make_sem(1)
    order = []

    async def worker(i):
        async with sem.acquire(1):
            order.append(i)
            await asyncio.sleep(0)

    async def main():
        held = await sem.acquire(1)
        tasks = [asyncio.ensure_future(worker(i)) for i in range(20)]
        await settle()
        assert sem.queue_size == 20
        sem.release(held)
        await asyncio.gather(*tasks)

    run(main())
    assert order == list(range(20))


def test_request_joins_queue_when_first_awaited(make_sem):
    sem = make_sem(1)

    async def main():
        held = await sem.acquire(1)
        early = sem.acquire(1)  # created first, awaited second
        late = asyncio.ensure_future(sem.acquire(1))
        await settle()
        assert sem.queue_size == 1
        early_task = asyncio.ensure_future(early)
        await settle()
        assert sem.queue_size == 2
        sem.release(held)
        p = await late
        assert not early_task.done()
        sem.release(p)
        q = await early_task
        sem.release(q)

    run(main())


def test_large_acquire_doesnt_starve(make_sem):
    """Go's scenario: a big request at the head blocks smaller ones."""
    sem = make_sem(10)

    async def main():
        held = [await sem.acquire(1) for _ in range(9)]
        big = asyncio.ensure_future(sem.acquire(8))
        await settle()
        small = asyncio.ensure_future(sem.acquire(1))
        await settle()
        # One permit is free, but neither a queued nor a new small request
        # may overtake the big one.
        assert sem.available_permits == 1
        assert sem.try_acquire(1) is None
        assert not small.done()
        for p in held[:7]:
            sem.release(p)
        b = await big
        assert b.permits == 8
        await settle()
        assert not small.done()      # big took everything that was free
        sem.release(b)
        s = await small
        assert s.permits == 1
        for p in held[7:] + [s]:
            sem.release(p)

    run(main())
    check_invariant(sem, [])


def test_queue_full(make_sem):
    sem = make_sem(1, max_queue_size=2)

    async def main():
        held = await sem.acquire(1)
        ws = [asyncio.ensure_future(sem.acquire(1)) for _ in range(2)]
        await settle()
        with pytest.raises(PermitAcquireQueueFullError):
            await sem.acquire(1)
        assert sem.stats().queue_full_total == 1
        sem.release(held)
        for w in ws:
            sem.release(await w)

    run(main())


def test_unbounded_queue(make_sem):
    sem = make_sem(1, max_queue_size=0)

    async def main():
        held = await sem.acquire(1)
        ws = [asyncio.ensure_future(sem.acquire(1)) for _ in range(50)]
        await settle()
        assert sem.queue_size == 50
        sem.close()
        res = await asyncio.gather(*ws, return_exceptions=True)
        assert all(isinstance(r, PermitAcquireAlreadyClosedError) for r in res)
        sem.release(held)

    run(main())


# ---- timeouts -------------------------------------------------------------------


def test_timeout_fails_and_requests_behind_are_reconsidered(make_sem):
    sem = make_sem(10)

    async def main():
        held = await sem.acquire(8)
        big = asyncio.ensure_future(sem.acquire(5, timeout=0.05))
        await settle()
        small = asyncio.ensure_future(sem.acquire(2, timeout=None))
        await settle()
        assert not small.done()
        with pytest.raises(PermitAcquireTimeoutError) as ei:
            await big
        assert isinstance(ei.value, TimeoutError)
        assert isinstance(ei.value, PermitAcquireError)
        s = await asyncio.wait_for(small, 5)
        assert s.permits == 2
        st = sem.stats()
        assert st.timeout_total == 1 and st.queue_size == 0
        sem.release(held)
        sem.release(s)

    run(main())


def test_timeout_zero_fails_only_if_it_would_queue(make_sem):
    sem = make_sem(2)

    async def main():
        p = await sem.acquire(2, timeout=0)
        with pytest.raises(PermitAcquireTimeoutError):
            await sem.acquire(1, timeout=0)
        with pytest.raises(PermitAcquireTimeoutError):
            sem.acquire_blocking(1, timeout=0)
        assert sem.queue_size == 0
        sem.release(p)

    run(main())


def test_default_timeout_and_none_waits(make_sem):
    sem = make_sem(1, timeout=0.05)

    async def main():
        held = await sem.acquire(1)
        with pytest.raises(PermitAcquireTimeoutError):
            await sem.acquire(1)
        forever = asyncio.ensure_future(sem.acquire(1, timeout=None))
        await asyncio.sleep(0.2)
        assert not forever.done()
        sem.release(held)
        sem.release(await forever)

    run(main())


# ---- is_cancelled ----------------------------------------------------------------


def test_is_cancelled_checked_before_fast_grant(make_sem):
    sem = make_sem(5)

    async def main():
        with pytest.raises(PermitAcquireCancelledError):
            await sem.acquire(1, is_cancelled=lambda: True)
        with pytest.raises(PermitAcquireCancelledError):
            sem.acquire_blocking(1, is_cancelled=lambda: True)
        assert sem.acquired_permits == 0
        assert sem.stats().cancelled_total == 2

    run(main())


def test_is_cancelled_checked_at_queue_head(make_sem):
    sem = make_sem(4)
    flag = {"cancel": False}

    async def main():
        held = await sem.acquire(4)
        head = asyncio.ensure_future(sem.acquire(4, is_cancelled=lambda: flag["cancel"]))
        await settle()
        nxt = asyncio.ensure_future(sem.acquire(1))
        await settle()
        flag["cancel"] = True
        # Releasing one permit processes the queue: the head, though it does
        # not fit, is checked, fails and the next request is granted.
        one = await sem.update(held, 3)
        with pytest.raises(PermitAcquireCancelledError):
            await head
        n = await asyncio.wait_for(nxt, 5)
        assert n.permits == 1
        sem.release(one)
        sem.release(n)

    run(main())


def test_is_cancelled_that_raises_counts_as_cancelled(make_sem):
    sem = make_sem(1)

    def boom():
        raise KeyError("gone")

    async def main():
        with pytest.raises(PermitAcquireCancelledError) as ei:
            await sem.acquire(1, is_cancelled=boom)
        assert isinstance(ei.value.__cause__, KeyError)

    run(main())


# ---- task cancellation ------------------------------------------------------------


def test_cancel_acquire_releases_permits(make_sem):
    sem = make_sem(3)

    async def main():
        held = await sem.acquire(3)
        t = asyncio.ensure_future(sem.acquire(2))
        behind = asyncio.ensure_future(sem.acquire(1))
        await settle()
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert sem.queue_size == 1
        sem.release(held)
        b = await behind
        check_invariant(sem, [b])
        sem.release(b)
        assert sem.stats().cancelled_total == 1

    run(main())


def test_cancel_racing_with_grant_gives_permits_back(make_sem):
    sem = make_sem(2)

    async def main():
        held = await sem.acquire(2)
        t = asyncio.ensure_future(sem.acquire(2))
        await settle()
        sem.release(held)      # grants t; its task has not resumed yet
        t.cancel()             # ... and is cancelled before it does
        with pytest.raises(asyncio.CancelledError):
            await t
        assert sem.acquired_permits == 0
        assert sem.available_permits == 2

    run(main())


def test_await_twice_is_runtime_error(make_sem):
    sem = make_sem(2)

    async def main():
        r = sem.acquire(1)
        p = await r
        with pytest.raises(RuntimeError):
            await r
        sem.release(p)

    run(main())


# ---- update --------------------------------------------------------------------------


def test_update_grow_and_shrink_in_place(make_sem):
    sem = make_sem(10)

    async def main():
        p = await sem.acquire(2)
        q = await sem.update(p, 6)
        assert q is p and p.permits == 6 and sem.acquired_permits == 6
        assert await sem.update(p, 1) is p
        assert sem.acquired_permits == 1
        assert sem.update_blocking(p, 4) is p
        assert sem.acquired_permits == 4
        sem.release(p)

    run(main())
    st = sem.stats()
    assert st.acquired_total == 3  # acquire + two growing updates


def test_update_shrink_works_after_close_and_ignores_is_cancelled(make_sem):
    sem = make_sem(10)

    async def main():
        p = await sem.acquire(8)
        sem.close()
        await sem.update(p, 3, is_cancelled=lambda: True)
        assert p.permits == 3 and sem.acquired_permits == 3
        with pytest.raises(PermitAcquireAlreadyClosedError):
            await sem.update(p, 5)
        assert p.permits == 3
        sem.release(p)

    run(main())


def test_update_grow_waits_and_failure_keeps_permit(make_sem):
    sem = make_sem(10)

    async def main():
        other = await sem.acquire(6)
        p = await sem.acquire(3)
        with pytest.raises(PermitAcquireTimeoutError):
            await sem.update(p, 5, timeout=0.05)
        assert p.permits == 3
        grow = asyncio.ensure_future(sem.update(p, 5))
        await settle()
        assert sem.queue_size == 1
        sem.release(other)
        assert (await grow).permits == 5
        check_invariant(sem, [p])
        sem.release(p)

    run(main())


def test_update_of_released_permit_is_fresh_acquire(make_sem):
    sem = make_sem(5)

    async def main():
        p = await sem.acquire(2)
        sem.release(p)
        await sem.update(p, 4)
        assert p.permits == 4 and sem.acquired_permits == 4
        sem.release(p)

    run(main())


def test_release_while_update_waits_needs_all(make_sem):
    sem = make_sem(10)

    async def main():
        other = await sem.acquire(5)
        p = await sem.acquire(4)
        grow = asyncio.ensure_future(sem.update(p, 8))   # needs 4 more, 1 free
        await settle()
        sem.release(p)                                     # p -> 0; now needs 8
        assert p.permits == 0 and sem.acquired_permits == 5
        await settle()
        assert not grow.done()
        sem.release(other)
        assert (await grow).permits == 8
        check_invariant(sem, [p, other])
        sem.release(p)

    run(main())


def test_concurrent_update_of_same_permit_is_runtime_error(make_sem):
    sem = make_sem(4)

    async def main():
        other = await sem.acquire(3)
        p = await sem.acquire(1)
        grow = asyncio.ensure_future(sem.update(p, 3))
        await settle()
        with pytest.raises(RuntimeError):
            await sem.update(p, 2)
        sem.release(other)
        await grow
        sem.release(p)

    run(main())


# ---- close ------------------------------------------------------------------------------


def test_close_wakes_all_waiters(make_sem):
    sem = make_sem(1)

    async def main():
        held = await sem.acquire(1)
        ws = [asyncio.ensure_future(sem.acquire(1)) for _ in range(5)]
        await settle()
        sem.close()
        sem.close()
        assert sem.closed
        for w in ws:
            with pytest.raises(PermitAcquireAlreadyClosedError):
                await w
        with pytest.raises(PermitAcquireAlreadyClosedError):
            await sem.acquire(1)
        with pytest.raises(PermitAcquireAlreadyClosedError):
            sem.try_acquire(1)
        with pytest.raises(PermitAcquireAlreadyClosedError):
            sem.acquire_blocking(1)
        sem.release(held)
        assert sem.acquired_permits == 0 and sem.queue_size == 0

    run(main())


# ---- set_max_permits -------------------------------------------------------------------


def test_set_max_permits_raise_grants_waiters(make_sem):
    sem = make_sem(2)

    async def main():
        held = await sem.acquire(2)
        w = asyncio.ensure_future(sem.acquire(2))
        await settle()
        sem.set_max_permits(4)
        p = await asyncio.wait_for(w, 5)
        assert sem.max_permits == 4 and sem.available_permits == 0
        sem.release(held)
        sem.release(p)

    run(main())


def test_set_max_permits_lower_below_held(make_sem):
    sem = make_sem(10)

    async def main():
        held = await sem.acquire(8)
        too_big = asyncio.ensure_future(sem.acquire(6))
        await settle()
        fits_later = asyncio.ensure_future(sem.acquire(2))
        await settle()
        sem.set_max_permits(5)
        assert sem.available_permits == -3
        assert sem.acquired_permits == 8
        with pytest.raises(ValueError, match=r"^Requested permits=6 is larger than max_permits=5$"):
            await too_big
        await settle()
        assert not fits_later.done()
        with pytest.raises(ValueError):
            sem.acquire(6)
        sem.release(held)
        p = await fits_later
        assert sem.available_permits == 3
        sem.release(p)

    run(main())


def test_set_max_permits_errors(make_sem):
    sem = make_sem(3)
    with pytest.raises(ValueError, match="exceeds"):
        sem.set_max_permits(2**60)
    for bad in (2.0, True, None, "3"):
        with pytest.raises(TypeError):
            sem.set_max_permits(bad)
    assert sem.max_permits == 3 and sem.available_permits == 3


# ---- stats ----------------------------------------------------------------------------------


def test_stats_fields_and_histogram(make_sem):
    sem = make_sem(2, max_queue_size=7)

    async def main():
        a = await sem.acquire(2)
        w = asyncio.ensure_future(sem.acquire(1))
        await asyncio.sleep(0.02)
        sem.release(a)
        b = await w
        return b

    b = run(main())
    st = sem.stats()
    assert (st.max_permits, st.acquired_permits, st.available_permits) == (2, 1, 1)
    assert (st.queue_size, st.max_queue_size) == (0, 7)
    assert st.acquired_total == 2 and st.wait_seconds_count == 2
    assert st.wait_seconds_sum >= 0.015
    bounds = [bd for bd, _ in st.wait_seconds_buckets]
    counts = [c for _, c in st.wait_seconds_buckets]
    assert bounds[-1] == float("inf") and counts[-1] == 2
    assert counts == sorted(counts)      # cumulative
    assert counts[0] == 1                # the immediate grant, as 0 s
    with pytest.raises(Exception):
        st.acquired_total = 5            # frozen
    sem.release(b)


# ---- threads and asyncio on one semaphore --------------------------------------------------


def test_thread_release_wakes_asyncio_waiter_at_once(make_sem):
    sem = make_sem(1)

    async def main():
        held = await sem.acquire(1)
        loop = asyncio.get_running_loop()
        # The only timer on the loop is far away: a wake that waited for the
        # loop's next timer would take 30 s.
        loop.call_later(30, lambda: None)
        released_at = []

        def releaser():
            time.sleep(0.05)
            released_at.append(time.monotonic())
            sem.release(held)

        threading.Thread(target=releaser).start()
        p = await sem.acquire(1, timeout=None)
        woke = time.monotonic() - released_at[0]
        assert woke < 5.0
        sem.release(p)

    run(main(), timeout=60)


def test_blocking_waiter_woken_by_asyncio_release(make_sem):
    sem = make_sem(2)
    got = []

    async def main():
        held = await sem.acquire(2)
        th = threading.Thread(target=lambda: got.append(sem.acquire_blocking(2, timeout=10)))
        th.start()
        while sem.queue_size == 0:
            await asyncio.sleep(0.001)
        sem.release(held)
        await asyncio.get_running_loop().run_in_executor(None, th.join)

    run(main())
    assert got[0].permits == 2
    sem.release(got[0])


def test_blocking_timeout(make_sem):
    sem = make_sem(1)
    p = sem.acquire_blocking(1)
    t0 = time.monotonic()
    with pytest.raises(PermitAcquireTimeoutError):
        sem.acquire_blocking(1, timeout=0.05)
    assert time.monotonic() - t0 >= 0.04
    assert sem.queue_size == 0 and sem.stats().timeout_total == 1
    sem.release(p)


def test_two_loops_in_two_threads_share_a_semaphore(make_sem):
    sem = make_sem(3)
    n_per = 200
    errors = []

    def loop_thread():
        async def main():
            async def one():
                async with sem.acquire(2):
                    await asyncio.sleep(0)

            await asyncio.gather(*(one() for _ in range(n_per)))

        try:
            asyncio.run(main())
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ths = [threading.Thread(target=loop_thread) for _ in range(3)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(60)
    assert not errors
    assert sem.acquired_permits == 0 and sem.queue_size == 0
    assert sem.stats().acquired_total == 3 * n_per
