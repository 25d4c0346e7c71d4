"""Issue 18: the hostile-argument matrix.  Every public constructor and
method of the limiter (AsyncSemaphore, AsyncDualMemoryLimiter, their
permits, a queued request's Future protocol, LimiterCollector) gets each
hostile value in each argument position: NaN, +-inf, -1, 0, 2**63, 2**64,
bool, None, str, float-for-int, and objects whose __index__, __int__,
__float__, __eq__, __hash__, __bool__ or __repr__ raise.  Each call either
works or raises TypeError/ValueError, the objects' books balance afterwards,
and the two twins give the same answer for every call."""

from __future__ import annotations

import asyncio
import importlib.util
import math

import pytest

from pylimiter import LimitType
from pylimiter._impls import PY, C
from tests._helpers import check_invariant, settle


class Boom(RuntimeError):
    """What the hostile dunders raise: never a TypeError or ValueError, so a
    call that lets one escape is caught by the matrix."""


def _boom(*args, **kwargs):
    raise Boom("hostile dunder")


class EvilIndex:
    __index__ = __int__ = __float__ = __bool__ = __repr__ = __str__ = _boom


class EvilEq:
    __eq__ = __ne__ = __hash__ = __bool__ = __repr__ = _boom


class EvilInt(int):
    __index__ = __int__ = __float__ = __eq__ = __ne__ = __lt__ = __le__ = _boom
    __gt__ = __ge__ = __hash__ = __bool__ = __repr__ = __str__ = __format__ = _boom


class EvilFloat(float):
    __float__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _boom
    __hash__ = __bool__ = __repr__ = __str__ = __format__ = __int__ = _boom


class EvilStr(str):
    __eq__ = __ne__ = __hash__ = __len__ = __iter__ = _boom


HOSTILE = {
    "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "-1": -1, "0": 0,
    "2**63": 2**63, "2**64": 2**64, "-2**63": -2**63, "2**63-1": 2**63 - 1,
    "True": True, "False": False, "None": None, "str": "1", "1.0": 1.0,
    "-0.5": -0.5, "1e10": 1e10, "EvilIndex": EvilIndex(), "EvilEq": EvilEq(),
    "EvilInt": EvilInt(1), "EvilInt-1": EvilInt(-1), "EvilFloat": EvilFloat(0.5),
    "EvilStr": EvilStr("x"), "list": [], "bytes": b"1", "object": object(),
    "LimitType": LimitType.HEAP_MEMORY,
}
ALLOWED = (TypeError, ValueError)


class Env:
    """One twin's objects, the loop to drive requests on, and its books."""

    def __init__(self, mod):
        self.mod = mod
        self.loop = asyncio.new_event_loop()
        self.sem = mod.AsyncSemaphore(10, 5, 1.0)
        self.ub = mod.AsyncSemaphore(0)
        self.dual = mod.AsyncDualMemoryLimiter(100, 100)
        self.p = self.sem.try_acquire(2)
        self.dp = self.dual.acquire_blocking(10, LimitType.HEAP_MEMORY)

    def drive(self, req):
        """Await a request (it never has to wait here) and give back what it got."""
        async def go():
            return await req
        got = self.loop.run_until_complete(asyncio.wait_for(go(), 5))
        self.give_back(got)

    def give_back(self, got):
        if got is None or got is self.p or got is self.dp:
            return
        if type(got).__name__ == "DualMemoryPermit":
            self.dual.release(got)
            return
        try:
            self.sem.release(got)
        except TypeError:          # the unbounded semaphore's
            self.ub.release(got)

    def check_books(self):
        """What is held is exactly what the live permits hold (no
        gc.collect per call: every permit a call made was given back)."""
        self.loop.run_until_complete(settle(2))
        sem, ub = self.sem, self.ub
        heap = self.dual.get_limiter(LimitType.HEAP_MEMORY)
        direct = self.dual.get_limiter(LimitType.DIRECT_MEMORY)
        assert sem.max_permits == 10 and not sem.closed and sem.queue_size == 0
        assert sem.acquired_permits == self.p.permits == 2
        assert sem.available_permits == 8
        assert ub.acquired_permits == 0 and ub.available_permits == 2**63 - 1
        assert heap.acquired_permits == self.dp.permits == 10
        assert heap.available_permits == 90 and heap.queue_size == 0
        assert direct.acquired_permits == 0 and direct.available_permits == 100

    def close(self):
        check_invariant(self.sem, [self.p])
        self.sem.release(self.p)
        self.dual.release(self.dp)
        self.loop.close()


