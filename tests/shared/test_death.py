"""Issue 33, point 6: a process that dies (SIGKILL, at any instruction)
loses nothing for the others.  Its permits return and its queued requests
leave at once when the next operation finds it dead, and within 1 s while
any attached process waits; a death inside a critical section (crash points:
SIGKILL between two stores) is repaired; after every death the books
balance."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import threading
import time

import pytest

from tests.shared import _workers
from tests.shared.test_processes import books, get, wait_until


def _hold_in_child(impl, name, shm_dir, children, n, limit):
    ctx = multiprocessing.get_context("fork")
    events, stop = ctx.Queue(), ctx.Event()
    child = children.start("fork", _workers.hold, impl.tag, name, shm_dir,
                           {"max_permits": limit}, n, events, stop)
    assert get(events)[:3] == ("held", child.pid, n)
    return child


def test_a_killed_holders_permits_come_back_at_the_next_look(impl, shm, name, shm_dir,
                                                              children):
    sem = shm.SharedSemaphore(name, 5)
    try:
        child = _hold_in_child(impl, name, shm_dir, children, 4, 5)
        assert sem.acquired_permits == 4
        children.kill(child)
        # holders() looks for dead processes itself: at once.
        assert sem.holders() == {os.getpid(): 0}
        assert sem.acquired_permits == 0 and sem.available_permits == 5
        books(sem)
    finally:
        sem.close()


def test_try_acquire_finds_a_dead_holder_within_a_second(impl, shm, name, shm_dir, children):
    """A refused try_acquire looks for dead processes: the dead holder's
    permits are back within 1 s (at once, in fact) without any other call."""
    sem = shm.SharedSemaphore(name, 3)
    try:
        child = _hold_in_child(impl, name, shm_dir, children, 3, 3)
        assert sem.try_acquire(1) is None
        children.kill(child)
        deadline = time.monotonic() + 1.0
        p = None
        while p is None and time.monotonic() < deadline:
            p = sem.try_acquire(3)
            time.sleep(0.01)
        assert p is not None, "the dead holder's permits did not come back within 1 s"
        sem.release(p)
        books(sem)
    finally:
        sem.close()


@pytest.mark.parametrize("look", ["acquired_permits", "available_permits", "try_acquire",
                                  "acquire_blocking", "await acquire", "stats", "locked"])
def test_the_next_operation_after_a_death_finds_it_at_once(impl, shm, name, shm_dir, children,
                                                           look):
    """Point 6: "at once when the next operation finds it dead" -- even when
    a timed sweep ran just before the death (the counts were just read)."""
    sem = shm.SharedSemaphore(name, 4)
    try:
        child = _hold_in_child(impl, name, shm_dir, children, 4, 4)
        assert sem.acquired_permits == 4 and sem.try_acquire(1) is None   # a sweep ran now
        children.kill(child)
        if look == "acquired_permits":
            assert sem.acquired_permits == 0
        elif look == "available_permits":
            assert sem.available_permits == 4
        elif look == "stats":
            assert sem.stats().acquired_permits == 0
        elif look == "locked":
            assert not sem.locked()
        else:
            if look == "try_acquire":
                p = sem.try_acquire(4)
            elif look == "acquire_blocking":
                p = sem.acquire_blocking(4, timeout=0)
            else:
                p = asyncio.run(sem.acquire(4, timeout=0))
            assert p is not None and p.permits == 4
            assert sem.acquired_permits == 4
            sem.release(p)
        assert sem.holders() == {os.getpid(): 0}
        books(sem)
    finally:
        sem.close()


def test_a_killed_waiter_leaves_the_queue(impl, shm, name, shm_dir, children):
    ctx = multiprocessing.get_context("fork")
    events = ctx.Queue()
    sem = shm.SharedSemaphore(name, 2)
    try:
        p = sem.acquire_blocking(2)
        child = children.start("fork", _workers.wait_one, impl.tag, name, shm_dir,
                               {"max_permits": 2}, 1, "task", None, events)
        wait_until(lambda: sem.queue_size == 1, what="child queued")
        children.kill(child)
        assert child.pid not in sem.holders()
        assert sem.queue_size == 0
        books(sem)
        sem.release(p)
    finally:
        sem.close()


@pytest.mark.parametrize("how", ["thread", "task"])
def test_a_waiter_here_gets_a_dead_holders_permits(impl, shm, name, shm_dir, children, how):
    """Nobody releases: only the waiter's own look for dead processes (every
    250 ms at most) can give it the permits."""
    sem = shm.SharedSemaphore(name, 3)
    try:
        child = _hold_in_child(impl, name, shm_dir, children, 3, 3)
        out = []

        def thread():
            out.append(sem.acquire_blocking(3, timeout=None))

        async def task():
            out.append(await sem.acquire(3, timeout=None))

        t = threading.Thread(target=thread if how == "thread" else lambda: asyncio.run(task()))
        t.start()
        wait_until(lambda: sem.queue_size == 1, what="queued")
        t0 = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        t.join(30)
        took = time.monotonic() - t0
        assert out and out[0].permits == 3, "the waiter never got the dead holder's permits"
        print(f"dead holder's permits reached the {how} after {took * 1000:.0f} ms")
        sem.release(out[0])
        child.join(10)
        books(sem)
    finally:
        sem.close()


def test_when_every_process_died_the_next_open_starts_fresh(impl, shm, name, shm_dir,
                                                            children):
    a = _hold_in_child(impl, name, shm_dir, children, 2, 5)
    b = _hold_in_child(impl, name, shm_dir, children, 3, 5)
    children.kill(a)
    children.kill(b)
    sem = shm.SharedSemaphore(name, 5)
    try:
        assert sem.acquired_permits == 0 and sem.holders() == {os.getpid(): 0}
        assert sem.try_acquire(5) is not None
    finally:
        sem.close()


CRASH_OPS = ["acquire", "release", "acquire_locked", "release_locked", "grant", "enqueue",
             "update", "set_max", "close"]


def _crash_case(impl, shm, name, shm_dir, children, op, k):
    ctx = multiprocessing.get_context("fork")
    events, go = ctx.Queue(), ctx.Event()
    limit = 3
    sem = shm.SharedSemaphore(name, limit)
    try:
        blocker = None
        if op == "enqueue":
            blocker = sem.acquire_blocking(limit - 1)   # the child's request must queue
        child = children.start("fork", _workers.crash_at, impl.tag, name, shm_dir,
                               {"max_permits": limit}, op, k, events, go)
        assert get(events) == ("ready", child.pid)
        out = []
        t = None
        if op == "grant":
            t = threading.Thread(target=lambda: out.append(sem.acquire_blocking(limit,
                                                                                 timeout=30)))
            t.start()
            wait_until(lambda: sem.queue_size == 1, what="parent queued")
        go.set()
        child.join(30)
        assert child.exitcode in (-signal.SIGKILL, 0), child.exitcode
        if child.exitcode == 0:
            # Fewer crash points than k: the operation finished.
            assert get(events)[0] == "finished"
        assert child.pid not in sem.holders()
        books(sem)
        if blocker is not None:
            sem.release(blocker)
        if t is not None:
            t.join(30)
            assert out and out[0].permits == limit
            sem.release(out[0])
        assert sem.acquired_permits == 0 and sem.queue_size == 0
        sem.set_max_permits(limit)
        held = sem.try_acquire(limit)
        assert held is not None
        sem.release(held)
        books(sem)
        return child.exitcode == -signal.SIGKILL
    finally:
        sem.close()
        shm.SharedSemaphore.unlink(name)


@pytest.mark.parametrize("op", CRASH_OPS)
def test_death_inside_a_critical_section_first_points(impl, shm, name, shm_dir, children, op):
    assert _crash_case(impl, shm, name, shm_dir, children, op, 1)


@pytest.mark.slow
@pytest.mark.parametrize("op", CRASH_OPS)
def test_death_at_every_crash_point(impl, shm, name, shm_dir, children, op):
    died = 0
    for k in range(2, 12):
        if not _crash_case(impl, shm, f"{name}-{k}", shm_dir, children, op, k):
            break
        died += 1
    print(f"{op}: died at crash points 1..{died + 1}")


def _random_kills(impl, shm, name, shm_dir, children, kills, nworkers, seed):
    """`nworkers` churning processes; one is SIGKILLed at a random moment
    and replaced, `kills` times; after each kill the dead process is gone
    from holders() and the books balance (read in one critical section
    while the others keep working)."""
    rng = random.Random(seed)
    kw = {"max_permits": 4, "max_queue_size": 16}
    sem = shm.SharedSemaphore(name, **kw)
    try:
        def spawn(i):
            # No multiprocessing.Queue here: a child killed while its feeder
            # thread holds the queue's lock (a POSIX semaphore, not robust)
            # would block every later writer.  The host's holders say when
            # it is up.
            p = children.start("fork", _workers.churn, impl.tag, name, shm_dir, kw,
                               seed * 997 + i)
            wait_until(lambda: p.pid in sem.holders(), what="worker attached")
            return p

        workers = [spawn(i) for i in range(nworkers)]
        for i in range(kills):
            time.sleep(rng.random() * 0.03)
            j = rng.randrange(nworkers)
            victim = workers[j]
            assert victim.is_alive(), f"worker {victim.pid} died by itself ({victim.exitcode})"
            children.kill(victim)
            assert victim.pid not in sem.holders()
            books(sem)
            children.procs.remove(victim)
            workers[j] = spawn(nworkers + i)
        for w in workers:
            children.kill(w)
            children.procs.remove(w)
        assert sem.holders() == {os.getpid(): 0}
        assert sem.acquired_permits == 0 and sem.queue_size == 0
        books(sem)
        assert sem.try_acquire(4) is not None
    finally:
        sem.close()


def test_random_kills(impl, shm, name, shm_dir, children):
    _random_kills(impl, shm, name, shm_dir, children, kills=10, nworkers=3, seed=1)


@pytest.mark.slow
def test_200_random_kills(impl, shm, name, shm_dir, children):
    _random_kills(impl, shm, name, shm_dir, children, kills=200, nworkers=4, seed=2)


def test_a_new_open_takes_the_lock_over_from_the_dead_holder_of_its_slot(impl, shm, name,
                                                                          shm_dir, children):
    """A process dies holding the host's lock; the next process to open
    registers in the dead one's slot, so the lock word names that slot: it
    is a dead holder (another generation), not another thread of ours."""
    ctx = multiprocessing.get_context("fork")
    events, go = ctx.Queue(), ctx.Event()
    first = shm.SharedSemaphore(name, 3)   # keeps the segment alive (no re-init)
    try:
        child = children.start("fork", _workers.crash_at, impl.tag, name, shm_dir,
                               {"max_permits": 3}, "acquire", 1, events, go)
        assert get(events) == ("ready", child.pid)
        go.set()
        child.join(30)
        assert child.exitcode == -signal.SIGKILL
        second = shm.SharedSemaphore(name, 3)   # registers in the dead child's slot
        try:
            assert second.holders() == {os.getpid(): 0}
            assert second.acquired_permits == 0
            books(second)
        finally:
            second.close()
    finally:
        first.close()
