"""What asyncio users expect (both implementations): ``async with sem:``,
``acquire()`` of one permit, ``locked()``; a clear error on event loops that
are not asyncio; a ResourceWarning for a permit collected while it holds
permits."""

from __future__ import annotations

import asyncio
import gc
import re
import warnings

import pytest

from pylimiter import LimitType, PermitAcquireAlreadyClosedError
from tests._helpers import check_invariant, release_all, settle

# ---- async with sem, acquire(), locked() ------------------------------------


def test_async_with_semaphore_holds_one_permit(make_sem, arun):
    sem = make_sem(2)
    inside = []
    peak = []

    async def worker(i):
        async with sem as value:
            assert value is None             # as asyncio.Semaphore
            inside.append(i)
            peak.append(len(inside))
            await asyncio.sleep(0)
            inside.remove(i)

    async def main():
        await asyncio.gather(*(worker(i) for i in range(20)))
        assert max(peak) == 2
        with pytest.raises(KeyError):
            async with sem:
                assert sem.acquired_permits == 1
                raise KeyError("body fails")
        check_invariant(sem, [])
        assert sem.available_permits == 2

    arun(main())


def test_async_with_semaphore_waits_in_the_same_fifo(make_sem, arun):
    sem = make_sem(1)
    order = []

    async def anon(i):
        async with sem:
            order.append(i)

    async def named(i):
        async with sem.acquire():
            order.append(i)

    async def main():
        held = await sem.acquire()
        tasks = [asyncio.ensure_future((anon if i % 2 else named)(i)) for i in range(6)]
        await settle()
        assert sem.queue_size == 6
        sem.release(held)
        await asyncio.gather(*tasks)
        assert order == list(range(6))

    arun(main())


def test_async_with_semaphore_after_close_fails_at_entry(make_sem, arun):
    sem = make_sem(1)
    sem.close()

    async def main():
        with pytest.raises(PermitAcquireAlreadyClosedError):
            async with sem:
                pass   # pragma: no cover - never entered

    arun(main())


def test_exit_without_entry_is_an_error(make_sem, arun):
    sem = make_sem(3)

    async def main():
        with pytest.raises(RuntimeError, match="exited more often"):
            await sem.__aexit__(None, None, None)
        assert sem.available_permits == 3

    arun(main())


def test_acquire_defaults_to_one_permit(make_sem, arun):
    sem = make_sem(3)

    async def main():
        p = await sem.acquire()
        assert p.permits == 1
        q = sem.try_acquire()
        b = sem.acquire_blocking()
        assert (q.permits, b.permits) == (1, 1)
        for x in (p, q, b):
            sem.release(x)

    arun(main())


def test_locked_like_asyncio(make_sem, arun):
    sem = make_sem(2)

    async def main():
        assert not sem.locked()
        p = await sem.acquire(2)
        assert sem.locked()
        sem.release(p)
        assert not sem.locked()
        big = await sem.acquire(1)
        w = asyncio.ensure_future(sem.acquire(2))
        await settle()
        # One permit is free, but acquire(1) would queue behind `w`.
        assert sem.available_permits == 1 and sem.locked()
        sem.release(big)
        sem.release(await w)
        assert not sem.locked()
        sem.set_max_permits(0)
        assert not sem.locked()             # unbounded: never waits
        sem.close()
        assert sem.locked()                 # closed: cannot be acquired

    arun(main())


# ---- event loops other than asyncio -------------------------------------------


def test_contended_acquire_outside_asyncio_names_what_is_supported(make_sem):
    sem = make_sem(1)
    it = sem.acquire(1).__await__()
    with pytest.raises(StopIteration) as done:
        next(it)                            # uncontended: no loop needed
    p = done.value.value
    assert p.permits == 1
    it = sem.acquire(1).__await__()
    with pytest.raises(RuntimeError, match=r"asyncio or uvloop.*acquire_blocking.*trio"):
        next(it)                            # contended, no running asyncio loop
    assert sem.queue_size == 0
    release_all(sem, [p])


def test_trio_contended_acquire_gets_the_clear_error(make_sem):
    trio = pytest.importorskip("trio")
    sem = make_sem(1)

    async def main():
        p = await sem.acquire(1)            # uncontended works anywhere
        with pytest.raises(RuntimeError, match="asyncio or uvloop"):
            await sem.acquire(1)
        sem.release(p)

    trio.run(main)
    check_invariant(sem, [])


# ---- ResourceWarning for leaked permits ------------------------------------------


def leak_message(sem, n):
    return re.escape(f"a permit of {sem!r} holding {n} permit(s) was garbage-collected")


