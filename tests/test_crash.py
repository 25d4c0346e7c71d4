"""Issue 18, items 1-2: what used to take the interpreter down.  Each case
runs in a child interpreter (a crash fails the test, not the session), on
both twins.

* A permit dropped without release() was freed twice by the cyclic GC: its
  deallocator warned (Python code) while still tracked.  Now it warns once,
  after it is gone, whatever the GC does meanwhile.
* Reading the private `_loop` of a request that is not queued segfaulted,
  and so did inspect.getmembers(request): every attribute of every object
  in every state is now readable (tests/test_attributes.py walks them all).
"""

from __future__ import annotations

import sys

import pytest

from tests._robust import crashed, run_script

pytestmark = pytest.mark.slow   # child interpreters: seconds, not milliseconds

TWINS = [pytest.param("c", marks=pytest.mark.c_extension), "python"]


@pytest.mark.parametrize("twin", TWINS)
def test_leaked_permits_under_gc_pressure_survive(twin):
    # The reproducer from the issue: a dict per try_acquire keeps the GC
    # collecting while leaked permits' warnings run; 300 live permits after.
    out = run_script("""
        import sys
        from pylimiter._impls import IMPLEMENTATIONS
        mod = IMPLEMENTATIONS[sys.argv[1]].module
        sem = mod.AsyncSemaphore(10**9)
        keep = []
        for _ in range(20000):
            keep.append({})
            sem.try_acquire(1)
        live = [sem.try_acquire(1) for _ in range(300)]
        assert len({id(p) for p in live}) == 300, "one object handed out twice"
        assert sem.acquired_permits == 20300, sem.acquired_permits
        print("ok")
    """, args=(twin,))
    assert out.returncode == 0 and "ok" in out.stdout, crashed(out)


@pytest.mark.parametrize("twin", TWINS)
def test_a_leaked_permit_warns_exactly_once_even_with_gc_threshold_1(twin):
    # The warning machinery itself collects here (threshold 1), and the
    # warnings are recorded (kept alive), not ignored.
    out = run_script("""
        import gc, sys, warnings
        from pylimiter._impls import IMPLEMENTATIONS
        mod = IMPLEMENTATIONS[sys.argv[1]].module
        sem = mod.AsyncSemaphore(10**6)
        gc.set_threshold(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(500):
                sem.try_acquire(1 + i % 3)
                cyc = [sem.try_acquire(2)]
                cyc.append(cyc)          # a leaked permit inside a cycle
                del cyc
            gc.collect()
        gc.set_threshold(700)
        leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(leaks) == 1000, len(leaks)
        assert sum(int(str(w.message).split("holding ")[1].split(" ")[0])
                   for w in leaks) == sem.acquired_permits
        live = [sem.try_acquire(1) for _ in range(300)]
        assert len({id(p) for p in live}) == 300
        print("ok")
    """, args=(twin,))
    assert out.returncode == 0 and "ok" in out.stdout, crashed(out)


@pytest.mark.parametrize("twin", TWINS)
def test_awaited_permits_leaked_under_gc_pressure(twin):
    # 3.12+: the request's deallocator used to drop the cached StopIteration's
    # reference to its permit (and so run the permit's warning) while the
    # request was still tracked.  Any version: many awaited permits dropped
    # with collections running inside their warnings.
    out = run_script("""
        import asyncio, gc, sys, warnings
        from pylimiter._impls import IMPLEMENTATIONS
        mod = IMPLEMENTATIONS[sys.argv[1]].module
        sem = mod.AsyncSemaphore(10**9)

        async def main():
            keep = []
            for i in range(5000):
                keep.append({})
                p = await sem.acquire(1)
                if i % 2:
                    async with sem.acquire(1):
                        pass
                del p
            return [await sem.acquire(1) for _ in range(300)]

        gc.set_threshold(50)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            live = asyncio.run(main())
            gc.collect()
        leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(leaks) == 5000, len(leaks)
        assert len({id(p) for p in live}) == 300
        assert sem.acquired_permits == 5300
        print("ok")
    """, args=(twin,))
    assert out.returncode == 0 and "ok" in out.stdout, crashed(out)


@pytest.mark.parametrize("twin", TWINS)
def test_loop_of_a_request_that_is_not_queued(twin):
    out = run_script("""
        import asyncio, inspect, sys
        from pylimiter._impls import IMPLEMENTATIONS
        mod = IMPLEMENTATIONS[sys.argv[1]].module
        sem = mod.AsyncSemaphore(10)
        r = sem.acquire(1)
        assert getattr(r, "_loop", None) is None
        inspect.getmembers(r)

        async def main():
            r2 = sem.acquire(1)
            p = await r2
            assert getattr(r2, "_loop", None) is None   # granted at once: never queued
            inspect.getmembers(r2)
            sem.release(p)

        asyncio.run(main())
        print("ok")
    """, args=(twin,))
    assert out.returncode == 0 and "ok" in out.stdout, crashed(out)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("twin", TWINS)
def test_gc_storm_over_the_whole_api(twin):
    # Every kind of object made and dropped with a collection at every
    # allocation: a deallocator that runs Python code while still tracked,
    # or a freelist entry used twice, aborts here (on a Py_DEBUG build at
    # once, see tests/test_pydebug.py).
    out = run_script("""
        import asyncio, gc, sys, warnings
        from pylimiter import LimitType
        from pylimiter._impls import IMPLEMENTATIONS
        mod = IMPLEMENTATIONS[sys.argv[1]].module
        warnings.simplefilter("ignore", ResourceWarning)

        async def main():
            sem = mod.AsyncSemaphore(3, timeout=None)
            dual = mod.AsyncDualMemoryLimiter(10, 10)
            for i in range(150):
                p = await sem.acquire(1)
                t = asyncio.ensure_future(sem.acquire(3))
                u = asyncio.ensure_future(sem.acquire(1, timeout=0.0005))
                await asyncio.sleep(0)
                if i % 3 == 0:
                    t.cancel()
                sem.release(p)
                await asyncio.sleep(0.001)
                for task in (t, u):
                    if not task.done():
                        task.cancel()
                    try:
                        q = await task
                    except BaseException:
                        continue
                    if i % 2:
                        sem.release(q)   # else leaked: warns, stays taken
                if sem.available_permits < 3:
                    sem.set_max_permits(sem.acquired_permits + 3)
                d = await dual.acquire(1, LimitType.HEAP_MEMORY)
                dual.release(d)
                b = sem.try_acquire(1)
                if b is not None and i % 4:
                    sem.release(b)
            sem.close()

        gc.set_threshold(1)
        asyncio.run(main())
        gc.set_threshold(700)
        gc.collect()
        print("ok")
    """, args=(twin,), timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, crashed(out)
