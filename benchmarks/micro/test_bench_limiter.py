"""Micro benchmarks: pylimiter (C and pure Python) side by side with the
stdlib and anyio, in one run.

Each benchmark times a batch of `ops` operations inside one call (so the
harness's own per-call overhead is amortised) and records `ops` in
extra_info; report.py divides to get ns per operation and forms ratios
against the anchors measured in the same run.  Event-loop creation and task
parking done in `setup` are excluded from the timing.
"""

from __future__ import annotations

import asyncio
import random
import sys
import threading

import anyio
import pytest

from pylimiter import PermitAcquireTimeoutError
from pylimiter._impls import IMPLEMENTATIONS

OPS = 20000
ASYNC_IMPLS = ["c", "python", "asyncio.Semaphore", "anyio.CapacityLimiter"]


def _ops_for(impl):
    return OPS // 10 if impl == "python" else OPS


# ---- uncontended await acquire(1) + release ---------------------------------


def _uncontended(impl, n):
    if impl in IMPLEMENTATIONS:
        sem = IMPLEMENTATIONS[impl].module.AsyncSemaphore(10)
        acq, rel = sem.acquire, sem.release

        async def batch():
            for _ in range(n):
                rel(await acq(1))
    elif impl == "asyncio.Semaphore":
        sem = asyncio.Semaphore(10)

        async def batch():
            for _ in range(n):
                await sem.acquire()
                sem.release()
    elif impl == "anyio.CapacityLimiter":
        holder = {}

        async def batch():
            lim = holder.get("lim")
            if lim is None:
                lim = holder["lim"] = anyio.CapacityLimiter(10)
            for _ in range(n):
                await lim.acquire()
                lim.release()
    else:  # baseline: the loop itself
        async def batch():
            for _ in range(n):
                pass
    return batch


@pytest.mark.benchmark(group="uncontended-async")
@pytest.mark.parametrize("impl", ASYNC_IMPLS + ["baseline"])
def test_uncontended_async(benchmark, loop, impl):
    n = _ops_for(impl)
    batch = _uncontended(impl, n)
    benchmark.extra_info["ops"] = n
    benchmark.pedantic(lambda: loop.run_until_complete(batch()), rounds=15,
                       warmup_rounds=2)


# ---- uncontended blocking -----------------------------------------------------


@pytest.mark.benchmark(group="uncontended-blocking")
@pytest.mark.parametrize("impl", ["c", "python", "threading.Semaphore",
                                  "threading.Lock", "baseline"])
def test_uncontended_blocking(benchmark, impl):
    n = _ops_for(impl)
    if impl in IMPLEMENTATIONS:
        sem = IMPLEMENTATIONS[impl].module.AsyncSemaphore(10)
        acq, rel = sem.acquire_blocking, sem.release

        def batch():
            for _ in range(n):
                rel(acq(1))
    elif impl == "baseline":
        def batch():
            for _ in range(n):
                pass
    else:
        lk = threading.Semaphore(10) if impl == "threading.Semaphore" else threading.Lock()
        acq, rel = lk.acquire, lk.release

        def batch():
            for _ in range(n):
                acq()
                rel()
    benchmark.extra_info["ops"] = n
    benchmark.pedantic(batch, rounds=15, warmup_rounds=2)


# ---- 1000 tasks on 10 permits -----------------------------------------------------


def _contention(impl, tasks=1000, permits=10):
    if impl in IMPLEMENTATIONS:
        mod = IMPLEMENTATIONS[impl].module

        async def run():
            sem = mod.AsyncSemaphore(permits, max_queue_size=0, timeout=None)

            async def one():
                p = await sem.acquire(1)
                await asyncio.sleep(0)
                sem.release(p)
            await asyncio.gather(*(one() for _ in range(tasks)))
    elif impl == "asyncio.Semaphore":
        async def run():
            sem = asyncio.Semaphore(permits)

            async def one():
                await sem.acquire()
                await asyncio.sleep(0)
                sem.release()
            await asyncio.gather(*(one() for _ in range(tasks)))
    elif impl == "anyio.CapacityLimiter":
        async def run():
            lim = anyio.CapacityLimiter(permits)

            async def one():
                async with lim:
                    await asyncio.sleep(0)
            await asyncio.gather(*(one() for _ in range(tasks)))
    else:
        async def run():
            async def one():
                await asyncio.sleep(0)
            await asyncio.gather(*(one() for _ in range(tasks)))
    return run


@pytest.mark.benchmark(group="1000-tasks-10-permits")
@pytest.mark.parametrize("impl", ASYNC_IMPLS + ["baseline"])
def test_tasks_contending(benchmark, loop, impl):
    run = _contention(impl)
    benchmark.extra_info["ops"] = 1000
    benchmark.pedantic(lambda: loop.run_until_complete(run()), rounds=15,
                       warmup_rounds=2)


# ---- parked waiters: cancelled newest-first, timing out ----------------------------

PARKED = 10000


