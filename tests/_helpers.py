"""Helpers shared by the test modules."""

import asyncio
import gc


def run(coro, timeout=30):
    """Run a coroutine on a fresh loop, bounded in time."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def check_invariant(sem, live_permits):
    """acquired_permits == sum of live permits; available == max - acquired."""
    gc.collect()
    assert sem.acquired_permits == sum(p.permits for p in live_permits)
    if sem.max_permits > 0:
        assert sem.available_permits == sem.max_permits - sem.acquired_permits
    else:
        assert sem.available_permits == 2**63 - 1
