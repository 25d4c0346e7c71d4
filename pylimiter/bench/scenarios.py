"""Benchmark scenarios: one trial = one implementation against its stdlib
anchor, measured side by side in the same process.

No Spark here: a trial is a plain function call, so the runner can execute
it inside any executor's Python worker (and the tests can call it directly).
Each side runs in time-boxed rounds, implementation and anchor alternating,
so slow drift of the machine (another tenant, frequency scaling) hits both
sides alike and the ratio stays honest.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from .._common import LimitType
from .._impls import IMPLEMENTATIONS



@dataclass(frozen=True)
class Scenario:
    name: str
    doc: str
    anchor: Optional[str]        # the stdlib primitive measured alongside, if any
    uses_concurrency: bool       # does the concurrency axis mean anything here
    uses_permits: bool           # does the permits axis mean anything here


SCENARIOS = {
    s.name: s
    for s in [
        Scenario("uncontended-async", "await acquire(1) + release, nobody waits",
                 "asyncio.Semaphore", False, False),
        Scenario("uncontended-threads", "acquire_blocking(1) + release, one thread",
                 "threading.Semaphore", False, False),
        Scenario("tasks", "N asyncio tasks on K permits: acquire(1), sleep(0), release",
                 "asyncio.Semaphore", True, True),
        Scenario("threads", "N threads on K permits: acquire_blocking(1), release",
                 "threading.Semaphore", True, True),
        Scenario("weighted", "N tasks request 1..K of K permits each",
                 None, True, True),
        Scenario("update", "acquire(1), update to K (grow), update to 1 (shrink), release",
                 None, False, True),
        Scenario("timeouts", "N waiters parked behind a held permit time out after 1 ms",
                 "asyncio.timeout+Semaphore", True, False),
        Scenario("cancel", "N parked waiters cancelled newest-first",
                 "asyncio.Semaphore", True, False),
        Scenario("dual", "heap acquire, update to actual, direct acquire, release both",
                 None, True, False),
        Scenario("scaling", "uncontended acquire/release on a limiter per executor; "
                 "concurrency = executors running at once", None, True, False),
    ]
}

UPDATE_OPS = 200      # per round in the update scenario
OPS_PER_TASK = 5      # acquire/release cycles per task or thread in a round
LATENCY_SAMPLE = 2000  # individually timed ops for the uncontended latency pass


class _Side:
    """Accumulates one side's (implementation's or anchor's) measurements."""

    def __init__(self) -> None:
        self.ns = 0
        self.ops = 0
        self.waits: list[int] = []
        self.errors = 0

    def ns_per_op(self) -> Optional[float]:
        return self.ns / self.ops if self.ops else None


# ---- one round of each scenario ------------------------------------------------
# Each returns (elapsed_ns, ops, waits_ns, errors) for one round on one side.
# `make` builds the limiter for the round (so a round also proves the limiter
# ends clean: see _leaked).


def _round_uncontended_async(sem, is_anchor, n, k, target_ops):
    async def main():
        if is_anchor:
            acquire, release = sem.acquire, sem.release
            t0 = time.perf_counter_ns()
            for _ in range(target_ops):
                await acquire()
                release()
        else:
            acquire, release = sem.acquire, sem.release
            t0 = time.perf_counter_ns()
            for _ in range(target_ops):
                release(await acquire(1))
        return time.perf_counter_ns() - t0

    return asyncio.run(main()), target_ops, [], 0


def _round_uncontended_threads(sem, is_anchor, n, k, target_ops):
    if is_anchor:
        acquire, release = sem.acquire, sem.release
        t0 = time.perf_counter_ns()
        for _ in range(target_ops):
            acquire()
            release()
    else:
        acquire, release = sem.acquire_blocking, sem.release
        t0 = time.perf_counter_ns()
        for _ in range(target_ops):
            release(acquire(1))
    return time.perf_counter_ns() - t0, target_ops, [], 0


def _round_tasks(sem, is_anchor, n, k, target_ops):
    waits: list[int] = []
    clock = time.perf_counter_ns

    async def worker():
        for _ in range(OPS_PER_TASK):
            t = clock()
            if is_anchor:
                await sem.acquire()
            else:
                p = await sem.acquire(1)
            waits.append(clock() - t)
            await asyncio.sleep(0)
            sem.release() if is_anchor else sem.release(p)

    async def main():
        t0 = clock()
        await asyncio.gather(*(worker() for _ in range(n)))
        return clock() - t0

    return asyncio.run(main()), n * OPS_PER_TASK, waits, 0


