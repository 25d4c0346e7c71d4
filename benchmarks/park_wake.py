"""``python -m benchmarks.park_wake``: what a parked task's park and wake
cost pylimiter and asyncio.Semaphore, on the default loop and on uvloop.

The 1000-task figure (1000 tasks, each: acquire 1 permit, ``sleep(0)``,
release) runs with 10 permits (990 tasks park and are woken) and with 1000
(no task parks), for pylimiter, asyncio.Semaphore and no limiter, on each
loop: 12 sides in one process, in interleaved rounds with the order flipped
every round, timed in thread CPU time, ns per task.  Per round:

- uncontended cost = side(1000 permits) - no limiter(1000)
- park+wake = side(10 permits) - side(1000 permits): the queueing, the
  wake-up and the parked task's own extra scheduling
- the figure's cost = (pylimiter - none) / (asyncio - none) at 10 permits

Medians over rounds, [first-third quartile].  It shows where a loop moves
the figure: uvloop's cheap ``call_soon`` cuts asyncio.Semaphore's per-waiter
wake (one callback per woken task), while pylimiter wakes a batch with one
``call_soon``, so its park+wake cost stays the same on both loops.

    python -m benchmarks.park_wake [--rounds 15] [--reps 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

TASKS = 1000


def side(kind: str, permits: int):
    async def run():
        if kind == "pylimiter":
            from pylimiter import AsyncSemaphore

            sem = AsyncSemaphore(permits, 0, None)

            async def one():
                p = await sem.acquire(1)
                await asyncio.sleep(0)
                sem.release(p)
        elif kind == "asyncio":
            sem = asyncio.Semaphore(permits)

            async def one():
                await sem.acquire()
                await asyncio.sleep(0)
                sem.release()
        else:
            async def one():
                await asyncio.sleep(0)
        coros = [one() for _ in range(TASKS)]   # made before the clock starts
        t0 = time.thread_time_ns()
        await asyncio.gather(*coros)
        return time.thread_time_ns() - t0
    return run


def quartiles(xs):
    q1, med, q3 = statistics.quantiles(xs, n=4)
    return med, q1, q3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.park_wake",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=20, help="gathers of 1000 tasks per side and round")
    args = ap.parse_args(argv)
    loops = {"asyncio": asyncio.new_event_loop()}
    try:
        import uvloop
        loops["uvloop"] = uvloop.new_event_loop()
    except ImportError:
        print("uvloop is not installed: the default loop only")
    sides = [(lp, kind, permits) for lp in loops for kind in ("none", "pylimiter", "asyncio")
             for permits in (10, TASKS)]
    times: dict[tuple, list[float]] = {s: [] for s in sides}
    try:
        for r in range(args.rounds + 2):
            for s in (sides if r % 2 else sides[::-1]):
                lp, kind, permits = s
                fn = side(kind, permits)
                ns = sum(loops[lp].run_until_complete(fn()) for _ in range(args.reps))
                if r >= 2:   # two warm-up rounds
                    times[s].append(ns / args.reps / TASKS)
    finally:
        for lp in loops.values():
            lp.close()
    print(f"CPython {sys.version.split()[0]}, ns per task (median [IQR] over {args.rounds} rounds)")
    for lp in loops:
        t = {(k, p): times[(lp, k, p)] for (_, k, p) in sides if _ == lp}
        print(f"  {lp}: no limiter {statistics.median(t[('none', TASKS)]):.0f} ns per task")
        for kind in ("pylimiter", "asyncio"):
            unc = [a - b for a, b in zip(t[(kind, TASKS)], t[("none", TASKS)])]
            park = [a - b for a, b in zip(t[(kind, 10)], t[(kind, TASKS)])]
            print(f"    {kind:9}  uncontended +{quartiles(unc)[0]:5.0f} [{quartiles(unc)[1]:.0f}-"
                  f"{quartiles(unc)[2]:.0f}]   park+wake +{quartiles(park)[0]:5.0f} "
                  f"[{quartiles(park)[1]:.0f}-{quartiles(park)[2]:.0f}]")
        cost = [(m - n) / (a - n) for m, a, n in
                zip(t[("pylimiter", 10)], t[("asyncio", 10)], t[("none", 10)])]
        print(f"    1000 tasks on 10 permits, cost: {quartiles(cost)[0]:.2f} "
              f"[{quartiles(cost)[1]:.2f}-{quartiles(cost)[2]:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
