"""The C twin allocates its permits itself (_binding/permit_alloc.h, plim_permit_new):
a permit of a plain AsyncSemaphore is left out of the cyclic GC (it closes
no cycle the collector could free), one of a subclass's semaphore, which may
keep it in its __dict__, is tracked; either way weak references, the leak
warning and the freelist behave."""

from __future__ import annotations

import asyncio
import gc
import warnings
import weakref

import pytest

from pylimiter._impls import C

pytestmark = pytest.mark.c_extension


def test_a_plain_semaphores_permits_are_not_tracked():
    sem = C.module.AsyncSemaphore(10)
    p = sem.try_acquire(1)
    assert not gc.is_tracked(p)
    q = asyncio.run(_acquire(sem))
    assert not gc.is_tracked(q)
    assert gc.get_referents(p)[0] is sem      # still traversable
    sem.release(p)
    sem.release(q)


async def _acquire(sem):
    return await sem.acquire(1)


def test_a_subclass_semaphores_permits_are_tracked_and_their_cycles_collected():
    class Holding(C.module.AsyncSemaphore):
        pass

    sem = Holding(10)
    p = sem.try_acquire(2)
    assert gc.is_tracked(p)
    sem.held = [p]                   # sem -> __dict__ -> list -> p -> sem
    ref = weakref.ref(sem)
    del sem, p
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    assert ref() is None
    leaks = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(leaks) == 1 and "holding 2" in str(leaks[0].message)


def test_weak_references_to_permits_are_cleared_and_objects_never_shared():
    sem = C.module.AsyncSemaphore(10**6)
    refs = []
    for _ in range(600):            # past the freelist's 256
        p = sem.try_acquire(1)
        refs.append(weakref.ref(p))
        sem.release(p)
        del p
    assert all(r() is None for r in refs)
    live = [sem.try_acquire(1) for _ in range(300)]
    assert len({id(p) for p in live}) == 300
    assert all(p.permits == 1 for p in live)
    assert sem.acquired_permits == 300
    for p in live:
        sem.release(p)
