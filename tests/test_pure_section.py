"""The pure twin's critical section (issue 32, point 3): a token the fast
paths only try for, and a lock that queues the slow paths, which then wait
for the token.  While anybody holds the token, every other call waits for
it -- the fast paths by going the slow way -- and none changes the books;
once it is back, they all finish and the books are right.

On 3.11+ a thread switch inside a fast path is rare (no eval-breaker check
between its bytecodes), so the token is held here by the test itself, as a
fast path interrupted there would hold it.
"""

from __future__ import annotations

import asyncio
import threading
import time

from pylimiter import _limiter_py as mod
from tests._helpers import check_invariant, release_all


def test_every_call_waits_for_a_held_token_then_finishes():
    sem = mod.AsyncSemaphore(3, 0, None)
    held = sem.try_acquire(1)
    sem._tok.pop()                       # a fast path holds the state
    got, errors = [], []

    def call(fn):
        try:
            got.append(fn())
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    async def awaited():
        return await sem.acquire(1)

    calls = [
        lambda: sem.acquire_blocking(1, timeout=10),
        lambda: sem.try_acquire(1),
        lambda: asyncio.run(awaited()),
        lambda: sem.release(held),
    ]
    threads = [threading.Thread(target=call, args=(fn,), daemon=True) for fn in calls]
    for t in threads:
        t.start()
    time.sleep(0.2)
    assert all(t.is_alive() for t in threads)   # nobody got past the token
    assert sem._avail == 2 and held.permits == 1
    sem._tok.append(True)
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads) and not errors
    permits = [p for p in got if p is not None]
    assert held.permits == 0
    assert sum(p.permits for p in permits) == sem.acquired_permits <= 3
    release_all(sem, permits)


def test_threads_hammering_the_fast_paths_keep_the_books():
    sem = mod.AsyncSemaphore(4, 0, None)
    stop = time.monotonic() + 0.5
    errors = []

    def worker():
        try:
            while time.monotonic() < stop:
                p = sem.acquire_blocking(1, timeout=10)
                q = sem.try_acquire(1)
                sem.release(p)
                if q is not None:
                    sem.release(q)
        except BaseException as exc:   # noqa: BLE001 - reported below
            errors.append(exc)

    async def tasks():
        async def one():
            while time.monotonic() < stop:
                sem.release(await sem.acquire(1))
                await asyncio.sleep(0)
        await asyncio.gather(*(one() for _ in range(4)))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    asyncio.run(tasks())
    for t in threads:
        t.join(10)
    assert not errors and not any(t.is_alive() for t in threads)
    check_invariant(sem, [])
    assert sem._tok == [True] and not sem._cs.lock.locked()
