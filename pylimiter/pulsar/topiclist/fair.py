"""Fair turns on the event loop for the service's CPU-heavy steps.

Listing a namespace, matching a pattern, hashing and encoding a topic list
are synchronous steps of a few milliseconds each (tens at 100,000 topics).
asyncio runs every ready callback in each loop iteration, so when N requests
each run a step and yield, one iteration costs N steps; accepting a
connection and answering it takes several iterations.  With thousands of
watchers being created at once that was tens of seconds before a new client
got its CONNECTED (issue 19, finding 3).

FairShare hands out one turn at a time, so an iteration runs at most one
heavy step (and starts at most one read loop's batch of commands, see
pace()) besides the I/O callbacks; and it hands the next turn to the
waiting owner (a connection) that has used the least CPU, so a new or quiet
connection goes before the busy ones instead of queueing behind them.  An
owner's claim is its CPU used, but never less than the claim last served
minus CREDIT: a connection idle for an hour does not get an hour of
priority, only a head start.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class Owner:
    """What FairShare charges: one per connection."""

    __slots__ = ("cpu_used",)

    def __init__(self) -> None:
        #: seconds of steps this owner has run
        self.cpu_used = 0.0


class FairShare:
    """One turn at a time, least-served owner first (see the module doc)."""

    #: How far behind the last claim served a quiet owner may claim.
    CREDIT = 0.05

    def __init__(self) -> None:
        # (claim, arrival, future): a heap; cancelled waits stay in it until
        # popped (skipped then), which keeps cancellation O(1).
        self._waiting: list[tuple[float, int, asyncio.Future]] = []
        self._busy = False
        self._arrivals = itertools.count()
        self._floor = 0.0
        #: turns granted (for tests and stats)
        self.turns = 0

    @property
    def waiting(self) -> int:
        """Owners' steps waiting for a turn (cancelled ones included until
        they are skipped)."""
        return len(self._waiting)

    async def run(self, owner: Owner, fn: Callable[..., T], *args: Any) -> T:
        """Run the synchronous step fn(*args) in one of owner's turns and
        return its result.  A step should be bounded (milliseconds): the
        loop serves nothing else while it runs."""
        await self._turn(owner)
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            owner.cpu_used += time.perf_counter() - t0
            self._next()

    async def pace(self, owner: Owner) -> None:
        """Wait for owner's turn and pass it on at once.  For work that
        awaits and so cannot run inside a turn (a read loop's batch of
        commands): such batches start in the order of their owners' claims,
        one per loop iteration; the caller charges owner.cpu_used with the
        time the batch took."""
        await self._turn(owner)
        self._next()

    async def _turn(self, owner: Owner) -> None:
        self.turns += 1
        if not self._busy and not self._waiting:
            self._busy = True
            try:
                # Even alone, a step starts in a fresh iteration, so the
                # sockets are polled between two steps of one request.
                await asyncio.sleep(0)
            except BaseException:
                self._next()
                raise
            return
        fut = asyncio.get_running_loop().create_future()
        claim = max(owner.cpu_used, self._floor - self.CREDIT)
        heapq.heappush(self._waiting, (claim, next(self._arrivals), fut))
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._next()     # granted, then cancelled: pass the turn on
            else:
                fut.cancel()     # skipped when popped
            raise

    def _next(self) -> None:
        while self._waiting:
            claim, _, fut = heapq.heappop(self._waiting)
            if not fut.done():
                self._floor = claim
                fut.set_result(None)
                return
        self._busy = False
