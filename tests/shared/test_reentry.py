"""A finaliser that gives a shared permit back, run by the collector while
its own thread is inside the limiter.

With a request queued, a release goes through the host's lock.  If the
thread the finaliser runs in held that lock (it made a refusal's exception,
or a queued request's waiter, under it), the release waited for its own
thread's lock: the lock timeout (10 s) later it failed, and the permit was
lost to the host until the process died.  Only C runs under the lock now;
these tests fail against the old code (each release fails after the 0.3 s
lock timeout set here).  Both twins."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import time
import weakref

import pytest

from pylimiter import PermitAcquireQueueFullError, PermitAcquireTimeoutError
from tests._helpers import wait_until


class _Conn:
    """What users hang permits on: an object whose finaliser gives its
    permit back.  Each is put in a cycle, so only the collector frees it."""

    def __init__(self, sem, held):
        self.sem = sem
        self.held = held
        self.me = self

    def __del__(self):
        if self.held:
            self.sem.release(self.held.pop())


@pytest.fixture
def unraisable(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    return seen


@pytest.fixture
def collect_often():
    old = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    try:
        yield
    finally:
        gc.set_threshold(*old)


@pytest.mark.parametrize("refusal", ["timeout-zero", "queued-then-timed-out", "queue-full"])
def test_a_finaliser_giving_a_permit_back_inside_a_refusal(shm, name, unraisable,
                                                           collect_often, refusal):
    sem = shm.SharedSemaphore(name, max_permits=1000,
                              max_queue_size=2 if refusal == "queue-full" else 10000)
    sem._set_lock_timeout(0.3)
    keep = sem.acquire_blocking(1, timeout=None)   # the waiters wait until the end
    held = [sem.acquire_blocking(1, timeout=None) for _ in range(60)]
    # Queued for more than there is: every release now takes the lock.
    waiters = [threading.Thread(target=_wait_for_all, args=(sem,), daemon=True)
               for _ in range(2 if refusal == "queue-full" else 1)]
    for t in waiters:
        t.start()
    deadline = time.monotonic() + 10
    while sem.queue_size < len(waiters):
        assert time.monotonic() < deadline, "the waiters never queued"
        time.sleep(0.01)
    timeout = {"timeout-zero": 0, "queued-then-timed-out": 0.0005,
               "queue-full": None}[refusal]
    deadline = time.monotonic() + 20
    refused = PermitAcquireTimeoutError if refusal != "queue-full" else PermitAcquireQueueFullError
    while held and not unraisable and time.monotonic() < deadline:
        with pytest.raises(refused):
            # Garbage from here: the next allocation the collector counts
            # frees it, and nothing between here and the limiter allocates.
            _Conn(sem, held)
            sem.acquire_blocking(900, timeout=timeout)
    gc.collect()
    assert unraisable == [], f"a finaliser's release failed: {unraisable[:1]!r}"
    assert held == [], "the collector never ran a finaliser"
    assert sem.acquired_permits == 1
    # Every permit the finalisers gave back is the host's again: the
    # waiters get all of it, one after the other.
    sem.release(keep)
    for t in waiters:
        t.join(10)
        assert not t.is_alive()
    assert sem.acquired_permits == 0 and sem.available_permits == 1000
    sem.close()


def _wait_for_all(sem):
    sem.release(sem.acquire_blocking(1000, timeout=None))


# ---- the pure twin: its sections are Python, so the collector can run there ----


@pytest.fixture
def pure(impl):
    if not impl.is_pure_python:
        pytest.skip("the C twin runs no Python code under the host's lock (above)")


def _inside_every_section(sem, monkeypatch, fn):
    """Run fn() once, as a finaliser would, inside the next critical section
    of sem's segment (just after its lock is taken)."""
    # Weakly: the patch must not hold the segment (CPython 3.11 runs a
    # finaliser freed by the class attribute's restore with the class in
    # the middle of the store, and crashes).
    seg = weakref.ref(sem._seg)
    once = [fn]
    real = type(sem._seg).lock

    def lock(self):
        real(self)
        if self is seg() and once:
            once.pop()()

    monkeypatch.setattr(type(sem._seg), "lock", lock)


def test_pure_a_release_inside_a_section_completes_as_it_ends(shm, name, pure, monkeypatch):
    sem = shm.SharedSemaphore(name, max_permits=4)
    a = sem.acquire_blocking(3, timeout=None)
    seen = []
    _inside_every_section(sem, monkeypatch, lambda: (sem.release(a), seen.append(a.permits)))
    # The section that runs it: a try_acquire refused for want of permits.
    assert sem.try_acquire(2) is None
    assert seen == [3], "the release was done inside the half-done section"
    wait_until(lambda: a.permits == 0, 10, "the deferred release never ran")
    assert sem.available_permits == 4 and sem.acquired_permits == 0


def test_pure_a_deferred_release_and_another_release_count_once(shm, name, pure, monkeypatch):
    """The deferred release and an explicit one of the same permit (it is
    still 3 until the deferred one runs) give back 3, not 6."""
    sem = shm.SharedSemaphore(name, max_permits=10)
    a = sem.acquire_blocking(3, timeout=None)
    b = sem.acquire_blocking(3, timeout=None)
    _inside_every_section(sem, monkeypatch, lambda: sem.release(a))
    assert sem.try_acquire(5) is None
    sem.release(a)
    wait_until(lambda: not [t for t in threading.enumerate() if t.name == "pylimiter-deferred"],
               10, "the deferred release never ended")
    assert a.permits == 0 and b.permits == 3
    assert sem.acquired_permits == 3 and sem.available_permits == 7
    sem.release(b)