def _round_threads(sem, is_anchor, n, k, target_ops):
    waits: list[list[int]] = [[] for _ in range(n)]
    clock = time.perf_counter_ns
    start = threading.Barrier(n + 1)
    errors = []

    def worker(mine):
        try:
            start.wait()
            for _ in range(OPS_PER_TASK):
                t = clock()
                if is_anchor:
                    sem.acquire()
                    mine.append(clock() - t)
                    sem.release()
                else:
                    p = sem.acquire_blocking(1)
                    mine.append(clock() - t)
                    sem.release(p)
        except Exception as exc:  # counted, and the trial goes on
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in waits]
    for t in threads:
        t.start()
    start.wait()
    t0 = clock()
    for t in threads:
        t.join()
    elapsed = clock() - t0
    return elapsed, n * OPS_PER_TASK, [x for w in waits for x in w], len(errors)


def _round_weighted(sem, is_anchor, n, k, target_ops):
    rng = random.Random(n * 1000 + k)
    sizes = [rng.randint(1, k) for _ in range(n)]
    waits: list[int] = []
    clock = time.perf_counter_ns

    async def worker(size):
        t = clock()
        p = await sem.acquire(size)
        waits.append(clock() - t)
        await asyncio.sleep(0)
        sem.release(p)

    async def main():
        t0 = clock()
        await asyncio.gather(*(worker(s) for s in sizes))
        return clock() - t0

    return asyncio.run(main()), n, waits, 0


def _round_update(sem, is_anchor, n, k, target_ops):
    async def main():
        t0 = time.perf_counter_ns()
        for _ in range(UPDATE_OPS):
            p = await sem.acquire(1)
            p = await sem.update(p, k)
            p = await sem.update(p, 1)
            sem.release(p)
        return time.perf_counter_ns() - t0

    return asyncio.run(main()), UPDATE_OPS, [], 0


def _round_timeouts(sem, is_anchor, n, k, target_ops):
    clock = time.perf_counter_ns
    errors = 0

    async def main():
        nonlocal errors
        if is_anchor:
            await sem.acquire()
        else:
            held = await sem.acquire(1)
        outcomes = []

        async def waiter():
            try:
                if is_anchor and hasattr(asyncio, "timeout"):
                    async with asyncio.timeout(0.001):
                        await sem.acquire()
                elif is_anchor:  # Python 3.10: no asyncio.timeout yet
                    await asyncio.wait_for(sem.acquire(), 0.001)
                else:
                    await sem.acquire(1, timeout=0.001)
                outcomes.append(False)
            except (TimeoutError, asyncio.TimeoutError):
                outcomes.append(True)
            except Exception:
                outcomes.append(False)

        t0 = clock()
        await asyncio.gather(*(waiter() for _ in range(n)))
        elapsed = clock() - t0
        sem.release() if is_anchor else sem.release(held)
        errors = outcomes.count(False)
        return elapsed

    elapsed = asyncio.run(main())
    return elapsed, n, [], errors


def _round_cancel(sem, is_anchor, n, k, target_ops):
    clock = time.perf_counter_ns

    async def main():
        held = None if is_anchor else await sem.acquire(1)
        if is_anchor:
            await sem.acquire()
        tasks = [asyncio.ensure_future(sem.acquire() if is_anchor else sem.acquire(1))
                 for _ in range(n)]
        await asyncio.sleep(0)  # all parked (untimed)
        t0 = clock()
        for t in reversed(tasks):
            t.cancel()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = clock() - t0
        bad = sum(not isinstance(r, asyncio.CancelledError) for r in res)
        sem.release() if is_anchor else sem.release(held)
        return elapsed, bad

    elapsed, bad = asyncio.run(main())
    return elapsed, n, [], bad


def _round_dual(lim, is_anchor, n, k, target_ops):
    waits: list[int] = []
    clock = time.perf_counter_ns

    async def worker(i):
        for _ in range(OPS_PER_TASK):
            t = clock()
            heap = await lim.acquire(10 * 1024, LimitType.HEAP_MEMORY)
            waits.append(clock() - t)
            heap = await lim.update(heap, 2048 + 32 * (i % 64))
            direct = await lim.acquire(4096, LimitType.DIRECT_MEMORY)
            await asyncio.sleep(0)
            lim.release(direct)
            lim.release(heap)

    async def main():
        t0 = clock()
        await asyncio.gather(*(worker(i) for i in range(n)))
        return clock() - t0

    return asyncio.run(main()), n * OPS_PER_TASK, waits, 0


ROUNDS: dict[str, Callable] = {
    "uncontended-async": _round_uncontended_async,
    "uncontended-threads": _round_uncontended_threads,
    "tasks": _round_tasks,
    "threads": _round_threads,
    "weighted": _round_weighted,
    "update": _round_update,
    "timeouts": _round_timeouts,
    "cancel": _round_cancel,
    "dual": _round_dual,
    "scaling": _round_uncontended_async,
}


