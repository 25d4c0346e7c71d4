"""The apps the real-server tests run under uvicorn (and gunicorn), built by
``create()`` from environment variables (a factory: ``uvicorn --factory
tests.integrations.server_app:create``):

PYLIMITER_TEST_FRAMEWORK  fastapi | starlette
PYLIMITER_TEST_IMPL       c | python (the limiter's twin)
PYLIMITER_TEST_LIMITER    semaphore | shared (SharedSemaphore, host-wide)
PYLIMITER_TEST_BUDGET     bytes (default 8 MiB)
PYLIMITER_TEST_TIMEOUT    seconds a request may queue (default 2)
PYLIMITER_TEST_SHARED     the SharedSemaphore's name (limiter=shared)
PYLIMITER_TEST_SHARED_DIR the directory of its segment
PYLIMITER_TEST_EVENTS     a directory: each process appends "<monotonic ns> <+-bytes>"
                          lines to events-<pid>.log as its handlers take and drop
                          body bytes, so that a test can add up what all the
                          workers of a host held at once

Routes: POST /upload?hold=S reads the body as a stream and holds it S
seconds before answering its size; POST /fail reads the body and raises;
GET /stats is JSON: the bytes the handlers hold now and at most (their
high-water mark), the limiter's permits and queue, this worker's pid; GET
/metrics is the limiter in Prometheus' text format (pylimiter.prometheus).
"""

from __future__ import annotations

import asyncio
import os
import time

from prometheus_client import CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from pylimiter._impls import IMPLEMENTATIONS
from pylimiter.asgi import MemoryLimitMiddleware
from pylimiter.prometheus import LimiterCollector


class Held:
    """Bytes the handlers of this process hold, and the most at once."""

    def __init__(self):
        self.now = 0
        self.hwm = 0
        events = os.environ.get("PYLIMITER_TEST_EVENTS")
        self.log = None if not events else open(
            os.path.join(events, f"events-{os.getpid()}.log"), "a", buffering=1)

    def add(self, n):
        self.now += n
        self.hwm = max(self.hwm, self.now)
        if self.log is not None:
            self.log.write(f"{time.monotonic_ns()} {n}\n")

    def drop(self, n):
        # Logged before the bytes are given back: the test's sum errs high.
        if self.log is not None:
            self.log.write(f"{time.monotonic_ns()} {-n}\n")
        self.now -= n


def _limiter():
    kind = os.environ.get("PYLIMITER_TEST_LIMITER", "semaphore")
    budget = int(os.environ.get("PYLIMITER_TEST_BUDGET", str(8 << 20)))
    timeout = float(os.environ.get("PYLIMITER_TEST_TIMEOUT", "2"))
    if kind == "shared":
        import pylimiter

        return pylimiter.SharedSemaphore(os.environ["PYLIMITER_TEST_SHARED"],
                                         max_permits=budget, timeout=timeout,
                                         directory=os.environ.get("PYLIMITER_TEST_SHARED_DIR"))
    mod = IMPLEMENTATIONS[os.environ.get("PYLIMITER_TEST_IMPL", "c")].module
    return mod.AsyncSemaphore(budget, timeout=timeout)


def create():
    limiter = _limiter()
    held = Held()
    registry = CollectorRegistry()
    metrics = LimiterCollector("test")
    metrics.track("uploads", limiter)
    registry.register(metrics)

    async def upload(request: Request) -> Response:
        hold = float(request.query_params.get("hold", "0"))
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                held.add(len(chunk))
            await asyncio.sleep(hold)
            return PlainTextResponse(str(size), headers={"x-pid": str(os.getpid())})
        finally:
            held.drop(size)

    async def fail(request: Request) -> Response:
        await request.body()
        raise RuntimeError("the app failed")

    async def stats(request: Request) -> Response:
        return JSONResponse({"held": held.now, "held_hwm": held.hwm,
                             "acquired": limiter.acquired_permits,
                             "queued": limiter.stats().queue_size, "pid": os.getpid()})

    async def prometheus(request: Request) -> Response:
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    routes = [("/upload", upload, ["POST"]), ("/fail", fail, ["POST"]),
              ("/stats", stats, ["GET"]), ("/metrics", prometheus, ["GET"])]
    if os.environ.get("PYLIMITER_TEST_FRAMEWORK", "fastapi") == "fastapi":
        from fastapi import FastAPI

        app = FastAPI()
        for path, endpoint, methods in routes:
            app.add_api_route(path, _fastapi_endpoint(endpoint), methods=methods)
    else:
        app = Starlette(routes=[Route(p, e, methods=m) for p, e, m in routes])
    app.add_middleware(MemoryLimitMiddleware, limiter=limiter, retry_after=1.5)
    return app


def _fastapi_endpoint(endpoint):
    async def route(request: Request) -> Response:
        return await endpoint(request)

    route.__name__ = endpoint.__name__
    return route
