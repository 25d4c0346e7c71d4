"""Issue 33 across processes (spawn and fork; threads and event loops in
each): one budget, one strict FIFO, host-wide timeouts and queue bound,
set_max_permits from another process, fork after open.  Every child has a
hard timeout and is reaped (the `children` fixture)."""

from __future__ import annotations

import multiprocessing
import os
import queue
import time

import pytest

from pylimiter import PermitAcquireQueueFullError
from tests._helpers import wait_until
from tests.shared import _workers


def get(q, timeout=30):
    try:
        return q.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no event within {timeout} s") from None


def read_log(path, count, timeout=60):
    """The first `count` lines of a log file the children append to."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            lines = []
        if len(lines) >= count:
            return lines[:count]
        assert time.monotonic() < deadline, f"log has {lines}, expected {count} lines"
        time.sleep(0.005)


def books(sem):
    a = sem._audit()
    assert a["acquired"] == a["held"] + a["granted"], a
    assert a["qlen"] == a["queued"] == a["linked"], a
    return a


def test_numbers_and_holders_are_the_hosts(impl, shm, name, shm_dir, children, method):
    ctx = multiprocessing.get_context(method)
    events, stop = ctx.Queue(), ctx.Event()
    sem = shm.SharedSemaphore(name, 10)
    try:
        kw = {"max_permits": 10}
        child = children.start(method, _workers.hold, impl.tag, name, shm_dir, kw, 3, events,
                               stop)
        assert get(events)[:3] == ("held", child.pid, 3)
        assert sem.acquired_permits == 3 and sem.available_permits == 7
        assert sem.holders() == {os.getpid(): 0, child.pid: 3}
        assert sem.try_acquire(8) is None
        stop.set()
        assert get(events)[0] == "released"
        children.join_all()
        wait_until(lambda: child.pid not in sem.holders(), what="child detached")
        assert sem.acquired_permits == 0 and sem.holders() == {os.getpid(): 0}
        books(sem)
    finally:
        sem.close()


@pytest.mark.parametrize("how", ["thread", "task"])
def test_a_release_here_wakes_a_waiter_there(impl, shm, name, shm_dir, children, method, how):
    ctx = multiprocessing.get_context(method)
    events = ctx.Queue()
    sem = shm.SharedSemaphore(name, 4)
    try:
        p = sem.acquire_blocking(4)
        child = children.start(method, _workers.wait_one, impl.tag, name, shm_dir,
                               {"max_permits": 4}, 3, how, 30, events)
        wait_until(lambda: sem.queue_size == 1, what="child queued")
        t0 = time.monotonic()
        sem.release(p)
        kind, pid, n, t1 = get(events)
        assert (kind, pid, n) == ("granted", child.pid, 3)
        assert t1 - t0 < 10   # woken, not left to a timeout
        children.join_all()
        assert sem.acquired_permits == 0
    finally:
        sem.close()


def test_strict_fifo_across_processes_threads_and_loops(impl, shm, name, shm_dir, children,
                                                        method):
    """Requests from 3 processes (threads and tasks alternating in each)
    join the queue in a known order; they are served in exactly that order."""
    ctx = multiprocessing.get_context(method)
    ready = ctx.Queue()
    log = os.path.join(shm_dir, "grants.log")
    sem = shm.SharedSemaphore(name, 1)
    kw = {"max_permits": 1}
    try:
        p = sem.acquire_blocking(1)
        expected = []
        for k in range(3):
            idents = [f"p{k}r{i}" for i in range(3)]
            before = sem.queue_size
            children.start(method, _workers.fifo_group, impl.tag, name, shm_dir, kw, idents,
                           log, ready)
            get(ready, 60)
            assert sem.queue_size == before + 3
            expected += idents
        # Interleave a second round so processes alternate in the queue.
        for k in range(3):
            ident = f"single{k}"
            before = sem.queue_size
            children.start(method, _workers.fifo_member, impl.tag, name, shm_dir, kw, ident,
                           "thread" if k % 2 else "task", log)
            wait_until(lambda: sem.queue_size == before + 1, 60, "single queued")
            expected.append(ident)
        sem.release(p)
        assert read_log(log, len(expected)) == expected
        children.join_all()
        books(sem)
    finally:
        sem.close()


def test_no_barging_across_processes(impl, shm, name, shm_dir, children, method):
    ctx = multiprocessing.get_context(method)
    log = os.path.join(shm_dir, "grants.log")
    events = ctx.Queue()
    sem = shm.SharedSemaphore(name, 4)
    kw = {"max_permits": 4}
    try:
        p = sem.acquire_blocking(3)
        big = children.start(method, _workers.wait_one, impl.tag, name, shm_dir, kw, 4,
                             "thread", 30, events)
        wait_until(lambda: sem.queue_size == 1, what="big queued")
        # One permit is free, but a request for 1 from another process must
        # queue behind the big one.
        small = children.start(method, _workers.fifo_member, impl.tag, name, shm_dir, kw,
                               "small", "task", log)
        wait_until(lambda: sem.queue_size == 2, what="small queued")
        assert sem.try_acquire(1) is None
        sem.release(p)
        kind, pid, n, _ = get(events)
        assert (kind, pid, n) == ("granted", big.pid, 4)
        assert read_log(log, 1) == ["small"]
        children.join_all()
        del small
    finally:
        sem.close()


def test_timeouts_and_queue_full_are_host_wide(impl, shm, name, shm_dir, children, method):
    ctx = multiprocessing.get_context(method)
    events = ctx.Queue()
    kw = {"max_permits": 2, "max_queue_size": 2}
    sem = shm.SharedSemaphore(name, **kw)
    try:
        p = sem.acquire_blocking(2)
        a = children.start(method, _workers.wait_one, impl.tag, name, shm_dir, kw, 1, "thread",
                           30, events)
        wait_until(lambda: sem.queue_size == 1, what="one queued")
        # b's timeout runs from when it joins the queue: long enough for this
        # process to see the queue full even on a loaded machine.
        b = children.start(method, _workers.wait_one, impl.tag, name, shm_dir, kw, 1, "task",
                           2.0, events)
        wait_until(lambda: sem.queue_size == 2, what="two queued")
        with pytest.raises(PermitAcquireQueueFullError):
            sem.acquire_blocking(1, timeout=5)
        kind, pid, err, _ = get(events)
        assert (kind, pid, err) == ("failed", b.pid, "PermitAcquireTimeoutError")
        s = sem.stats()
        assert s.timeout_total == 1 and s.queue_full_total == 1 and s.queue_size == 1
        sem.release(p)
        assert get(events)[:3] == ("granted", a.pid, 1)
        children.join_all()
        books(sem)
    finally:
        sem.close()


def test_set_max_permits_from_another_process(impl, shm, name, shm_dir, children, method):
    ctx = multiprocessing.get_context(method)
    events = ctx.Queue()
    kw = {"max_permits": 2}
    sem = shm.SharedSemaphore(name, 2)
    try:
        out = []
        import threading
        p = sem.acquire_blocking(2)
        t = threading.Thread(target=lambda: out.append(sem.acquire_blocking(3, timeout=None)))
        with pytest.raises(ValueError):
            sem.acquire_blocking(3)   # larger than the limit now
        children.start(method, _workers.set_max, impl.tag, name, shm_dir, kw, 5, events)
        assert get(events)[0] == "set"
        assert sem.max_permits == 5 and sem.available_permits == 3
        t.start()
        t.join(30)
        assert out and out[0].permits == 3 and sem.available_permits == 0
        children.join_all()
        children.start(method, _workers.set_max, impl.tag, name, shm_dir, kw, 0, events)
        assert get(events)[0] == "set"
        assert sem.max_permits == 0 and sem.available_permits == 2**63 - 1
        q = sem.acquire_blocking(100)
        children.join_all()
        children.start(method, _workers.set_max, impl.tag, name, shm_dir, kw, 10, events)
        assert get(events)[0] == "set"
        assert sem.available_permits == 10 - 105
        for x in (p, out[0], q):
            sem.release(x)
        assert sem.available_permits == 10
        children.join_all()
        books(sem)
    finally:
        sem.close()


def test_fork_after_open(impl, shm, name, shm_dir, children):
    """gunicorn --preload: the parent opened the semaphore and holds 2; a
    forked child registers at its first call, cannot release what the
    parent holds, and takes its own permits."""
    ctx = multiprocessing.get_context("fork")
    events = ctx.Queue()
    sem = shm.SharedSemaphore(name, 5)
    try:
        mine = sem.acquire_blocking(2)
        child = children.start("fork", _workers.forked_user, sem, mine, events)
        kind, out = get(events)
        assert out["pid"] == child.pid
        assert out["release"] == "TypeError" and out["update"] == "TypeError"
        assert out["holders"] == {os.getpid(): 2, child.pid: 2}
        assert out["acquired"] == 4 and out["after"] == 2
        children.join_all()
        assert mine.permits == 2 and sem.acquired_permits == 2
        wait_until(lambda: sem.holders() == {os.getpid(): 2}, what="child gone")
        sem.release(mine)
        books(sem)
    finally:
        sem.close()


def _hammer(impl, shm, name, shm_dir, children, method, nprocs, nthreads, ntasks, seconds,
            limit=6, max_weight=3):
    ctx = multiprocessing.get_context(method)
    lock = ctx.Lock()
    inuse = ctx.Value("q", 0, lock=False)
    peak = ctx.Value("q", 0, lock=False)
    kw = {"max_permits": limit}
    sem = shm.SharedSemaphore(name, **kw)
    try:
        for i in range(nprocs):
            children.start(method, _workers.hammer, impl.tag, name, shm_dir, kw, seconds, i,
                           nthreads, ntasks, inuse, peak, lock, max_weight)
        children.join_all(timeout=seconds + 120)
        assert 0 < peak.value <= limit
        assert inuse.value == 0
        assert sem.peak_acquired_permits <= limit
        assert sem.acquired_permits == 0 and sem.queue_size == 0
        assert sem.holders() == {os.getpid(): 0}
        s = sem.stats()
        assert s.acquired_total > 0
        books(sem)
    finally:
        sem.close()


def test_never_more_than_the_limit_held(impl, shm, name, shm_dir, children, method):
    _hammer(impl, shm, name, shm_dir, children, method, nprocs=2, nthreads=2, ntasks=3,
            seconds=1.0)


@pytest.mark.slow
def test_never_more_than_the_limit_held_8_processes(impl, shm, name, shm_dir, children, method):
    _hammer(impl, shm, name, shm_dir, children, method, nprocs=8, nthreads=3, ntasks=10,
            seconds=4.0, limit=16, max_weight=4)
