"""pylimiter.httpx.MemoryLimitTransport against a real HTTP server (aiohttp,
on 127.0.0.1 in the test's loop), against both implementations (`mod`)."""

from __future__ import annotations

import asyncio

import pytest

from tests._helpers import run

from . import need

httpx = need("httpx")
need("aiohttp")
from aiohttp import web  # noqa: E402

from pylimiter.httpx import MemoryLimitTransport  # noqa: E402

MiB = 1 << 20


class Downloads:
    """GET /bytes?n= (Content-Length), /chunked?n=&k= (k chunks of n, no
    length), /empty (204)."""

    async def sized(self, request):
        return web.Response(body=b"x" * int(request.query["n"]))

    async def chunked(self, request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(int(request.query["k"])):
            await resp.write(b"y" * int(request.query["n"]))
            await asyncio.sleep(0.005)
        await resp.write_eof()
        return resp

    async def empty(self, request):
        return web.Response(status=204)

    async def __aenter__(self):
        app = web.Application()
        app.router.add_get("/bytes", self.sized)
        app.router.add_get("/chunked", self.chunked)
        app.router.add_get("/empty", self.empty)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.base = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def client(limiter):
    return httpx.AsyncClient(transport=MemoryLimitTransport(limiter), timeout=30)


def test_a_response_holds_its_length_until_closed(mod):
    sem = mod.AsyncSemaphore(10 * MiB)

    async def main():
        async with Downloads() as srv, client(sem) as http:
            async with http.stream("GET", f"{srv.base}/bytes?n=12345") as r:
                before = sem.acquired_permits       # headers in, body not read yet
                part = await r.aiter_raw(100).__anext__()
                reading = sem.acquired_permits
            closed = sem.acquired_permits           # left unread: closed on leaving
            async with http.stream("GET", f"{srv.base}/bytes?n=12345") as r:
                body = await r.aread()              # httpx closes a body read to its end
                after_read = sem.acquired_permits
            r2 = await http.get(f"{srv.base}/bytes?n=999")   # reads, then closes
            return (before, len(part), reading, closed, len(body), after_read,
                    len(r2.content), sem.acquired_permits)

    assert run(main()) == (12345, 100, 12345, 0, 12345, 0, 999, 0)


@pytest.mark.slow
def test_20_concurrent_1mib_downloads_under_a_4mib_budget(mod):
    sem = mod.AsyncSemaphore(4 * MiB, timeout=60)
    open_now = [0]
    open_most = [0]

    async def one(http, base):
        async with http.stream("GET", f"{base}/bytes?n={MiB}") as r:
            open_now[0] += 1
            open_most[0] = max(open_most[0], open_now[0])
            size = 0
            async for chunk in r.aiter_bytes(64 * 1024):
                size += len(chunk)
                await asyncio.sleep(0.002)   # a slow consumer
            open_now[0] -= 1
            return size

    async def main():
        async with Downloads() as srv, client(sem) as http:
            return await asyncio.gather(*(one(http, srv.base) for _ in range(20)))

    assert run(main(), timeout=120) == [MiB] * 20
    # Never more than 4 bodies (4 MiB) in flight at once, and the budget was used.
    assert open_most[0] == 4
    assert sem.acquired_permits == 0 and sem.stats().acquired_total == 20


def test_a_body_of_unknown_length_is_charged_as_it_is_read(mod):
    sem = mod.AsyncSemaphore(10 * MiB)
    seen = []

    async def main():
        async with Downloads() as srv, client(sem) as http:
            async with http.stream("GET", f"{srv.base}/chunked?n=1000&k=5") as r:
                assert "content-length" not in r.headers
                seen.append(sem.acquired_permits)
                async for chunk in r.aiter_raw():
                    seen.append(sem.acquired_permits)
                total = seen[-1]
            return total, sem.acquired_permits

    assert run(main()) == (5000, 0)
    assert seen[0] == 0 and seen == sorted(seen)


def test_no_room_is_the_limiters_error_and_the_connection_is_closed(mod):
    sem = mod.AsyncSemaphore(100, timeout=0.05)

    async def main():
        async with Downloads() as srv, client(sem) as http:
            held = sem.try_acquire(100)
            with pytest.raises(mod.PermitAcquireTimeoutError if hasattr(
                    mod, "PermitAcquireTimeoutError") else TimeoutError):
                await http.get(f"{srv.base}/bytes?n=50")
            sem.release(held)
            r = await http.get(f"{srv.base}/bytes?n=50")   # the client still works
            return r.status_code, sem.acquired_permits, sem.queue_size

    assert run(main()) == (200, 0, 0)


def test_a_cancelled_download_leaks_nothing(mod):
    sem = mod.AsyncSemaphore(100, timeout=60)

    async def main():
        async with Downloads() as srv, client(sem) as http:
            held = sem.try_acquire(100)
            t = asyncio.ensure_future(http.get(f"{srv.base}/bytes?n=50"))
            while sem.queue_size == 0:
                await asyncio.sleep(0.01)
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
            sem.release(held)
            return sem.acquired_permits, sem.queue_size

    assert run(main()) == (0, 0)


def test_head_and_204_take_nothing_and_oversize_takes_the_whole_limit(mod):
    sem = mod.AsyncSemaphore(1000)

    async def main():
        async with Downloads() as srv, client(sem) as http:
            await http.head(f"{srv.base}/bytes?n=500")
            await http.get(f"{srv.base}/empty")
            async with http.stream("GET", f"{srv.base}/bytes?n=5000") as r:
                big = sem.acquired_permits
                await r.aread()
            return big

    assert run(main()) == 1000
    stats = sem.stats()
    assert stats.acquired_permits == 0 and stats.acquired_total == 3


def test_a_dual_limiter_holds_downloads_in_its_heap_pool(mod):
    dual = mod.AsyncDualMemoryLimiter(10_000, 10_000)
    heap = dual.get_limiter(mod.LimitType.HEAP_MEMORY)
    direct = dual.get_limiter(mod.LimitType.DIRECT_MEMORY)

    async def main():
        async with Downloads() as srv, client(dual) as http:
            async with http.stream("GET", f"{srv.base}/bytes?n=777") as r:
                held = heap.acquired_permits, direct.acquired_permits
                await r.aread()
            return held

    assert run(main()) == (777, 0)
    assert heap.acquired_permits == 0


def test_bad_arguments(mod):
    with pytest.raises(TypeError, match="^pylimiter: limiter must be a semaphore"):
        MemoryLimitTransport(object())
    with pytest.raises(TypeError, match="^pylimiter: transport must be"):
        MemoryLimitTransport(mod.AsyncSemaphore(1), transport=object())
