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

import asyncio
import gc
import sys
import warnings

import pytest

from tests._helpers import wait_until


@pytest.fixture
def pure(impl):
    if not impl.is_pure_python:
        pytest.skip("the C twin's critical section runs no Python code")


class _InterruptAt:
    """A profile function that raises KeyboardInterrupt at the k-th place in
    the pure host-wide twin where CPython may run a signal handler: the
    entry of a Python function and the return of a C call (the eval-breaker
    check after CALL)."""

    FILES = ("_shared_py", "_shared_common", "_deferred")

    def __init__(self, k):
        self.k = k
        self.seen = 0

    def __call__(self, frame, event, arg):
        if event in ("call", "c_return") and \
                any(f in frame.f_code.co_filename for f in self.FILES):
            self.seen += 1
            if self.seen == self.k:
                raise KeyboardInterrupt("injected")


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

            async def cycle():
                p = await sem.acquire(1)
                kept.append(p)
                sem.release(p)
                q = sem.acquire_blocking(2)
                kept.append(q)
                assert sem.try_acquire(3) is None     # refused: 2 of 4 are free
                sem.update(q, 1)
                sem.release(q)
                r = sem.try_acquire(1)
                kept.append(r)
                sem.release(r)

            tracer = _InterruptAt(k)
            loop = asyncio.new_event_loop()
            with warnings.catch_warnings():
                # A request or permit an interrupt dropped warns, as it would
                # after an interrupt right after `p = ...`: counted below.
                warnings.simplefilter("ignore", ResourceWarning)
                warnings.simplefilter("ignore", RuntimeWarning)
                try:
                    sys.setprofile(tracer)
                    try:
                        loop.run_until_complete(cycle())
                    except KeyboardInterrupt:
                        pass
                    finally:
                        sys.setprofile(None)
                finally:
                    loop.close()
                gc.collect()
            seg = sem._seg
            assert _lock_free(shm, other), f"the host lock stayed held (interrupt at point {k})"
            assert not seg.tlock._is_owned(), f"the thread lock stayed held (point {k})"
            assert getattr(_shared_py._sections, "depth", 0) == 0, k
            # The other attachment is served at once, the books balance: what
            # the interrupt lost (a grant it dropped) is at most one permit.
            held = sum(p.permits for p in kept if p is not None)
            taken = other.acquired_permits
            assert held <= taken <= held + 2, (k, taken, held)
            for p in kept:
                if p is not None and p.permits:
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
    assert k > 200, k   # every point of the cycle was tried
