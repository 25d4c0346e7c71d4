"""Downloads in flight, bounded on the client side: an httpx transport
(extra ``[httpx]``).

::

    import httpx
    from pylimiter import AsyncSemaphore
    from pylimiter.httpx import MemoryLimitTransport

    limiter = AsyncSemaphore(32 << 20, timeout=30.0)
    async with httpx.AsyncClient(transport=MemoryLimitTransport(limiter)) as client:
        r = await client.get(url)     # its body's bytes held until the response is closed
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Optional

from . import _admission as adm
from ._common import LimitType

try:
    import httpx
except ImportError as exc:  # pragma: no cover - depends on the install
    raise adm.missing_extra("httpx", "httpx", exc) from exc

__all__ = ["MemoryLimitTransport"]

#: Responses that have no body whatever their headers say.
_NO_BODY = frozenset((204, 304))


class MemoryLimitTransport(httpx.AsyncBaseTransport):
    """An ``httpx.AsyncClient`` transport bounding the response bodies in
    flight: a response takes its ``Content-Length`` in permits (bytes) once
    its headers have arrived, before its body is read, and gives them back
    when it is closed (``aclose()``: ``client.get()`` closes after reading,
    ``client.stream()`` on leaving its block).  A body of unknown length
    takes its chunks as they are read (``update()``).

    ``limiter`` is a semaphore (``AsyncSemaphore``, ``SharedSemaphore``) or
    a dual memory limiter, whose heap pool is used (the bodies are read into
    memory); ``transport`` is the one that does the I/O (default: a new
    ``httpx.AsyncHTTPTransport()``).  Waiting uses the limiter's own
    timeout; its ``PermitAcquireTimeoutError`` or
    ``PermitAcquireQueueFullError`` propagates from the request (or, for a
    chunk of unknown length, from the read), and the response is closed.
    A body larger than the whole limit is charged the whole limit.
    """

    def __init__(self, limiter: Any, transport: Optional[httpx.AsyncBaseTransport] = None
                 ) -> None:
        self.limiter = limiter
        self._pool = adm.semaphore_of(limiter, LimitType.HEAP_MEMORY, "limiter")
        if transport is not None and not isinstance(transport, httpx.AsyncBaseTransport):
            raise TypeError("pylimiter: transport must be an httpx.AsyncBaseTransport, not "
                            f"{type(transport).__name__}")
        self.transport = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.transport.handle_async_request(request)
        pool = self._pool
        length: Optional[int] = 0
        if request.method != "HEAD" and response.status_code not in _NO_BODY:
            value = response.headers.get("content-length", "")
            length = int(value) if value.isdigit() else None
        try:
            permit = await pool.acquire(adm.clamp(pool, length or 0))
        except BaseException:
            await response.aclose()
            raise
        return httpx.Response(status_code=response.status_code, headers=response.headers,
                              stream=_HeldStream(response.stream, pool, permit,
                                                 grow=length is None),
                              extensions=response.extensions, request=request)

    async def aclose(self) -> None:
        await self.transport.aclose()


class _HeldStream(httpx.AsyncByteStream):
    """A response body holding its permit until closed."""

    def __init__(self, inner: Any, pool: Any, permit: Any, grow: bool) -> None:
        self._inner = inner
        self._pool = pool
        self._permit = permit
        self._grow = grow

    async def __aiter__(self) -> AsyncIterator[bytes]:
        total = 0
        async for chunk in self._inner:
            if self._grow and chunk:
                total += len(chunk)
                permit = self._permit
                n = adm.clamp(self._pool, total)
                if permit is not None and n > permit.permits:
                    await self._pool.update(permit, n)
            yield chunk

    async def aclose(self) -> None:
        permit, self._permit = self._permit, None
        try:
            aclose = getattr(self._inner, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            if permit is not None:
                self._pool.release(permit)
