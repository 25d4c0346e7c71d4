"""``python -m benchmarks.ab_builds DIR_A DIR_B``: is build B of the C
extension faster than build A?  Both builds are loaded into this one
interpreter (each directory holds a ``_limiter_c.cpython-3XY-*.so`` for this
Python; two files at two paths are two modules with their own types and
freelists), and each part below runs on A's semaphore and on B's in
interleaved rounds with the order flipped every round, timed in thread CPU
time; a part's figure is the median over rounds of B's time / A's, with its
[first-third quartile].  Medians of separate processes are never divided.

    python -m benchmarks.ab_builds build/old build/new --parts await,with
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import statistics
import sys
import time
from pathlib import Path

PARTS = ("await", "with", "sem", "blocking")


def load(directory: str):
    """The extension in ``directory`` built for this Python, as a module of
    its own."""
    import pylimiter  # noqa: F401  the package its relative imports need

    tag = f"cpython-{sys.version_info[0]}{sys.version_info[1]}"
    found = sorted(Path(directory).glob(f"_limiter_c.{tag}*.so"))
    if not found:
        raise SystemExit(f"no _limiter_c.{tag}*.so in {directory}")
    spec = importlib.util.spec_from_file_location("pylimiter._limiter_c", found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parts(mod, ops: int) -> dict:
    sem = mod.AsyncSemaphore(10)
    acq, rel, blocking = sem.acquire, sem.release, sem.acquire_blocking

    async def await_release():
        for _ in range(ops):
            rel(await acq(1))

    async def async_with():
        for _ in range(ops):
            async with acq(1):
                pass

    async def async_with_sem():
        for _ in range(ops):
            async with sem:
                pass

    async def acquire_blocking():
        for _ in range(ops):
            rel(blocking(1))

    return {"await": await_release, "with": async_with, "sem": async_with_sem,
            "blocking": acquire_blocking}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab_builds",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("dir_a")
    ap.add_argument("dir_b")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--ops", type=int, default=20000)
    args = ap.parse_args(argv)
    chosen = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown or args.rounds < 2 or args.ops < 1:
        ap.error(f"parts are {', '.join(PARTS)}; --rounds >= 2, --ops >= 1")
    sides = [parts(load(d), args.ops) for d in (args.dir_a, args.dir_b)]
    loop = asyncio.new_event_loop()

    def timed(fn) -> float:
        gc.collect()
        t0 = time.thread_time_ns()
        loop.run_until_complete(fn())
        return (time.thread_time_ns() - t0) / args.ops

    print(f"CPython {sys.version.split()[0]}: ns per operation, B/A per round")
    for part in chosen:
        for side in sides:                       # warm-up
            timed(side[part])
        a_ns, b_ns, ratio = [], [], []
        for r in range(args.rounds):
            t = {}
            for i in ((0, 1) if r % 2 == 0 else (1, 0)):
                t[i] = timed(sides[i][part])
            a_ns.append(t[0])
            b_ns.append(t[1])
            ratio.append(t[1] / t[0])
        q1, med, q3 = statistics.quantiles(ratio, n=4)
        print(f"  {part:9s} A {statistics.median(a_ns):7.1f}  B {statistics.median(b_ns):7.1f}"
              f"  B/A {med:.3f} [{q1:.3f}-{q3:.3f}]", flush=True)
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
