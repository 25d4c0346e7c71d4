"""Issue 33, point 1: hostile names and paths, and hostile bytes.  A file
that is not a sound segment of this implementation is a SharedLimiterError
naming the path and the reason; a segment corrupted while processes use it
(a fuzzer writing random bytes into it) never crashes or hangs them: every
operation works or raises SharedLimiterError, a PermitAcquireError or a
ValueError.  Children are bounded in time and reaped."""

from __future__ import annotations

import os
import random
import struct

import pytest

from pylimiter import _shared_common as sc
from tests.shared import _workers


def make_segment(shm, name):
    sem = shm.SharedSemaphore(name, 5)
    path = sem.path
    sem.close()
    return path


def test_a_symlink_is_refused(shm, name, shm_dir):
    target = make_segment(shm, name + "x")
    path = os.path.join(shm_dir, f"pylimiter-{os.geteuid()}-{name}")
    os.symlink(target, path)
    with pytest.raises(shm.SharedLimiterError, match="symbolic link") as info:
        shm.SharedSemaphore(name, 5)
    assert info.value.filename == path and path in str(info.value)
    dangling = os.path.join(shm_dir, f"pylimiter-{os.geteuid()}-{name}d")
    os.symlink(os.path.join(shm_dir, "nowhere"), dangling)
    with pytest.raises(shm.SharedLimiterError, match="symbolic link"):
        shm.SharedSemaphore(name + "d", 5)
    assert not os.path.exists(os.path.join(shm_dir, "nowhere"))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
def test_another_owners_file_is_refused(shm, name):
    path = make_segment(shm, name)
    os.chown(path, 65534, -1)
    with pytest.raises(shm.SharedLimiterError, match="owned by uid 65534"):
        shm.SharedSemaphore(name, 5)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o400, 0o700, 0o4600])
def test_a_mode_other_than_0600_is_refused(shm, name, mode):
    path = make_segment(shm, name)
    os.chmod(path, mode)
    with pytest.raises(shm.SharedLimiterError, match=f"mode {mode & 0o7777:04o}"):
        shm.SharedSemaphore(name, 5)


def test_a_directory_or_fifo_is_refused(shm, name, shm_dir):
    os.mkdir(os.path.join(shm_dir, f"pylimiter-{os.geteuid()}-{name}"))
    with pytest.raises(shm.SharedLimiterError):
        shm.SharedSemaphore(name, 5)
    os.mkfifo(os.path.join(shm_dir, f"pylimiter-{os.geteuid()}-{name}f"), 0o600)
    with pytest.raises(shm.SharedLimiterError, match="regular file"):
        shm.SharedSemaphore(name + "f", 5)


@pytest.mark.parametrize("delta", [-4096, -1, 1, 4096, 1 << 20])
def test_a_wrong_size_is_refused(shm, name, delta):
    path = make_segment(shm, name)
    size = os.path.getsize(path)
    os.truncate(path, size + delta)
    with pytest.raises(shm.SharedLimiterError, match="size"):
        shm.SharedSemaphore(name, 5)


@pytest.mark.parametrize("size", [0, 7, 255, 4096, 65536, 1 << 20])
def test_random_bytes_are_refused(shm, name, shm_dir, size):
    path = os.path.join(shm_dir, f"pylimiter-{os.geteuid()}-{name}")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.write(fd, random.Random(size).randbytes(size))
    os.close(fd)
    with pytest.raises(shm.SharedLimiterError, match="size|magic"):
        shm.SharedSemaphore(name, 5)
    assert os.path.getsize(path) == size   # left as it was


@pytest.mark.parametrize("field, value, reason", [
    (sc.H_VERSION, struct.pack("<I", 99), "layout version"),
    (sc.H_IMPL, struct.pack("<I", 77), "unknown implementation"),
    (sc.H_KIND, struct.pack("<I", 9), "kind"),
    (sc.H_NPOOLS, struct.pack("<I", 2), "kind"),
    (sc.H_MAXPROC, struct.pack("<I", 0), "settings"),
    (sc.H_MAXPROC, struct.pack("<I", 1 << 30), "settings"),
    (sc.H_NREC, struct.pack("<I", 3), "record count"),
    (sc.H_SIZE, struct.pack("<Q", 1 << 62), "size"),
    (sc.H_CFG_QUEUE, struct.pack("<q", 1 << 40), "settings"),
    (sc.H_CFG_MAX, struct.pack("<q", 1 << 62), "settings"),
])
def test_a_bad_header_is_refused(shm, name, field, value, reason):
    path = make_segment(shm, name)
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, value, field)
    os.close(fd)
    with pytest.raises(shm.SharedLimiterError, match=reason):
        shm.SharedSemaphore(name, 5)


