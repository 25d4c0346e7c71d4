"""``python -m benchmarks.park_wake``: what a parked task's park and wake
cost pylimiter and asyncio.Semaphore, on the default loop and on uvloop.

The 1000-task figure (``benchmarks.figures``: 1000 tasks, each: acquire 1
permit, ``sleep(0)``, release; the same sides as the table's) runs with 10
permits (990 tasks park and are woken) and with 1000 (no task parks), for
pylimiter, asyncio.Semaphore and no limiter, on each loop: 12 sides in one
process, in interleaved rounds with the order flipped every round
(:func:`pylimiter.spark.interleave.interleaved`), timed in thread CPU time,
ns per task.  Per round:

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
import gc
import sys

import pylimiter
from pylimiter.spark.interleave import Spread, interleaved, per_round

from .figures import LOOPS, TASKS, _tasks, new_loop

KINDS = {"none": "base", "pylimiter": "mine", "asyncio": "anchor"}   # -> figures' names


def _spread(values) -> str:
    s = Spread.of(values)
    return f"{s.median:5.0f} [{s.q1:.0f}-{s.q3:.0f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.park_wake",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=20, help="gathers of 1000 tasks per side and round")
    args = ap.parse_args(argv)
    if "uvloop" not in LOOPS:
        print("uvloop is not installed: the default loop only")
    loops = {name: new_loop(name) for name in LOOPS}

    def side(lp, kind, permits):
        run = _tasks(KINDS[kind], pylimiter, permits=permits)
        return lambda: sum(loops[lp].run_until_complete(run())
                           for _ in range(args.reps)) / args.reps / TASKS

    sides = {(lp, kind, permits): side(lp, kind, permits) for lp in loops for kind in KINDS
             for permits in (10, TASKS)}
    try:
        times = interleaved(sides, args.rounds, warmup=2, before=gc.collect)
    finally:
        for lp in loops.values():
            lp.close()
    print(f"CPython {sys.version.split()[0]}, ns per task (median [IQR] over {args.rounds} rounds)")
    for lp in loops:
        t = {(kind, permits): times[(lp, kind, permits)]
             for kind in KINDS for permits in (10, TASKS)}
        print(f"  {lp}: no limiter {Spread.of(t[('none', TASKS)]).median:.0f} ns per task")
        for kind in ("pylimiter", "asyncio"):
            unc = per_round({"a": t[(kind, TASKS)], "b": t[("none", TASKS)]}, lambda a, b: a - b)
            park = per_round({"a": t[(kind, 10)], "b": t[(kind, TASKS)]}, lambda a, b: a - b)
            print(f"    {kind:9}  uncontended +{_spread(unc)}   park+wake +{_spread(park)}")
        cost = per_round({"m": t[("pylimiter", 10)], "a": t[("asyncio", 10)],
                          "n": t[("none", 10)]}, lambda m, a, n: (m - n) / (a - n))
        s = Spread.of(cost)
        print(f"    1000 tasks on 10 permits, cost: {s.median:.2f} [{s.q1:.2f}-{s.q3:.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
