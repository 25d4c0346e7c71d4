"""Issue 18, items 3, 4 and 8: misuse a hostile or careless user can try,
on both twins, with the same exception types.

* Objects built with ``Cls.__new__(Cls)`` and no ``__init__``: the types
  only pylimiter makes (permits, requests, waiters, loop states) refuse to
  be made at all (TypeError); a semaphore or limiter made so refuses every
  call with a RuntimeError saying why, instead of reporting 2**60 held.
* A second ``__init__`` would forget what is held and queued: refused.
* copy.copy, copy.deepcopy and pickle of permits, requests, semaphores and
  limiters raise TypeError (a copied C permit was a second live permit).
"""

from __future__ import annotations

import asyncio
import copy
import pickle

import pytest

from pylimiter import LimitType
from pylimiter._impls import PY, C
from tests._helpers import check_invariant, settle
from tests._robust import loop_states

# Requests are made and dropped unawaited on purpose here (misuse, traces);
# both twins warn for each (tests/test_habits.py checks that warning).
pytestmark = pytest.mark.filterwarnings("ignore:pylimiter.*was never awaited:RuntimeWarning")

UNINIT = "not initialised"


def uninitialised_semaphore_calls(sem, foreign_permit):
    """(name, call) for every public method and property of a semaphore."""
    return [
        ("max_permits", lambda: sem.max_permits),
        ("available_permits", lambda: sem.available_permits),
        ("acquired_permits", lambda: sem.acquired_permits),
        ("queue_size", lambda: sem.queue_size),
        ("max_queue_size", lambda: sem.max_queue_size),
        ("closed", lambda: sem.closed),
        ("locked", lambda: sem.locked()),
        ("stats", lambda: sem.stats()),
        ("acquire", lambda: sem.acquire(1)),
        ("acquire 0", lambda: sem.acquire(0)),
        ("acquire bad", lambda: sem.acquire("x")),
        ("acquire_blocking", lambda: sem.acquire_blocking(1, timeout=0)),
        ("acquire_blocking checked",
         lambda: sem.acquire_blocking(1, timeout=0, is_cancelled=lambda: False)),
        ("try_acquire", lambda: sem.try_acquire(1)),
        ("try_acquire 0", lambda: sem.try_acquire(0)),
        ("set_max_permits", lambda: sem.set_max_permits(5)),
        ("close", lambda: sem.close()),
        ("__aenter__", lambda: sem.__aenter__()),
        ("__aexit__", lambda: sem.__aexit__(None, None, None)),
        # A permit cannot belong to a semaphore that never started: these
        # say so, as for any foreign permit.
        ("release", lambda: sem.release(foreign_permit)),
        ("update", lambda: sem.update(foreign_permit, 1)),
        ("update_blocking", lambda: sem.update_blocking(foreign_permit, 1, timeout=0)),
    ]


def outcome(call):
    try:
        result = call()
    except Exception as exc:
        return type(exc), str(exc)
    return "returned", result


@pytest.mark.c_extension
@pytest.mark.parametrize("subclass", [False, True], ids=["new", "subclass-skips-init"])
def test_uninitialised_semaphore_refuses_every_call_alike_in_both_twins(subclass):
    results = {}
    for impl in (C, PY):
        mod = impl.module
        cls = mod.AsyncSemaphore
        if subclass:
            class Skips(cls):
                def __init__(self):   # forgets super().__init__
                    pass
            sem = Skips()
        else:
            sem = cls.__new__(cls)
        other = mod.AsyncSemaphore(5)
        foreign = other.try_acquire(1)
        assert "not initialised" in repr(sem)
        got = {}
        for name, call in uninitialised_semaphore_calls(sem, foreign):
            kind, msg = outcome(call)
            got[name] = kind
            if name in ("release", "update", "update_blocking"):
                assert kind is TypeError, (impl, name, kind, msg)
            else:
                assert kind is RuntimeError and UNINIT in msg, (impl, name, kind, msg)
        results[impl.tag] = got
        # __init__ makes it a working semaphore after all.
        if not subclass:
            sem.__init__(3, 10, None)
            p = sem.acquire_blocking(2)
            assert sem.acquired_permits == 2 and p.permits == 2
            sem.release(p)
            assert sem.acquired_permits == 0
        other.release(foreign)
    assert results["c"] == results["python"]


def test_uninitialised_dual_limiter_refuses_every_call(mod):
    cls = mod.AsyncDualMemoryLimiter
    lim = cls.__new__(cls)
    assert "not initialised" in repr(lim)
    for call in (lambda: lim.acquire(1, LimitType.HEAP_MEMORY),
                 lambda: lim.acquire_blocking(1, LimitType.DIRECT_MEMORY, timeout=0),
                 lambda: lim.get_limiter(LimitType.HEAP_MEMORY),
                 lambda: lim.stats(), lambda: lim.close()):
        with pytest.raises(RuntimeError, match=UNINIT):
            call()
    other = cls(10, 10)
    dp = other.acquire_blocking(1, LimitType.HEAP_MEMORY)
    with pytest.raises(TypeError):
        lim.release(dp)
    with pytest.raises(TypeError):
        lim.update(dp, 2)
    other.release(dp)


