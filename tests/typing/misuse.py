"""Misuse that `mypy --strict` must reject, one error per marked line
(tests/test_typing.py checks each `# E:` line is reported, and no other).
Not run; checked only."""

from __future__ import annotations

from pylimiter import (
    AsyncDualMemoryLimiter,
    AsyncSemaphore,
    DualMemoryPermit,
    LimitType,
    _limiter_c,
)

sem = AsyncSemaphore(10)
lim = AsyncDualMemoryLimiter(100, 100)
csem = _limiter_c.AsyncSemaphore(10)


async def misuse() -> None:
    sem.release(42)  # E: arg-type
    sem.acquire("1")  # E: arg-type
    wrong: DualMemoryPermit = await sem.acquire(1)  # E: assignment
    async with sem.acquire(1) as p:
        p.nonexistent  # E: attr-defined
    lim.release(await sem.acquire(1))  # E: arg-type
    await sem.update(await lim.acquire(1, LimitType.HEAP_MEMORY), 3)  # E: arg-type
    text: str = (await sem.acquire()).permits  # E: assignment
    sem.try_acquire().permits  # E: union-attr
    csem.release(lim)  # E: arg-type
    await sem.acquire(1, timeout="5")  # E: arg-type
    print(wrong, text)
