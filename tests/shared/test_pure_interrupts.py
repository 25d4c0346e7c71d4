"""An interrupt (KeyboardInterrupt from a signal handler) at any point of the
pure host-wide twin's calls never leaves the host's lock held.

The pure twin's critical section is a file lock taken and dropped by Python
code.  An interrupt that landed after the lock was taken but before the code
that drops it was reached (or inside that code, before its system call) left
the lock with this process's file description: a process that caught the
KeyboardInterrupt and went idle shut every other process out of the
semaphore (they failed after the lock timeout), until it made a call again.
These tests inject the interrupt at each such point and look at the lock
from another file description.  Pure twin only: the C twin's section is C.
"""

from __future__ import annotations

import gc
import warnings

import pytest

from pylimiter import PermitAcquireTimeoutError
from tests._helpers import InterruptAt, call_interrupted, run_interrupted, wait_until


@pytest.fixture
def pure(impl):
    if not impl.is_pure_python:
        pytest.skip("the C twin's critical section runs no Python code")


def _interrupt_at(k):
    """An InterruptAt for the pure host-wide twin's modules."""
    return InterruptAt(k, ("_shared_py", "_shared_common", "_deferred"))


def _lock_free(shm, other):
    """The host's mutex byte is free: no file description holds it."""
    from pylimiter._shared_common import MUTEX_BYTE, ofd_held
    return not ofd_held(other._seg.lockfd, MUTEX_BYTE)


def test_an_interrupt_at_any_point_never_keeps_the_host_lock(shm, name, pure):
    from pylimiter import _shared_py
    other = shm.SharedSemaphore(name, max_permits=4)
    other._set_lock_timeout(0.5)
    k = 1
    try:
        while True:
            sem = shm.SharedSemaphore(name, max_permits=4)
            kept = []

            # What an interrupt may lose: the permits of a grant it stops
            # on the way to the caller (as an interrupt right after `p = ...`
            # would); never those of a release, an update or a refusal.
            may_lose = [0]

            def acquired(p):
                kept.append(p)
                may_lose[0] = 0

            async def cycle():
                may_lose[0] = 1
                acquired(await sem.acquire(1))
                sem.release(kept[-1])
                may_lose[0] = 2
                acquired(sem.acquire_blocking(2))
                assert sem.try_acquire(3) is None     # refused: 2 of 4 are free
                sem.update(kept[-1], 1)
                sem.release(kept[-1])
                may_lose[0] = 1
                acquired(sem.try_acquire(1))
                sem.release(kept[-1])
                may_lose[0] = 1
                async with sem:
                    may_lose[0] = 0
                    assert other.acquired_permits == 1
                may_lose[0] = 1     # the `async with` exit is done: the last acquire
                acquired(await sem.acquire(1))
                sem.release(kept[-1])

            tracer = _interrupt_at(k)
            with warnings.catch_warnings():
                # A request or permit an interrupt dropped warns, as it would
                # after an interrupt right after `p = ...`: counted below.
                warnings.simplefilter("ignore", ResourceWarning)
                warnings.simplefilter("ignore", RuntimeWarning)
                run_interrupted(tracer, cycle())
                gc.collect()
            seg = sem._seg
            assert _lock_free(shm, other), f"the host lock stayed held (interrupt at point {k})"
            assert not seg.tlock._is_owned(), f"the thread lock stayed held (point {k})"
            assert getattr(_shared_py._sections, "depth", 0) == 0, k
            # The other attachment is served at once, the books balance: what
            # the interrupt lost (a grant it dropped) is at most one permit.
            # An interrupt at the very entry of `__aexit__` (a Python
            # function's entry runs pending handlers) leaves the permit of
            # `async with sem:` with the semaphore, as one before
            # `release(p)` leaves it with p: close() gives it back.
            held = sum(p.permits for p in kept) + seg.anon[0]
            taken = other.acquired_permits
            assert held <= taken <= held + may_lose[0], \
                (k, taken, held, may_lose[0], getattr(tracer, "where", None))
            for p in kept:
                if p.permits:
                    sem.release(p)
            sem.close()     # gives back what a dropped grant still held
            wait_until(lambda: other.acquired_permits == 0, 10,
                       f"permits stayed taken after close (point {k})")
            every = other.acquire_blocking(4, timeout=5)
            other.release(every)
            if tracer.seen < k:
                break   # the cycle ran without reaching point k: every point was tried
            k += 1
    finally:
        other.close()
    assert k > 500, k   # every point of the cycle was tried


def test_a_waiter_is_served_after_a_release_an_interrupt_stopped(shm, name, pure):
    """A release stopped at any point, with a thread of another attachment
    queued for the permit: the release happened or not (a retry completes
    it), and the waiter is served either way: the half-done section is
    repaired by the next one, the waiter's own poll included."""
    import threading
    other = shm.SharedSemaphore(name, max_permits=4)
    k = 1
    try:
        while True:
            sem = shm.SharedSemaphore(name, max_permits=4)
            p = sem.acquire_blocking(4)
            got = []
            waiter = threading.Thread(target=lambda: got.append(
                other.acquire_blocking(1, timeout=20)))
            waiter.start()
            wait_until(lambda: other.queue_size == 1, 10, "the waiter never queued")
            tracer = _interrupt_at(k)
            call_interrupted(tracer, sem.release, p)
            if p.permits:
                assert p.permits == 4, (k, p.permits)
                sem.release(p)      # it did not happen: the retry does it
            waiter.join(20)
            assert not waiter.is_alive() and len(got) == 1, f"the waiter was not served (point {k})"
            assert p.permits == 0 and other.acquired_permits == 1, (k, other.acquired_permits)
            other.release(got[0])
            assert other.acquired_permits == 0 and other.queue_size == 0, k
            sem.close()
            if tracer.seen < k:
                break
            k += 1
    finally:
        other.close()
    assert k > 100, k   # every point of the release was tried


def test_a_request_interrupted_as_it_queues_leaves_nothing_behind(shm, name, pure):
    """A blocking request that cannot fit, interrupted at each point of its
    call: once the permits it waited for are free, nothing is queued and
    nothing is held.  Before, an interrupt after its record was queued but
    before the caller had its waiter left a record nobody would collect: it
    took the next grant, and those permits were lost to the host."""
    import threading
    other = shm.SharedSemaphore(name, max_permits=4)
    k = 1
    try:
        while True:
            sem = shm.SharedSemaphore(name, max_permits=4)
            p = other.acquire_blocking(3)
            tracer = _interrupt_at(k)
            th = threading.Thread(target=lambda: call_interrupted(
                tracer, lambda: sem.acquire_blocking(4, timeout=0.02),
                also=(PermitAcquireTimeoutError,)))
            th.start()
            th.join(10)
            assert not th.is_alive()
            other.release(p)
            wait_until(lambda: other.queue_size == 0 and other.acquired_permits == 0, 5,
                       f"permits stayed taken or the queue did not empty (point {k}, "
                       f"{tracer.where})")
            sem.close()
            if tracer.seen < k:
                break
            k += 1
    finally:
        other.close()
    assert k > 100, k
