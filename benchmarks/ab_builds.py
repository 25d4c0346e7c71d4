"""``python -m benchmarks.ab_builds DIR_A DIR_B``: is build B of the C
extension faster than build A?  Both builds are loaded into this one
interpreter (each directory holds a ``_limiter_c.cpython-3XY-*.so`` for this
Python; two files at two paths are two modules with their own types and
freelists), and each part below runs on A's semaphore and on B's in
interleaved rounds with the order flipped every round
(pylimiter.spark.interleave), timed in thread CPU time; a part's figure is
the median over rounds of B's time / A's, with its [first-third quartile].
Medians of separate processes are never divided.

    python -m benchmarks.ab_builds build/old build/new --parts await,with

``compare`` and ``load`` are shared with ``benchmarks.ab_cache_builds``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import importlib.util
import statistics
import sys
from pathlib import Path
from typing import Callable, Sequence

from pylimiter.spark.interleave import CPU, Spread, interleaved, per_round

from . import figures

PARTS = ("await", "with", "sem", "blocking", "cancel", "tasks")
#: Parts that are benchmarks.table's figure of the same name, run on one
#: build's side ("mine"): their own sizes (figures.WAITERS, figures.TASKS),
#: not --ops; the coroutine returns the time of its timed part.
FIGURE_PARTS = {"cancel": (figures._cancel, figures.WAITERS),
                "tasks": (figures._tasks, figures.TASKS)}

#: (module, part name, ops) -> a side: runs the part, returns ns per operation.
MakeSide = Callable[[object, str, int], Callable[[], float]]


def load(directory: str, stem: str = "_limiter_c", qualname: str = "pylimiter._limiter_c"):
    """The extension ``stem`` in ``directory`` built for this Python, as a
    module of its own (named ``qualname``, so its relative imports resolve)."""
    importlib.import_module(qualname.rpartition(".")[0])   # the package they need
    tag = f"cpython-{sys.version_info[0]}{sys.version_info[1]}"
    found = sorted(Path(directory).glob(f"{stem}.{tag}*.so"))
    if not found:
        raise SystemExit(f"no {stem}.{tag}*.so in {directory}")
    spec = importlib.util.spec_from_file_location(qualname, found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def compare(prog: str, doc: str, parts: Sequence[str], make_side: MakeSide,
            load_build: Callable[[str], object], argv=None, rounds: int = 21,
            ops_of: Callable[[str, int], int] = lambda name, ops: ops) -> int:
    """The command line both A/B scripts share: parse, load both builds,
    print each chosen part's ns per operation and B/A per round."""
    ap = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    ap.add_argument("dir_a")
    ap.add_argument("dir_b")
    ap.add_argument("--parts", default=",".join(parts))
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--ops", type=int, default=20000)
    args = ap.parse_args(argv)
    chosen = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(chosen) - set(parts))
    if unknown or args.rounds < 2 or args.ops < 1:
        ap.error(f"parts are {', '.join(parts)}; --rounds >= 2, --ops >= 1")
    mods = [load_build(d) for d in (args.dir_a, args.dir_b)]
    width = max(len(p) for p in parts)
    print(f"CPython {sys.version.split()[0]}: ns per operation, B/A per round")
    for name in chosen:
        ops = ops_of(name, args.ops)
        got = interleaved({"a": make_side(mods[0], name, ops),
                           "b": make_side(mods[1], name, ops)},
                          rounds=args.rounds, warmup=1, before=gc.collect)
        r = Spread.of(per_round(got, lambda a, b: b / a))
        print(f"  {name:{width}s} A {statistics.median(got['a']):8.1f}  "
              f"B {statistics.median(got['b']):8.1f}  B/A {r.median:.3f} [{r.q1:.3f}-{r.q3:.3f}]",
              flush=True)
    return 0


_loop: asyncio.AbstractEventLoop | None = None


def side(mod, name: str, ops: int) -> Callable[[], float]:
    """One build's side of a part, on a semaphore of its own."""
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
    loop = _loop
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

    if name in FIGURE_PARTS:
        make, n = FIGURE_PARTS[name]
        body = make("mine", mod)
    else:
        body = {"await": await_release, "with": async_with, "sem": async_with_sem,
                "blocking": acquire_blocking}[name]
        n = ops

    def run() -> float:
        t0 = CPU()
        timed = loop.run_until_complete(body())
        return (CPU() - t0 if timed is None else timed) / n
    return run


def main(argv=None) -> int:
    return compare("python -m benchmarks.ab_builds", __doc__, PARTS, side, load, argv)


if __name__ == "__main__":
    sys.exit(main())
