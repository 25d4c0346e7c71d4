"""pylimiter.aiohttp.memory_limit_middleware in a real aiohttp server (on
127.0.0.1, in the test's process and loop), with aiohttp clients and raw
sockets, against both implementations (`mod`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests._helpers import run

from . import need

need("aiohttp")
from aiohttp import ClientSession, web  # noqa: E402

from pylimiter import LimitType  # noqa: E402
from pylimiter.aiohttp import memory_limit_middleware  # noqa: E402

MiB = 1 << 20


class Service:
    """An aiohttp app with the middleware: POST /upload reads the body (as
    a stream, chunk by chunk) and answers its size; handlers record what
    the limiter held and the bytes they held at most."""

    def __init__(self, sem, **kw):
        self.sem = sem
        self.calls = 0
        self.held_at_start = []
        self.chunk_permits = []
        self.now = 0
        self.hwm = 0
        self.hold = 0.0
        self.gate: asyncio.Event | None = None
        self.app = web.Application(middlewares=[memory_limit_middleware(sem, **kw)])
        self.app.router.add_post("/upload", self.upload)
        self.app.router.add_post("/fail", self.fail)
        self.app.router.add_post("/reply", self.reply)

    def permits(self):
        sem = self.sem
        if hasattr(sem, "get_limiter"):
            sem = sem.get_limiter(LimitType.HEAP_MEMORY)
        return sem.acquired_permits

    async def upload(self, request):
        self.calls += 1
        self.held_at_start.append(self.permits())
        if self.gate is not None:
            await self.gate.wait()
        size = 0
        try:
            async for chunk in request.content.iter_any():
                size += len(chunk)
                self.now += len(chunk)
                self.hwm = max(self.hwm, self.now)
                self.chunk_permits.append(self.permits())
            await asyncio.sleep(self.hold)
        finally:
            self.now -= size
        return web.Response(text=str(size))

    async def fail(self, request):
        await request.read()
        raise RuntimeError("the handler failed")

    async def reply(self, request):
        await request.read()
        return web.Response(body=b"r" * 5000)

    async def __aenter__(self):
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]
        self.base = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


async def until(cond, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.01)


async def raw(port, length, body=b""):
    """Headers declaring `length` and `body` (less than that), sent by hand."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % length
                 + body)
    await writer.drain()
    return writer


def test_declared_bytes_are_held_until_the_response_is_written(mod):
    sem = mod.AsyncSemaphore(100)

    async def main():
        async with Service(sem) as svc, ClientSession() as http:
            async with http.post(svc.base + "/upload", data=b"x" * 40) as r:
                assert r.status == 200 and await r.text() == "40"
            await until(lambda: sem.acquired_permits == 0)
            return svc

    svc = run(main())
    assert svc.held_at_start == [40]


@pytest.mark.slow
def test_40_concurrent_uploads_never_hold_more_than_the_budget(mod):
    sem = mod.AsyncSemaphore(8 * MiB, timeout=30)

    async def main():
        async with Service(sem) as svc, ClientSession() as http:
            svc.hold = 0.1

            async def one():
                async with http.post(svc.base + "/upload", data=b"x" * MiB) as r:
                    return r.status, await r.text()

            results = await asyncio.gather(*(one() for _ in range(40)))
            await until(lambda: sem.acquired_permits == 0)
            return svc, results

    svc, results = run(main(), timeout=120)
    assert results == [(200, str(MiB))] * 40
    assert 4 * MiB < svc.hwm <= 8 * MiB


def test_a_timeout_is_503_with_retry_after_and_the_handler_never_runs(mod):
    sem = mod.AsyncSemaphore(10, timeout=60)

    async def main():
        async with Service(sem, timeout=0.05, retry_after=1.2) as svc, \
                ClientSession() as http:
            held = sem.try_acquire(10)
            async with http.post(svc.base + "/upload", data=b"x" * 5) as r:
                out = r.status, r.headers.get("Retry-After"), await r.text()
            sem.release(held)
            return svc, out

    svc, (status, retry, text) = run(main())
    assert status == 503 and retry == "2" and text.count("\n") == 1
    assert svc.calls == 0 and sem.acquired_permits == 0 and sem.queue_size == 0


def test_a_full_queue_is_503_at_once(mod):
    sem = mod.AsyncSemaphore(10, max_queue_size=1, timeout=60)

    async def main():
        async with Service(sem) as svc, ClientSession() as http:
            held = sem.try_acquire(10)
            w = await raw(svc.port, 5, b"x" * 5)
            await until(lambda: sem.queue_size == 1)
            t0 = time.monotonic()
            async with http.post(svc.base + "/upload", data=b"x" * 5) as r:
                status = r.status
            took = time.monotonic() - t0
            w.close()
            sem.release(held)
            await until(lambda: sem.acquired_permits == 0 and sem.queue_size == 0)
            return status, took

    status, took = run(main())
    assert status == 503 and took < 5 and sem.stats().queue_full_total == 1


def test_over_the_limit_is_413_and_alone_runs_alone(mod):
    sem = mod.AsyncSemaphore(10)

    async def main():
        out = []
        for kw in ({}, {"oversize": "alone"}):
            async with Service(sem, **kw) as svc, ClientSession() as http:
                async with http.post(svc.base + "/upload", data=b"x" * 25) as r:
                    out.append((r.status, await r.text(), list(svc.held_at_start)))
        return out

    (s1, t1, h1), (s2, t2, h2) = run(main())
    assert s1 == 413 and h1 == [] and t1.startswith("Payload Too Large")
    assert (s2, t2, h2) == (200, "25", [10])
    assert sem.acquired_permits == 0


