"""Hypothesis state machine: the C twin and the pure twin driven side by
side with the same operations (issue 18), exceptions included.  Every call
must give the same result or raise the same exception type with the same
message, every task must end the same way, and the books must match after
every step: hostile arguments, is_cancelled checks that answer true or raise
an Exception or KeyboardInterrupt (at the call and at the queue's head),
updates, cancels, limit changes, close, copy/pickle, and objects that were
never initialised.  (tests/test_stateful.py holds each twin against a model
of the FIFO queue; tests/test_differential.py replays seeded traces.)"""

from __future__ import annotations

import asyncio
import copy
import math
import pickle

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pylimiter._impls import PY, C

pytestmark = pytest.mark.c_extension

HOSTILE = [-1, 2**63, 2**64, -2**63, True, None, "1", 1.0, math.nan, math.inf,
           -math.inf, [], 0.5]
counts = st.one_of(st.integers(-1, 10), st.sampled_from(HOSTILE))
timeouts = st.sampled_from([None, 0, 0.0, 1e10, math.inf, -1, math.nan, "1", True, [],
                            2**70])
check_kinds = st.sampled_from([None, "check", "check", "not callable"])
flag_kinds = st.sampled_from(["true", "error", "interrupt"])


class Check:
    """is_cancelled: False until flagged; then True, or raises."""

    def __init__(self):
        self.kind = None

    def __call__(self):
        if self.kind == "true":
            return True
        if self.kind == "error":
            raise ValueError("check failed")
        if self.kind == "interrupt":
            raise KeyboardInterrupt("check interrupted")
        return False


def shape(value):
    """What a result looks like, independent of the twin."""
    name = type(value).__name__
    if name in ("SemaphorePermit", "DualMemoryPermit"):
        return ("permit", value.permits)
    if name in ("_Request", "_DualRequest"):
        return "request"
    if isinstance(value, (int, float, bool, str, type(None))):
        return value
    return name


def call(fn):
    """("ok", shape) or ("raise", type name, message)."""
    try:
        return ("ok", shape(fn()))
    except BaseException as exc:   # noqa: BLE001 - compared between twins
        return ("raise", type(exc).__name__, str(exc))


class Side:
    """One twin: its loop, semaphore, tasks, permits and checks."""

    def __init__(self, mod):
        self.mod = mod
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda lp, ctx: None)
        self.sem = mod.AsyncSemaphore(8, max_queue_size=4, timeout=None)
        self.tasks = {}
        self.permits = {}
        self.checks = {}

    def step(self):
        """Run the loop until quiet; a KeyboardInterrupt out of it (from a
        check a task's first step asked) is recorded and the loop goes on."""
        out = []
        for _ in range(20):
            try:
                self.loop.run_until_complete(self._quiet())
                break
            except BaseException as exc:   # noqa: BLE001
                out.append(type(exc).__name__)
        for i, t in list(self.tasks.items()):
            if t.done() and not t.cancelled() and t.exception() is None:
                r = t.result()
                # An update's result is the permit it updated: kept once.
                if r is not None and all(r is not q for q in self.permits.values()):
                    self.permits[i] = r
        return out

    async def _quiet(self):
        for _ in range(6):
            await asyncio.sleep(0)

    def task_outcomes(self):
        out = {}
        for i, t in self.tasks.items():
            if not t.done():
                out[i] = "pending"
            elif t.cancelled():
                out[i] = "cancelled"
            elif t.exception() is not None:
                e = t.exception()
                out[i] = (type(e).__name__, str(e), type(e.__cause__).__name__)
            else:
                out[i] = shape(t.result())
        return out

    def books(self):
        s = self.sem
        st_ = s.stats()
        return (s.max_permits, s.available_permits, s.acquired_permits, s.queue_size,
                s.closed, s.locked(), st_.acquired_total, st_.timeout_total,
                st_.queue_full_total, st_.cancelled_total, st_.wait_seconds_count)

    def close(self):
        self.sem.close()
        self.step()
        for t in self.tasks.values():
            t.cancel()
        self.step()
        for p in self.permits.values():
            self.sem.release(p)
        self.loop.close()


class TwinsMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.sides = [Side(C.module), Side(PY.module)]
        self.next = 0

    def both(self, fn):
        """fn(side) on both twins; the outcomes must agree."""
        got = [call(lambda s=s: fn(s)) for s in self.sides]
        assert got[0] == got[1], got
        steps = [s.step() for s in self.sides]
        assert steps[0] == steps[1], steps
        return got[0]

    def teardown(self):
        for s in self.sides:
            s.close()

    def new_id(self):
        self.next += 1
        return self.next

    def _check_for(self, side, i, kind):
        if kind is None:
            return None
        if kind == "not callable":
            return 42
        side.checks[i] = Check()
        return side.checks[i]

    @rule(n=counts, timeout=timeouts, kind=check_kinds, how=st.sampled_from(
        ["ensure_future", "create_task"]))
    def acquire(self, n, timeout, kind, how):
        i = self.new_id()

        def go(s):
            req = s.sem.acquire(n, timeout=timeout, is_cancelled=self._check_for(s, i, kind))
            spawn = getattr(asyncio, how) if how == "ensure_future" else s.loop.create_task
            s.tasks[i] = spawn(req, loop=s.loop) if how == "ensure_future" else spawn(req)
            return req

        self.both(go)

    @rule(n=counts, timeout=timeouts, kind=check_kinds)
    def acquire_blocking_now(self, n, timeout, kind):
        # Never waits: a valid timeout becomes 0; an invalid one is refused
        # before anything could wait.
        i = self.new_id()
        valid = timeout is None or (type(timeout) in (int, float) and timeout >= 0)

        def go(s):
            p = s.sem.acquire_blocking(n, timeout=0 if valid else timeout,
                                       is_cancelled=self._check_for(s, i, kind))
            s.permits[i] = p
            return p

        self.both(go)

    @rule(n=counts)
    def try_acquire(self, n):
        i = self.new_id()

        def go(s):
            p = s.sem.try_acquire(n)
            if p is not None:
                s.permits[i] = p
            return p

        self.both(go)

    @precondition(lambda self: self.sides[0].permits)
    @rule(data=st.data())
    def release(self, data):
        i = data.draw(st.sampled_from(sorted(self.sides[0].permits)))
        self.both(lambda s: s.sem.release(s.permits.pop(i)))

    @precondition(lambda self: self.sides[0].permits)
    @rule(data=st.data(), n=counts, kind=check_kinds, blocking=st.booleans())
    def update(self, data, n, kind, blocking):
        i = data.draw(st.sampled_from(sorted(self.sides[0].permits)))
        j = self.new_id()

        def go(s):
            p = s.permits[i]
            if blocking:
                return s.sem.update_blocking(p, n, timeout=0,
                                             is_cancelled=self._check_for(s, j, kind))
            req = s.sem.update(p, n, is_cancelled=self._check_for(s, j, kind))
            s.tasks[j] = s.loop.create_task(req)
            return req

        self.both(go)

    @rule(v=st.sampled_from(HOSTILE + [object(), "x"]))
    def release_hostile(self, v):
        self.both(lambda s: s.sem.release(v))

    @precondition(lambda self: any(not t.done() for t in self.sides[0].tasks.values()))
    @rule(data=st.data())
    def cancel(self, data):
        pending = sorted(i for i, t in self.sides[0].tasks.items() if not t.done())
        i = data.draw(st.sampled_from(pending))
        self.both(lambda s: s.tasks[i].cancel())

    @precondition(lambda self: self.sides[0].checks)
    @rule(data=st.data(), kind=flag_kinds)
    def flag(self, data, kind):
        i = data.draw(st.sampled_from(sorted(self.sides[0].checks)))

        def go(s):
            s.checks[i].kind = kind

        self.both(go)

    @rule(m=st.one_of(st.integers(-2, 12), st.sampled_from(HOSTILE)))
    def set_max(self, m):
        self.both(lambda s: s.sem.set_max_permits(m))

    @precondition(lambda self: self.next > 20)
    @rule()
    def close(self):
        self.both(lambda s: s.sem.close())

    @rule(how=st.sampled_from(["copy", "deepcopy", "pickle"]),
          what=st.sampled_from(["sem", "permit", "request"]))
    def copy_something(self, how, what):
        def go(s):
            obj = {"sem": s.sem, "request": s.sem.acquire(0) if not s.sem.closed else s.sem,
                   "permit": next(iter(s.permits.values()), s.sem)}[what]
            return {"copy": copy.copy, "deepcopy": copy.deepcopy,
                    "pickle": pickle.dumps}[how](obj)

        self.both(go)

    @rule(method=st.sampled_from(["acquire", "try_acquire", "acquire_blocking", "stats",
                                  "close", "set_max_permits", "locked", "release",
                                  "acquired_permits", "__init__"]))
    def uninitialised(self, method):
        def go(s):
            cls = s.mod.AsyncSemaphore
            u = cls.__new__(cls)
            if method in ("acquire", "try_acquire", "acquire_blocking", "set_max_permits"):
                return getattr(u, method)(1)
            if method == "release":
                return u.release(next(iter(s.permits.values()), None))
            if method == "acquired_permits":
                return u.acquired_permits
            if method == "__init__":
                return s.sem.__init__(3)    # a second __init__ of a live one
            return getattr(u, method)()

        self.both(go)

    @invariant()
    def same_everywhere(self):
        a, b = self.sides
        assert a.books() == b.books()
        assert a.task_outcomes() == b.task_outcomes()
        assert sorted(a.permits) == sorted(b.permits)
        assert [p.permits for _, p in sorted(a.permits.items())] == \
               [p.permits for _, p in sorted(b.permits.items())]
        # The books balance on each twin.
        held = sum(p.permits for p in a.permits.values())
        assert a.sem.acquired_permits >= held >= 0


def test_twins_agree_step_by_step_exceptions_included():
    TwinsMachine.TestCase.settings = settings(
        max_examples=150, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow])
    TwinsMachine.TestCase().runTest()
