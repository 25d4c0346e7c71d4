"""The cost-free parts of an await, pinned: a failed request raises once with
no frame of the binding in its traceback; ``async with`` exits through an
already-completed awaitable, not a coroutine; from 3.12 the C await reuses
one StopIteration while nobody else holds it, and never touches one that is
held; before 3.14 ``async with`` and ``with`` bind the C types' special
methods without a builtin-method object, and those bindings behave as
methods do."""

from __future__ import annotations

import asyncio
import gc
import inspect
import sys
import traceback

import pytest

from pylimiter import PermitAcquireTimeoutError
from pylimiter._impls import C
from tests._helpers import run

# Requests are made and dropped unawaited on purpose here (misuse, traces);
# both twins warn for each (tests/test_habits.py checks that warning).
pytestmark = pytest.mark.filterwarnings("ignore:pylimiter.*was never awaited:RuntimeWarning")


def test_aexit_returns_a_completed_awaitable(make_sem):
    sem = make_sem(2)

    async def main():
        req = sem.acquire(1)
        permit = await req.__aenter__()
        exit_awaitable = req.__aexit__(None, None, None)
        assert not inspect.iscoroutine(exit_awaitable)
        assert sem.acquired_permits == 0          # released by the call itself
        assert await exit_awaitable is None
        assert permit.permits == 0
        await sem.__aenter__()
        anon_exit = sem.__aexit__(None, None, None)
        assert not inspect.iscoroutine(anon_exit)
        assert await anon_exit is None
        assert sem.acquired_permits == 0

    run(main())


@pytest.mark.c_extension
def test_timeout_is_raised_once_without_binding_frames():
    sem = C.module.AsyncSemaphore(1)

    async def main():
        held = await sem.acquire(1)
        try:
            await sem.acquire(1, timeout=0.01)
        except PermitAcquireTimeoutError as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            assert exc.__context__ is None
        else:   # pragma: no cover - the test fails below
            frames = None
        sem.release(held)
        return frames

    frames = run(main())
    assert frames is not None
    assert [f.name for f in frames] == ["main"]   # ours raised it, from C


@pytest.mark.c_extension
@pytest.mark.parametrize("wrapped", [False, True], ids=["task-of-request", "in-a-coroutine"])
def test_cancel_is_raised_without_binding_frames(wrapped):
    """A cancelled waiter's CancelledError passes through the request's
    result() and throw() (asyncio.Task calls them); neither adds a frame of
    the binding, which was a frame and a traceback object per cancel."""
    sem = C.module.AsyncSemaphore(1)

    async def waiter():
        return await sem.acquire(1)

    async def main():
        held = await sem.acquire(1)
        t = asyncio.ensure_future(waiter() if wrapped else sem.acquire(1))
        await asyncio.sleep(0)
        assert sem.queue_size == 1
        t.cancel("enough")
        try:
            await t
        except asyncio.CancelledError as exc:
            frames = traceback.extract_tb(exc.__traceback__)
        else:   # pragma: no cover - the test fails below
            frames = None
        assert sem.queue_size == 0
        assert sem.stats().cancelled_total == 1
        sem.release(held)
        assert sem.available_permits == 1
        return frames

    frames = run(main())
    assert frames is not None
    assert not [f for f in frames if f.filename.endswith((".pyx", ".pxd"))], frames


@pytest.mark.c_extension
def test_request_result_and_throw_as_a_future_and_a_coroutine_have_them():
    sem = C.module.AsyncSemaphore(1)

    async def main():
        held = await sem.acquire(1)
        req = sem.acquire(1)
        t = asyncio.ensure_future(req)
        await asyncio.sleep(0)
        with pytest.raises(asyncio.InvalidStateError, match="not ready"):
            req.result()
        for bad in ((), (ValueError, None, None, None)):
            with pytest.raises(TypeError, match="throw expected"):
                req.throw(*bad)
        with pytest.raises(TypeError):
            req.throw(ValueError, val=None)   # positional only, as a coroutine's
        assert sem.queue_size == 1            # a refused call changed nothing
        t.cancel("why")
        with pytest.raises(asyncio.CancelledError):
            await t
        with pytest.raises(asyncio.CancelledError, match="why"):
            req.result()
        assert req.cancelled() and req.done()
        # throw() on a finished request raises what it is given
        with pytest.raises(KeyError):
            req.throw(KeyError("k"))
        with pytest.raises(TypeError):
            req.throw(42)                     # not an exception
        sem.release(held)
        assert sem.available_permits == 1 and sem.queue_size == 0

    run(main())
    assert "typ, val=None, tb=None" in str(inspect.signature(C.module._Request.throw))
    assert C.module._Request.result.__doc__.startswith("None once done")


needs_312 = pytest.mark.skipif(sys.version_info < (3, 12),
                               reason="3.10/3.11 return through am_send, no StopIteration")
# 3.12-3.14's SEND finishes a C awaitable through tp_iternext (a StopIteration
# per await); 3.15's through am_send again, as 3.10/3.11 did.
STOP_PER_AWAIT = (3, 12) <= sys.version_info[:2] < (3, 15)