def test_random_state_behind_a_sound_header(shm, name):
    """Garbage in the pools, slots and records of a segment nobody uses: the
    next open starts it afresh (every attached process died)."""
    path = make_segment(shm, name)
    size = os.path.getsize(path)
    fd = os.open(path, os.O_WRONLY)
    os.pwrite(fd, random.Random(1).randbytes(size - sc.H_MUTEX), sc.H_MUTEX)
    os.close(fd)
    sem = shm.SharedSemaphore(name, 5)
    try:
        assert sem.acquired_permits == 0 and sem.queue_size == 0
        assert sem.try_acquire(5) is not None
    finally:
        sem.close()


def _scribble(path, rng, writes, start=sc.H_MUTEX):
    fd = os.open(path, os.O_RDWR)
    size = os.fstat(fd).st_size
    for _ in range(writes):
        n = rng.choice([1, 2, 4, 8])
        os.pwrite(fd, rng.randbytes(n), rng.randrange(start, size - n))
    os.close(fd)


def _fuzz_targets(path, rng, lay):
    """Offsets worth hitting: every field of the pools, the first slots and
    the first records (uniform offsets over a sparse file mostly hit unused
    records)."""
    offs = list(range(sc.H_MUTEX, sc.HEADER_SIZE, 4))
    offs += list(range(lay.pools, lay.slots, 4))
    offs += list(range(lay.slots, lay.slot(4), 4))
    offs += list(range(lay.records, lay.rec(32), 4))
    return offs


def test_corrupted_while_in_use_in_this_process(impl, shm, name, children):
    """Hostile bytes at the fields that matter while this process works:
    each call works or raises an allowed error (the children variant below
    runs several processes against a fuzzer)."""
    import pylimiter
    sem = shm.SharedSemaphore(name, 5, max_queue_size=8, max_processes=8)
    allowed = (shm.SharedLimiterError, pylimiter.PermitAcquireError, ValueError)
    rng = random.Random(3)
    lay = sc.Layout(1, 8, sc.nrecords(1, 8, 8))
    offs = _fuzz_targets(sem.path, rng, lay)
    fd = os.open(sem.path, os.O_RDWR)
    held = []
    outcomes = {"ok": 0, "refused": 0}
    try:
        for i in range(400):
            off = rng.choice(offs)
            os.pwrite(fd, rng.randbytes(4), off)
            try:
                r = rng.random()
                if r < 0.4:
                    held.append(sem.acquire_blocking(rng.randint(1, 3), timeout=0.01))
                elif r < 0.6 and held:
                    sem.release(held.pop())
                elif r < 0.7:
                    sem.stats()
                    sem.holders()
                    sem._audit()
                elif r < 0.8:
                    p = sem.try_acquire(1)
                    if p is not None:
                        held.append(p)
                else:
                    sem.set_max_permits(rng.randint(1, 6))
                outcomes["ok"] += 1
            except allowed:
                outcomes["refused"] += 1
    finally:
        os.close(fd)
        try:
            sem.close()
        except allowed:
            pass
    assert outcomes["ok"] > 0
    print(outcomes)


def _fuzz_processes(impl, shm, name, shm_dir, children, nvictims, seconds, rate):
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    events = ctx.Queue()
    kw = {"max_permits": 6, "max_queue_size": 8, "max_processes": 16}
    sem = shm.SharedSemaphore(name, **kw)
    path = sem.path
    sem.close()
    victims = [children.start("fork", _workers.victim_of_fuzz, impl.tag, name, shm_dir, kw,
                              seconds, i, events) for i in range(nvictims)]
    lay = sc.Layout(1, 16, sc.nrecords(1, 8, 16))
    fuzzer = children.start("fork", _workers.fuzz, path, seconds, 99, rate, lay.rec(64))
    for v in victims:
        # No hang: each finishes within its time plus the stuck-lock bound.
        assert children.join(v, timeout=seconds + 60) == 0, "a victim crashed or failed"
    assert children.join(fuzzer, timeout=seconds + 30) == 0
    reports = [events.get(timeout=10) for _ in victims]
    assert all(r[0] == "fuzzed" for r in reports)
    print(reports)