# ---- limiters ------------------------------------------------------------------


def _make(scenario: str, impl: str, k: int, is_anchor: bool):
    if is_anchor:
        if scenario in ("uncontended-threads", "threads"):
            return threading.Semaphore(k)
        return asyncio.Semaphore(1 if scenario in ("timeouts", "cancel") else k)
    mod = IMPLEMENTATIONS[impl].module
    # No default timeout and no queue bound: the anchors have neither, and a
    # default timeout arms a timer per queued waiter.
    if scenario == "dual":
        return mod.AsyncDualMemoryLimiter(1 << 20, 1 << 20, heap_max_queue_size=0,
                                          direct_max_queue_size=0, heap_timeout=None,
                                          direct_timeout=None)
    if scenario in ("timeouts", "cancel"):
        return mod.AsyncSemaphore(1, 0, None)
    return mod.AsyncSemaphore(k, 0, None)


def _leaked(lim, scenario: str, k: int, is_anchor: bool) -> int:
    """Permits not back after a round (0 when the limiter ended clean)."""
    if is_anchor:
        full = 1 if scenario in ("timeouts", "cancel") else k
        return full - lim._value
    if scenario == "dual":
        return sum(s.acquired_permits + s.queue_size
                   for s in (lim.get_limiter(t) for t in LimitType))
    return lim.acquired_permits + lim.queue_size


# ---- a trial -------------------------------------------------------------------


def _percentile(sorted_vals: list[int], q: float) -> Optional[float]:
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return float(sorted_vals[i])


def _latency_pass(scenario: str, impl: str) -> list[int]:
    """Individually timed uncontended ops, apart from the throughput rounds so
    the clock reads do not distort ns/op."""
    lim = _make(scenario, impl, 1, False)
    clock = time.perf_counter_ns
    out = []
    if scenario == "uncontended-threads":
        for _ in range(LATENCY_SAMPLE):
            t = clock()
            p = lim.acquire_blocking(1)
            out.append(clock() - t)
            lim.release(p)
        return out

    async def main():
        for _ in range(LATENCY_SAMPLE):
            t = clock()
            p = await lim.acquire(1)
            out.append(clock() - t)
            lim.release(p)

    asyncio.run(main())
    return out


def run_trial(scenario: str, impl: str, concurrency: int, permits: int,
              budget_s: float = 0.3, ops: int = 5000) -> dict:
    """Run one trial and return its row (see runner.RESULT_FIELDS)."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}")
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {impl!r}")
    spec = SCENARIOS[scenario]
    rnd = ROUNDS[scenario]
    n, k = concurrency, permits
    sides = {False: _Side(), True: _Side()}
    leaked = 0
    run_anchor = spec.anchor is not None
    deadline = time.perf_counter() + 2 * budget_s
    first = True
    # Alternate impl and anchor rounds until both used their budget (at
    # least one round each), so both sides see the same machine.
    while first or time.perf_counter() < deadline:
        first = False
        for is_anchor in ((False, True) if run_anchor else (False,)):
            lim = _make(scenario, impl, k, is_anchor)
            elapsed, done, waits, errors = rnd(lim, is_anchor, n, k, ops)
            side = sides[is_anchor]
            side.ns += elapsed
            side.ops += done
            side.errors += errors
            if len(side.waits) < 200_000:
                side.waits.extend(waits)
            leaked += _leaked(lim, scenario, k, is_anchor)
    mine = sides[False]
    waits = mine.waits
    if not waits and scenario in ("uncontended-async", "uncontended-threads", "scaling"):
        waits = _latency_pass("uncontended-threads" if scenario == "uncontended-threads"
                              else "uncontended-async", impl)
    waits.sort()
    ns = mine.ns_per_op()
    anchor_ns = sides[True].ns_per_op() if run_anchor else None
    return {
        "scenario": scenario,
        "impl": impl,
        "concurrency": n,
        "permits": k,
        "ops": mine.ops,
        "ns_per_op": ns,
        "ops_per_s": 1e9 / ns if ns else None,
        "anchor": spec.anchor,
        "anchor_ns_per_op": anchor_ns,
        "speedup": anchor_ns / ns if (anchor_ns and ns) else None,
        "wait_p50_us": _us(_percentile(waits, 0.50)),
        "wait_p99_us": _us(_percentile(waits, 0.99)),
        "wait_max_us": _us(float(waits[-1]) if waits else None),
        "errors": mine.errors + sides[True].errors,
        "leaked_permits": leaked,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def _us(ns: Optional[float]) -> Optional[float]:
    return None if ns is None else ns / 1000.0