def test_pure_a_release_of_another_attachment_inside_a_section(shm, name, pure, monkeypatch):
    """Another attachment's lock is the host's file lock, which this thread's
    section holds: done there, the release waited out the lock timeout and
    was lost."""
    sem = shm.SharedSemaphore(name, max_permits=4)
    other = shm.SharedSemaphore(name, max_permits=4)
    other._set_lock_timeout(0.3)
    p = other.acquire_blocking(2, timeout=None)
    errors = []

    def release_other():
        try:
            other.release(p)
        except Exception as e:   # noqa: BLE001 - what the old code raised
            errors.append(e)

    _inside_every_section(sem, monkeypatch, release_other)
    assert sem.try_acquire(3) is None
    wait_until(lambda: p.permits == 0 or errors, 10, "the deferred release never ran")
    assert errors == [] and sem.acquired_permits == 0 and sem.available_permits == 4
    other.close()


def test_pure_an_async_with_exit_inside_a_section_gives_the_permit_back(shm, name, pure,
                                                                        monkeypatch):
    """A coroutine suspended inside `async with sem:` and closed there (as
    the collector closes a dropped one) exits the block: its permit goes
    back as the section ends."""
    sem = shm.SharedSemaphore(name, max_permits=4)

    class Suspend:
        def __await__(self):
            yield "suspended"

    async def holder():
        async with sem:
            await Suspend()

    coro = holder()
    assert coro.send(None) == "suspended" and sem.acquired_permits == 1
    _inside_every_section(sem, monkeypatch, coro.close)
    assert sem.try_acquire(4) is None
    wait_until(lambda: sem.acquired_permits == 0, 10, "the block's permit never came back")
    assert sem.available_permits == 4


def test_pure_a_blocking_wait_granted_from_its_own_thread(shm, name, pure, monkeypatch):
    """A finaliser run while the thread waits for its queued request (here
    where the collector ran in a stress test: a threading.Condition's exit)
    gives back the permit that request waits for.  The waiter's wake-up was
    a threading.Event, whose set() waited there for the lock its own thread
    held, for ever."""
    sem = shm.SharedSemaphore(name, max_permits=1)
    held = sem.acquire_blocking(1, timeout=None)
    me = []
    real_exit = threading.Condition.__exit__

    def exit_(self, *a):
        if me and threading.current_thread() is me[0] and held.permits:
            sem.release(held)
        return real_exit(self, *a)

    monkeypatch.setattr(threading.Condition, "__exit__", exit_)
    got = []

    def waiter():
        me.append(threading.current_thread())
        got.append(sem.acquire_blocking(1, timeout=5))

    t = threading.Thread(target=waiter, daemon=True)
    t.start()
    wait_until(lambda: sem.queue_size == 1, 10, "the waiter never queued")
    # Long enough for a wait that polls to leave one of its waits.
    time.sleep(0.3)
    if held.permits:   # its thread ran no Condition code: released from here
        sem.release(held)
    t.join(10)
    assert not t.is_alive(), "the waiter's thread waits for itself"
    assert got and got[0].permits == 1
    sem.release(got[0])
    assert sem.acquired_permits == 0


def test_pure_a_cancel_inside_a_section_leaves_the_queue_as_it_ends(shm, name, pure,
                                                                   monkeypatch):
    sem = shm.SharedSemaphore(name, max_permits=1)
    held = sem.acquire_blocking(1, timeout=None)

    async def main():
        task = asyncio.ensure_future(sem.acquire(1, timeout=None))
        await asyncio.sleep(0)
        for _ in range(100):
            if sem.queue_size == 1:
                break
            await asyncio.sleep(0.01)
        assert sem.queue_size == 1
        # The waiting coroutine closed inside another section (a task
        # dropped and collected there leaves its queue the same way).
        _inside_every_section(sem, monkeypatch, lambda: task.get_coro().close())
        assert sem.try_acquire(1) is None
        for _ in range(1000):
            if sem.queue_size == 0:
                break
            await asyncio.sleep(0.01)
        return task

    loop = asyncio.new_event_loop()
    try:
        task = loop.run_until_complete(main())
        task.cancel()
        loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    finally:
        loop.close()
    assert sem.queue_size == 0
    sem.release(held)
    assert sem.available_permits == 1


def test_pure_anything_else_inside_a_section_is_refused_at_once(shm, name, pure, monkeypatch):
    sem = shm.SharedSemaphore(name, max_permits=4)
    errors = []

    def other():
        try:
            sem.try_acquire(1)
        except RuntimeError as e:
            errors.append(str(e))

    _inside_every_section(sem, monkeypatch, other)
    p = sem.acquire_blocking(1, timeout=None)
    assert errors and "finaliser or a signal handler" in errors[0]
    sem.release(p)
    assert sem.available_permits == 4


_EXIT_SCRIPT = r'''
import os, sys
from pylimiter import _shared_py as sp
sem = sp.SharedSemaphore("exit-%d" % os.getpid(), max_permits=300, directory=sys.argv[1])
permits = [sem.try_acquire(1) for _ in range(200)]

class Conn:
    def __init__(self, p):
        self.p = p
    def __del__(self):   # at module teardown
        sem.release(self.p)
        sys.stderr.write("released at exit\n")

conn = Conn(sem.try_acquire(1))
# Releases made inside a section, as finalisers there would: deferred.
sem._seg.run_locked(lambda: [sem.release(p) for p in permits])
'''


def test_pure_the_interpreter_exits_after_deferred_releases(shm_dir, pure):
    """Deferred work must not keep a lock that a finaliser at exit needs (a
    daemon thread frozen at exit holding the thread lock hung the exit)."""
    import subprocess
    r = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, shm_dir], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PYLIMITER_NO_EXTENSIONS": "1"})
    assert r.returncode == 0, r.stderr
    assert "released at exit" in r.stderr