def test_a_fuzzer_against_working_processes(impl, shm, name, shm_dir, children):
    _fuzz_processes(impl, shm, name, shm_dir, children, nvictims=2, seconds=1.0, rate=300)


@pytest.mark.slow
def test_a_fuzzer_against_working_processes_long(impl, shm, name, shm_dir, children):
    _fuzz_processes(impl, shm, name, shm_dir, children, nvictims=4, seconds=6.0, rate=2000)


def test_a_lock_held_by_a_live_process_is_an_error_not_a_hang(impl, shm, name):
    """A process that keeps the host's lock (stopped, or hostile bytes that
    name a live process as its holder) makes operations fail after the
    bound, never hang."""
    import fcntl
    import time
    sem = shm.SharedSemaphore(name, 5)
    fd = os.open(sem.path, os.O_RDWR)
    try:
        sem._set_lock_timeout(0.2)
        if impl.is_pure_python:
            # Another file description takes the twin's lock byte and keeps it.
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK,
                        struct.pack("hhxxxxqqixxxx", fcntl.F_WRLCK, 0, sc.MUTEX_BYTE, 1, 0))
        else:
            # The C twin's lock word names slot 0 at its generation: alive
            # (ours, as if another of our threads held it).
            lay = sc.Layout(1, 256, sc.nrecords(1, 10000, 256))
            gen = struct.unpack("<I", os.pread(fd, 4, lay.slot(0) + sc.S_GEN))[0]
            os.pwrite(fd, struct.pack("<I", 1 | (gen & 0x7FFF) << 16), sc.H_MUTEX)
        if not impl.is_pure_python:
            # The uncontended acquire and release do not take the lock.
            sem.release(sem.acquire_blocking(1))
        t0 = time.monotonic()
        with pytest.raises(shm.SharedLimiterError, match="held by a live process"):
            sem.holders()
        assert time.monotonic() - t0 < 10
        if impl.is_pure_python:
            fcntl.fcntl(fd, fcntl.F_OFD_SETLK,
                        struct.pack("hhxxxxqqixxxx", fcntl.F_UNLCK, 0, sc.MUTEX_BYTE, 1, 0))
        else:
            os.pwrite(fd, struct.pack("<I", 0), sc.H_MUTEX)
        p = sem.acquire_blocking(1)
        sem.release(p)
    finally:
        os.close(fd)
        sem.close()


def test_a_lock_word_naming_a_dead_or_unknown_holder_is_taken_over(impl, shm, name):
    if impl.is_pure_python:
        pytest.skip("the pure twin's lock is a kernel lock: a dead holder's is dropped")
    sem = shm.SharedSemaphore(name, 5, max_processes=4)
    fd = os.open(sem.path, os.O_RDWR)
    try:
        held = sem.acquire_blocking(2)
        for word in (3, 0xFFFF, 0x7FFF0000 | 4, 0x80000000 | 2):   # free slots, garbage
            os.pwrite(fd, struct.pack("<I", word), sc.H_MUTEX)
            p = sem.acquire_blocking(1, timeout=5)
            sem.release(p)
            assert sem.acquired_permits == 2
        sem.release(held)
    finally:
        os.close(fd)
        sem.close()


@pytest.mark.parametrize("value", [(1 << 63) - 1, -(1 << 63)])
def test_extreme_held_counts_are_no_internal_error(shm, name, value):
    """A held count another process set to an int64 extreme: the sums over
    it saturate (the pure twin raised struct.error from its arithmetic)."""
    sem = shm.SharedSemaphore(name, 10, max_processes=2)
    try:
        q = sem.try_acquire(1)
        lay = sc.Layout(1, 2, sc.nrecords(1, 10000, 2))
        fd = os.open(sem.path, os.O_RDWR)
        for s in range(2):
            os.pwrite(fd, struct.pack("<q", value), lay.slot(s) + sc.S_HELD)
        os.close(fd)
        p = sem.try_acquire(1)
        assert p is not None and p.permits == 1
        sem.release(q)
        sem.release(p)
        assert set(sem.holders()) == {os.getpid()}
        assert sem.acquire_blocking(2, timeout=1).permits == 2
    finally:
        sem.close()
