"""Request and response bodies in flight, bounded for an aiohttp server
(extra ``[aiohttp]``).

::

    from aiohttp import web
    from pylimiter import AsyncSemaphore
    from pylimiter.aiohttp import memory_limit_middleware

    limiter = AsyncSemaphore(64 << 20, timeout=5.0)
    app = web.Application(middlewares=[memory_limit_middleware(limiter)])

The rules of ``pylimiter.asgi.MemoryLimitMiddleware``, in aiohttp's terms:
see ``memory_limit_middleware``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Optional

from . import _admission as adm

try:
    from aiohttp import StreamReader, web
except ImportError as exc:  # pragma: no cover - depends on the install
    raise adm.missing_extra("aiohttp", "aiohttp", exc) from exc

__all__ = ["memory_limit_middleware"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_BUSY_TEXT = "Service busy: too many request bytes in flight, retry later\n"
#: While a request is queued, how often its connection is looked at.
_DISCONNECT_POLL_S = 0.1


def memory_limit_middleware(limiter: Any, *, timeout: Optional[float] = None,
                            max_body_size: Optional[int] = None, oversize: str = "reject",
                            retry_after: float = 1.0,
                            key: Optional[Callable[[web.Request], Optional[str]]] = None,
                            key_limiter: Optional[Callable[[str], Any]] = None,
                            response_limiter: Any = None) -> Any:
    """An aiohttp middleware (``web.middleware``) holding each request's
    bytes in ``limiter``, with the rules and arguments of
    ``pylimiter.asgi.MemoryLimitMiddleware``; ``key`` receives the
    ``web.Request``.

    * ``Content-Length: N`` takes N permits before the handler runs; a body
      of unknown length (chunked) takes its first chunk before the handler
      runs and each later chunk as the handler reads it (``update()``).
      The handler reads the body as usual (``request.read()``,
      ``request.content``...).  Permits go back once the response has been
      written, or when the handler fails.
    * A wait past ``timeout`` (None: the limiter's own) or a full queue:
      503 with ``Retry-After: ceil(retry_after)``, the handler never runs; a
      later chunk with no room makes the handler's read raise
      ``web.HTTPServiceUnavailable`` (413: ``web.HTTPRequestEntityTooLarge``
      for a body growing past the limit), which aiohttp answers.
    * A declared body over ``max_body_size`` (default: the limiter's limit):
      413 at once; ``oversize="alone"`` charges it the whole limit instead.
    * A client that disconnects while queued leaves the queue within
      ``0.1`` s (its connection is looked at; the body is not touched).
    * Responses: the middleware writes a response the handler returned
      unprepared (``prepare`` and ``write_eof``) so that the request's bytes
      are held until it is written; ``response_limiter`` (or the direct
      pool of a dual ``limiter``) holds the response body's bytes while it
      is written (no room: 503 instead).  A response the handler prepared
      and streamed itself is not counted there.  Put this middleware first
      in ``middlewares=[...]`` (outermost): the ones outside it would get a
      response already written.
    """
    s = adm.Settings(limiter, timeout=timeout, max_body_size=max_body_size, oversize=oversize,
                     retry_after=retry_after, key=key, key_limiter=key_limiter,
                     response_limiter=response_limiter)

    @web.middleware
    async def pylimiter_memory_limit(request: web.Request,
                                     handler: Handler) -> web.StreamResponse:
        held: adm.Held = []
        pump: Optional[asyncio.Task] = None
        try:
            length = request.content_length
            limit = s.limit()
            if length:
                charges = s.declared_charges(s.pools(request), length, limit)
                if charges is None:
                    return _too_large(f"{length} bytes, limit {limit}")
                answer = await _admit(request, s, charges, held)
                if answer is not None:
                    return answer
            elif length is None and request.body_exists:
                request, pump, answer = await _admit_chunked(request, s, held, limit)
                if answer is not None:
                    return answer
            response = await handler(request)
            cut = request.content.exception() if pump is not None else None
            if isinstance(cut, web.HTTPException):
                raise cut   # the handler swallowed the read error of a cut body
            if not response.prepared and (held or s.response_pool is not None):
                answer = await _write(request, response, s)
                if answer is not None:
                    return answer
            return response
        finally:
            if pump is not None:
                pump.cancel()
            adm.release_all(held)

    return pylimiter_memory_limit


def _busy(s: adm.Settings) -> web.Response:
    return web.Response(status=503, text=_BUSY_TEXT,
                        headers={"Retry-After": s.retry_after_header})


def _too_large(what: str) -> web.Response:
    return web.Response(status=413, text=f"Payload Too Large: {what}\n")


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing() or \
        request.content.exception() is not None


async def _admit(request: web.Request, s: adm.Settings, charges: list,
                 held: adm.Held) -> Optional[web.StreamResponse]:
    """Take the charges in order; None once held, else the answer (503,
    or a 503 nobody reads when the client is gone)."""
    try:
        taken = adm.try_all(charges, held)
    except adm.BUSY_ERRORS:
        return _busy(s)
    if taken == len(charges):
        return None
    acq = asyncio.ensure_future(adm.acquire_all(charges[taken:], adm.deadline_of(s.timeout)))
    try:
        while not acq.done():
            await asyncio.wait((acq,), timeout=_DISCONNECT_POLL_S)
            if not acq.done() and _gone(request):
                adm.give_up(acq)
                adm.release_all(held)
                return _busy(s)
    except BaseException:
        adm.give_up(acq)
        raise
    try:
        held.extend(acq.result())
    except adm.BUSY_ERRORS:
        return _busy(s)
    return None


async def _admit_chunked(request: web.Request, s: adm.Settings, held: adm.Held,
                         limit: Optional[int]) -> tuple[web.Request, Optional[asyncio.Task],
                                                        Optional[web.StreamResponse]]:
    """A body of unknown length: the handler gets a clone of the request
    whose body stream is fed by a pump that charges each chunk (growing the
    permits) before handing it on.  The first chunk is charged before the
    handler runs."""
    source = request.content
    first = await source.readany()
    if limit is not None and len(first) > limit:
        return request, None, _too_large(f"more than {limit} bytes")
    answer = await _admit(request, s, [(p, adm.clamp(p, len(first))) for p in s.pools(request)],
                          held)
    if answer is not None:
        return request, None, answer
    # The handler's stream pauses and resumes the connection itself, so the
    # pump never moves more than its buffer's high-water mark ahead of the
    # handler (aiohttp's flow control).
    charged = StreamReader(request.protocol, 2**16, loop=asyncio.get_running_loop())
    if first:
        charged.feed_data(first)
    else:
        charged.feed_eof()
    # aiohttp has no public way to hand a handler another body stream: a
    # clone (its `content` not yet read, so not cached) gets it in place of
    # the connection's.  Values set on the clone (request["..."]) stay there.
    clone = request.clone()
    clone._payload = charged   # type: ignore[attr-defined]
    if not first:
        return clone, None, None
    pump = asyncio.ensure_future(_pump(source, charged, s, held, len(first), limit))
    return clone, pump, None


async def _pump(source: StreamReader, charged: StreamReader, s: adm.Settings,
                held: adm.Held, total: int, limit: Optional[int]) -> None:
    try:
        while True:
            chunk = await source.readany()
            if not chunk:
                charged.feed_eof()
                return
            total += len(chunk)
            if limit is not None and total > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=total,
                                                    text=f"Payload Too Large: more than "
                                                         f"{limit} bytes\n")
            try:
                await adm.grow_all(held, total, adm.deadline_of(s.timeout))
            except adm.BUSY_ERRORS:
                raise web.HTTPServiceUnavailable(
                    text=_BUSY_TEXT, headers={"Retry-After": s.retry_after_header}) from None
            charged.feed_data(chunk)
    except asyncio.CancelledError:
        charged.set_exception(ConnectionResetError("pylimiter: the request ended"))
        raise
    except Exception as exc:
        # The handler's next read raises it: a cut (413/503, which aiohttp
        # answers if the handler lets it through), or the connection's own
        # failure (the client left).
        charged.set_exception(exc)
        if isinstance(exc, web.HTTPException):
            adm.release_all(held)   # cut: its bytes are back at once


async def _write(request: web.Request, response: web.StreamResponse,
                 s: adm.Settings) -> Optional[web.StreamResponse]:
    """Write an unprepared response here, holding its body's bytes in the
    response pool while it is written; None once written, or the 503 to
    send instead when there is no room for them."""
    pool = s.response_pool
    permit = None
    if pool is not None:
        n = _body_size(response)
        if n:
            try:
                permit = await pool.acquire(adm.clamp(pool, n),
                                            **adm.timeout_kw(adm.deadline_of(s.timeout)))
            except adm.BUSY_ERRORS:
                return _busy(s)
    try:
        await response.prepare(request)
        await response.write_eof()
    finally:
        if permit is not None:
            pool.release(permit)   # type: ignore[union-attr]
    return None


def _body_size(response: web.StreamResponse) -> int:
    if isinstance(response, web.Response):
        body = response.body
        if isinstance(body, (bytes, bytearray, memoryview)):
            return len(body)
        size = getattr(body, "size", None)
        if isinstance(size, int):
            return size
    return 0
