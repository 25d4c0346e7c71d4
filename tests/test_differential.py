"""Seeded random operation traces replayed on the C and the Python
implementation: the same grants, in the same order, with the same errors
(type and message)."""

from __future__ import annotations

import asyncio
import copy
import math
import pickle
import random

import pytest

from pylimiter._impls import PY, C

# Requests are made and dropped unawaited on purpose here (misuse, traces);
# both twins warn for each (tests/test_habits.py checks that warning).
pytestmark = [pytest.mark.c_extension,
              pytest.mark.filterwarnings("ignore:pylimiter.*was never awaited:RuntimeWarning")]


def _err(exc: BaseException) -> tuple[str, str]:
    """What a user sees of an error: its type and its message."""
    return type(exc).__name__, str(exc)


async def _settle():
    for _ in range(4):
        await asyncio.sleep(0)


async def _trace(mod, seed: int, steps: int = 150):
    rnd = random.Random(seed)
    sem = mod.AsyncSemaphore(10, max_queue_size=6, timeout=None)
    other = mod.AsyncSemaphore(10)
    foreign = other.try_acquire(1)
    log = []
    tasks = {}     # id -> task
    permits = {}   # id -> permit (granted)
    flags = {}     # id -> is_cancelled answer
    next_id = 0

    def done_cb(i):
        def cb(t):
            if t.cancelled():
                log.append(("cancelled", i))
            elif t.exception() is not None:
                log.append(("error", i, _err(t.exception())))
            else:
                permits[i] = t.result()
                log.append(("granted", i, t.result().permits))
        return cb

    for _ in range(steps):
        op = rnd.choice(["acq", "acq", "acq", "rel", "upd", "cancel", "try",
                         "flag", "max", "acq0", "misuse"])
        if op in ("acq", "acq0"):
            n = 0 if op == "acq0" else rnd.randint(1, 8)
            i = next_id
            next_id += 1
            check = None
            if rnd.random() < 0.3:
                flags[i] = False
                check = (lambda i=i: _answer(flags[i]))
            try:
                req = sem.acquire(n, is_cancelled=check)
            except Exception as e:
                log.append(("call-error", i, _err(e)))
                continue
            t = asyncio.ensure_future(req)
            t.add_done_callback(done_cb(i))
            tasks[i] = t
        elif op == "rel" and permits:
            i = rnd.choice(sorted(permits))
            sem.release(permits.pop(i))
            log.append(("released", i))
        elif op == "upd" and permits:
            i = rnd.choice(sorted(permits))
            n = rnd.randint(0, 9)
            p = permits[i]
            j = next_id
            next_id += 1
            try:
                req = sem.update(p, n)
            except Exception as e:
                log.append(("call-error", j, _err(e)))
                continue
            t = asyncio.ensure_future(req)
            t.add_done_callback(done_cb(j))
            tasks[j] = t
        elif op == "cancel":
            pending = sorted(i for i, t in tasks.items() if not t.done())
            if pending:
                tasks[rnd.choice(pending)].cancel()
        elif op == "try":
            try:
                p = sem.try_acquire(rnd.randint(1, 5))
            except ValueError as e:
                log.append(("try-error", _err(e)))
                continue
            log.append(("try", None if p is None else p.permits))
            if p is not None:
                permits[next_id] = p
                next_id += 1
        elif op == "flag" and flags:
            # True, or a check that raises (it counts as cancelled too).
            flags[rnd.choice(sorted(flags))] = rnd.choice([True, True, "error"])
        elif op == "max":
            # The live switch too: <= 0 is unbounded (grants every queued
            # request); a later bound carries over what is held.
            sem.set_max_permits(rnd.choice([0, -1, *range(4, 15)]))
        elif op == "misuse":
            # Every argument check, on both twins: same type, same text.
            bad = rnd.choice([
                lambda: sem.acquire(-1), lambda: sem.acquire(True), lambda: sem.acquire(99),
                lambda: sem.acquire(1.5), lambda: sem.acquire(1, timeout=-1),
                lambda: sem.acquire(1, timeout="1"), lambda: sem.acquire(1, is_cancelled=3),
                lambda: sem.release(foreign), lambda: sem.release(object()),
                lambda: sem.set_max_permits(1.5), lambda: sem.set_max_permits(2**61),
                lambda: sem.set_max_permits(None), lambda: sem.set_max_permits(True),
                lambda: mod.AsyncSemaphore(2**61), lambda: mod.AsyncSemaphore(1, None),
                lambda: mod.AsyncSemaphore("1"), lambda: sem.try_acquire(2**62),
                # issue 18: hostile values, copies, half-made objects
                lambda: sem.acquire(math.nan), lambda: sem.acquire(1, timeout=math.nan),
                lambda: sem.try_acquire(2**64), lambda: mod.AsyncSemaphore(0).try_acquire(2**63),
                lambda: sem.set_max_permits(-2**63) or sem.set_max_permits(10),
                lambda: sem.acquire_blocking(1, timeout="x"), lambda: sem.release(foreign),
                lambda: copy.copy(sem), lambda: copy.deepcopy(foreign),
                lambda: pickle.dumps(sem.acquire(1)), lambda: sem.__init__(10),
                lambda: mod.AsyncSemaphore.__new__(mod.AsyncSemaphore).acquired_permits,
                lambda: mod.AsyncSemaphore.__new__(mod.AsyncSemaphore).try_acquire(1),
                lambda: type(foreign).__new__(type(foreign)),
            ])
            try:
                bad()
            except Exception as e:
                log.append(("misuse", _err(e)))
            else:
                log.append(("misuse-accepted",))
        await _settle()
        log.append(("state", sem.max_permits, sem.available_permits,
                    sem.acquired_permits, sem.queue_size, sem.locked()))
    sem.close()
    await _settle()
    for p in permits.values():
        sem.release(p)
    other.release(foreign)
    st = sem.stats()
    log.append(("end", sem.acquired_permits, st.acquired_total, st.cancelled_total,
                st.queue_full_total, st.timeout_total))
    return log


def _answer(flag):
    if flag == "error":
        raise ValueError("check failed")
    return flag


@pytest.mark.parametrize("seed", range(40))
def test_same_trace_on_c_and_python(seed):
    c = asyncio.run(_trace(C.module, seed))
    py = asyncio.run(_trace(PY.module, seed))
    assert c == py
    assert c[-1][1] == 0  # nothing leaked