def _park(loop, impl):
    """Untimed: hold every permit and park PARKED waiters."""
    if impl in IMPLEMENTATIONS:
        mod = IMPLEMENTATIONS[impl].module
        sem = mod.AsyncSemaphore(1, max_queue_size=0, timeout=None)
        loop.run_until_complete(sem.acquire(1))

        async def coro():
            return await sem.acquire(1)
    else:
        sem = asyncio.Semaphore(1)
        loop.run_until_complete(sem.acquire())
        coro = sem.acquire
    tasks = [loop.create_task(coro()) for _ in range(PARKED)]
    loop.run_until_complete(asyncio.sleep(0))
    return tasks


@pytest.mark.benchmark(group="10k-parked-cancel-newest-first")
@pytest.mark.parametrize("impl", ["c", "python", "asyncio.Semaphore"])
def test_parked_cancel_newest_first(benchmark, loop, impl):
    async def cancel_all(tasks):
        for t in reversed(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    benchmark.extra_info["ops"] = PARKED
    benchmark.pedantic(lambda tasks: loop.run_until_complete(cancel_all(tasks)),
                       setup=lambda: ((_park(loop, impl),), {}), rounds=5)


def _timeouts(impl):
    if impl in IMPLEMENTATIONS:
        mod = IMPLEMENTATIONS[impl].module

        async def run():
            sem = mod.AsyncSemaphore(1, max_queue_size=0)
            held = await sem.acquire(1)

            async def one():
                try:
                    await sem.acquire(1, timeout=0.001)
                except PermitAcquireTimeoutError:
                    pass
            await asyncio.gather(*(one() for _ in range(PARKED)))
            sem.release(held)
    elif impl == "asyncio.Semaphore":
        async def run():
            sem = asyncio.Semaphore(1)
            await sem.acquire()

            async def one():
                try:
                    if sys.version_info >= (3, 11):
                        async with asyncio.timeout(0.001):
                            await sem.acquire()
                    else:
                        await asyncio.wait_for(sem.acquire(), 0.001)
                except TimeoutError:
                    pass
            await asyncio.gather(*(one() for _ in range(PARKED)))
    else:  # parking alone: the same tasks on a timer, no semaphore
        async def run():
            async def one():
                await asyncio.sleep(0.001)
            await asyncio.gather(*(one() for _ in range(PARKED)))
    return run


@pytest.mark.benchmark(group="10k-parked-timeout")
@pytest.mark.parametrize("impl", ["c", "python", "asyncio.Semaphore",
                                  "baseline"])
def test_parked_timeouts(benchmark, loop, impl):
    run = _timeouts(impl)
    benchmark.extra_info["ops"] = PARKED
    benchmark.pedantic(lambda: loop.run_until_complete(run()), rounds=5)


# ---- weighted requests: FIFO without overtaking --------------------------------------


def _weighted(impl, tasks=300, seed=3):
    """Requests of 1..8 of 10 permits.  Counts overtakes (a later request
    granted before an earlier one) and deadlocks of the workaround."""
    rnd = random.Random(seed)
    sizes = [rnd.randint(1, 8) for _ in range(tasks)]
    result = {}

    async def run():
        order = []
        if impl == "c":
            sem = IMPLEMENTATIONS["c"].module.AsyncSemaphore(10, max_queue_size=0, timeout=None)

            async def one(i, k):
                p = await sem.acquire(k)
                order.append(i)
                await asyncio.sleep(0)
                sem.release(p)
        elif impl == "asyncio.Condition":   # weighted wait: lets small ones overtake
            cond = asyncio.Condition()
            free = [10]

            async def one(i, k):
                async with cond:
                    await cond.wait_for(lambda: free[0] >= k)
                    free[0] -= k
                order.append(i)
                await asyncio.sleep(0)
                async with cond:
                    free[0] += k
                    cond.notify_all()
        else:                                # k separate acquire(): can deadlock
            sem = asyncio.Semaphore(10)

            async def one(i, k):
                for _ in range(k):
                    await sem.acquire()
                order.append(i)
                await asyncio.sleep(0)
                for _ in range(k):
                    sem.release()
        ts = []
        for i, k in enumerate(sizes):
            ts.append(asyncio.ensure_future(one(i, k)))
        await asyncio.sleep(0)
        done, pending = await asyncio.wait(ts, timeout=2.0)
        for t in pending:
            t.cancel()
        result["deadlocked"] = bool(pending)
        result["overtakes"] = sum(1 for a, b in zip(order, order[1:]) if b < a)
    return run, result


@pytest.mark.benchmark(group="weighted-1-to-8-of-10")
@pytest.mark.parametrize("impl", ["c", "asyncio.Condition",
                                  "asyncio.Semaphore-k-times"])
def test_weighted_fifo(benchmark, loop, impl):
    run, result = _weighted(impl)
    benchmark.extra_info["ops"] = 300
    benchmark.pedantic(lambda: loop.run_until_complete(run()), rounds=3)
    benchmark.extra_info.update(result)
    if impl == "c":
        assert result["overtakes"] == 0 and not result["deadlocked"]
