"""Issue 18, item 2: every attribute of every object, public and private,
in every state, is readable or raises an Exception: what a debugger's
variable view, a REPL's completion or inspect.getmembers() does.  Both
twins; in a child interpreter, since the failure this catches was a
segfault (request._loop while not queued)."""

from __future__ import annotations

import pytest

from tests._robust import crashed, run_script

pytestmark = pytest.mark.slow   # a child interpreter


@pytest.mark.parametrize("twin", [pytest.param("c", marks=pytest.mark.c_extension), "python"])
def test_every_attribute_of_every_object_in_every_state(twin):
    out = run_script("""
        import asyncio, sys
        from pylimiter._impls import IMPLEMENTATIONS
        from tests._robust import objects_in_every_state, read_everything

        mod = IMPLEMENTATIONS[sys.argv[1]].module

        async def main():
            objs = await objects_in_every_state(mod)
            names = 0
            kinds = set()
            for label, obj in objs:
                names += read_everything(obj)
                read_everything(type(obj))
                kinds.add(type(obj).__name__)
            # Once more after the loop state of each semaphore is gone.
            for label, obj in objs:
                names += read_everything(obj)
            print("walked", len(objs), "objects", len(kinds), "kinds", names, "names")

        asyncio.run(main())
    """, args=(twin,))
    assert out.returncode == 0 and "walked" in out.stdout, crashed(out)
    objects = int(out.stdout.split("walked ")[1].split()[0])
    assert objects >= 32


@pytest.mark.parametrize("twin", [pytest.param("c", marks=pytest.mark.c_extension), "python"])
def test_the_loop_of_a_waiter_is_its_tasks_loop_or_none(twin):
    # The private `_loop` answers asyncio (its Future protocol); None where
    # no loop is involved, never a crash or an AssertionError.
    out = run_script("""
        import asyncio, sys
        from pylimiter._impls import IMPLEMENTATIONS
        mod = IMPLEMENTATIONS[sys.argv[1]].module

        async def main():
            sem = mod.AsyncSemaphore(1)
            held = sem.try_acquire(1)
            t = asyncio.ensure_future(sem.acquire(1))
            for _ in range(3):
                await asyncio.sleep(0)
            w = t._fut_waiter
            assert w._loop is asyncio.get_running_loop()
            assert w.cancel() is True
            for _ in range(3):
                await asyncio.sleep(0)
            assert t.cancelled()
            assert w._loop is asyncio.get_running_loop()
            sem.release(held)
            assert sem.acquired_permits == 0
            print("ok")

        asyncio.run(main())
    """, args=(twin,))
    assert out.returncode == 0 and "ok" in out.stdout, crashed(out)
