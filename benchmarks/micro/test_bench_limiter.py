"""Micro benchmarks: pylimiter (C and pure Python) beside the stdlib and
anyio.

Two kinds of rows:

- *uncontended* groups (pytest-benchmark's own timing, thread CPU time with
  `make bench-micro`): each benchmark times a batch of `ops` operations in one
  call and records `ops` in extra_info; report.py divides to get ns per
  operation.  These are for before/after comparisons of one implementation
  (`--benchmark-compare`), not for ratios between rows.
- the *figures* group: every ratio (contended, timeouts, cancellation, and
  the uncontended speed-ups) measured by :mod:`benchmarks.figures` with both
  sides in interleaved rounds of the same test, stored in extra_info.

Event-loop creation and task parking are excluded from every timing.
"""

from __future__ import annotations

import asyncio
import random
import threading

import anyio
import pytest

from benchmarks.figures import BY_KEY, FIGURES, LOOPS, measure
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


@pytest.mark.benchmark(group="uncontended-with")
@pytest.mark.parametrize("impl", ["c", "python", "c-bare", "asyncio.Semaphore"])
def test_uncontended_async_with(benchmark, loop, impl):
    """`async with sem.acquire(1)`; c-bare is `async with sem:` (core v2)."""
    n = _ops_for(impl)
    if impl == "asyncio.Semaphore":
        sem, bare = asyncio.Semaphore(10), True
    else:
        sem = IMPLEMENTATIONS[impl.removesuffix("-bare")].module.AsyncSemaphore(10, 0, None)
        bare = impl.endswith("-bare")
        if bare and not hasattr(sem, "__aenter__"):
            pytest.skip("`async with sem:` needs core v2")

    async def batch():
        if bare:
            for _ in range(n):
                async with sem:
                    pass
        else:
            acq = sem.acquire
            for _ in range(n):
                async with acq(1):
                    pass
    benchmark.extra_info["ops"] = n
    benchmark.pedantic(lambda: loop.run_until_complete(batch()), rounds=15, warmup_rounds=2)


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


# ---- the figures: ratios measured side by side --------------------------------------
# One test per figure and loop.  The figure is measured by benchmarks.figures
# (interleaved rounds, order flipped, thread CPU time, median over rounds) and
# lands in extra_info; pytest-benchmark's own timing of the test is just how
# long the measurement took.


def _figure_params():
    for fig in FIGURES:
        for loop in (LOOPS if fig.uses_loop else ["-"]):
            yield pytest.param(fig.key, loop, id=f"{fig.key}-{loop}")


@pytest.mark.benchmark(group="figures")
@pytest.mark.parametrize(("figure", "loop_name"), list(_figure_params()))
def test_figure(benchmark, figure, loop_name):
    fig = BY_KEY[figure]
    c, py = IMPLEMENTATIONS["c"].module, IMPLEMENTATIONS["python"].module
    res = benchmark.pedantic(measure, args=(fig, c, py, loop_name), rounds=1, iterations=1)
    if res is None:
        pytest.skip(f"{figure} cannot run here ({fig.note})")
    benchmark.extra_info.update(res)
    assert res["n"] >= 3 and res["lo"] <= res["median"] <= res["hi"]


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
