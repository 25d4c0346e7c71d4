"""Issue 33 in one process: the API of SharedSemaphore and
SharedDualMemoryLimiter (names, settings, errors, the AsyncSemaphore
semantics host-wide), both implementations."""

from __future__ import annotations

import asyncio
import os
import pickle
import stat
import threading
import time

import pytest

import pylimiter
from pylimiter import (
    LimitType,
    PermitAcquireAlreadyClosedError,
    PermitAcquireCancelledError,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
    _shared_common,
)
from tests._helpers import run, settle


def books(sem):
    """The pool's books balance (see _audit)."""
    a = sem._audit()
    assert a["acquired"] == a["held"] + a["granted"], a
    assert a["qlen"] == a["queued"] == a["linked"], a
    return a


# ---- names, paths, settings ----------------------------------------------------


@pytest.mark.parametrize("bad", ["", ".hidden", "a/b", "a b", "x" * 101, "é", "a\0b", "..",
                                 "-" * 0])
def test_bad_names_are_value_errors(shm, shm_dir, bad):
    with pytest.raises(ValueError, match="name"):
        shm.SharedSemaphore(bad, 1)
    with pytest.raises(ValueError, match="name"):
        shm.SharedDualMemoryLimiter(bad, 1, 1)
    with pytest.raises(ValueError):
        shm.SharedSemaphore.unlink(bad)


@pytest.mark.parametrize("bad", [None, 1, b"abc", ["a"]])
def test_non_str_names_are_type_errors(shm, shm_dir, bad):
    with pytest.raises(TypeError):
        shm.SharedSemaphore(bad, 1)


@pytest.mark.parametrize("good", ["a", "a.b_c-1", "x" * 100, "-lead", "_", "9"])
def test_good_names_make_the_file(shm, shm_dir, good):
    sem = shm.SharedSemaphore(good, 5)
    try:
        path = os.path.join(shm_dir, f"pylimiter-{os.geteuid()}-{good}")
        assert sem.path == path and sem.name == good
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
        assert st.st_uid == os.geteuid()
        # No temporary file is left behind.
        assert os.listdir(shm_dir) == [os.path.basename(path)]
    finally:
        sem.close()
        shm.SharedSemaphore.unlink(good)


def test_directory_argument_and_environment(shm, shm_dir, tmp_path, name):
    other = tmp_path / "other"
    other.mkdir()
    a = shm.SharedSemaphore(name, 3, directory=other)
    b = shm.SharedSemaphore(name, 4)   # $PYLIMITER_SHM_DIR: another segment
    try:
        assert os.path.dirname(a.path) == str(other)
        assert os.path.dirname(b.path) == shm_dir
        assert (a.max_permits, b.max_permits) == (3, 4)
    finally:
        a.close()
        b.close()
    with pytest.raises(TypeError):
        shm.SharedSemaphore(name, 3, directory=3)


def test_missing_directory_is_a_shared_limiter_error(shm, tmp_path, name):
    with pytest.raises(shm.SharedLimiterError) as info:
        shm.SharedSemaphore(name, 1, directory=tmp_path / "nope")
    assert isinstance(info.value, OSError)
    assert str(tmp_path / "nope") in str(info.value)
    assert str(info.value).startswith("pylimiter: ")


def test_settings_are_checked(shm, shm_dir, name):
    with pytest.raises(TypeError):
        shm.SharedSemaphore(name, 1.5)
    with pytest.raises(TypeError):
        shm.SharedSemaphore(name, True)
    with pytest.raises(ValueError):
        shm.SharedSemaphore(name, 1 << 61)
    with pytest.raises(ValueError):
        shm.SharedSemaphore(name, 1, max_processes=0)
    with pytest.raises(ValueError):
        shm.SharedSemaphore(name, 1, max_queue_size=1 << 30)
    with pytest.raises(ValueError):
        shm.SharedSemaphore(name, 1, timeout=-1)
    assert not os.listdir(shm_dir)   # nothing was created


