"""A task parked on a shared acquire whose event loop is closed by hand
(asyncio.run cancels its tasks first; `loop.close()` does not): it will
never run again, so its request leaves the host's queue at this process's
next call, and a grant it got meanwhile goes back.  Before, the request
stayed queued, took the next grant, and those permits were lost to every
process of the host until this one closed the semaphore or exited.  Both
twins."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from tests._helpers import wait_until


def _park_and_close(sem, n):
    """A task waiting for n permits on a loop that is then closed under it.
    The loop and task are returned so that nothing is collected early."""
    loop = asyncio.new_event_loop()

    async def want():
        return await sem.acquire(n, timeout=None)

    task = loop.create_task(want())
    loop.run_until_complete(asyncio.sleep(0.02))
    assert not task.done()
    loop.close()
    return loop, task


@pytest.mark.parametrize("when", ["queued", "granted-after-close"])
def test_a_waiter_of_a_closed_loop_gives_its_place_and_grant_back(shm, name, when):
    sem = shm.SharedSemaphore(name, max_permits=4)
    other = shm.SharedSemaphore(name, max_permits=4)
    try:
        held = other.acquire_blocking(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            keep = _park_and_close(sem, 4)
        assert other.queue_size == 1
        if when == "granted-after-close":
            other.release(held)   # granted to the parked request, which will never take it
            held = None
        # This process's next calls (a count read here) find the closed loop.
        wait_until(lambda: sem.queue_size == 0 and sem.acquired_permits == (3 if held else 0),
                   5, "the closed loop's request still queued or holding its grant")
        if held is not None:
            other.release(held)
        p = other.acquire_blocking(4, timeout=5)   # the whole budget is there
        other.release(p)
        assert other.acquired_permits == 0 and other.queue_size == 0
        del keep
        gc.collect()
    finally:
        sem.close()
        other.close()