def cases():
    """(name, call(env, v)): one hostile value in one argument position."""
    H = LimitType.HEAP_MEMORY

    def restore_max(e):
        e.sem.set_max_permits(10)

    def set_max(e, v):
        try:
            e.sem.set_max_permits(v)
        finally:
            restore_max(e)

    def new_sem(*args, **kw):
        def call(e, v):
            a = [v if x is ... else x for x in args]
            k = {n: (v if x is ... else x) for n, x in kw.items()}
            s = e.mod.AsyncSemaphore(*a, **k)
            q = s.acquire_blocking(0)
            s.release(q)
        return call

    def new_dual(*args, **kw):
        def call(e, v):
            a = [v if x is ... else x for x in args]
            k = {n: (v if x is ... else x) for n, x in kw.items()}
            e.mod.AsyncDualMemoryLimiter(*a, **k).close()
        return call

    def waiter_call(method):
        def call(e, v):
            held = e.sem.try_acquire(8)
            t = e.loop.create_task(e.sem.acquire(1))
            try:
                e.loop.run_until_complete(settle(3))
                getattr(t._fut_waiter, method)(v)
            finally:
                e.sem.release(held)
                t.cancel()
                e.loop.run_until_complete(settle(3))
                if t.done() and not t.cancelled() and t.exception() is None:
                    e.sem.release(t.result())
        return call

    def collector(**kw):
        def call(e, v):
            from pylimiter.prometheus import LimiterCollector
            k = {n: (v if x is ... else x) for n, x in kw.items()}
            c = LimiterCollector(**k)
            c.track("pool", e.sem)
            assert list(c.collect())
        return call

    def track(*args, **kw):
        def call(e, v):
            from pylimiter.prometheus import LimiterCollector
            c = LimiterCollector("ns")
            a = [v if x is ... else e.sem if x == "<sem>" else x for x in args]
            k = {n: (v if x is ... else x) for n, x in kw.items()}
            c.track(*a, **k)
            assert list(c.collect()) is not None
        return call

    def untrack(*args, **kw):
        def call(e, v):
            from pylimiter.prometheus import LimiterCollector
            c = LimiterCollector("ns")
            c.track("pool", e.sem, labels={"a": "b"})
            a = [v if x is ... else x for x in args]
            k = {n: (v if x is ... else x) for n, x in kw.items()}
            try:
                c.untrack(*a, **k)
            except KeyError:
                pass        # documented: nothing tracked under that
            assert list(c.collect()) is not None
        return call

    has_prometheus = importlib.util.find_spec("prometheus_client") is not None
    out = {
        "AsyncSemaphore(v)": new_sem(...),
        "AsyncSemaphore(5, v)": new_sem(5, ...),
        "AsyncSemaphore(5, 10, v)": new_sem(5, 10, ...),
        "AsyncSemaphore(max_permits=v, timeout=None)": new_sem(max_permits=..., timeout=None),
        "acquire(v)": lambda e, v: e.drive(e.sem.acquire(v)),
        "acquire(1, timeout=v)": lambda e, v: e.drive(e.sem.acquire(1, timeout=v)),
        "acquire(1, is_cancelled=v)": lambda e, v: e.drive(e.sem.acquire(1, is_cancelled=v)),
        "unbounded acquire(v)": lambda e, v: e.drive(e.ub.acquire(v)),
        "acquire_blocking(v)": lambda e, v: e.give_back(e.sem.acquire_blocking(v)),
        "acquire_blocking(1, timeout=v)":
            lambda e, v: e.give_back(e.sem.acquire_blocking(1, timeout=v)),
        "acquire_blocking(1, is_cancelled=v)":
            lambda e, v: e.give_back(e.sem.acquire_blocking(1, is_cancelled=v)),
        "unbounded acquire_blocking(v)": lambda e, v: e.give_back(e.ub.acquire_blocking(v)),
        "try_acquire(v)": lambda e, v: e.give_back(e.sem.try_acquire(v)),
        "unbounded try_acquire(v)": lambda e, v: e.give_back(e.ub.try_acquire(v)),
        "update(v, 3)": lambda e, v: e.drive(e.sem.update(v, 3)),
        "update(p, v)": lambda e, v: (e.drive(e.sem.update(e.p, v)),
                                      e.drive(e.sem.update(e.p, 2))),
        "update(p, 3, timeout=v)": lambda e, v: (e.drive(e.sem.update(e.p, 3, timeout=v)),
                                                 e.drive(e.sem.update(e.p, 2))),
        "update(p, 3, is_cancelled=v)":
            lambda e, v: (e.drive(e.sem.update(e.p, 3, is_cancelled=v)),
                          e.drive(e.sem.update(e.p, 2))),
        "update_blocking(v, 3)": lambda e, v: e.sem.update_blocking(v, 3),
        "update_blocking(p, v)": lambda e, v: (e.sem.update_blocking(e.p, v),
                                               e.sem.update_blocking(e.p, 2)),
        "update_blocking(p, 3, timeout=v)":
            lambda e, v: (e.sem.update_blocking(e.p, 3, timeout=v),
                          e.sem.update_blocking(e.p, 2)),
        "release(v)": lambda e, v: e.sem.release(v),
        "set_max_permits(v)": set_max,
        "permit.__exit__(v, v, v)": lambda e, v: e.sem.try_acquire(1).__exit__(v, v, v),
        "waiter.remove_done_callback(v)": waiter_call("remove_done_callback"),
        "waiter.add_done_callback(v)": waiter_call("add_done_callback"),
        "waiter.cancel(v)": waiter_call("cancel"),
        "AsyncDualMemoryLimiter(v, 10)": new_dual(..., 10),
        "AsyncDualMemoryLimiter(10, v)": new_dual(10, ...),
        "AsyncDualMemoryLimiter(heap_max_queue_size=v)":
            new_dual(10, 10, heap_max_queue_size=...),
        "AsyncDualMemoryLimiter(direct_timeout=v)": new_dual(10, 10, direct_timeout=...),
        "dual.acquire(v, HEAP)": lambda e, v: e.drive(e.dual.acquire(v, H)),
        "dual.acquire(1, v)": lambda e, v: e.drive(e.dual.acquire(1, v)),
        "dual.acquire(1, HEAP, timeout=v)": lambda e, v: e.drive(e.dual.acquire(1, H, timeout=v)),
        "dual.acquire_blocking(v, HEAP)": lambda e, v: e.give_back(e.dual.acquire_blocking(v, H)),
        "dual.acquire_blocking(1, v)": lambda e, v: e.give_back(e.dual.acquire_blocking(1, v)),
        "dual.acquire_blocking(1, HEAP, is_cancelled=v)":
            lambda e, v: e.give_back(e.dual.acquire_blocking(1, H, is_cancelled=v)),
        "dual.update(v, 5)": lambda e, v: e.drive(e.dual.update(v, 5)),
        "dual.update(dp, v)": lambda e, v: (e.drive(e.dual.update(e.dp, v)),
                                            e.drive(e.dual.update(e.dp, 10))),
        "dual.update_blocking(dp, v)": lambda e, v: (e.dual.update_blocking(e.dp, v),
                                                     e.dual.update_blocking(e.dp, 10)),
        "dual.release(v)": lambda e, v: e.dual.release(v),
        "dual.get_limiter(v)": lambda e, v: e.dual.get_limiter(v),
        "LimiterCollector(v)": collector(namespace=...),
        "LimiterCollector(labels=v)": collector(labels=...),
        "LimiterCollector(labels={'k': v})": lambda e, v: collector(labels={"k": v})(e, v),
        "track(v, sem)": track(..., "<sem>"),
        "track('n', v)": track("n", ...),
        "track('n', sem, labels=v)": track("n", "<sem>", labels=...),
        "track('n', sem, labels={'k': v})": lambda e, v: track("n", "<sem>", labels={"k": v})(e, v),
        "untrack(v)": untrack(...),
        "untrack('pool', labels=v)": untrack("pool", labels=...),
    }
    if not has_prometheus:   # an install without the [prometheus] extra
        out = {k: v for k, v in out.items()
               if not k.startswith(("LimiterCollector", "track", "untrack"))}
    return out