def test_attach_with_other_settings_names_both(shm, shm_dir, name):
    a = shm.SharedSemaphore(name, 10, max_queue_size=5, max_processes=8)
    try:
        with pytest.raises(ValueError) as info:
            shm.SharedSemaphore(name, 11, max_queue_size=5, max_processes=8)
        assert "max_permits=10" in str(info.value) and "max_permits=11" in str(info.value)
        with pytest.raises(ValueError, match="max_queue_size=6"):
            shm.SharedSemaphore(name, 10, max_queue_size=6, max_processes=8)
        with pytest.raises(ValueError, match="max_processes=9"):
            shm.SharedSemaphore(name, 10, max_queue_size=5, max_processes=9)
        b = shm.SharedSemaphore(name, 10, max_queue_size=5, max_processes=8, timeout=1)
        b.close()
    finally:
        a.close()


def test_kind_mismatch_is_refused(shm, shm_dir, name):
    a = shm.SharedSemaphore(name, 10)
    try:
        with pytest.raises(shm.SharedLimiterError, match="SharedSemaphore"):
            shm.SharedDualMemoryLimiter(name, 10, 10)
    finally:
        a.close()


@pytest.mark.c_extension
def test_the_other_implementations_segment_is_refused(impl, shm, shm_dir, name):
    from pylimiter._impls import PY, C
    other = (PY if impl is C else C).module_of("shared")
    a = shm.SharedSemaphore(name, 10)
    try:
        with pytest.raises(shm.SharedLimiterError, match="implementation"):
            other.SharedSemaphore(name, 10)
    finally:
        a.close()


def test_unsupported_platform_raises_not_implemented(shm, shm_dir, name, monkeypatch):
    monkeypatch.setattr(_shared_common, "PLATFORM", ("darwin", "arm64"))
    with pytest.raises(NotImplementedError, match="darwin"):
        shm.SharedSemaphore(name, 1)
    with pytest.raises(NotImplementedError, match="darwin"):
        shm.SharedDualMemoryLimiter(name, 1, 1)
    monkeypatch.setattr(_shared_common, "PLATFORM", ("linux", "riscv64"))
    with pytest.raises(NotImplementedError, match="riscv64"):
        shm.SharedSemaphore(name, 1)


def test_unlink_keeps_attached_processes_working(shm, shm_dir, name):
    a = shm.SharedSemaphore(name, 4)
    shm.SharedSemaphore.unlink(name)
    assert not os.path.exists(a.path)
    shm.SharedSemaphore.unlink(name)   # idempotent
    p = a.acquire_blocking(3)
    assert a.acquired_permits == 3
    b = shm.SharedSemaphore(name, 4)   # a new segment, a new budget
    try:
        assert b.acquired_permits == 0
        assert b.try_acquire(4) is not None
    finally:
        a.release(p)
        a.close()
        b.close()


def test_the_public_names(shm):
    assert issubclass(shm.SharedLimiterError, OSError)
    assert pylimiter.SharedLimiterError is shm.SharedLimiterError
    active = pylimiter._impls.ACTIVE.module_of("shared")
    assert pylimiter.SharedSemaphore is active.SharedSemaphore
    assert pylimiter.SharedDualMemoryLimiter is active.SharedDualMemoryLimiter


# ---- one process, the AsyncSemaphore semantics ---------------------------------------


def test_properties_and_holders(shm, name):
    sem = shm.SharedSemaphore(name, 10, max_queue_size=7)
    try:
        assert (sem.max_permits, sem.available_permits, sem.acquired_permits) == (10, 10, 0)
        assert (sem.queue_size, sem.max_queue_size, sem.closed) == (0, 7, False)
        assert not sem.locked()
        assert sem.holders() == {os.getpid(): 0}
        p = sem.acquire_blocking(4)
        q = sem.try_acquire(6)
        assert q is not None and sem.locked()
        assert (sem.available_permits, sem.acquired_permits) == (0, 10)
        assert sem.holders() == {os.getpid(): 10}
        assert sem.try_acquire(1) is None
        assert sem.try_acquire(0).permits == 0
        assert sem.peak_acquired_permits == 10
        s = sem.stats()
        assert (s.acquired_permits, s.available_permits, s.acquired_total) == (10, 0, 3)
        sem.release(p)
        sem.release(p)   # a no-op
        sem.release(q)
        assert sem.acquired_permits == 0 and sem.peak_acquired_permits == 10
        books(sem)
        assert repr(sem).startswith("<SharedSemaphore")
    finally:
        sem.close()


