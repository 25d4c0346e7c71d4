"""How queued asyncio requests are woken (both implementations, default loop
and uvloop): tasks park on the request's waiter itself, not on a Future;
waiters that leave the queue go to their loop's wake batch in FIFO order,
and one call_soon runs a whole batch; a task cancelled inside a batch gives
its permits back."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tests._helpers import check_invariant, release_all, settle


class CountCalls:
    """Count one loop method's calls (default loop only: uvloop's methods
    cannot be shadowed on the instance)."""

    def __init__(self, loop, name):
        self.loop, self.name, self.calls = loop, name, []
        self.orig = getattr(loop, name)

    def __enter__(self):
        def counting(*args, **kwargs):
            self.calls.append(args[0])
            return self.orig(*args, **kwargs)

        setattr(self.loop, self.name, counting)
        return self

    def __exit__(self, *exc):
        delattr(self.loop, self.name)


def test_task_parks_on_the_waiter_not_a_future(make_sem, arun):
    sem = make_sem(1)

    async def main():
        held = await sem.acquire(1)
        t = asyncio.ensure_future(sem.acquire(1))
        await settle()
        waiter = t._fut_waiter
        assert waiter is not None and not isinstance(waiter, asyncio.Future)
        assert waiter._loop is asyncio.get_running_loop()
        assert not waiter.done() and not waiter.cancelled()
        sem.release(held)
        assert waiter.done()
        p = await t
        sem.release(p)

    arun(main())


def test_a_request_is_not_mistaken_for_a_future(make_sem, arun):
    # ensure_future, gather and wait_for must wrap a request in a Task.
    sem = make_sem(1)

    async def main():
        r = sem.acquire(1)
        assert not asyncio.isfuture(r)
        t = asyncio.ensure_future(r)
        assert isinstance(t, asyncio.Task)
        p = await t
        q = (await asyncio.gather(asyncio.wait_for(sem.acquire(0), 5)))[0]
        sem.release(p)
        sem.release(q)

    arun(main())


def test_fifo_order_of_wakeups_across_one_batch(make_sem, arun):
    sem = make_sem(6)
    order = []

    async def worker(i, n):
        p = await sem.acquire(n)
        order.append(i)
        return p

    async def main():
        held = await sem.acquire(6)
        sizes = [2, 1, 3, 1, 1, 2, 1]
        tasks = []
        for i, n in enumerate(sizes):
            tasks.append(asyncio.ensure_future(worker(i, n)))
            await settle(1)   # join the queue in index order
        assert sem.queue_size == len(sizes)
        # One release grants 0..3 (2+1+3 = 6 permits): one batch; 4.. wait.
        sem.release(held)
        await settle()
        assert order == [0, 1, 2]
        ps = [await t for t in tasks[:3]]
        for p in ps:          # each release grants the next ones, in order
            sem.release(p)
        rest = [await t for t in tasks[3:]]
        assert order == list(range(len(sizes)))
        release_all(sem, rest)

    arun(main())


def test_one_call_soon_per_wake_batch(make_sem):
    sem = make_sem(5)
    order = []

    async def worker(i):
        p = await sem.acquire(1)
        order.append(i)
        return p

    async def main():
        loop = asyncio.get_running_loop()
        held = [await sem.acquire(1) for _ in range(5)]
        tasks = [asyncio.ensure_future(worker(i)) for i in range(5)]
        await settle()
        with CountCalls(loop, "call_soon") as calls:
            # Five releases, five grants, before the loop runs again: they
            # all join the batch the first one started.
            for p in held:
                sem.release(p)
        assert len(calls.calls) == 1
        ps = await asyncio.gather(*tasks)
        assert order == list(range(5))
        for p in ps:
            sem.release(p)

    asyncio.run(main())


def test_release_from_a_thread_wakes_a_batch_with_one_threadsafe_call(make_sem):
    sem = make_sem(4)

    async def main():
        loop = asyncio.get_running_loop()
        held = await sem.acquire(4)
        tasks = [asyncio.ensure_future(sem.acquire(1)) for _ in range(4)]
        await settle()
        with CountCalls(loop, "call_soon_threadsafe") as calls:
            th = threading.Thread(target=sem.release, args=(held,))
            th.start()
            th.join()
        assert len(calls.calls) == 1
        ps = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        for p in ps:
            sem.release(p)

    asyncio.run(main())


def test_cancelled_task_inside_a_batch_gives_its_permits_back(make_sem, arun):
    sem = make_sem(3)

    async def main():
        held = await sem.acquire(3)
        tasks = [asyncio.ensure_future(sem.acquire(1)) for _ in range(4)]
        await settle()
        sem.release(held)          # grants 0, 1, 2 in one batch; 3 waits
        assert sem.queue_size == 1 and sem.acquired_permits == 3
        tasks[1].cancel()          # granted, not resumed yet
        res = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(res[1], asyncio.CancelledError)
        got = [r for r in res if not isinstance(r, BaseException)]
        assert [p.permits for p in got] == [1, 1, 1]   # 3 got 1's permit
        check_invariant(sem, got)
        assert sem.stats().cancelled_total == 1
        for p in got:
            sem.release(p)

    arun(main())


def test_cancelled_queued_task_leaves_without_touching_others(make_sem, arun):
    sem = make_sem(2)

    async def main():
        held = await sem.acquire(2)
        tasks = [asyncio.ensure_future(sem.acquire(1)) for _ in range(3)]
        await settle()
        tasks[0].cancel("stop")    # parked: the waiter leaves the queue at once
        assert sem.queue_size == 2
        with pytest.raises(asyncio.CancelledError):
            await tasks[0]
        sem.release(held)
        ps = await asyncio.gather(*tasks[1:])
        release_all(sem, ps)

    arun(main())


def test_failing_wake_callback_does_not_lose_the_others(make_sem):
    sem = make_sem(2)
    reported = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda lp, ctx: reported.append(ctx))
        held = await sem.acquire(2)
        tasks = [asyncio.ensure_future(sem.acquire(1)) for _ in range(2)]
        await settle()

        def boom(waiter):
            raise KeyError("callback")

        tasks[0]._fut_waiter.add_done_callback(boom)
        sem.release(held)
        ps = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert [p.permits for p in ps] == [1, 1]
        for p in ps:
            sem.release(p)

    asyncio.run(main())
    assert len(reported) == 1
    assert isinstance(reported[0]["exception"], KeyError)
    assert reported[0]["message"] == "pylimiter: exception in a wake-up callback"


def test_grant_to_a_closed_loop_goes_back(make_sem):
    sem = make_sem(1)
    started = threading.Event()
    box = {}

    async def wants_one():
        return await sem.acquire(1)

    def other_loop():
        loop = asyncio.new_event_loop()
        task = loop.create_task(wants_one())
        task._log_destroy_pending = False
        loop.run_until_complete(asyncio.sleep(0.01))   # parks the task
        box["task"] = task
        # The loop stops and is closed with the task still parked.
        loop.close()
        started.set()

    held = sem.acquire_blocking(1)
    th = threading.Thread(target=other_loop)
    th.start()
    started.wait(5)
    th.join(5)
    assert sem.queue_size == 1
    sem.release(held)           # grants the parked task: its loop is closed
    assert sem.acquired_permits == 0 and sem.queue_size == 0
    assert sem.available_permits == 1
    box["task"]._coro.close()   # the task never ran to the end
    assert sem.acquired_permits == 0
