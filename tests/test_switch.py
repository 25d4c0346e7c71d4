"""The live switch between unbounded and bounded (set_max_permits accepts any
int on any semaphore), both implementations."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

from pylimiter import PermitAcquireError
from tests._helpers import check_invariant, release_all, settle

UNBOUNDED = 2**63 - 1



def test_switching_off_grants_every_queued_request(make_sem, arun):
    sem = make_sem(4)

    async def main():
        held = await sem.acquire(3)
        order = []

        async def waiter(i, n, check=None):
            p = await sem.acquire(n, is_cancelled=check)
            order.append(i)
            return p

        tasks = []
        # One that would never fit the old limit's room, one with a check
        # (not asked once unbounded), and small ones behind them.
        for i, (n, check) in enumerate([(4, None), (2, lambda: False), (1, None), (3, None)]):
            tasks.append(asyncio.ensure_future(waiter(i, n, check)))
            await settle(1)
        assert sem.queue_size == 4
        sem.set_max_permits(0)
        assert sem.max_permits == 0
        assert sem.queue_size == 0
        assert sem.available_permits == UNBOUNDED
        assert sem.acquired_permits == 3 + 4 + 2 + 1 + 3
        assert not sem.locked()
        ps = await asyncio.gather(*tasks)
        assert order == [0, 1, 2, 3]                 # FIFO, one batch
        assert [p.permits for p in ps] == [4, 2, 1, 3]
        # Unbounded now: anything goes at once.
        big = await sem.acquire(10**12, timeout=0)
        release_all(sem, [held, big, *ps])
        assert sem.acquired_permits == 0

    arun(main())


@pytest.mark.parametrize("off", [0, -1, -(10**30)])
def test_any_limit_at_or_below_zero_is_unbounded(make_sem, off):
    sem = make_sem(5)
    p = sem.try_acquire(5)
    sem.set_max_permits(off)
    assert sem.max_permits == off
    assert sem.available_permits == UNBOUNDED
    assert sem.stats().max_permits == off
    q = sem.try_acquire(100)
    assert sem.acquired_permits == 105
    sem.release(p)
    sem.release(q)


def test_switching_on_carries_what_is_held(make_sem, arun):
    sem = make_sem(-3)

    async def main():
        held = await sem.acquire(50)
        sem.set_max_permits(20)
        assert (sem.max_permits, sem.acquired_permits) == (20, 50)
        assert sem.available_permits == -30            # negative: over the new limit
        assert sem.locked()
        assert sem.try_acquire(1) is None
        with pytest.raises(ValueError,
                           match=r"^Requested permits=21 is larger than max_permits=20$"):
            sem.acquire(21)
        w = asyncio.ensure_future(sem.acquire(5))
        await settle()
        assert sem.queue_size == 1
        part = await sem.update(held, 16)              # 34 back: still 4 short
        await settle()
        assert not w.done() and sem.available_permits == 4
        await sem.update(part, 15)                     # 1 more: 5 free
        p = await asyncio.wait_for(w, 5)
        assert sem.available_permits == 0
        release_all(sem, [part, p])
        assert sem.available_permits == 20

    arun(main())


def test_switching_on_fails_queued_requests_larger_than_the_limit(make_sem, arun):
    sem = make_sem(10)

    async def main():
        held = await sem.acquire(10)
        big = asyncio.ensure_future(sem.acquire(8))
        small = asyncio.ensure_future(sem.acquire(3))
        await settle()
        sem.set_max_permits(5)
        with pytest.raises(ValueError, match=r"^Requested permits=8 is larger than max_permits=5$"):
            await big
        assert sem.queue_size == 1 and sem.available_permits == -5
        sem.release(held)
        p = await small
        release_all(sem, [p])

    arun(main())


def test_request_made_before_a_lowering_fails_when_awaited(make_sem, arun):
    sem = make_sem(10)

    async def main():
        held = await sem.acquire(10)
        r = sem.acquire(8)            # checked against 10: fine
        sem.set_max_permits(5)
        with pytest.raises(ValueError, match=r"^Requested permits=8 is larger than max_permits=5$"):
            await r                   # would have to queue for ever: fails instead
        assert sem.queue_size == 0
        sem.release(held)

    arun(main())


def test_back_and_forth_keeps_exact_accounting(make_sem):
    sem = make_sem(10)
    held = [sem.try_acquire(3), sem.try_acquire(4)]
    for m in (0, 2, -1, 50, 7, 0, 10):
        sem.set_max_permits(m)
        assert sem.acquired_permits == 7
        if m > 0:
            assert sem.available_permits == m - 7
        else:
            assert sem.available_permits == UNBOUNDED
    for p in held:
        sem.release(p)
    assert sem.available_permits == 10


def test_no_leak_under_concurrent_acquire_release_during_the_switch(make_sem):
    sem = make_sem(10, max_queue_size=0, timeout=None)
    stop = threading.Event()
    errors = []
    limits = [0, 3, 10, -1, 1, 25, 2]

    def switcher():
        rnd = random.Random(1)
        while not stop.is_set():
            sem.set_max_permits(rnd.choice(limits))
            stop.wait(0.0005)

    def thread_worker(seed):
        rnd = random.Random(seed)
        try:
            for _ in range(400):
                try:
                    p = sem.acquire_blocking(rnd.randint(1, 3),
                                             timeout=rnd.choice([None, 0.002, 0.05]))
                except (PermitAcquireError, ValueError):
                    continue   # timed out, or larger than the limit of the moment
                sem.release(p)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    async def task_worker(seed):
        rnd = random.Random(seed)
        for _ in range(400):
            try:
                async with sem.acquire(rnd.randint(1, 3),
                                       timeout=rnd.choice([None, 0.002, 0.05])):
                    await asyncio.sleep(0)
            except (PermitAcquireError, ValueError):
                pass

    async def main():
        sw = threading.Thread(target=switcher)
        threads = [threading.Thread(target=thread_worker, args=(i,)) for i in range(4)]
        sw.start()
        for t in threads:
            t.start()
        await asyncio.gather(*(task_worker(100 + i) for i in range(10)))
        loop = asyncio.get_running_loop()
        for t in threads:
            await loop.run_in_executor(None, t.join, 60)
        stop.set()
        await loop.run_in_executor(None, sw.join, 10)

    asyncio.run(asyncio.wait_for(main(), 120))
    assert not errors
    sem.set_max_permits(10)
    assert sem.queue_size == 0
    check_invariant(sem, [])
    assert sem.available_permits == 10
