"""``python -m benchmarks.await_parts``: where the time of an uncontended
``await sem.acquire(1)`` + ``release`` and of ``async with sem.acquire(1)``
goes, part by part, next to asyncio.Semaphore's whole operations.

Each part is a loop of ``--ops`` operations inside one coroutine on one
event loop; the parts run in interleaved rounds with the order flipped every
round, timed in thread CPU time; a part's cost is the median over rounds in
ns per operation with the empty loop's median taken off, [first-third
quartile] beside it.  The derived line: what the ``await`` itself costs
(GET_AWAITABLE, SEND and how the result comes back: a StopIteration on
3.12-3.14, am_send's return value on 3.10/3.11 and 3.15) is the whole
await+release less making the request and less a try_acquire+release.

    python -m benchmarks.await_parts [--rounds 25] [--ops 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time


def parts(ops: int):
    from pylimiter._limiter_c import AsyncSemaphore

    sem = AsyncSemaphore(10)
    asem = asyncio.Semaphore(10)
    acq, rel, try_acq = sem.acquire, sem.release, sem.try_acquire

    async def empty():
        for _ in range(ops):
            pass

    async def request():          # acquire(1) called, the request dropped
        for _ in range(ops):
            acq(1)

    async def try_release():      # a permit without any await
        for _ in range(ops):
            rel(try_acq(1))

    async def await_release():
        for _ in range(ops):
            rel(await acq(1))

    async def async_with():
        for _ in range(ops):
            async with acq(1):
                pass

    async def asyncio_await():
        for _ in range(ops):
            await asem.acquire()
            asem.release()

    async def asyncio_with():
        for _ in range(ops):
            async with asem:
                pass

    return [empty, request, try_release, await_release, async_with, asyncio_await,
            asyncio_with]


def quartiles(xs):
    q1, med, q3 = statistics.quantiles(xs, n=4)
    return med, q1, q3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.await_parts",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--ops", type=int, default=20000)
    args = ap.parse_args(argv)
    fns = parts(args.ops)
    loop = asyncio.new_event_loop()
    times = {f.__name__: [] for f in fns}
    try:
        for r in range(args.rounds + 2):
            for f in (fns if r % 2 else fns[::-1]):
                t0 = time.thread_time_ns()
                loop.run_until_complete(f())
                if r >= 2:   # two warm-up rounds
                    times[f.__name__].append((time.thread_time_ns() - t0) / args.ops)
    finally:
        loop.close()
    base = statistics.median(times.pop("empty"))
    cost = {k: [x - base for x in v] for k, v in times.items()}
    print(f"CPython {sys.version.split()[0]}: ns per operation, loop ({base:.0f} ns) taken off")
    for k, v in cost.items():
        med, q1, q3 = quartiles(v)
        print(f"  {k:14} {med:6.0f}  [{q1:.0f}-{q3:.0f}]")
    per_round = [a - r - t for a, r, t in zip(cost["await_release"], cost["request"],
                                              cost["try_release"])]
    med, q1, q3 = quartiles(per_round)
    print(f"  {'the await':14} {med:6.0f}  [{q1:.0f}-{q3:.0f}]  "
          "(await_release - request - try_release)")
    for mine, anchor in (("await_release", "asyncio_await"), ("async_with", "asyncio_with")):
        med, q1, q3 = quartiles([(a + base) / (m + base) for m, a in zip(cost[mine], cost[anchor])])
        print(f"  {mine} x faster than {anchor}: {med:.2f}x [{q1:.2f}-{q3:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
