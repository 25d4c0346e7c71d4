"""Benchmark scenarios: one trial = one implementation against its stdlib
anchor, measured side by side in the same process.

No Spark here: a trial is a plain function call, so the pipeline can execute
it inside any executor's Python worker (and the tests can call it directly).
The sides (pylimiter, its stdlib anchor and, for the contended scenarios, a
no-limiter baseline) run in interleaved rounds with the order flipped every
round (:func:`pylimiter.spark.interleave.interleaved`), timed in thread CPU
time except where several threads share the work (``threads``: wall time).
A trial's speed-up and cost ratio are medians of per-round ratios, so slow
drift of the machine (another tenant, frequency scaling) hits every side
alike.  Wait latencies (acquire call to grant) are always wall time.
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
from ..spark.interleave import CPU, WALL, Spread, interleaved, per_round


@dataclass(frozen=True)
class Scenario:
    name: str
    doc: str
    anchor: Optional[str]        # the stdlib primitive measured alongside, if any
    uses_concurrency: bool       # does the concurrency axis mean anything here
    uses_permits: bool           # does the permits axis mean anything here
    baseline: Optional[str] = None  # the same work without a limiter, if measured


SCENARIOS = {
    s.name: s
    for s in [
        Scenario("uncontended-async", "await acquire(1) + release, nobody waits",
                 "asyncio.Semaphore", False, False),
        Scenario("uncontended-threads", "acquire_blocking(1) + release, one thread",
                 "threading.Semaphore", False, False),
        Scenario("tasks", "N asyncio tasks on K permits: acquire(1), sleep(0), release",
                 "asyncio.Semaphore", True, True, "tasks without a limiter"),
        Scenario("threads", "N threads on K permits: acquire_blocking(1), release",
                 "threading.Semaphore", True, True),
        Scenario("weighted", "N tasks request 1..K of K permits each",
                 None, True, True),
        Scenario("update", "acquire(1), update to K (grow), update to 1 (shrink), release",
                 None, False, True),
        Scenario("timeouts", "N waiters parked behind a held permit time out after 1 ms",
                 "asyncio.timeout+Semaphore", True, False, "tasks sleeping 1 ms"),
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


# ---- one round of each scenario ------------------------------------------------
# Each returns (elapsed_ns, ops, waits_ns, errors) for one round of one side
# ("mine", "anchor" or "base"), elapsed on `clock`.  `_make` builds the
# limiter for the round (so a round also proves the limiter ends clean: see
# _leaked); the base side gets None.


def _round_uncontended_async(sem, side, n, k, target_ops, clock):
    async def main():
        acquire, release = sem.acquire, sem.release
        if side == "anchor":
            t0 = clock()
            for _ in range(target_ops):
                await acquire()
                release()
        else:
            t0 = clock()
            for _ in range(target_ops):
                release(await acquire(1))
        return clock() - t0

    return asyncio.run(main()), target_ops, [], 0


def _round_uncontended_threads(sem, side, n, k, target_ops, clock):
    release = sem.release
    if side == "anchor":
        acquire = sem.acquire
        t0 = clock()
        for _ in range(target_ops):
            acquire()
            release()
    else:
        acquire = sem.acquire_blocking
        t0 = clock()
        for _ in range(target_ops):
            release(acquire(1))
    return clock() - t0, target_ops, [], 0


def _round_tasks(sem, side, n, k, target_ops, clock):
    waits: list[int] = []
    stamp = time.perf_counter_ns

    async def worker():
        for _ in range(OPS_PER_TASK):
            if side == "base":
                await asyncio.sleep(0)
                continue
            t = stamp()
            p = await (sem.acquire() if side == "anchor" else sem.acquire(1))
            waits.append(stamp() - t)
            await asyncio.sleep(0)
            sem.release() if side == "anchor" else sem.release(p)

    async def main():
        t0 = clock()
        await asyncio.gather(*(worker() for _ in range(n)))
        return clock() - t0

    return asyncio.run(main()), n * OPS_PER_TASK, waits, 0


def _round_threads(sem, side, n, k, target_ops, clock):
    # Several threads share the work: wall time, whatever `clock` says.
    waits: list[list[int]] = [[] for _ in range(n)]
    stamp = WALL
    start = threading.Barrier(n + 1)
    errors = []
    anchor = side == "anchor"

    def worker(mine):
        try:
            start.wait()
            for _ in range(OPS_PER_TASK):
                t = stamp()
                p = sem.acquire() if anchor else sem.acquire_blocking(1)
                mine.append(stamp() - t)
                sem.release() if anchor else sem.release(p)
        except Exception as exc:  # counted, and the trial goes on
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in waits]
    for t in threads:
        t.start()
    start.wait()
    t0 = stamp()
    for t in threads:
        t.join()
    elapsed = stamp() - t0
    return elapsed, n * OPS_PER_TASK, [x for w in waits for x in w], len(errors)


def _round_weighted(sem, side, n, k, target_ops, clock):
    rng = random.Random(n * 1000 + k)
    sizes = [rng.randint(1, k) for _ in range(n)]
    waits: list[int] = []
    stamp = time.perf_counter_ns

    async def worker(size):
        t = stamp()
        p = await sem.acquire(size)
        waits.append(stamp() - t)
        await asyncio.sleep(0)
        sem.release(p)

    async def main():
        t0 = clock()
        await asyncio.gather(*(worker(s) for s in sizes))
        return clock() - t0

    return asyncio.run(main()), n, waits, 0


def _round_update(sem, side, n, k, target_ops, clock):
    async def main():
        t0 = clock()
        for _ in range(UPDATE_OPS):
            p = await sem.acquire(1)
            p = await sem.update(p, k)
            p = await sem.update(p, 1)
            sem.release(p)
        return clock() - t0

    return asyncio.run(main()), UPDATE_OPS, [], 0


async def _anchor_timeout(sem):
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(0.001):
            await sem.acquire()
    else:  # Python 3.10: no asyncio.timeout yet
        await asyncio.wait_for(sem.acquire(), 0.001)


def _round_timeouts(sem, side, n, k, target_ops, clock):
    async def main():
        held = None
        if side == "anchor":
            await sem.acquire()
        elif side == "mine":
            held = await sem.acquire(1)
        outcomes = []

        async def waiter():
            try:
                if side == "base":
                    await asyncio.sleep(0.001)
                    outcomes.append(True)
                    return
                if side == "anchor":
                    await _anchor_timeout(sem)
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
        if side == "anchor":
            sem.release()
        elif side == "mine":
            sem.release(held)
        return elapsed, outcomes.count(False)

    elapsed, errors = asyncio.run(main())
    return elapsed, n, [], errors


def _round_cancel(sem, side, n, k, target_ops, clock):
    anchor = side == "anchor"

    async def main():
        held = await (sem.acquire() if anchor else sem.acquire(1))
        tasks = [asyncio.ensure_future(sem.acquire() if anchor else sem.acquire(1))
                 for _ in range(n)]
        await asyncio.sleep(0)  # all parked (untimed)
        t0 = clock()
        for t in reversed(tasks):
            t.cancel()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = clock() - t0
        bad = sum(not isinstance(r, asyncio.CancelledError) for r in res)
        sem.release() if anchor else sem.release(held)
        return elapsed, bad

    elapsed, bad = asyncio.run(main())
    return elapsed, n, [], bad


def _round_dual(lim, side, n, k, target_ops, clock):
    waits: list[int] = []
    stamp = time.perf_counter_ns

    async def worker(i):
        for _ in range(OPS_PER_TASK):
            t = stamp()
            heap = await lim.acquire(10 * 1024, LimitType.HEAP_MEMORY)
            waits.append(stamp() - t)
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
#: Scenarios whose work is spread over threads: timed in wall time.
WALL_CLOCK = {"threads"}


# ---- limiters ------------------------------------------------------------------


def _make(scenario: str, impl: str, k: int, side: str):
    if side == "base":
        return None
    if side == "anchor":
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


def _leaked(lim, scenario: str, k: int, side: str) -> int:
    """Permits not back after a round (0 when the limiter ended clean)."""
    if side == "base":
        return 0
    if side == "anchor":
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
    lim = _make(scenario, impl, 1, "mine")
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


class _Side:
    """One side of a trial: each call runs one round on a fresh limiter and
    returns its ns per operation; ops, waits, errors and leaks accumulate."""

    def __init__(self, scenario: str, impl: str, name: str, n: int, k: int, ops: int):
        self.scenario, self.impl, self.name, self.n, self.k, self.target_ops = \
            scenario, impl, name, n, k, ops
        self.clock = WALL if scenario in WALL_CLOCK else CPU
        self.ops = self.errors = self.leaked = 0
        self.waits: list[int] = []

    def __call__(self) -> float:
        lim = _make(self.scenario, self.impl, self.k, self.name)
        elapsed, done, waits, errors = ROUNDS[self.scenario](
            lim, self.name, self.n, self.k, self.target_ops, self.clock)
        self.ops += done
        self.errors += errors
        if len(self.waits) < 200_000:
            self.waits.extend(waits)
        self.leaked += _leaked(lim, self.scenario, self.k, self.name)
        return elapsed / max(done, 1)


def run_trial(scenario: str, impl: str, concurrency: int, permits: int,
              budget_s: float = 0.3, ops: int = 5000, min_rounds: int = 3) -> dict:
    """Run one trial and return its row (see pipeline.RESULT_FIELDS).  The
    sides run in interleaved rounds (at least ``min_rounds``) until about
    ``budget_s`` seconds per side have passed."""
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}")
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown implementation {impl!r}")
    spec = SCENARIOS[scenario]
    n, k = concurrency, permits
    names = ["mine"] + (["anchor"] if spec.anchor else []) + (["base"] if spec.baseline else [])
    sides = {name: _Side(scenario, impl, name, n, k, ops) for name in names}
    per_op = interleaved(sides, min_rounds, warmup=1, budget_s=budget_s * len(sides))
    mine = sides["mine"]
    waits = mine.waits
    if not waits and scenario in ("uncontended-async", "uncontended-threads", "scaling"):
        waits = _latency_pass("uncontended-threads" if scenario == "uncontended-threads"
                              else "uncontended-async", impl)
    waits.sort()
    ns = Spread.of(per_op["mine"]).median
    row = {
        "scenario": scenario, "impl": impl, "concurrency": n, "permits": k,
        "ops": mine.ops, "rounds": len(per_op["mine"]),
        "ns_per_op": ns, "ops_per_s": 1e9 / ns if ns else None,
        "anchor": spec.anchor, "anchor_ns_per_op": None,
        "speedup": None, "speedup_lo": None, "speedup_hi": None,
        "baseline_ns_per_op": None, "cost_ratio": None,
        "wait_p50_us": _us(_percentile(waits, 0.50)),
        "wait_p99_us": _us(_percentile(waits, 0.99)),
        "wait_max_us": _us(float(waits[-1]) if waits else None),
        "errors": sum(s.errors for s in sides.values()),
        "leaked_permits": sum(s.leaked for s in sides.values()),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    if spec.anchor:
        speedup = Spread.of(per_round(per_op, lambda mine, anchor, **_: anchor / mine))
        row.update(anchor_ns_per_op=Spread.of(per_op["anchor"]).median,
                   speedup=speedup.median, speedup_lo=speedup.lo, speedup_hi=speedup.hi)
    if spec.baseline:
        row["baseline_ns_per_op"] = Spread.of(per_op["base"]).median
        if spec.anchor:
            row["cost_ratio"] = Spread.of(per_round(
                per_op, lambda mine, anchor, base: (mine - base) / (anchor - base))).median
    return row


def _us(ns: Optional[float]) -> Optional[float]:
    return None if ns is None else ns / 1000.0
