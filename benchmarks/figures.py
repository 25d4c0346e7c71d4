"""The figures of the performance table, each a ratio measured in one process.

Every figure pits pylimiter against its asyncio anchor (and, for the
contended ones, a no-limiter baseline) with interleaved rounds, the order
flipped every round, in thread CPU time (all of these run on one event-loop
thread), and reports the median over rounds with the quartiles and extremes
(:mod:`pylimiter.spark.interleave`).  Excluded from every timing: creating
the event loop and the limiter, and parking waiters where a figure says so.

Used by the micro suite (``benchmarks/micro``) and by the table runner
(``python -m benchmarks.table``), so both measure exactly the same thing.
Only the public API is used; ``async with sem:`` (core v2) is measured only
where the semaphore supports it.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Optional

try:
    from pylimiter.spark.interleave import CPU, Spread, interleaved, per_round
except ImportError:     # a pylimiter from before the kit moved (asv runs old commits)
    from pylimiter.bench.interleave import CPU, Spread, interleaved, per_round

try:
    import uvloop
except ImportError:  # uvloop is in the test group; without it only asyncio runs
    uvloop = None

LOOPS = ["asyncio"] + (["uvloop"] if uvloop is not None else [])

UNCONTENDED_OPS = 20_000
TASKS, PERMITS = 1000, 10
WAITERS = 10_000
SHORT_TIMEOUT = 0.001
LONG_TIMEOUT = 25.0  # pylimiter's default timeout


def new_loop(name: str) -> asyncio.AbstractEventLoop:
    """A fresh event loop: "asyncio" (the default loop) or "uvloop"."""
    if name == "uvloop":
        if uvloop is None:
            raise RuntimeError("uvloop is not installed")
        return uvloop.new_event_loop()
    if name != "asyncio":
        raise ValueError(f"unknown loop {name!r} (asyncio or uvloop)")
    return asyncio.new_event_loop()


# ---- sides: coroutine factories that time themselves in CPU ns -------------------


def _uncontended_await(sem, n, anchor):
    async def run():
        acq, rel = sem.acquire, sem.release
        if anchor:
            t0 = CPU()
            for _ in range(n):
                await acq()
                rel()
        else:
            t0 = CPU()
            for _ in range(n):
                rel(await acq(1))
        return CPU() - t0
    return run


def _async_with_request(sem, n):
    async def run():
        acq = sem.acquire
        t0 = CPU()
        for _ in range(n):
            async with acq(1):
                pass
        return CPU() - t0
    return run


def _async_with_sem(sem, n):
    async def run():
        t0 = CPU()
        for _ in range(n):
            async with sem:
                pass
        return CPU() - t0
    return run


async def _gather_timed(make_one, n):
    t0 = CPU()
    await asyncio.gather(*(make_one() for _ in range(n)))
    return CPU() - t0


def _tasks(kind, mod=None, timeout=None, permits=PERMITS):
    """TASKS tasks, each: acquire 1 of ``permits``, sleep(0), release.  kind:
    "base" (no limiter), "mine" (pylimiter) or "anchor" (asyncio)."""
    async def run():
        if kind == "base":
            async def one():
                await asyncio.sleep(0)
        elif kind == "mine":
            # timeout=None: no timer per waiter; otherwise the constructor's
            # defaults (25 s, queue of 10000) as a user gets them.
            sem = (mod.AsyncSemaphore(permits, 0, None) if timeout is None
                   else mod.AsyncSemaphore(permits))

            async def one():
                p = await sem.acquire(1)
                await asyncio.sleep(0)
                sem.release(p)
        else:
            sem = asyncio.Semaphore(permits)
            if timeout is None:
                async def one():
                    await sem.acquire()
                    await asyncio.sleep(0)
                    sem.release()
            else:
                async def one():
                    async with asyncio.timeout(timeout):
                        await sem.acquire()
                    await asyncio.sleep(0)
                    sem.release()
        return await _gather_timed(one, TASKS)
    return run


def _timeouts(kind, mod=None):
    """WAITERS waiters behind a held permit, each giving up after
    SHORT_TIMEOUT; "base" is the same tasks just sleeping that long."""
    async def run():
        if kind == "base":
            async def one():
                await asyncio.sleep(SHORT_TIMEOUT)
            return await _gather_timed(one, WAITERS)
        if kind == "mine":
            sem = mod.AsyncSemaphore(1, 0, None)
            held = await sem.acquire(1)

            async def one():
                try:
                    await sem.acquire(1, timeout=SHORT_TIMEOUT)
                except TimeoutError:
                    pass
            elapsed = await _gather_timed(one, WAITERS)
            sem.release(held)
            return elapsed
        sem = asyncio.Semaphore(1)
        await sem.acquire()

        async def one():
            try:
                async with asyncio.timeout(SHORT_TIMEOUT):
                    await sem.acquire()
            except TimeoutError:
                pass
        return await _gather_timed(one, WAITERS)
    return run


def _cancel(kind, mod=None):
    """WAITERS parked behind a held permit (untimed), then cancelled
    newest-first and gathered (timed)."""
    async def run():
        if kind == "mine":
            sem = mod.AsyncSemaphore(1, 0, None)
            held = await sem.acquire(1)
            tasks = [asyncio.ensure_future(sem.acquire(1)) for _ in range(WAITERS)]
        else:
            sem = asyncio.Semaphore(1)
            await sem.acquire()
            tasks = [asyncio.ensure_future(sem.acquire()) for _ in range(WAITERS)]
        await asyncio.sleep(0)
        t0 = CPU()
        for t in reversed(tasks):
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        elapsed = CPU() - t0
        if kind == "mine":
            sem.release(held)
        return elapsed
    return run


def _blocking(sem, n, anchor):
    def run():
        if anchor:
            acq, rel = sem.acquire, sem.release
            t0 = CPU()
            for _ in range(n):
                acq()
                rel()
        else:
            acq, rel = sem.acquire_blocking, sem.release
            t0 = CPU()
            for _ in range(n):
                rel(acq(1))
        return CPU() - t0
    return run


# ---- figures -----------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    """One row of the table: how it is computed and what it should reach."""

    key: str
    title: str
    kind: str                    # "faster" (anchor/mine), "slower" (mine/anchor), "cost"
    ops: int                     # operations per side per round (for ns/op)
    rounds: int
    # (mod_c, mod_py, loop) -> {side: callable returning CPU ns}, or None
    # when this Python or this core cannot run the figure.
    sides: Callable
    targets: dict                # {(major, minor): goal}; missing: no target
    note: str = ""
    uses_loop: bool = True       # False: measured once, with no event loop

    def value(self, one_round: dict) -> float:
        if self.kind == "faster":
            return one_round["anchor"] / one_round["mine"]
        if self.kind == "slower":
            return one_round["mine"] / one_round["anchor"]
        base = one_round["base"]
        return (one_round["mine"] - base) / (one_round["anchor"] - base)

    def target(self, version=None) -> Optional[float]:
        return self.targets.get(tuple(version or sys.version_info[:2]))

    def meets(self, value: float, version=None) -> Optional[bool]:
        goal = self.target(version)
        if goal is None:
            return None
        return value >= goal if self.kind == "faster" else value <= goal


def _run_on(loop, factories):
    return {name: (lambda f=f: loop.run_until_complete(f())) for name, f in factories.items()}


def _await_sides(c, py, loop):
    n = UNCONTENDED_OPS
    return _run_on(loop, {"mine": _uncontended_await(c.AsyncSemaphore(10, 0, None), n, False),
                          "anchor": _uncontended_await(asyncio.Semaphore(10), n, True)})


def _async_with_sides(c, py, loop):
    n = UNCONTENDED_OPS
    return _run_on(loop, {"mine": _async_with_request(c.AsyncSemaphore(10, 0, None), n),
                          "anchor": _async_with_sem(asyncio.Semaphore(10), n)})


def _async_with_bare_sides(c, py, loop):
    sem = c.AsyncSemaphore(10, 0, None)
    if not hasattr(sem, "__aenter__"):
        return None  # `async with sem:` arrives with core v2
    n = UNCONTENDED_OPS
    return _run_on(loop, {"mine": _async_with_sem(sem, n),
                          "anchor": _async_with_sem(asyncio.Semaphore(10), n)})


def _tasks_sides(c, py, loop, timeout=None, anchor_timeout=None):
    if anchor_timeout is not None and not hasattr(asyncio, "timeout"):
        return None  # asyncio.timeout is 3.11+; wait_for would cost a task more
    return _run_on(loop, {"base": _tasks("base"), "mine": _tasks("mine", c, timeout),
                          "anchor": _tasks("anchor", timeout=anchor_timeout)})


def _timeout_sides(c, py, loop):
    if not hasattr(asyncio, "timeout"):
        return None
    return _run_on(loop, {"base": _timeouts("base"), "mine": _timeouts("mine", c),
                          "anchor": _timeouts("anchor")})


def _drop_base(sides):
    if sides is not None:
        sides.pop("base")
    return sides


def _pure_sides(c, py, loop):
    n = UNCONTENDED_OPS // 4
    return _run_on(loop, {"mine": _uncontended_await(py.AsyncSemaphore(10, 0, None), n, False),
                          "anchor": _uncontended_await(asyncio.Semaphore(10), n, True)})


def _cancel_sides(c, py, loop):
    return _run_on(loop, {"mine": _cancel("mine", c), "anchor": _cancel("anchor")})


def _blocking_sides(anchor_cls):
    def sides(c, py, loop):
        n = UNCONTENDED_OPS
        return {"mine": _blocking(c.AsyncSemaphore(10, 0, None), n, False),
                "anchor": _blocking(anchor_cls(), n, True)}
    return sides


_ALL = [(3, 10), (3, 11), (3, 12), (3, 13), (3, 14), (3, 15)]
# Issue 20: 3.14 and 3.15 keep 3.12's targets, and the blocking path gets one.
_NEW = [(3, 14), (3, 15)]

FIGURES = [
    Figure("await", "`await acquire(1)`+`release`, x faster than asyncio.Semaphore",
           "faster", UNCONTENDED_OPS, 21, _await_sides,
           {(3, 10): 3.0, (3, 11): 3.0, (3, 12): 2.5, (3, 13): 2.5, (3, 14): 2.5, (3, 15): 2.5}),
    Figure("async-with", "`async with sem.acquire(1)`, x faster than `async with` "
           "asyncio.Semaphore", "faster", UNCONTENDED_OPS, 21, _async_with_sides,
           {(3, 11): 3.0, (3, 12): 2.5, (3, 13): 2.5, (3, 14): 2.5, (3, 15): 2.5}),
    Figure("async-with-sem", "`async with sem:` (one permit), x faster than asyncio's",
           "faster", UNCONTENDED_OPS, 21, _async_with_bare_sides, {},
           note="core v2 only"),
    Figure("tasks", f"{TASKS} tasks on {PERMITS} permits, cost over no-limiter / asyncio's",
           "cost", TASKS, 15, _tasks_sides, {v: 0.5 for v in _ALL}),
    # As issue 14 states it: pylimiter with its default timeout against
    # asyncio.Semaphore as it is usually run, without one.
    Figure("tasks-timeout", f"same, pylimiter's default {LONG_TIMEOUT:.0f} s timeout on "
           "every waiter (asyncio without)", "cost", TASKS, 15,
           lambda c, py, loop: _tasks_sides(c, py, loop, LONG_TIMEOUT),
           {v: 0.6 for v in _ALL}),
    Figure("tasks-timeout-both", f"same, {LONG_TIMEOUT:.0f} s timeout on both sides "
           "(asyncio.timeout for asyncio)", "cost", TASKS, 15,
           lambda c, py, loop: _tasks_sides(c, py, loop, LONG_TIMEOUT, LONG_TIMEOUT), {},
           note="3.11+: asyncio.timeout"),
    Figure("timeouts", f"{WAITERS // 1000}k waiters timing out, cost over parking / "
           "asyncio.timeout's", "cost", WAITERS, 15, _timeout_sides,
           {v: 0.33 for v in _ALL[1:]}, note="3.11+: asyncio.timeout"),
    # Where pylimiter's timed-out waiters cost less than tasks merely sleeping
    # as long (one timer per semaphore against one per sleeping task), the
    # cost above is negative and swings with the small baseline gap; the
    # plain ratio of the two timed sides is the stable reading.
    Figure("timeouts-ratio", f"same {WAITERS // 1000}k waiters, pylimiter's time / "
           "asyncio.timeout's", "slower", WAITERS, 15,
           lambda c, py, loop: _drop_base(_timeout_sides(c, py, loop)), {},
           note="3.11+: asyncio.timeout"),
    Figure("pure", "pure-Python twin, uncontended await / asyncio.Semaphore's time",
           "slower", UNCONTENDED_OPS // 4, 15, _pure_sides, {v: 1.5 for v in _ALL}),
    # Not in issue 14's table; kept so the README's other figures have a source.
    Figure("cancel", f"{WAITERS // 1000}k parked waiters cancelled newest-first, "
           "x cheaper than asyncio.Semaphore", "faster", WAITERS, 7, _cancel_sides, {}),
    Figure("blocking", "`acquire_blocking(1)`+`release`, x faster than threading.Semaphore",
           "faster", UNCONTENDED_OPS, 21, _blocking_sides(lambda: threading.Semaphore(10)),
           {v: 4.0 for v in _NEW}, uses_loop=False),
    Figure("blocking-lock", "`acquire_blocking(1)`+`release` / threading.Lock's time",
           "slower", UNCONTENDED_OPS, 21, _blocking_sides(threading.Lock), {},
           uses_loop=False),
]
BY_KEY = {f.key: f for f in FIGURES}


def measure(figure: Figure, c, py, loop_name: str, rounds: Optional[int] = None,
            scale: float = 1.0) -> Optional[dict]:
    """Measure one figure on a fresh loop; None if this Python or core
    cannot run it.  ``rounds`` overrides the figure's; ``scale`` < 1 shrinks
    nothing but the round count (tests use a quick pass)."""
    loop = new_loop(loop_name) if figure.uses_loop else None
    loop_name = loop_name if figure.uses_loop else "-"
    try:
        sides = figure.sides(c, py, loop)
        if sides is None:
            return None
        n_rounds = rounds or max(3, int(figure.rounds * scale))

        samples = interleaved(sides, n_rounds, warmup=2, before=gc.collect)
    finally:
        if loop is not None:
            loop.close()
    spread = Spread.of(per_round(samples, lambda **r: figure.value(r)))
    per_op = {k: Spread.of([ns / figure.ops for ns in v]).median for k, v in samples.items()}
    version = sys.version_info[:2]
    return {
        "figure": figure.key, "title": figure.title, "kind": figure.kind,
        "loop": loop_name, "python": ".".join(map(str, version)),
        "python_full": sys.version.split()[0], "rounds": n_rounds,
        **spread.as_dict(), "target": figure.target(version),
        "meets": figure.meets(spread.median, version),
        **{f"{k}_ns_per_op": v for k, v in per_op.items()},
    }
