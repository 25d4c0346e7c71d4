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
from collections import Counter

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pylimiter._impls import PY, C

# Requests are made and dropped unawaited on purpose here (misuse, traces);
# both twins warn for each (tests/test_habits.py checks that warning).
pytestmark = [pytest.mark.c_extension,
              pytest.mark.filterwarnings("ignore:pylimiter.*was never awaited:RuntimeWarning")]

HOSTILE = [-1, 2**63, 2**64, -2**63, True, None, "1", 1.0, math.nan, math.inf,
           -math.inf, [], 0.5]
# Mostly valid (so that requests queue and checks get asked), hostile often.
counts = st.one_of(st.integers(0, 8), st.integers(1, 4), st.sampled_from(HOSTILE))
timeouts = st.sampled_from([None, None, None, None, 1e10, math.inf, 2**70, 0,
                            -1, math.nan, "1", True, []])
#: What the machine saw (checked at the end: it must reach the cases).
SEEN: Counter = Counter()

check_kinds = st.sampled_from([None, "check", "check", "check", "not callable"])
flag_kinds = st.sampled_from(["true", "error", "interrupt", "interrupt", "release", "take",
                              "close", "set_max", "cancel"])


class Check:
    """is_cancelled: False until flagged; then True, or raises, or (once)
    re-enters the semaphore from inside the check and answers False."""

    def __init__(self, side):
        self.side = side
        self.kind = None

    def __call__(self):
        kind, s = self.kind, self.side
        if kind == "true":
            return True
        if kind == "error":
            raise ValueError("check failed")
        if kind == "interrupt":
            raise KeyboardInterrupt("check interrupted")
        self.kind = None
        if kind is not None:
            SEEN[f"re-entered: {kind}"] += 1
        if kind == "release" and s.permits:
            s.sem.release(s.permits.pop(min(s.permits)))
        elif kind == "take":
            p = s.sem.try_acquire(1)
            if p is not None:
                s.permits[-len(s.permits) - 1] = p
        elif kind == "close":
            s.sem.close()
        elif kind == "set_max":
            s.sem.set_max_permits(s.sem.max_permits + 2)
        elif kind == "cancel":
            for t in s.tasks.values():
                if not t.done():
                    t.cancel()
                    break
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
        self.sem = mod.AsyncSemaphore(4, max_queue_size=6, timeout=None)
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
        SEEN["calls"] += 1
        if got[0][0] == "raise":
            SEEN[f"raised {got[0][1]}"] += 1
        for name in steps[0]:
            SEEN[f"loop raised {name}"] += 1
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
        side.checks[i] = Check(side)
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

    @precondition(lambda self: any(not t.done() for t in self.sides[0].tasks.values()))
    @rule(data=st.data())
    def cancel(self, data):
        pending = sorted(i for i, t in self.sides[0].tasks.items() if not t.done())
        i = data.draw(st.sampled_from(pending))
        self.both(lambda s: s.tasks[i].cancel())

    def waiting_checks(self):
        """Checks of requests still waiting: the ones that will be asked."""
        s = self.sides[0]
        return sorted(i for i in s.checks if i in s.tasks and not s.tasks[i].done())

    @precondition(lambda self: self.waiting_checks())
    @rule(data=st.data(), kind=flag_kinds)
    def flag(self, data, kind):
        i = data.draw(st.sampled_from(self.waiting_checks()))

        def go(s):
            s.checks[i].kind = kind

        self.both(go)

    @rule(m=st.one_of(st.integers(1, 6), st.integers(1, 6), st.integers(-2, 0),
                      st.sampled_from(HOSTILE)))
    def set_max(self, m):
        self.both(lambda s: s.sem.set_max_permits(m))

    @precondition(lambda self: self.next > 60)
    @rule()
    def close(self):
        self.both(lambda s: s.sem.close())

    @rule(what=st.sampled_from([
        "release hostile", "release object", "copy sem", "deepcopy permit",
        "pickle request", "copy request", "uninit acquire", "uninit try_acquire",
        "uninit acquire_blocking", "uninit stats", "uninit close", "uninit set_max",
        "uninit locked", "uninit release", "uninit acquired_permits", "reinit"]),
        v=st.sampled_from(HOSTILE))
    def misuse(self, what, v):
        def go(s):
            permit = next(iter(s.permits.values()), s.sem)
            cls = s.mod.AsyncSemaphore
            u = cls.__new__(cls)
            verb, _, obj = what.partition(" ")
            if verb == "release":
                return s.sem.release(v if obj == "hostile" else object())
            if verb in ("copy", "deepcopy", "pickle"):
                target = {"sem": s.sem, "permit": permit,
                          "request": s.sem.acquire(0) if not s.sem.closed else s.sem}[obj]
                return {"copy": copy.copy, "deepcopy": copy.deepcopy,
                        "pickle": pickle.dumps}[verb](target)
            if what == "reinit":
                return s.sem.__init__(3)    # a second __init__ of a live one
            if obj in ("acquire", "try_acquire", "acquire_blocking", "set_max"):
                return getattr(u, "set_max_permits" if obj == "set_max" else obj)(1)
            if obj == "release":
                return u.release(permit)
            if obj == "acquired_permits":
                return u.acquired_permits
            return getattr(u, obj)()

        self.both(go)

    @precondition(lambda self: self.waiting_checks())
    @rule(kind=st.sampled_from(["interrupt", "interrupt", "interrupt", "error", "true",
                                "release", "take", "close", "set_max", "cancel"]),
          how=st.sampled_from(["release", "set_max", "set_max", "cancel"]))
    def flag_then_move(self, kind, how):
        # The oldest waiting check answers `kind`, then the queue moves: a
        # release, a higher limit, or a cancelled waiter (whose check is
        # asked from inside Task.cancel()).
        i = self.waiting_checks()[0]

        def go(s):
            s.checks[i].kind = kind
            if how == "release" and s.permits:
                s.sem.release(s.permits.pop(max(s.permits)))
            elif how == "cancel":
                pending = [t for j, t in sorted(s.tasks.items()) if not t.done() and j != i]
                if pending:
                    pending[0].cancel()
            else:
                s.sem.set_max_permits(max(s.sem.max_permits, 0) + 1)

        self.both(go)

    @precondition(lambda self: self.sides[0].permits)
    @rule()
    def release_all(self):
        # Moves the queue as far as it goes: every head's check is asked.
        def go(s):
            for i in sorted(s.permits):
                s.sem.release(s.permits.pop(i))

        self.both(go)

    @rule(n=st.integers(1, 3), k=st.integers(2, 4), kind=check_kinds)
    def queue_up(self, n, k, kind):
        # A few requests at once, mostly with checks: the queue and its
        # head's check are where re-entry and interrupts matter.
        for _ in range(n):
            i = self.new_id()

            def go(s, i=i):
                req = s.sem.acquire(k, is_cancelled=self._check_for(s, i, kind))
                s.tasks[i] = s.loop.create_task(req)
                return req

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
    SEEN.clear()
    TwinsMachine.TestCase.settings = settings(
        max_examples=200, stateful_step_count=40, deadline=None,
        suppress_health_check=[HealthCheck.too_slow])
    # Interrupts at the head need a queue, a check and a re-entry to line
    # up: a run of 200 random sequences nearly always gets there (20-30
    # times), once in a fresh-clone run it did not; another run then does.
    for _ in range(3):
        TwinsMachine.TestCase().runTest()
        if SEEN["raised KeyboardInterrupt"] > 0:
            break
    # It reached what it is for (a database replay may be short: a floor).
    print("\n".join(f"{k}: {v}" for k, v in sorted(SEEN.items())))
    assert SEEN["calls"] >= 500
    for kind in ("TypeError", "ValueError", "RuntimeError", "KeyboardInterrupt"):
        assert SEEN[f"raised {kind}"] > 0, kind