def run_matrix(mod):
    """Every case with every value on one twin: {(case, value): outcome}."""
    env = Env(mod)
    out = {}
    try:
        for cname, call in cases().items():
            for vname, v in HOSTILE.items():
                try:
                    call(env, v)
                    got = "ok"
                except ALLOWED as exc:
                    got = type(exc).__name__
                except BaseException as exc:   # noqa: BLE001 - reported below
                    got = f"ESCAPED {type(exc).__name__}: {exc}"
                out[cname, vname] = got
                env.check_books()
    finally:
        env.close()
    return out


@pytest.fixture(scope="module")
def matrices():
    return {impl.tag: run_matrix(impl.module) for impl in (C, PY)}


@pytest.mark.c_extension
def test_every_hostile_call_works_or_raises_type_or_value_error(matrices):
    escaped = {k: v for m in matrices.values() for k, v in m.items()
               if v.startswith("ESCAPED")}
    assert not escaped
    n = sum(len(m) for m in matrices.values())
    assert n >= 2 * 40 * len(HOSTILE)


@pytest.mark.c_extension
def test_the_twins_answer_every_hostile_call_alike(matrices):
    c, py = matrices["c"], matrices["python"]
    assert c.keys() == py.keys()
    differ = {k: (c[k], py[k]) for k in c if c[k] != py[k]}
    assert not differ


def test_hostile_matrix_on_the_pure_twin_alone():
    # The pure-only run (PYLIMITER_NO_EXTENSIONS, --no-c-extensions) too.
    m = run_matrix(PY.module)
    assert not [k for k, v in m.items() if v.startswith("ESCAPED")]
