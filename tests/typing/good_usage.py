"""Typed use of the public API: `mypy --strict` must accept every line
(tests/test_typing.py).  Not run; checked only."""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Awaitable

from pylimiter import (
    AsyncDualMemoryLimiter,
    AsyncSemaphore,
    DualMemoryPermit,
    LimitType,
    SemaphorePermit,
    SemaphoreStats,
    _limiter_c,
)


async def semaphore() -> int:
    sem = AsyncSemaphore(10, max_queue_size=100, timeout=5.0)
    request: Awaitable[SemaphorePermit] = sem.acquire(2)
    cm: AbstractAsyncContextManager[SemaphorePermit] = sem.acquire(1, timeout=None)
    p = await request
    async with cm as q:
        total = p.permits + q.permits
    grown: SemaphorePermit = await sem.update(p, 4, is_cancelled=lambda: False)
    sem.release(grown)
    async with sem:
        pass
    async with sem.acquire() as r:
        total += r.permits
    t = sem.try_acquire()
    if t is not None:
        sem.release(t)
    with sem.acquire_blocking(1, timeout=None) as b:
        total += b.permits
    sem.set_max_permits(0)
    stats: SemaphoreStats = sem.stats()
    busy: bool = sem.locked()
    return total + stats.queue_size + int(busy)


async def dual() -> int:
    lim = AsyncDualMemoryLimiter(1 << 20, 1 << 20, heap_timeout=None)
    heap: DualMemoryPermit = await lim.acquire(1024, LimitType.HEAP_MEMORY)
    async with lim.acquire(10, LimitType.DIRECT_MEMORY) as d:
        d2: DualMemoryPermit = await lim.update(d, 20)
    lim.release(heap)
    return d2.permits + lim.get_limiter(LimitType.HEAP_MEMORY).acquired_permits


async def compiled() -> int:
    sem = _limiter_c.AsyncSemaphore(3)
    cm: AbstractAsyncContextManager[_limiter_c.SemaphorePermit] = sem.acquire()
    async with cm as p:
        return p.permits


if __name__ == "__main__":
    asyncio.run(semaphore())