def _stopiterations_seen(sem, awaits=50):
    """ids of the StopIterations carrying a permit raised while ``awaits``
    acquires are awaited and released (no reference kept)."""
    seen = []
    mon = sys.monitoring
    tool = mon.PROFILER_ID

    def on_raise(code, offset, exc):
        if isinstance(exc, StopIteration) and type(exc.value).__name__ == "SemaphorePermit":
            seen.append(id(exc))

    async def main():
        for _ in range(awaits):
            sem.release(await sem.acquire(1))

    events = mon.events.RAISE | mon.events.STOP_ITERATION
    mon.use_tool_id(tool, "pylimiter-test")
    try:
        mon.register_callback(tool, mon.events.RAISE, on_raise)
        mon.register_callback(tool, mon.events.STOP_ITERATION, on_raise)
        mon.set_events(tool, events)
        run(main())
    finally:
        mon.set_events(tool, 0)
        mon.register_callback(tool, mon.events.RAISE, None)
        mon.register_callback(tool, mon.events.STOP_ITERATION, None)
        mon.free_tool_id(tool)
    return seen


@pytest.mark.c_extension
@needs_312
def test_await_reuses_one_stopiteration_or_raises_none():
    """3.12-3.14: one StopIteration, reused.  3.15: the result comes back
    through am_send, no exception at all (the binding compiles its cache
    out there: a build-time check, _binding/stop_cache.h)."""
    seen = _stopiterations_seen(C.module.AsyncSemaphore(10))
    if STOP_PER_AWAIT:
        assert len(seen) == 50
        assert len(set(seen[1:])) == 1      # one object, reused (the first may be new)
    else:
        assert seen == []


@pytest.mark.c_extension
@needs_312
def test_a_held_stopiteration_is_never_reused():
    sem = C.module.AsyncSemaphore(10)

    def finish():
        it = sem.acquire(1).__await__()
        try:
            next(it)
        except StopIteration as exc:
            return exc
        raise AssertionError("not granted at once")

    first = finish()
    p1 = first.value
    second = finish()
    assert second is not first and first.value is p1
    p2 = second.value
    assert p2 is not p1 and p2.permits == 1
    sem.release(p1)
    sem.release(p2)


# Before 3.14, BEFORE_(ASYNC_)WITH binds __(a)enter__/__(a)exit__ through the
# descriptor: the binding's own (_binding/specials.h, plim_speed_special) makes
# no builtin-method object.  3.14's LOAD_SPECIAL binds nothing: Cython's
# method descriptors stay.
SPECIALS = (("_Request", "__aenter__"), ("_Request", "__aexit__"),
            ("AsyncSemaphore", "__aenter__"), ("AsyncSemaphore", "__aexit__"),
            ("SemaphorePermit", "__enter__"), ("SemaphorePermit", "__exit__"))
OWN_SPECIALS = sys.version_info < (3, 14)


@pytest.mark.c_extension
@pytest.mark.parametrize("cls,name", SPECIALS)
def test_special_methods_are_bound_by_the_binding_before_314(cls, name):
    descr = getattr(C.module, cls).__dict__[name]
    if OWN_SPECIALS:
        assert type(descr).__name__ == "special_method"
    else:
        assert type(descr).__name__ == "method_descriptor"
    assert descr.__name__ == name
    assert descr.__qualname__ == f"{cls}.{name}"
    assert name in descr.__doc__
    assert name in repr(descr)


@pytest.mark.c_extension
def test_bound_special_methods_behave_as_methods():
    mod = C.module
    sem = mod.AsyncSemaphore(2)

    async def main():
        req = sem.acquire(1)
        enter = req.__aenter__
        assert enter.__self__ is req and enter.__name__ == "__aenter__"
        assert "__aenter__" in repr(enter) and enter.__doc__
        if OWN_SPECIALS:
            assert type(enter).__name__ == "bound_special_method"
            assert gc.is_tracked(enter)       # its self may sit on a cycle
        with pytest.raises(TypeError):
            enter(1)
        with pytest.raises(TypeError):
            enter(x=1)
        with pytest.raises(TypeError):
            req.__aexit__(None)
        with pytest.raises(TypeError):        # bound to another type's object
            type(req).__dict__["__aexit__"].__get__(sem)
        with pytest.raises(TypeError):        # called unbound with another self
            type(req).__aexit__(sem, None, None, None)
        permit = await type(req).__aenter__(req)
        assert permit.permits == 1 and sem.acquired_permits == 1
        assert await type(req).__aexit__(req, None, None, None) is None
        assert sem.acquired_permits == 0
        # Keyword arguments reach the method (the generic path).
        req = sem.acquire(1)
        permit = await req
        assert await req.__aexit__(exc_type=None, exc=None, tb=None) is None
        assert permit.permits == 0
        with (await sem.acquire(2)) as p:
            assert p.permits == 2
        assert sem.acquired_permits == 0
        # Equal (and hashed alike) when bound to one object, as methods are.
        assert req.__aexit__ == req.__aexit__ and req.__aexit__ != sem.acquire(1).__aexit__
        assert hash(req.__aexit__) == hash(req.__aexit__)
        other = sem.acquire(1)
        other.add_done_callback(other.__aexit__)
        assert other.remove_done_callback(other.__aexit__) == 1
        # Unbound access through the class gives the descriptor itself.
        assert type(req).__dict__["__aexit__"].__get__(None, type(req)) is \
            type(req).__dict__["__aexit__"]

    run(main())


@pytest.mark.c_extension
def test_a_cycle_through_a_bound_special_method_is_collected():
    Request = C.module._Request
    sem = C.module.AsyncSemaphore(2)

    def alive():
        return sum(type(o) is Request for o in gc.get_objects())

    gc.collect()
    before = alive()
    for _ in range(10):
        req = sem.acquire(1)
        req.add_done_callback(req.__aexit__)   # req -> callback -> bound -> req
    del req
    assert alive() >= before + 10
    gc.collect()
    assert alive() == before
