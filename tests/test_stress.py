"""Storms and hammers: many tasks and threads on one semaphore, with
cancellations, timeouts, updates and close mixed in; no permit may leak."""

from __future__ import annotations

import asyncio
import random
import threading

from pylimiter import PermitAcquireError
from tests._helpers import run


def test_cancellation_timeout_storm_leaks_nothing(make_sem):
    sem = make_sem(10, max_queue_size=0)

    async def worker(i):
        async with sem.acquire(1 + i % 3, timeout=0.2 if i % 2 else None):
            await asyncio.sleep(0)
        return i

    async def main():
        held = await sem.acquire(10)
        waiters = [asyncio.ensure_future(worker(i)) for i in range(3000)]
        await asyncio.sleep(0)
        assert sem.queue_size == 3000
        rnd = random.Random(7)
        for w in rnd.sample(waiters, 1500):
            w.cancel()
        # Some cancellations race with the grants handed out now.
        sem.release(held)
        return await asyncio.gather(*waiters, return_exceptions=True)

    results = run(main(), timeout=60)
    assert sem.acquired_permits == 0 and sem.queue_size == 0
    assert sem.available_permits == 10
    kinds = {type(r).__name__ for r in results}
    assert "CancelledError" in kinds
    st = sem.stats()
    assert st.cancelled_total >= 1500 - 10


def test_parked_waiters_cancelled_newest_first(make_sem):
    sem = make_sem(1, max_queue_size=0)

    async def main():
        held = await sem.acquire(1)
        ws = [asyncio.ensure_future(sem.acquire(1)) for _ in range(2000)]
        await asyncio.sleep(0)
        for w in reversed(ws):
            w.cancel()
        await asyncio.gather(*ws, return_exceptions=True)
        assert sem.queue_size == 0
        sem.release(held)

    run(main())
    assert sem.acquired_permits == 0


def test_threads_and_tasks_hammer_one_semaphore(make_sem):
    sem = make_sem(5, max_queue_size=0, timeout=None)
    errors = []
    stop_threads = 6
    per_thread = 300

    def thread_worker(seed):
        rnd = random.Random(seed)
        try:
            for _ in range(per_thread):
                n = rnd.randint(1, 3)
                try:
                    p = sem.acquire_blocking(n, timeout=rnd.choice([None, 0.001, 0.05]))
                except PermitAcquireError:
                    continue
                if rnd.random() < 0.3:
                    try:
                        sem.update_blocking(p, rnd.randint(0, 5), timeout=0.01)
                    except PermitAcquireError:
                        pass
                sem.release(p)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    async def task_worker(seed):
        rnd = random.Random(seed)
        for _ in range(per_thread):
            n = rnd.randint(1, 3)
            try:
                async with sem.acquire(n, timeout=rnd.choice([None, 0.001, 0.05])) as p:
                    if rnd.random() < 0.3:
                        try:
                            await sem.update(p, rnd.randint(0, 5), timeout=0.01)
                        except PermitAcquireError:
                            pass
                    await asyncio.sleep(0)
            except PermitAcquireError:
                pass

    async def main():
        threads = [threading.Thread(target=thread_worker, args=(i,)) for i in range(stop_threads)]
        for t in threads:
            t.start()
        tasks = [asyncio.ensure_future(task_worker(100 + i)) for i in range(20)]
        # A canceller racing with everyone.
        for _ in range(50):
            await asyncio.sleep(0.001)
            victims = [t for t in tasks if not t.done()]
            if not victims:
                break
        await asyncio.gather(*tasks)
        loop = asyncio.get_running_loop()
        for t in threads:
            await loop.run_in_executor(None, t.join, 60)

    run(main(), timeout=120)
    assert not errors
    assert sem.acquired_permits == 0
    assert sem.queue_size == 0
    assert sem.available_permits == 5


def test_close_during_hammer_wakes_everyone(make_sem):
    sem = make_sem(2, max_queue_size=0, timeout=None)
    outcomes = []

    def worker():
        try:
            while True:
                p = sem.acquire_blocking(1)
                sem.release(p)
        except PermitAcquireError as e:
            outcomes.append(type(e).__name__)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    threading.Event().wait(0.1)
    sem.close()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert outcomes == ["PermitAcquireAlreadyClosedError"] * 8
    assert sem.acquired_permits == 0