def test_two_attachments_in_one_process_share_the_budget(shm, name):
    a = shm.SharedSemaphore(name, 5)
    b = shm.SharedSemaphore(name, 5)
    try:
        p = a.acquire_blocking(3)
        assert b.acquired_permits == 3 and b.try_acquire(3) is None
        assert a.holders() == {os.getpid(): 3}
        with pytest.raises(TypeError):
            b.release(p)   # a permit of another semaphore object
        a.release(p)
        assert b.try_acquire(5) is not None
    finally:
        a.close()
        b.close()


def test_bad_arguments(shm, name):
    sem = shm.SharedSemaphore(name, 10)
    try:
        with pytest.raises(ValueError):
            sem.acquire_blocking(11)
        with pytest.raises(ValueError):
            sem.acquire_blocking(-1)
        with pytest.raises(TypeError):
            sem.acquire_blocking(1.0)
        with pytest.raises(TypeError):
            sem.release(object())
        with pytest.raises(TypeError):
            sem.acquire_blocking(1, is_cancelled=3)
        with pytest.raises(ValueError):
            sem.acquire_blocking(1, timeout=-1)
        with pytest.raises(TypeError):
            sem.set_max_permits("3")
        with pytest.raises(ValueError):
            sem.acquire(11)
        r = sem.acquire(n=2)
        assert run(r.__await__().__next__() if False else _await(r)).permits == 2
        assert sem.acquire_blocking(permits=3).permits == 3
    finally:
        sem.close()


async def _await(r):
    return await r


def test_timeout_zero_and_timeouts(shm, name):
    sem = shm.SharedSemaphore(name, 2, timeout=0.05)
    try:
        p = sem.acquire_blocking(2)
        with pytest.raises(PermitAcquireTimeoutError, match="timeout=0"):
            sem.acquire_blocking(1, timeout=0)
        t0 = time.monotonic()
        with pytest.raises(PermitAcquireTimeoutError, match="0.05 s"):
            sem.acquire_blocking(1)   # the default
        assert time.monotonic() - t0 >= 0.04

        async def main():
            with pytest.raises(PermitAcquireTimeoutError):
                await sem.acquire(1, timeout=0.05)
        run(main())
        assert sem.stats().timeout_total == 3 and sem.queue_size == 0
        sem.release(p)
        books(sem)
    finally:
        sem.close()


def test_queue_full_and_too_large(shm, name):
    sem = shm.SharedSemaphore(name, 3, max_queue_size=2)
    try:
        p = sem.acquire_blocking(3)

        async def main():
            a = asyncio.ensure_future(sem.acquire(1, timeout=5))
            b = asyncio.ensure_future(sem.acquire(2, timeout=5))
            await settle()
            assert sem.queue_size == 2
            with pytest.raises(PermitAcquireQueueFullError):
                await sem.acquire(1)
            with pytest.raises(PermitAcquireQueueFullError):
                sem.acquire_blocking(1, timeout=1)
            sem.release(p)
            return await a, await b
        a, b = run(main())
        assert (a.permits, b.permits) == (1, 2)
        assert sem.stats().queue_full_total == 2
        sem.release(a)
        sem.release(b)
        books(sem)
    finally:
        sem.close()


def test_strict_fifo_no_barging(shm, name):
    sem = shm.SharedSemaphore(name, 10)
    try:
        order = []

        async def main():
            p = await sem.acquire(9)

            async def req(tag, n):
                got = await sem.acquire(n, timeout=5)
                order.append(tag)
                return got
            big = asyncio.ensure_future(req("big", 8))
            await settle()
            small = asyncio.ensure_future(req("small", 1))
            await settle()
            # 1 permit is free, but the big request is first: nobody barges.
            assert order == [] and sem.try_acquire(1) is None and sem.queue_size == 2
            sem.release(p)
            got = [await big, await small]
            assert order == ["big", "small"]
            for g in got:
                sem.release(g)
        run(main())
        books(sem)
    finally:
        sem.close()


