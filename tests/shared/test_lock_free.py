"""The C twin's lock-free paths and one-hop wake-ups (csrc/plim_shm.c, "The
counter word" and "Who wakes whom"): the same behaviour with and without
them, statistics that count every grant, a repair that cannot wait out a
process stuck inside a lock-free path (it keeps the word, says a repair is
due, and rebuilds once the process goes on), and event loops woken through
their own socket, through the waker thread when the socket is off or its
name is taken, and not fooled by datagrams for nothing.  The pure twin has
no lock-free path: these tests are the C twin's."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import struct
import time

import pytest

from pylimiter import _shared_common as sc
from tests.shared.test_processes import books, get, wait_until


@pytest.fixture
def c_only(impl):
    if impl.is_pure_python:
        pytest.skip("the pure twin has no lock-free paths or wake sockets")


def _slot_of(path, pid, maxp=256, npools=1, queue=10000):
    """The slot index and generation of process `pid` in a segment."""
    lay = sc.Layout(npools, maxp, sc.nrecords(npools, queue, maxp))
    fd = os.open(path, os.O_RDONLY)
    try:
        for s in range(maxp):
            state, gen, spid = struct.unpack("<IIi", os.pread(fd, 12, lay.slot(s)))
            if state == sc.SLOT_LIVE and spid == pid:
                return lay, s, gen
    finally:
        os.close(fd)
    raise AssertionError(f"no live slot for pid {pid}")


@pytest.mark.parametrize("lock_free", [True, False], ids=["lock-free", "locked"])
def test_every_path_keeps_the_same_books(shm, c_only, name, lock_free):
    """Acquire, try_acquire, weights, update, async with and release give
    the same numbers whichever path they take; every grant is counted once
    and the peak is exact."""
    sem = shm.SharedSemaphore(name, 10)
    try:
        sem._set_lock_free(lock_free)
        a = sem.acquire_blocking(3)
        b = sem.try_acquire(2)
        assert sem.acquired_permits == 5 and sem.available_permits == 5
        assert sem.holders() == {os.getpid(): 5}
        sem.update_blocking(a, 1)   # shrinking gives 2 back
        assert sem.acquired_permits == 3
        c = sem.acquire_blocking(7)
        assert sem.try_acquire(1) is None and sem.peak_acquired_permits == 10
        for p in (a, b, c):
            sem.release(p)
            sem.release(p)   # twice: a no-op

        async def body():
            async with sem:
                assert sem.acquired_permits == 1
            p = await sem.acquire(4)
            sem.release(p)
        asyncio.run(body())
        st = sem.stats()
        assert st.acquired_total == 5 and st.wait_seconds_count == 5
        assert st.acquired_permits == 0 and st.available_permits == 10
        assert sem.peak_acquired_permits == 10
        books(sem)
    finally:
        sem.close()


def test_permits_taken_one_way_go_back_the_other(shm, c_only, name):
    """A permit taken lock-free and given back under the lock (a queue had
    formed meanwhile), and the reverse: the two ledgers add up."""
    sem = shm.SharedSemaphore(name, 4)
    try:
        a = sem.acquire_blocking(2)             # lock-free
        sem._set_lock_free(False)
        b = sem.acquire_blocking(2)             # under the lock
        sem._set_lock_free(True)
        assert sem.holders() == {os.getpid(): 4}
        sem.release(b)                          # lock-free
        sem._set_lock_free(False)
        sem.release(a)                          # under the lock
        assert sem.holders() == {os.getpid(): 0} and sem.acquired_permits == 0
        sem._set_lock_free(True)
        p = sem.acquire_blocking(4)
        sem.release(p)
        books(sem)
    finally:
        sem.close()


def _churn(name, directory, n, q):
    from pylimiter import _shared_c
    sem = _shared_c.SharedSemaphore(name, 3, directory=directory)
    for _ in range(n):
        sem.release(sem.acquire_blocking(1))
    q.put(os.getpid())
    sem.close()



def test_grants_made_lock_free_by_other_processes_are_counted(shm, c_only, name, shm_dir,
                                                             children):
    """stats() is the host's: lock-free grants of every process, those of
    processes gone since included."""
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    sem = shm.SharedSemaphore(name, 3)
    try:
        for _ in range(2):
            children.start("fork", _churn, name, shm_dir, 50, q)
        get(q)
        get(q)
        children.join_all()
        sem.release(sem.acquire_blocking(1))
        st = sem.stats()
        assert st.acquired_total == 101
        assert st.wait_seconds_buckets[0][1] == 101   # all at once (0 s waits)
    finally:
        sem.close()


def _hold_and_wait(name, directory, n, q, stop):
    from pylimiter import _shared_c
    sem = _shared_c.SharedSemaphore(name, 5, directory=directory)
    p = sem.acquire_blocking(n)
    q.put(("held", os.getpid()))
    stop.wait(60)
    sem.release(p)
    sem.close()



def test_a_repair_waits_out_a_live_lock_free_path(shm, c_only, name, shm_dir, children):
    """A live process whose in-flight mark stays set (as if stopped inside
    its lock-free path) keeps a repair from rebuilding the word: the dead
    process's permits stay out (never handed out twice), the lock-free
    paths keep working, and once the mark clears the next look rebuilds."""
    ctx = multiprocessing.get_context("fork")
    # Each child its own event: one killed while waiting on an Event would
    # leave its condition waiting for it for ever.
    q, stop, never = ctx.Queue(), ctx.Event(), ctx.Event()
    sem = shm.SharedSemaphore(name, 5)
    fd = os.open(sem.path, os.O_RDWR)
    try:
        dead = children.start("fork", _hold_and_wait, name, shm_dir, 3, q, never)
        stuck = children.start("fork", _hold_and_wait, name, shm_dir, 0, q, stop)
        assert {get(q), get(q)} == {("held", dead.pid), ("held", stuck.pid)}
        lay, slot, _gen = _slot_of(sem.path, stuck.pid)
        mark = lay.slot(slot) + sc.S_INFLIGHT
        os.pwrite(fd, struct.pack("<I", 1), mark)
        children.kill(dead)
        t0 = time.monotonic()
        assert dead.pid not in sem.holders()          # found dead, repaired...
        assert time.monotonic() - t0 < 5              # ...waiting a bounded time
        assert sem.acquired_permits == 3              # the word stood
        p = sem.acquire_blocking(2)                   # lock-free still works
        sem.release(p)
        assert struct.unpack("<q", os.pread(fd, 8, sc.H_REPAIR_AT))[0] != 0
        os.pwrite(fd, struct.pack("<I", 0), mark)     # it goes on
        wait_until(lambda: sem.acquired_permits == 0, timeout=10, what="the rebuild")
        assert struct.unpack("<q", os.pread(fd, 8, sc.H_REPAIR_AT))[0] == 0
        books(sem)
        stop.set()
        assert children.join(stuck) == 0
    finally:
        stop.set()
        os.close(fd)
        sem.close()


def _loop_waiter(name, directory, q, go, direct):
    from pylimiter import _shared_c
    sem = _shared_c.SharedSemaphore(name, 1, directory=directory)
    if not direct:
        sem._set_direct_wake(False)
    q.put(("open", os.getpid()))
    go.wait(30)

    async def body():
        p = await sem.acquire(1, timeout=30)
        q.put(("got", os.getpid(), p.permits))
        sem.release(p)
    asyncio.run(body())
    sem.close()



@pytest.mark.parametrize("how", ["socket", "waker", "name-taken"])
def test_a_task_there_is_woken_by_a_release_here(shm, c_only, name, shm_dir, children, how):
    """An event loop of another process wakes at once on a release here:
    through its own socket, through its waker thread when its socket is
    off, or when its name was taken first by someone else (who gets a
    datagram for nothing, nothing more)."""
    ctx = multiprocessing.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    sem = shm.SharedSemaphore(name, 1)
    squatter = None
    try:
        held = sem.acquire_blocking(1)
        child = children.start("fork", _loop_waiter, name, shm_dir, q, go, how != "waker")
        assert get(q) == ("open", child.pid)
        if how == "name-taken":
            _lay, slot, gen = _slot_of(sem.path, child.pid)
            st = os.stat(sem.path)
            squatter = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            squatter.bind(f"\0pylimiter/{st.st_dev:x}/{st.st_ino:x}/{slot}/{gen}/0")
        go.set()
        wait_until(lambda: sem.queue_size == 1, what="the task queued")
        lay, slot, _gen = _slot_of(sem.path, child.pid)
        with open(sem.path, "rb") as f:
            f.seek(lay.slot(slot) + sc.S_DIRECT)
            direct = struct.unpack("<Q", f.read(8))[0]
        assert direct == (1 if how == "socket" else 0)   # loop 0 has a socket, or not
        sem.release(held)
        assert get(q, timeout=10) == ("got", child.pid, 1)
        children.join_all()
        books(sem)
    finally:
        if squatter is not None:
            squatter.close()
        sem.close()


def test_datagrams_for_nothing_only_make_the_loop_look_again(shm, c_only, name, shm_dir,
                                                            children):
    """Anyone may write to a loop's socket: it rechecks its records and its
    request stays queued, in order, until a real release."""
    ctx = multiprocessing.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    sem = shm.SharedSemaphore(name, 1)
    try:
        held = sem.acquire_blocking(1)
        child = children.start("fork", _loop_waiter, name, shm_dir, q, go, True)
        assert get(q) == ("open", child.pid)
        go.set()
        wait_until(lambda: sem.queue_size == 1, what="the task queued")
        _lay, slot, gen = _slot_of(sem.path, child.pid)
        st = os.stat(sem.path)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            for _ in range(200):
                s.sendto(b"wake up", f"\0pylimiter/{st.st_dev:x}/{st.st_ino:x}/{slot}/{gen}/0")
        time.sleep(0.2)
        assert sem.queue_size == 1 and q.empty()
        assert sem.holders() == {os.getpid(): 1, child.pid: 0}
        sem.release(held)
        assert get(q, timeout=10) == ("got", child.pid, 1)
        children.join_all()
        books(sem)
    finally:
        sem.close()