def test_a_chunked_body_is_charged_chunk_by_chunk_and_cut_past_the_limit(mod):
    sem = mod.AsyncSemaphore(1000)

    async def chunks(sizes, pause=0.02):
        for n in sizes:
            yield b"x" * n
            await asyncio.sleep(pause)

    async def main():
        async with Service(sem) as svc, ClientSession() as http:
            async with http.post(svc.base + "/upload", data=chunks([100, 200, 300])) as r:
                ok = r.status, await r.text(), list(svc.chunk_permits)
            async with http.post(svc.base + "/upload", data=chunks([400, 400, 400])) as r:
                cut = r.status
            await until(lambda: sem.acquired_permits == 0)
            return ok, cut

    (status, text, permits), cut = run(main())
    assert status == 200 and text == "600"
    assert permits == [100, 300, 600]      # each chunk charged before it was read
    assert cut == 413


def test_a_chunk_with_no_room_is_503(mod):
    sem = mod.AsyncSemaphore(1000)

    async def chunks():
        yield b"x" * 100
        await until(lambda: sem.acquired_permits == 100)
        other.append(sem.try_acquire(900))
        yield b"x" * 100

    other = []

    async def main():
        async with Service(sem, timeout=0.05) as svc, ClientSession() as http:
            async with http.post(svc.base + "/upload", data=chunks()) as r:
                status, retry = r.status, r.headers.get("Retry-After")
            sem.release(other[0])
            await until(lambda: sem.acquired_permits == 0)
            return status, retry

    assert run(main()) == (503, "1")


def test_a_client_leaving_while_queued_leaves_the_queue_at_once(mod):
    sem = mod.AsyncSemaphore(10, timeout=60)

    async def main():
        async with Service(sem) as svc:
            held = sem.try_acquire(10)
            w = await raw(svc.port, 5)
            await until(lambda: sem.queue_size == 1)
            w.close()
            t0 = time.monotonic()
            await until(lambda: sem.queue_size == 0, 2.0)
            left = time.monotonic() - t0
            sem.release(held)
            return svc, left

    svc, left = run(main())
    assert left < 2.0 and svc.calls == 0 and sem.acquired_permits == 0


def test_a_client_leaving_mid_body_and_a_failing_handler_give_the_bytes_back(mod):
    sem = mod.AsyncSemaphore(10 * MiB)

    async def main():
        async with Service(sem) as svc, ClientSession() as http:
            w = await raw(svc.port, MiB, b"x" * 1000)
            await until(lambda: sem.acquired_permits == MiB)
            w.close()
            await until(lambda: sem.acquired_permits == 0)
            async with http.post(svc.base + "/fail", data=b"x" * 100) as r:
                assert r.status == 500
            await until(lambda: sem.acquired_permits == 0)

    run(main())


def test_the_key_gets_the_request_and_its_permits_come_first(mod):
    glob = mod.AsyncSemaphore(100)
    tenants = {"a": mod.AsyncSemaphore(10)}
    seen = []

    def key(request):
        seen.append(type(request).__name__)
        return request.headers.get("X-Tenant")

    async def main():
        async with Service(glob, key=key, key_limiter=tenants.get) as svc, \
                ClientSession() as http:
            svc.gate = asyncio.Event()

            async def post(tenant, n):
                async with http.post(svc.base + "/upload", data=b"x" * n,
                                     headers={"X-Tenant": tenant}) as r:
                    return r.status

            t1 = asyncio.ensure_future(post("a", 8))
            await until(lambda: svc.calls == 1)
            t2 = asyncio.ensure_future(post("a", 8))
            await until(lambda: tenants["a"].queue_size == 1)
            assert glob.acquired_permits == 8   # the waiting one holds no global bytes
            t3 = asyncio.ensure_future(post("b", 8))   # no per-key limit for "b"
            await until(lambda: svc.calls == 2)
            svc.gate.set()
            return await asyncio.gather(t1, t2, t3)

    assert run(main()) == [200, 200, 200]
    assert set(seen) == {"Request"} and glob.acquired_permits == 0


def test_a_dual_limiter_holds_responses_in_direct_while_written(mod):
    dual = mod.AsyncDualMemoryLimiter(100, 10_000, direct_timeout=0.05)
    direct = dual.get_limiter(mod.LimitType.DIRECT_MEMORY)
    seen = []

    async def main():
        svc = Service(dual)

        async def on_prepare(request, response):
            seen.append(direct.acquired_permits)

        svc.app.on_response_prepare.append(on_prepare)
        async with svc, ClientSession() as http:
            async with http.post(svc.base + "/reply", data=b"x" * 10) as r:
                assert r.status == 200 and len(await r.read()) == 5000
            held = direct.try_acquire(10_000)
            async with http.post(svc.base + "/reply", data=b"x" * 10) as r:
                busy = r.status
            direct.release(held)
            return busy

    assert run(main()) == 503   # no room for the second reply
    assert seen[0] == 5000
    assert direct.acquired_permits == 0
    assert dual.get_limiter(mod.LimitType.HEAP_MEMORY).acquired_permits == 0