def test_blocking_thread_is_woken_by_a_release(shm, name):
    sem = shm.SharedSemaphore(name, 1)
    try:
        p = sem.acquire_blocking(1)
        out = []
        t = threading.Thread(target=lambda: out.append(sem.acquire_blocking(1, timeout=10)))
        t.start()
        deadline = time.monotonic() + 10
        while sem.queue_size == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        sem.release(p)
        t.join(10)
        assert out and out[0].permits == 1
        sem.release(out[0])
    finally:
        sem.close()


def test_async_with_forms(shm, name, arun):
    sem = shm.SharedSemaphore(name, 2)
    try:
        async def main():
            async with sem:
                assert sem.acquired_permits == 1
                async with sem.acquire(1) as p:
                    assert p.permits == 1 and sem.acquired_permits == 2
                    assert sem.locked()
            assert sem.acquired_permits == 0
            t = asyncio.create_task(sem.acquire(2))
            p = await t
            assert p.permits == 2
            sem.release(p)
            with pytest.raises(RuntimeError):
                await sem.__aexit__(None, None, None)
        arun(main())
    finally:
        sem.close()


def test_task_cancel_leaves_the_queue(shm, name):
    sem = shm.SharedSemaphore(name, 1)
    try:
        async def main():
            p = await sem.acquire(1)
            t = asyncio.ensure_future(sem.acquire(1, timeout=None))
            await settle()
            assert sem.queue_size == 1
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert sem.queue_size == 0 and sem.stats().cancelled_total == 1
            sem.release(p)
            assert sem.acquired_permits == 0
        run(main())
        books(sem)
    finally:
        sem.close()


def test_is_cancelled_before_and_after_the_grant(shm, name):
    sem = shm.SharedSemaphore(name, 2)
    try:
        with pytest.raises(PermitAcquireCancelledError):
            sem.acquire_blocking(1, is_cancelled=lambda: True)
        flag = []

        async def main():
            p = await sem.acquire(2)
            t = asyncio.ensure_future(sem.acquire(2, is_cancelled=lambda: bool(flag)))
            await settle()
            flag.append(1)
            sem.release(p)
            with pytest.raises(PermitAcquireCancelledError):
                await t
        run(main())
        assert sem.acquired_permits == 0
        books(sem)
    finally:
        sem.close()


def test_update_grows_and_shrinks(shm, name):
    sem = shm.SharedSemaphore(name, 10)
    try:
        p = sem.acquire_blocking(2)
        assert sem.update_blocking(p, 6) is p and p.permits == 6
        assert sem.acquired_permits == 6
        sem.update_blocking(p, 1)
        assert sem.acquired_permits == 1
        q = sem.acquire_blocking(8)

        async def main():
            t = asyncio.ensure_future(sem.update(p, 5, timeout=5))
            await settle()
            assert sem.queue_size == 1
            with pytest.raises(RuntimeError):
                sem.update_blocking(p, 0)   # an update is in progress
            sem.release(q)
            return await t
        assert run(main()) is p and p.permits == 5
        r = sem.acquire_blocking(5)
        with pytest.raises(PermitAcquireTimeoutError):
            sem.update_blocking(p, 6, timeout=0)
        assert p.permits == 5 and sem.acquired_permits == 10
        sem.release(p)
        sem.release(r)
        books(sem)
    finally:
        sem.close()


def test_release_during_a_growing_update(shm, name):
    sem = shm.SharedSemaphore(name, 4)
    try:
        async def main():
            p = await sem.acquire(2)
            q = await sem.acquire(2)
            t = asyncio.ensure_future(sem.update(p, 4, timeout=5))
            await settle()
            sem.release(p)   # the update now takes all 4
            await settle()
            assert not t.done()
            sem.release(q)
            return await t
        p = run(main())
        assert p.permits == 4 and sem.acquired_permits == 4
        sem.release(p)
        books(sem)
    finally:
        sem.close()


