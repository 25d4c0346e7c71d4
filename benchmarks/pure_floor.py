"""``python -m benchmarks.pure_floor``: how close to ``asyncio.Semaphore``
can a pure-Python semaphore with pylimiter's API get on an uncontended
``rel(await acq(1))``?

Issue 32 asks the pure twin for at most 1.5x asyncio.Semaphore's time.
This builds throwaway prototypes of the uncontended path only, each adding
one thing the twin's contract or safety needs to the one before, and times
each against asyncio.Semaphore in this one process (rounds interleaved,
order flipped every round, thread CPU time, median of the per-round ratios
with [first-third quartile]); the real twin (``pylimiter._limiter_py``) is
the last row.  The steps:

``shape``     the API's objects and calls alone: ``acquire()`` makes a
              request, ``await`` calls its ``__await__``, which makes a
              generator that makes the permit; ``release(permit)`` checks
              the permit's type and semaphore.  No argument checks.
``checks``    + ``acquire``'s argument checks (bad input raises at the call
              site: permits an int within the limit, the timeout, the
              is_cancelled check, closed).
``fields``    + the request's other fields (update, timeout, check, mode...)
              and the permit's pending update.
``stats``     + the two counters ``stats()`` reports for a grant.
``finally``   + the ``try``/``finally`` that ends the request whatever
              happens (an interrupt, a cancel) and drops its references.
``token``     + the acquire's critical section (the twin's token:
              ``del tok[0]`` ... ``tok.append``, safe against other threads
              and signal handlers).
``rel-token`` + the release's critical section.
``tracked``   + noting each request for the never-awaited warning.
``finaliser`` + the permit's ``__del__`` (the leaked-permit ResourceWarning).
``twin``      pylimiter's pure twin itself.

Nothing here is part of pylimiter; the prototypes handle only the
uncontended case (a queued request would hang).

    python -m benchmarks.pure_floor [--rounds 15] [--ops 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from typing import Any, Callable

from pylimiter.spark.interleave import CPU, Spread, interleaved, per_round

STEPS = ("shape", "checks", "fields", "stats", "finally", "token", "rel-token", "tracked",
         "finaliser")
_new = object.__new__
_MAX = 1 << 62


def prototype(level: int) -> Callable[[int], Any]:
    """A semaphore class with the first ``level + 1`` STEPS."""
    checks, fields, stats, fin, tok_acq, tok_rel, tracked, finaliser = (
        level >= i for i in range(1, 9))
    noted: list[Any] = []
    note = noted.append

    class Permit:
        __slots__ = ("_sem", "_permits", "_pending", "__weakref__")

        if finaliser:
            def __del__(self) -> None:
                try:
                    n = self._permits
                except AttributeError:
                    return
                if n:
                    raise AssertionError("a prototype permit leaked")

    class Request:
        __slots__ = ("_sem", "_n", "_stage", "_permit", "_timeout", "_check", "_result",
                     "_gen", "_mode", "_ref", "__weakref__")

        def __await__(self) -> Any:
            if self._stage:
                raise RuntimeError("already awaited")
            self._stage = 1
            if fields:
                if self._ref is not None:
                    raise AssertionError("never watched here")
                g = self._gen = self._run()
                return g
            return self._run()

        def _run(self) -> Any:
            # The grant is written out in each variant, not shared: a call
            # would be a cost of its own in every step's figure.
            sem = self._sem
            if not fin:
                n = self._n
                if not sem._closed and not sem._queue and sem._avail >= n:
                    sem._avail -= n
                    p = _new(Permit)
                    p._sem = sem
                    p._permits = n
                    p._pending = None
                    if stats:
                        sem._acquired_total += 1
                        sem._wait_counts[0] += 1
                    self._stage = 2
                    return p
                yield
                return None
            try:
                n = self._n
                p = _new(Permit)
                p._sem = sem
                p._permits = 0
                p._pending = None
                if tok_acq:
                    tok = sem._tok
                    del tok[0]   # never taken here: one thread, no handler
                    try:
                        if not sem._closed and not sem._queue and sem._avail >= n:
                            sem._avail -= n
                            p._permits = n
                            sem._acquired_total += 1
                            sem._wait_counts[0] += 1
                            n = -1
                    finally:
                        tok.append(True)
                elif not sem._closed and not sem._queue and sem._avail >= n:
                    sem._avail -= n
                    p._permits = n
                    sem._acquired_total += 1
                    sem._wait_counts[0] += 1
                    n = -1
                if n < 0:
                    return p
                yield
                return None
            finally:
                self._stage = 2
                self._permit = None
                self._check = None

    class Semaphore:
        def __init__(self, permits: int) -> None:
            self._avail = self._lim = permits
            self._queue: list[Any] = []
            self._tok = [True]
            self._closed = False
            self._timeout = None
            self._acquired_total = 0
            self._wait_counts = [0] * 4

        def acquire(self, permits: int = 1, *, timeout: Any = -1.0,
                    is_cancelled: Any = None) -> Request:
            if checks:
                lim = self._lim
                if type(permits) is not int or not 0 <= permits <= lim:
                    raise ValueError("permits")
                if timeout == -1.0:
                    timeout = self._timeout
                if is_cancelled is not None and not callable(is_cancelled):
                    raise TypeError("is_cancelled")
                if self._closed:
                    raise RuntimeError("closed")
            r = _new(Request)
            r._sem = self
            r._n = permits
            r._stage = 0
            if fields:
                r._permit = None
                r._timeout = timeout
                r._check = is_cancelled
                r._result = None
                r._gen = None
                r._mode = 0
                r._ref = None
            if tracked:
                note(r)
                if len(noted) >= 32:
                    noted.clear()
            return r

        def release(self, permit: Permit) -> None:
            if type(permit) is not Permit or permit._sem is not self:
                raise TypeError("not a permit of this semaphore")
            if tok_rel:
                tok = self._tok
                del tok[0]
                try:
                    n = permit._permits
                    if n and permit._pending is None and not self._queue:
                        permit._permits = 0
                        self._avail += n
                finally:
                    tok.append(True)
                return
            n = permit._permits
            if n:
                permit._permits = 0
                self._avail += n

    return Semaphore


def _twin(permits: int) -> Any:
    from pylimiter._limiter_py import AsyncSemaphore
    return AsyncSemaphore(permits, 0, None)


def _side(loop: asyncio.AbstractEventLoop, make: Callable[[int], Any], ops: int,
          anchor: bool) -> Callable[[], float]:
    async def mine() -> None:
        sem = make(10)
        acq, rel = sem.acquire, sem.release
        for _ in range(ops):
            rel(await acq(1))

    async def asyncio_semaphore() -> None:
        sem = asyncio.Semaphore(10)
        acq, rel = sem.acquire, sem.release
        for _ in range(ops):
            await acq()
            rel()

    body = asyncio_semaphore if anchor else mine

    def run() -> float:
        t0 = CPU()
        loop.run_until_complete(body())
        return (CPU() - t0) / ops
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pure_floor",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ops", type=int, default=20000)
    args = ap.parse_args(argv)
    if args.rounds < 2 or args.ops < 1:
        ap.error("--rounds >= 2, --ops >= 1")
    loop = asyncio.new_event_loop()
    rows = [(name, prototype(i)) for i, name in enumerate(STEPS)] + [("twin", _twin)]
    print(f"CPython {sys.version.split()[0]}: uncontended rel(await acq(1)), "
          f"/ asyncio.Semaphore's time, {args.rounds} rounds x {args.ops} ops")
    try:
        for name, make in rows:
            got = interleaved({"mine": _side(loop, make, args.ops, False),
                               "anchor": _side(loop, make, args.ops, True)},
                              rounds=args.rounds, warmup=1, before=gc.collect)
            r = Spread.of(per_round(got, lambda mine, anchor: mine / anchor))
            print(f"  {name:10s} {r.median:5.2f}x [{r.q1:.2f}-{r.q3:.2f}]", flush=True)
    finally:
        loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
