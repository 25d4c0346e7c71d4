"""AsyncDualMemoryLimiter: two independent pools behind one API."""

from __future__ import annotations

import pytest

from pylimiter import LimitType, PermitAcquireAlreadyClosedError, PermitAcquireTimeoutError
from tests._helpers import run

HEAP, DIRECT = LimitType.HEAP_MEMORY, LimitType.DIRECT_MEMORY


def test_pools_are_independent(mod):
    lim = mod.AsyncDualMemoryLimiter(100, 50, heap_timeout=0.05, direct_timeout=0.05)

    async def main():
        h = await lim.acquire(100, HEAP)
        d = await lim.acquire(50, DIRECT)
        assert (h.permits, h.limit_type) == (100, HEAP)
        assert (d.permits, d.limit_type) == (50, DIRECT)
        with pytest.raises(PermitAcquireTimeoutError):
            await lim.acquire(1, HEAP)
        st = lim.stats()
        assert st[HEAP].acquired_permits == 100 and st[DIRECT].acquired_permits == 50
        assert st[HEAP].timeout_total == 1 and st[DIRECT].timeout_total == 0
        lim.release(h)
        lim.release(d)
        assert lim.get_limiter(HEAP).acquired_permits == 0

    run(main())


def test_update_in_place_and_context_managers(mod):
    lim = mod.AsyncDualMemoryLimiter(1000, 1000)

    async def main():
        async with lim.acquire(10, HEAP) as p:
            q = await lim.update(p, 500)
            assert q is p and p.permits == 500
            assert lim.get_limiter(HEAP).acquired_permits == 500
        assert p.permits == 0
        with lim.acquire_blocking(30, DIRECT) as d:
            assert lim.update_blocking(d, 5) is d and d.permits == 5
        assert lim.get_limiter(DIRECT).acquired_permits == 0

    run(main())


def test_per_pool_queue_and_timeout_settings(mod):
    lim = mod.AsyncDualMemoryLimiter(
        10, 20, heap_max_queue_size=3, direct_max_queue_size=4,
        heap_timeout=1.5, direct_timeout=None)
    assert lim.get_limiter(HEAP).max_queue_size == 3
    assert lim.get_limiter(DIRECT).max_queue_size == 4
    assert lim.get_limiter(HEAP).max_permits == 10
    assert lim.get_limiter(DIRECT).max_permits == 20


def test_bad_arguments(mod):
    lim = mod.AsyncDualMemoryLimiter(10, 10)
    other = mod.AsyncDualMemoryLimiter(10, 10)
    with pytest.raises(TypeError):
        lim.acquire(1, "heap")
    with pytest.raises(ValueError, match="larger than max_permits=10"):
        lim.acquire(11, HEAP)
    p = other.acquire_blocking(1, HEAP)
    with pytest.raises(TypeError):
        lim.release(p)
    raw = other.get_limiter(HEAP).try_acquire(1)
    with pytest.raises(TypeError):
        lim.update(raw, 2)
    other.release(p)
    other.get_limiter(HEAP).release(raw)


def test_close_closes_both(mod):
    lim = mod.AsyncDualMemoryLimiter(10, 10)
    lim.close()
    for t in (HEAP, DIRECT):
        assert lim.get_limiter(t).closed
        with pytest.raises(PermitAcquireAlreadyClosedError):
            lim.acquire_blocking(1, t)


def test_disabled_pool_is_unbounded(mod):
    lim = mod.AsyncDualMemoryLimiter(0, 10)
    p = lim.acquire_blocking(10**12, HEAP)
    assert lim.stats()[HEAP].acquired_permits == 10**12
    lim.release(p)