def test_leaked_permit_warns_naming_the_semaphore_and_count(make_sem):
    sem = make_sem(5)
    p = sem.try_acquire(2)
    with pytest.warns(ResourceWarning, match=leak_message(sem, 2)):
        del p
        gc.collect()
    assert sem.acquired_permits == 2       # the permits stay taken
    sem.set_max_permits(7)                 # (the fixture checks the books)


def test_awaited_permit_is_not_kept_alive_after_its_request(make_sem, arun):
    # On 3.12+ the C await reuses a StopIteration: it must not hold the last
    # permit once the request is gone, or this leak would warn late.
    sem = make_sem(5)

    async def main():
        p = await sem.acquire(3)
        with pytest.warns(ResourceWarning, match=leak_message(sem, 3)):
            del p

    arun(main())
    assert sem.acquired_permits == 3
    sem.set_max_permits(0)


def test_released_or_empty_permits_do_not_warn(make_sem, arun):
    sem = make_sem(5)

    async def main():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            p = await sem.acquire(2)
            sem.release(p)
            del p
            z = await sem.acquire(0)
            del z
            async with sem.acquire(1):
                pass
            with sem.acquire_blocking(2):
                pass
            gc.collect()

    arun(main())


def test_leaked_dual_permit_warns(mod):
    lim = mod.AsyncDualMemoryLimiter(100, 100)
    p = lim.acquire_blocking(40, LimitType.DIRECT_MEMORY)
    pool = lim.get_limiter(LimitType.DIRECT_MEMORY)
    with pytest.warns(ResourceWarning, match=leak_message(pool, 40)):
        del p
        gc.collect()


# ---- a timeout names itself and how to change it -------------------------------


def _names_the_timeout(exc, seconds):
    text = str(exc)
    assert f"timed out after {seconds} s" in text
    assert "timeout=None" in text and "default is 25 s" in text


def test_timeout_error_names_the_semaphores_default_and_the_way_out(make_sem, arun):
    sem = make_sem(2, timeout=0.05)   # the constructor's default, as 25 s would be
    held, other = sem.try_acquire(1), sem.try_acquire(1)

    async def main():
        with pytest.raises(asyncio.TimeoutError) as info:
            await sem.acquire(1)
        _names_the_timeout(info.value, "0.05")
        with pytest.raises(asyncio.TimeoutError) as info:
            async with sem.acquire(1, timeout=0.02):
                pass
        _names_the_timeout(info.value, "0.02")
        with pytest.raises(asyncio.TimeoutError) as info:
            await sem.update(held, 2, timeout=0.03)
        _names_the_timeout(info.value, "0.03")

    arun(main())
    with pytest.raises(TimeoutError) as info:
        sem.acquire_blocking(1)
    _names_the_timeout(info.value, "0.05")
    sem.release(held)
    sem.release(other)


def test_dual_limiter_timeout_names_the_pool_default(mod, arun):
    lim = mod.AsyncDualMemoryLimiter(10, 10, heap_timeout=0.04)
    held = lim.acquire_blocking(10, LimitType.HEAP_MEMORY)

    async def main():
        with pytest.raises(TimeoutError) as info:
            await lim.acquire(1, LimitType.HEAP_MEMORY)
        _names_the_timeout(info.value, "0.04")

    arun(main())
    lim.release(held)


# ---- a request never awaited warns, as a coroutine does ------------------------


def test_request_never_awaited_warns_at_collection(make_sem):
    sem = make_sem(4)
    held = sem.try_acquire(1)
    with pytest.warns(RuntimeWarning, match=r"an acquire request of .* for 2 permit\(s\) "
                                            r"was never awaited"):
        sem.acquire(2)
        gc.collect()
    with pytest.warns(RuntimeWarning, match=r"an update request .* for 3 permit\(s\) "
                                            r"was never awaited"):
        sem.update(held, 3)
        gc.collect()
    assert sem.acquired_permits == 1   # nothing was taken
    sem.release(held)


def test_awaited_closed_or_entered_requests_do_not_warn(make_sem, arun):
    sem = make_sem(2)

    async def main():
        sem.release(await sem.acquire(1))
        async with sem.acquire(1):
            pass
        async with sem:
            pass
        sem.acquire(1).close()                        # what a coroutine's close() does
        task = asyncio.ensure_future(sem.acquire(1))  # started by the task
        sem.release(await task)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        arun(main())
        gc.collect()


def test_dual_request_never_awaited_warns(mod):
    lim = mod.AsyncDualMemoryLimiter(10, 10)
    with pytest.warns(RuntimeWarning, match="never awaited"):
        lim.acquire(5, LimitType.DIRECT_MEMORY)
        gc.collect()
