"""Request and response bodies in flight, bounded for any ASGI 3 app
(extra ``[asgi]``: nothing to install, ASGI is a protocol).

::

    from fastapi import FastAPI
    from pylimiter import AsyncSemaphore
    from pylimiter.asgi import MemoryLimitMiddleware

    app = FastAPI()
    app.add_middleware(MemoryLimitMiddleware, limiter=AsyncSemaphore(64 << 20, timeout=5.0))

PIP-442's rule for HTTP: a request declaring ``Content-Length: N`` takes N
permits (bytes) before the app sees the first byte of its body, and holds
them until the last ``http.response.body`` send has returned, or until the
client disconnects.  More requests queue, FIFO; one that waits past its
timeout, or finds the queue full, is answered 503 with ``Retry-After`` and
the app never runs.  A body without a declared length (chunked, HTTP/2)
takes each chunk's size as it arrives, growing one permit with
``update()``.  See ``MemoryLimitMiddleware`` for every rule.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, MutableMapping, Optional

from . import _admission as adm
from ._common import LimitType

__all__ = ["MemoryLimitMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_HEAP, _DIRECT = LimitType.HEAP_MEMORY, LimitType.DIRECT_MEMORY
_DISCONNECT: Message = {"type": "http.disconnect"}
_BUSY_TEXT = b"Service busy: too many request bytes in flight, retry later\n"
_CUT_AFTER_START = ("pylimiter: the request body was cut (over its limit, or no room for "
                    "it) after the response had started; the connection is aborted")


class MemoryLimitMiddleware:
    """ASGI 3 middleware holding each HTTP request's bytes in a limiter.

    ``limiter``: an ``AsyncSemaphore`` (or ``SharedSemaphore``) counting
    bytes, or a dual memory limiter (heap pool for request bodies, direct pool
    for response bodies).

    * ``Content-Length: N`` takes N permits before the app is called; the
      body itself is never read into memory by the middleware.  A body of
      unknown length (chunked) takes each chunk's size as it arrives, one
      permit grown with ``update()``.  Permits go back once the last
      ``http.response.body`` send has returned (a background task still
      running does not hold them), or when the client disconnects.
    * ``timeout`` (seconds; None: each limiter's own default) bounds the
      wait; past it, or with the queue full (at once), the answer is 503
      with ``Retry-After: ceil(retry_after)`` and a one-line text body, and
      the app is never called.  A chunk that finds no room later cuts the
      request the same way.
    * A declared body larger than ``max_body_size`` (default: the limiter's
      limit) is answered 413 at once; ``oversize="alone"`` instead charges
      it the whole limit, so it runs alone.  A body of unknown length that
      grows past that size is cut with 413.  A request larger than a pool's
      whole limit is charged that limit (it runs alone in that pool).
    * ``key(scope) -> str`` with ``key_limiter(key) -> limiter`` (e.g. a
      dict's ``__getitem__``; a key or limiter of None means no per-key
      limit): a request holds its key's permits and the global ones; the
      key's are taken first, so a tenant over its own budget waits without
      holding global permits.  With an explicit ``timeout`` the whole chain
      shares one deadline.
    * ``response_limiter`` (or the direct pool of a dual ``limiter``): the
      bytes of each ``http.response.body`` are held from that message until
      its send returns.  The response start is kept back until the first
      body has its permits, so no room there is still a clean 503.
    * While a request is queued the middleware pulls at most one body
      message (handed on to the app, never buffered beyond it) to notice a
      disconnect; a disconnect leaves the queue at once.  Once a partial
      body message is in hand, a disconnect can only be noticed at the
      timeout: pulling more would buffer the body.
    * Websocket and lifespan scopes pass through untouched.
    """

    def __init__(self, app: ASGIApp, limiter: Any, *, timeout: Optional[float] = None,
                 max_body_size: Optional[int] = None, oversize: str = "reject",
                 retry_after: float = 1.0,
                 key: Optional[Callable[[Scope], Optional[str]]] = None,
                 key_limiter: Optional[Callable[[str], Any]] = None,
                 response_limiter: Any = None) -> None:
        if not callable(app):
            raise TypeError(f"pylimiter: app must be an ASGI app, not {type(app).__name__}")
        self.app = app
        self.limiter = limiter
        self._s = adm.Settings(limiter, timeout=timeout, max_body_size=max_body_size,
                               oversize=oversize, retry_after=retry_after, key=key,
                               key_limiter=key_limiter, response_limiter=response_limiter)
        self._retry_after = self._s.retry_after_header.encode()
        # The lean path's inputs, looked up once (the pool is fixed).
        s = self._s
        self._quick = s.key is None and s.response_pool is None
        self._try_acquire = getattr(s.pool, "try_acquire", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._quick:
            # The common case, kept lean: one global pool, a declared length
            # (or no body) that is granted at once.  Anything else, and every
            # way of waiting, takes the general path below.
            length, chunked = _declared(scope)
            if not chunked and length is not None and length >= 0:
                if length == 0:
                    await self.app(scope, receive, send)   # no body: nothing to hold
                    return
                s = self._s
                pool = s.pool
                most = pool.max_permits
                limit = s.max_body_size
                if limit is None:
                    limit = most
                if (limit <= 0 or length <= limit) and (most <= 0 or length <= most):
                    try_acquire = self._try_acquire
                    try:
                        permit = try_acquire(length) if try_acquire is not None else None
                    except adm.BUSY_ERRORS:   # closed: answered below
                        permit = None
                    if permit is not None:
                        quick = _Quick(pool, permit, receive, send)
                        try:
                            await self.app(scope, quick.app_receive, quick.app_send)
                        finally:
                            quick.release()
                        return
                    # No room now: queue (the general path does not try again).
                    await _Exchange(self, scope, receive, send, tried=True).run()
                    return
        await _Exchange(self, scope, receive, send).run()


class _Quick:
    """A request granted at once, with nothing else to do than give its
    permit back after the last body send (or at a disconnect)."""

    __slots__ = ("permit", "pool", "receive", "send", "trailers")

    def __init__(self, pool: Any, permit: Any, receive: Receive, send: Send) -> None:
        self.pool = pool
        self.permit = permit
        self.receive = receive
        self.send = send
        self.trailers = False

    async def app_receive(self) -> Message:
        msg = await self.receive()
        if msg["type"] == "http.disconnect":
            self.release()
        return msg

    async def app_send(self, msg: Message) -> None:
        await self.send(msg)
        t = msg["type"]
        if t == "http.response.body":
            if not msg.get("more_body", False) and not self.trailers:
                self.release()
        elif t == "http.response.start":
            self.trailers = bool(msg.get("trailers", False))
        elif t == "http.response.pathsend" or (
                t == "http.response.trailers" and not msg.get("more_trailers", False)):
            self.release()

    def release(self) -> None:
        permit = self.permit
        if permit is not None:
            self.permit = None
            self.pool.release(permit)


def _declared(scope: Scope) -> tuple[Optional[int], bool]:
    """(Content-Length or None, whether a body of unknown length may come).
    A malformed Content-Length is (-1, False)."""
    length = None
    chunked = False
    for name, value in scope["headers"]:
        if name == b"content-length":
            if not value.isdigit():
                value = value.strip()   # servers strip it; this is the rare path
                if not value.isdigit():
                    return -1, False
            n = int(value)
            if length is not None and n != length:
                return -1, False
            length = n
        elif name == b"transfer-encoding":
            chunked = True
    if length is not None:
        return length, False
    # HTTP/1.x without either header has no body; HTTP/2 and 3 frame bodies
    # without declaring them.
    return None, chunked or scope.get("http_version", "1.1") not in ("1.0", "1.1")


class _Exchange:
    """One HTTP request through the middleware: its permits and its state."""

    __slots__ = ("aborted", "app_receive_stash", "chunked", "cut", "deadline", "held", "limit",
                 "mw", "tried",
                 "pending", "receive", "released", "resp_permit", "scope", "send",
                 "start", "started", "total", "trailers")

    def __init__(self, mw: MemoryLimitMiddleware, scope: Scope, receive: Receive,
                 send: Send, tried: bool = False) -> None:
        self.mw = mw
        self.tried = tried         # the fast path's try_acquire already failed
        self.scope = scope
        self.receive = receive
        self.send = send
        self.held: adm.Held = []
        self.app_receive_stash: list[Message] = []   # pulled while queued: handed on
        self.pending: Optional[asyncio.Future] = None   # a receive() in flight
        self.resp_permit: Any = None
        self.start: Optional[Message] = None   # a response start kept back
        self.started = False       # a response start reached the server
        self.trailers = False
        self.cut = False           # the middleware answered (or gave up) for the app
        self.aborted = False       # ... after the app's response had started
        self.released = False      # the request's permits are back for good
        self.chunked = False
        self.total = 0
        self.limit: Optional[int] = None
        self.deadline: Optional[float] = None

    # ---- the request ---------------------------------------------------

    async def run(self) -> None:
        length, chunked = _declared(self.scope)
        if length == -1:
            await self._answer(400, b"Bad Request: malformed Content-Length\n")
            return
        self.limit = self.mw._s.limit()
        try:
            if chunked:
                self.chunked = True
                if not await self._admit_chunked():
                    return
            elif length:
                if not await self._admit_declared(length):
                    return
            await self._call_app()
        finally:
            self._finish()

    async def _admit_declared(self, length: int) -> bool:
        charges = self.mw._s.declared_charges(self.mw._s.pools(self.scope), length, self.limit)
        if charges is None:
            await self._answer(413, b"Payload Too Large: %d bytes, limit %d\n"
                               % (length, self.limit))
            return False
        return await self._admit(charges)

    async def _admit_chunked(self) -> bool:
        """A body of unknown length: its first message is pulled (waiting for
        it takes no permits) and charged before the app runs; later chunks
        grow the permits as the app receives them."""
        msg = await self.receive()
        if msg["type"] != "http.request":   # gone before sending anything
            return False
        self.app_receive_stash.append(msg)
        n = len(msg.get("body", b""))
        self.total = n
        if self.limit is not None and n > self.limit:
            await self._answer(413, b"Payload Too Large: more than %d bytes\n" % self.limit)
            return False
        pools = self.mw._s.pools(self.scope)
        return await self._admit([(p, adm.clamp(p, n)) for p in pools])

    async def _admit(self, charges: list) -> bool:
        """Take the charges (in order); True once held.  False when the
        request was answered (503) or its client left while it waited."""
        self.deadline = adm.deadline_of(self.mw._s.timeout)
        held = self.held
        try:
            taken = 0 if self.tried else adm.try_all(charges, held)
        except adm.BUSY_ERRORS:
            await self._busy()
            return False
        if taken == len(charges):
            return True
        acq = asyncio.ensure_future(adm.acquire_all(charges[taken:], self.deadline))
        watch = self._watch()
        try:
            while True:
                waiting = {acq} if watch is None else {acq, watch}
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                if watch is not None and watch.done():
                    msg = watch.result()
                    if msg["type"] == "http.disconnect":
                        watch = None
                        adm.give_up(acq)
                        adm.release_all(held)
                        return False
                    self.app_receive_stash.append(msg)
                    watch = self._watch()
                    continue
                break
        except BaseException:
            adm.give_up(acq)
            if watch is not None:
                watch.cancel()
            raise
        self.pending = watch   # the app's next receive() takes it over
        try:
            held.extend(acq.result())
        except adm.BUSY_ERRORS:
            await self._busy()
            return False
        return True

    def _watch(self) -> Optional[asyncio.Future]:
        """A receive() to notice a disconnect while queued, when one may be
        made without buffering the body: nothing pulled yet, or the whole
        body already in hand (then only a disconnect can come)."""
        stash = self.app_receive_stash
        if stash and stash[-1].get("more_body", False):
            return None
        return asyncio.ensure_future(self.receive())

    async def _call_app(self) -> None:
        try:
            await self.mw.app(self.scope, self._app_receive, self._app_send)
        except Exception:
            if not self.cut:
                raise
            # The app failed on the disconnect it was shown after the
            # middleware answered for it: that answer stands.
        if self.aborted:
            # The client has part of the app's response and no way to learn
            # that the request was cut: the server must drop the connection.
            raise RuntimeError(_CUT_AFTER_START)

    async def _app_receive(self) -> Message:
        if self.app_receive_stash:
            return self.app_receive_stash.pop(0)
        if self.cut:
            return _DISCONNECT
        pending = self.pending
        if pending is not None:
            self.pending = None
            msg = await pending
        else:
            msg = await self.receive()
        t = msg["type"]
        if t == "http.request":
            if self.chunked and not self.released:
                body = msg.get("body", b"")
                if body:
                    return await self._charge_chunk(msg, len(body))
        elif t == "http.disconnect":
            self._release_request()
        return msg

    async def _charge_chunk(self, msg: Message, n: int) -> Message:
        self.total += n
        limit = self.limit
        if limit is not None and self.total > limit:
            await self._cut(413, b"Payload Too Large: more than %d bytes\n" % limit)
            return _DISCONNECT
        try:
            # Each chunk waits at most `timeout` of its own.
            await adm.grow_all(self.held, self.total, adm.deadline_of(self.mw._s.timeout))
        except adm.BUSY_ERRORS:
            await self._cut(503, _BUSY_TEXT)
            return _DISCONNECT
        return msg

    # ---- the response --------------------------------------------------

    async def _app_send(self, msg: Message) -> None:
        if self.cut:
            return   # the middleware answered for the app: as after a disconnect
        t = msg["type"]
        pool = self.mw._s.response_pool
        if t == "http.response.start":
            self.trailers = bool(msg.get("trailers", False))
            if pool is None:
                self.started = True
                await self.send(msg)
            else:
                self.start = msg
            return
        if t == "http.response.body":
            body = msg.get("body", b"")
            final = not msg.get("more_body", False) and not self.trailers
            if pool is not None and body:
                try:
                    self.resp_permit = await pool.acquire(
                        adm.clamp(pool, len(body)), **adm.timeout_kw(adm.deadline_of(
                            self.mw._s.timeout)))
                except adm.BUSY_ERRORS:
                    if self.started:
                        raise
                    self.start = None
                    await self._cut(503, _BUSY_TEXT)
                    return
            try:
                await self._flush_start()
                await self.send(msg)
            finally:
                p, self.resp_permit = self.resp_permit, None
                if p is not None:
                    pool.release(p)   # type: ignore[union-attr]
            if final:
                self._release_request()
            return
        await self._flush_start()
        await self.send(msg)
        if t == "http.response.pathsend" or (
                t == "http.response.trailers" and not msg.get("more_trailers", False)):
            self._release_request()

    async def _flush_start(self) -> None:
        start = self.start
        if start is not None:
            self.start = None
            self.started = True
            await self.send(start)

    # ---- answers and clean-up ------------------------------------------

    async def _busy(self) -> None:
        await self._answer(503, _BUSY_TEXT)

    async def _cut(self, status: int, text: bytes) -> None:
        """Stop the request for the app: its permits go back, the app is shown
        a disconnect, and the client gets `status` if no response started."""
        self.cut = True
        self._release_request()
        if self.started:
            self.aborted = True
        else:
            await self._answer(status, text)

    async def _answer(self, status: int, text: bytes) -> None:
        # No "connection: close" although the body was not read: the server
        # then reads and drops the rest of it, so that the client, still
        # sending, gets to read this answer (a server closing at once would
        # reset the connection under the client's feet, answer unread).
        headers = [(b"content-type", b"text/plain; charset=utf-8"),
                   (b"content-length", b"%d" % len(text))]
        if status == 503:
            headers.append((b"retry-after", self.mw._retry_after))
        self.started = True
        await self.send({"type": "http.response.start", "status": status, "headers": headers})
        await self.send({"type": "http.response.body", "body": text, "more_body": False})

    def _release_request(self) -> None:
        self.released = True
        if self.held:
            adm.release_all(self.held)

    def _finish(self) -> None:
        pending, self.pending = self.pending, None
        try:
            self._release_request()
        finally:
            if pending is not None:
                if pending.done():
                    if not pending.cancelled():
                        pending.exception()   # retrieved: no "never retrieved" log
                else:
                    pending.cancel()