async def _internal_types(mod):
    """Every type a user can reach but only pylimiter may make."""
    sem = mod.AsyncSemaphore(1)
    dual = mod.AsyncDualMemoryLimiter(5, 5)
    held = sem.try_acquire(1)
    t = asyncio.ensure_future(sem.acquire(1))
    await settle()
    dp = dual.acquire_blocking(1, LimitType.HEAP_MEMORY)
    types = {
        "permit": type(held),
        "request": type(sem.acquire(1)),
        "waiter": type(t._fut_waiter),
        "loop state": type(loop_states(sem)[0]),
        "dual permit": type(dp),
        "dual request": type(dual.acquire(1, LimitType.HEAP_MEMORY)),
    }
    t.cancel()
    await settle()
    sem.release(held)
    dual.release(dp)
    return types


def test_internal_types_cannot_be_made_from_python(mod):
    types = asyncio.run(_internal_types(mod))
    for name, cls in types.items():
        with pytest.raises(TypeError):
            cls.__new__(cls)
        with pytest.raises(TypeError):
            cls()
        with pytest.raises(TypeError):
            cls(1, 2)


def test_permit_init_cannot_be_called_again(mod):
    sem = mod.AsyncSemaphore(5)
    p = sem.try_acquire(2)
    with pytest.raises(TypeError):
        p.__init__()
    dual = mod.AsyncDualMemoryLimiter(5, 5)
    dp = dual.acquire_blocking(2, LimitType.HEAP_MEMORY)
    with pytest.raises(TypeError):
        dp.__init__()
    assert p.permits == 2 and dp.permits == 2
    sem.release(p)
    dual.release(dp)


def test_second_init_is_refused_and_forgets_nothing(mod):
    sem = mod.AsyncSemaphore(5, 7, 3.0)
    p = sem.try_acquire(3)
    with pytest.raises(RuntimeError, match="already initialised"):
        sem.__init__(10)
    with pytest.raises(TypeError):   # argument checks come first, as at first
        sem.__init__("10")
    assert (sem.max_permits, sem.max_queue_size, sem.acquired_permits) == (5, 7, 3)
    check_invariant(sem, [p])
    sem.release(p)
    dual = mod.AsyncDualMemoryLimiter(100, 200)
    dp = dual.acquire_blocking(50, LimitType.DIRECT_MEMORY)
    with pytest.raises(RuntimeError, match="already initialised"):
        dual.__init__(1, 1)
    assert dual.get_limiter(LimitType.DIRECT_MEMORY).acquired_permits == 50
    assert dual.get_limiter(LimitType.HEAP_MEMORY).max_permits == 100
    dual.release(dp)


# ---- copy and pickle ---------------------------------------------------------


def copiers():
    yield "copy", copy.copy
    yield "deepcopy", copy.deepcopy
    for proto in range(pickle.HIGHEST_PROTOCOL + 1):
        yield f"pickle{proto}", lambda o, proto=proto: pickle.dumps(o, proto)


async def _every_stateful_object(mod):
    sem = mod.AsyncSemaphore(2)
    dual = mod.AsyncDualMemoryLimiter(10, 10)
    p = sem.try_acquire(1)
    blocker = sem.try_acquire(1)
    t = asyncio.ensure_future(sem.acquire(1))
    await settle()
    objs = {
        "semaphore": sem,
        "permit": p,
        "request": sem.acquire(1),
        "update request": sem.update(p, 2),
        "waiter": t._fut_waiter,
        "loop state": loop_states(sem)[0],
        "dual limiter": dual,
        "dual permit": dual.acquire_blocking(3, LimitType.HEAP_MEMORY),
        "dual request": dual.acquire(1, LimitType.DIRECT_MEMORY),
    }
    return objs, t, blocker


def test_copy_and_pickle_are_refused(mod):
    async def main():
        objs, t, blocker = await _every_stateful_object(mod)
        sem = objs["semaphore"]
        before = (sem.acquired_permits, sem.queue_size, sem.stats())
        n = 0
        for name, obj in objs.items():
            for how, copier in copiers():
                with pytest.raises(TypeError, match="cannot be copied or pickled"):
                    copier(obj)
                n += 1
        assert (sem.acquired_permits, sem.queue_size, sem.stats()) == before
        assert n >= 9 * 8
        t.cancel()
        await settle()
        sem.release(objs["permit"])
        sem.release(blocker)
        objs["dual limiter"].release(objs["dual permit"])
        check_invariant(sem, [])

    asyncio.run(main())


def test_a_copied_permit_would_have_been_a_second_live_permit(mod):
    # The case: copy.copy(permit) on the C twin, then releasing both,
    # gave acquired_permits=-4 and 14 grants on max_permits=10.
    sem = mod.AsyncSemaphore(10)
    p = sem.try_acquire(4)
    with pytest.raises(TypeError):
        copy.copy(p)
    sem.release(p)
    sem.release(p)
    assert sem.acquired_permits == 0
    got = [sem.try_acquire(1) for _ in range(11)]
    assert sum(g is not None for g in got) == 10
    for g in got:
        if g is not None:
            sem.release(g)
