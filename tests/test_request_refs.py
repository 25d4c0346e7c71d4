"""A request that has ended keeps nothing of its caller's alive: a
connection whose bound method was the ``is_cancelled`` check is freed by
reference counting alone, as soon as the caller drops it, whether the
request was granted, timed out or was cancelled.  (The pure twin keeps
recent requests in a list for its never-awaited warning, which must not
keep their checks alive.)"""

from __future__ import annotations

import asyncio
import weakref

import pytest


class _Conn:
    def is_closed(self) -> bool:
        return False


@pytest.mark.parametrize("how", ["granted", "timed-out", "cancelled"])
def test_an_ended_request_drops_its_is_cancelled_check(impl, gc_disabled, how):
    async def main():
        sem = impl.module.AsyncSemaphore(1)
        held = await sem.acquire(1) if how != "granted" else None
        refs = []
        for _ in range(40):              # more than the pure twin's batch
            conn = _Conn()
            refs.append(weakref.ref(conn))
            req = sem.acquire(1, timeout=0.001 if how == "timed-out" else None,
                              is_cancelled=conn.is_closed)
            if how == "granted":
                sem.release(await req)
            elif how == "timed-out":
                with pytest.raises(TimeoutError):
                    await req
            else:
                task = asyncio.ensure_future(req)
                await asyncio.sleep(0)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                del task
            del conn, req
        if held is not None:
            sem.release(held)
        return refs

    # looked at once the loop is gone: the last exception raised in main()
    # holds its frames until then
    alive = [r for r in asyncio.run(main()) if r() is not None]
    assert alive == [], f"{len(alive)} of 40 connections kept alive by ended requests"