def test_set_max_permits_live(shm, name):
    sem = shm.SharedSemaphore(name, 2)
    try:
        async def main():
            p = await sem.acquire(2)
            big = asyncio.ensure_future(sem.acquire(2, timeout=5))
            huge = asyncio.ensure_future(sem.acquire(2, timeout=5))
            await settle()
            sem.set_max_permits(1)   # both queued requests are now too large
            with pytest.raises(ValueError, match="max_permits=1"):
                await big
            with pytest.raises(ValueError):
                await huge
            assert sem.available_permits == -1
            sem.set_max_permits(4)
            q = await sem.acquire(2, timeout=5)
            w = asyncio.ensure_future(sem.acquire(3, timeout=5))
            await settle()
            sem.set_max_permits(0)   # unbounded: granted at once
            r = await w
            assert sem.available_permits == 2**63 - 1 and sem.acquired_permits == 7
            sem.set_max_permits(7)
            assert sem.available_permits == 0 and sem.locked()
            for x in (p, q, r):
                sem.release(x)
        run(main())
        assert sem.available_permits == 7
        books(sem)
    finally:
        sem.close()


def test_close_detaches_this_process(shm, name):
    a = shm.SharedSemaphore(name, 3)
    b = shm.SharedSemaphore(name, 3)
    try:
        held = a.acquire_blocking(2)
        out = []

        def wait():
            try:
                a.acquire_blocking(3, timeout=10)
            except Exception as exc:
                out.append(exc)
        t = threading.Thread(target=wait)
        t.start()
        deadline = time.monotonic() + 10
        while b.queue_size == 0:
            assert time.monotonic() < deadline
            time.sleep(0.001)
        a.close()
        t.join(10)
        assert out and isinstance(out[0], PermitAcquireAlreadyClosedError)
        assert a.closed and not b.closed
        assert b.acquired_permits == 0 and b.queue_size == 0   # its permits went back
        a.release(held)   # a no-op, never returned twice
        assert held.permits == 0 and b.acquired_permits == 0
        with pytest.raises(PermitAcquireAlreadyClosedError):
            a.acquire_blocking(1)
        with pytest.raises(PermitAcquireAlreadyClosedError):
            a.try_acquire(1)
        a.close()   # idempotent
        assert b.try_acquire(3) is not None
        books(b)
    finally:
        a.close()
        b.close()


def test_open_limit(shm, name):
    a = shm.SharedSemaphore(name, 3, max_processes=2)
    b = shm.SharedSemaphore(name, 3, max_processes=2)
    try:
        with pytest.raises(shm.SharedLimiterError, match="max_processes=2"):
            shm.SharedSemaphore(name, 3, max_processes=2)
        b.close()
        c = shm.SharedSemaphore(name, 3, max_processes=2)
        assert len(c.holders()) == 1
        c.close()
    finally:
        a.close()
        b.close()


def test_reopen_after_everyone_closed_starts_fresh(shm, name):
    a = shm.SharedSemaphore(name, 3)
    a.set_max_permits(1)
    a.close()
    b = shm.SharedSemaphore(name, 3)
    try:
        assert b.max_permits == 3 and b.acquired_permits == 0
    finally:
        b.close()


def test_pickle_reopens_by_name(shm, name):
    a = shm.SharedSemaphore(name, 3)
    b = pickle.loads(pickle.dumps(a))
    try:
        assert b is not a and b.name == a.name and b.max_permits == 3
        p = b.acquire_blocking(2)
        assert a.acquired_permits == 2
        b.release(p)
        with pytest.raises(TypeError):
            pickle.dumps(p)
    finally:
        a.close()
        b.close()


