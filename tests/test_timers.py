"""Timeouts of queued asyncio requests (both implementations, default loop
and uvloop): one timer per semaphore and loop, armed for the earliest
deadline; mixed per-call timeouts expire in deadline order; the timer is
re-armed after the earliest waiter leaves; close() with a timer pending."""

from __future__ import annotations

import asyncio
import time

import pytest

from pylimiter import PermitAcquireAlreadyClosedError, PermitAcquireTimeoutError
from tests._helpers import check_invariant, release_all, settle
from tests.test_wakeups import CountCalls


def live_timers(loop):
    """pylimiter's timer handles on the default loop still due to run."""
    return [h for h in loop._scheduled
            if not h.cancelled() and getattr(h._callback, "__name__", "") == "on_timer"]


def test_one_timer_for_many_waiters(make_sem):
    sem = make_sem(1, timeout=30)

    async def main():
        loop = asyncio.get_running_loop()
        held = await sem.acquire(1)
        with CountCalls(loop, "call_later") as armed:
            tasks = [asyncio.ensure_future(sem.acquire(1)) for _ in range(200)]
            await settle()
        assert sem.queue_size == 200
        assert len(armed.calls) == 1            # not one per waiter
        assert len(live_timers(loop)) == 1
        sem.close()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(r, PermitAcquireAlreadyClosedError) for r in res)
        sem.release(held)

    asyncio.run(main())


def test_mixed_timeouts_expire_in_deadline_order(make_sem, arun):
    sem = make_sem(1, timeout=None)
    expired = []

    async def waiter(name, timeout):
        t0 = time.monotonic()
        try:
            p = await sem.acquire(1, timeout=timeout)
        except PermitAcquireTimeoutError:
            expired.append((name, time.monotonic() - t0))
            return None
        return p

    async def main():
        held = await sem.acquire(1)
        spec = [("a", 0.30), ("b", 0.05), ("c", 0.15), ("d", None), ("e", 0.15)]
        tasks = {}
        for name, t in spec:
            tasks[name] = asyncio.ensure_future(waiter(name, t))
            await settle(1)
        await asyncio.wait([tasks[n] for n in "abce"], timeout=5)
        assert [n for n, _ in expired] == ["b", "c", "e", "a"]
        timeouts = dict(spec)
        for name, waited in expired:
            assert waited >= timeouts[name] - 0.005, (name, waited)
        assert not tasks["d"].done() and sem.queue_size == 1
        sem.release(held)
        p = await tasks["d"]
        assert sem.stats().timeout_total == 4
        release_all(sem, [p])

    arun(main())


@pytest.mark.parametrize("leaves_by", ["cancel", "grant"])
def test_timer_rearmed_after_the_earliest_waiter_leaves(make_sem, arun, leaves_by):
    sem = make_sem(1, timeout=None)

    async def main():
        held = await sem.acquire(1)
        first = asyncio.ensure_future(sem.acquire(1, timeout=0.05))
        await settle()
        second = asyncio.ensure_future(sem.acquire(1, timeout=0.3))
        await settle()
        t0 = time.monotonic()
        if leaves_by == "cancel":
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            got = None
        else:
            sem.release(held)
            got = await first
            held2 = got
        # The timer armed for `first` still fires (or was re-armed); either
        # way `second` times out at its own deadline, not earlier or never.
        with pytest.raises(PermitAcquireTimeoutError):
            await asyncio.wait_for(second, 5)
        waited = time.monotonic() - t0
        assert 0.3 - 0.06 <= waited < 3, waited
        assert sem.queue_size == 0
        sem.release(held if got is None else held2)

    arun(main())


def test_idle_semaphore_keeps_no_timer(make_sem):
    sem = make_sem(1, timeout=30)

    async def main():
        loop = asyncio.get_running_loop()
        held = await sem.acquire(1)
        t = asyncio.ensure_future(sem.acquire(1))
        await settle()
        assert len(live_timers(loop)) == 1
        sem.release(held)
        p = await t
        await settle()
        # Nobody waits: the timer is gone and the loop is not woken at 30 s.
        assert live_timers(loop) == []
        sem.release(p)

    asyncio.run(main())


def test_no_timer_left_when_only_untimed_waiters_remain(make_sem):
    sem = make_sem(1, timeout=None)

    async def main():
        loop = asyncio.get_running_loop()
        held = await sem.acquire(1)
        timed = asyncio.ensure_future(sem.acquire(1, timeout=0.02))
        untimed = asyncio.ensure_future(sem.acquire(1))
        await settle()
        assert len(live_timers(loop)) == 1
        with pytest.raises(PermitAcquireTimeoutError):
            await timed
        await settle()
        assert sem.queue_size == 1 and live_timers(loop) == []
        sem.release(held)
        sem.release(await untimed)

    asyncio.run(main())


def test_close_with_a_pending_timer(make_sem, arun):
    sem = make_sem(1, timeout=0.2)

    async def main():
        held = await sem.acquire(1)
        tasks = [asyncio.ensure_future(sem.acquire(1)) for _ in range(20)]
        await settle()
        t0 = time.monotonic()
        sem.close()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        assert time.monotonic() - t0 < 0.15     # woken by close, not the timer
        assert all(isinstance(r, PermitAcquireAlreadyClosedError) for r in res)
        await asyncio.sleep(0.3)                 # past the old deadline: nothing fires
        st = sem.stats()
        assert st.timeout_total == 0 and st.queue_size == 0
        if arun.loop == "asyncio":
            assert live_timers(asyncio.get_running_loop()) == []
        sem.release(held)

    arun(main())


def test_timeout_and_grant_race_leaves_nothing_behind(make_sem, arun):
    # Many short timeouts while permits come and go: every waiter ends up
    # granted or timed out, and the accounting is exact.
    sem = make_sem(3, max_queue_size=0, timeout=None)

    async def one(i):
        try:
            async with sem.acquire(1 + i % 2, timeout=0.001 * (i % 7)):
                await asyncio.sleep(0)
        except PermitAcquireTimeoutError:
            return "timeout"
        return "ok"

    async def main():
        res = await asyncio.gather(*(one(i) for i in range(600)))
        assert set(res) <= {"ok", "timeout"} and "ok" in res
        await settle()
        check_invariant(sem, [])
        assert sem.queue_size == 0

    arun(main())
