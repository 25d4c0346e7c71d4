"""The FastAPI app benchmarks.http_bench serves under uvicorn (a factory:
``uvicorn --factory benchmarks.http_app:create``), one variant per process:

PYLIMITER_BENCH_VARIANT  plain      no middleware
                         pylimiter  pylimiter.asgi.MemoryLimitMiddleware
                         asyncio    a hand-written asyncio.Semaphore middleware
                                    (requests, not bytes, the usual stopgap)
PYLIMITER_BENCH_BUDGET   the middleware's budget in bytes (pylimiter)
PYLIMITER_BENCH_LIMIT    the asyncio.Semaphore's count (asyncio)

POST /small reads its (small) body and answers 2 bytes; POST /upload?hold=S
reads the whole body into memory (as a broker holds a message) and keeps it
S seconds before answering its size.
"""

from __future__ import annotations

import asyncio
import os

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

from pylimiter import AsyncSemaphore
from pylimiter.asgi import MemoryLimitMiddleware


class SemaphoreMiddleware:
    """What services write by hand today: at most `limit` requests in the
    app at once, whatever their size."""

    def __init__(self, app, limit: int):
        self.app = app
        self.sem = asyncio.Semaphore(limit)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        async with self.sem:
            await self.app(scope, receive, send)


def create() -> FastAPI:
    app = FastAPI()

    @app.post("/small")
    async def small(request: Request) -> Response:
        await request.body()
        return Response(b"ok")

    @app.post("/upload")
    async def upload(request: Request) -> Response:
        body = await request.body()
        await asyncio.sleep(float(request.query_params.get("hold", "0")))
        return PlainTextResponse(str(len(body)))

    variant = os.environ.get("PYLIMITER_BENCH_VARIANT", "plain")
    if variant == "pylimiter":
        budget = int(os.environ.get("PYLIMITER_BENCH_BUDGET", str(1 << 30)))
        app.add_middleware(MemoryLimitMiddleware, limiter=AsyncSemaphore(budget, timeout=300))
    elif variant == "asyncio":
        app.add_middleware(SemaphoreMiddleware,
                           limit=int(os.environ.get("PYLIMITER_BENCH_LIMIT", "1000")))
    elif variant != "plain":
        raise ValueError(f"unknown PYLIMITER_BENCH_VARIANT {variant!r}")
    return app