def test_dual_limiter(shm, name):
    lim = shm.SharedDualMemoryLimiter(name, 100, 50, max_queue_size=3, timeout=1)
    other = shm.SharedDualMemoryLimiter(name, 100, 50, max_queue_size=3)
    try:
        h = lim.acquire_blocking(60, LimitType.HEAP_MEMORY)
        d = lim.acquire_blocking(50, LimitType.DIRECT_MEMORY)
        assert other.get_limiter(LimitType.HEAP_MEMORY).acquired_permits == 60
        assert lim.holders() == {os.getpid(): {LimitType.HEAP_MEMORY: 60,
                                               LimitType.DIRECT_MEMORY: 50}}
        with pytest.raises(PermitAcquireTimeoutError):
            other.acquire_blocking(1, LimitType.DIRECT_MEMORY, timeout=0)

        async def main():
            t = asyncio.ensure_future(other.acquire(50, LimitType.HEAP_MEMORY))
            await settle()
            lim.release(h)
            p = await t
            assert p.permits == 50 and p.limit_type is LimitType.HEAP_MEMORY
            await other.update(p, 70)
            return p
        p = run(main())
        stats = lim.stats()
        assert stats[LimitType.HEAP_MEMORY].acquired_permits == 70
        assert stats[LimitType.DIRECT_MEMORY].acquired_permits == 50
        other.release(p)
        lim.release(d)
        with pytest.raises(TypeError):
            other.release(d)
        assert "SharedDualMemoryLimiter" in repr(lim)
        q = pickle.loads(pickle.dumps(lim))
        q.close()
        lim.close()
        assert lim.closed and not other.closed
        with pytest.raises(PermitAcquireAlreadyClosedError):
            lim.acquire_blocking(1, LimitType.HEAP_MEMORY)
        assert other.holders() == {os.getpid(): {LimitType.HEAP_MEMORY: 0,
                                                 LimitType.DIRECT_MEMORY: 0}}
    finally:
        lim.close()
        other.close()
        shm.SharedDualMemoryLimiter.unlink(name)


def test_zero_permits_are_granted_at_once_as_async_semaphores(shm, name):
    """acquire(0) in every form returns a permit holding 0 at once, even
    with a queue (AsyncSemaphore's behaviour; it was a RuntimeError)."""
    sem = shm.SharedSemaphore(name, 2)
    try:
        held = sem.acquire_blocking(2)

        async def main():
            waiter = asyncio.ensure_future(sem.acquire(1))
            await asyncio.sleep(0.05)
            assert sem.queue_size == 1
            p = await sem.acquire(0, timeout=0)
            async with sem.acquire(0) as q:
                assert q.permits == 0
            sem.release(held)
            sem.release(await waiter)
            return p

        assert asyncio.run(main()).permits == 0
        p = sem.acquire_blocking(0)
        assert p.permits == 0 and sem.try_acquire(0).permits == 0
        sem.release(p)
        assert sem.acquired_permits == 0
        books(sem)
    finally:
        sem.close()
    dual = shm.SharedDualMemoryLimiter(name + "d", 5, 5)
    try:
        assert dual.acquire_blocking(0, LimitType.DIRECT_MEMORY).permits == 0
        assert asyncio.run(dual.acquire(0, LimitType.HEAP_MEMORY)).permits == 0
    finally:
        dual.close()


def test_a_dropped_semaphore_closes_its_descriptors_without_the_gc(shm, name, gc_disabled):
    """No reference cycle keeps a semaphore (and its descriptors and slot)
    alive once the program lets go of it."""
    def fds():
        return len(os.listdir("/proc/self/fd"))

    before = fds()
    for i in range(20):
        sem = shm.SharedSemaphore(name, 2)
        sem.close()
        dual = shm.SharedDualMemoryLimiter(name + "d", 2, 2)
        del sem, dual
    assert fds() == before


def test_permits_after_close_read_zero_and_cannot_grow(shm, name):
    """close() gave the permits back: the permit objects say 0, an update
    that would grow one is refused as closed, one to 0 is a no-op."""
    sem = shm.SharedSemaphore(name, 5)
    p = sem.acquire_blocking(4)
    sem.close()
    assert p.permits == 0
    with pytest.raises(PermitAcquireAlreadyClosedError):
        sem.update_blocking(p, 1)
    with pytest.raises(PermitAcquireAlreadyClosedError):
        asyncio.run(sem.update(p, 2))
    assert sem.update_blocking(p, 0).permits == 0
    sem.release(p)
    other = shm.SharedSemaphore(name, 5)
    try:
        assert other.acquired_permits == 0 and other.try_acquire(5) is not None
    finally:
        other.close()
