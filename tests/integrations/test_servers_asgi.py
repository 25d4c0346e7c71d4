"""MemoryLimitMiddleware in real servers: uvicorn serving a FastAPI app and a
plain Starlette app (tests/integrations/server_app.py) in a subprocess on
127.0.0.1, driven by httpx clients and raw sockets.  The budget is 8 MiB and
a request may queue 2 s.  Each framework runs on one of the twins (FastAPI
on the C one, Starlette on the pure-Python one); the unit tests in
test_asgi.py run every rule on both."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import pytest

from tests._helpers import run

from . import need
from .servers import get, uvicorn

httpx = need("httpx")
need("uvicorn")
need("fastapi")

pytestmark = pytest.mark.slow

MiB = 1 << 20
BUDGET = 8 * MiB
TIMEOUT = 2.0


@pytest.fixture(scope="module", params=[("fastapi", "c"), ("starlette", "python")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def server(request, tmp_path_factory):
    framework, impl = request.param
    log = tmp_path_factory.mktemp("asgi") / "server.log"
    env = {"PYLIMITER_TEST_FRAMEWORK": framework, "PYLIMITER_TEST_IMPL": impl,
           "PYLIMITER_TEST_BUDGET": str(BUDGET), "PYLIMITER_TEST_TIMEOUT": str(TIMEOUT)}
    with uvicorn("tests.integrations.server_app:create", log, env) as srv:
        yield srv
        stats = server_stats(srv)
        # Whatever ran, the handlers never held more than the budget.
        assert stats["held_hwm"] <= BUDGET, stats


def server_stats(srv) -> dict:
    return json.loads(get(srv.base + "/stats"))


def wait_stats(srv, cond, timeout=5.0) -> dict:
    """Poll /stats until cond(stats) holds (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        s = server_stats(srv)
        if cond(s):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout} s: {s}")
        time.sleep(0.02)


def client() -> "httpx.AsyncClient":
    return httpx.AsyncClient(limits=httpx.Limits(max_connections=256),
                             timeout=httpx.Timeout(30.0))


def raw_request(srv, length: int, body: bytes = b"") -> socket.socket:
    """A request sent by hand: headers declaring `length`, then `body` (less
    than that), and the connection left open."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"POST /upload HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % length + body)
    return s


def test_40_concurrent_uploads_never_hold_more_than_the_budget(server):
    async def main():
        async with client() as http:
            async def one(i):
                t0 = time.monotonic()
                r = await http.post(f"{server.base}/upload?hold=0.2", content=b"x" * MiB)
                return r, time.monotonic() - t0

            return await asyncio.gather(*(one(i) for i in range(40)))

    results = run(main(), timeout=120)
    ok = [r for r, _ in results if r.status_code == 200]
    for r, waited in results:
        # Every request is answered: served, or refused after its timeout.
        assert r.status_code in (200, 503), r.text
        if r.status_code == 200:
            assert r.text == str(MiB)
        else:
            assert r.headers["retry-after"] == "2" and waited >= TIMEOUT * 0.9
    assert len(ok) >= 16
    stats = wait_stats(server, lambda s: s["acquired"] == 0 and s["queued"] == 0)
    # The budget was used (more than half of it held at once), never exceeded.
    assert BUDGET // 2 < stats["held_hwm"] <= BUDGET
    metrics = get(server.base + "/metrics").decode()
    assert sample(metrics, "test_uploads_permits_used") == 0
    assert sample(metrics, "test_uploads_permits_limit") == BUDGET
    assert sample(metrics, "test_uploads_acquired_total") >= len(ok)


def sample(exposition: str, name: str) -> float:
    """One sample's value from Prometheus' text format."""
    m = re.search(rf"^{name} (\S+)$", exposition, re.M)
    assert m, f"{name} not in the exposition"
    return float(m[1])


def test_queued_requests_get_503_after_their_timeout_and_a_leaver_leaves_at_once(server):
    async def main():
        async with client() as http:
            fill = asyncio.ensure_future(
                http.post(f"{server.base}/upload?hold=3.5", content=b"x" * BUDGET))
            await asyncio.to_thread(wait_stats, server, lambda s: s["acquired"] == BUDGET)
            leaver = raw_request(server, MiB)           # headers only, then gone
            await asyncio.to_thread(wait_stats, server, lambda s: s["queued"] == 1)
            t0 = time.monotonic()
            waiting = [asyncio.ensure_future(
                http.post(f"{server.base}/upload", content=b"x" * MiB)) for _ in range(2)]
            await asyncio.to_thread(wait_stats, server, lambda s: s["queued"] == 3)
            leaver.close()
            left = time.monotonic()
            await asyncio.to_thread(wait_stats, server, lambda s: s["queued"] == 2, 1.5)
            left = time.monotonic() - left
            refused = await asyncio.gather(*waiting)
            waited = time.monotonic() - t0
            return (await fill), refused, left, waited

    fill, refused, left, waited = run(main(), timeout=60)
    assert fill.status_code == 200 and fill.text == str(BUDGET)
    assert left < TIMEOUT                   # the disconnect, not the timeout
    for r in refused:
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        assert r.text.count("\n") == 1
    assert waited >= TIMEOUT * 0.9
    wait_stats(server, lambda s: s["acquired"] == 0 and s["queued"] == 0)


def test_a_declared_body_over_the_budget_is_413(server):
    async def main():
        async with client() as http:
            return await http.post(f"{server.base}/upload", content=b"x" * (BUDGET + 1))

    r = run(main())
    assert r.status_code == 413
    wait_stats(server, lambda s: s["acquired"] == 0)


def test_chunked_bodies_are_charged_as_they_come_and_cut_past_the_budget(server):
    async def chunks(n, size):
        for _ in range(n):
            yield b"x" * size
            await asyncio.sleep(0)

    async def main():
        async with client() as http:
            ok = await http.post(f"{server.base}/upload", content=chunks(3, 256 * 1024))
            try:
                big = await http.post(f"{server.base}/upload", content=chunks(12, MiB))
            except httpx.TransportError as exc:   # the server stopped reading
                big = exc
            return ok, big

    ok, big = run(main(), timeout=60)
    assert ok.status_code == 200 and ok.text == str(3 * 256 * 1024)
    assert ok.request.headers.get("transfer-encoding") == "chunked"
    assert not isinstance(big, Exception) and big.status_code == 413, big
    wait_stats(server, lambda s: s["acquired"] == 0)


def test_a_client_leaving_mid_body_gives_its_bytes_back(server):
    s = raw_request(server, MiB, b"x" * (100 * 1024))
    wait_stats(server, lambda st: st["acquired"] == MiB)
    s.close()
    wait_stats(server, lambda st: st["acquired"] == 0, 5.0)


def test_an_app_exception_gives_the_bytes_back(server):
    async def main():
        async with client() as http:
            return await http.post(f"{server.base}/fail", content=b"x" * 1000)

    assert run(main()).status_code == 500
    wait_stats(server, lambda s: s["acquired"] == 0)
