"""Request messages in flight, bounded for a ``grpc.aio`` server (extra
``[grpc]``).

::

    import grpc
    from pylimiter import AsyncSemaphore
    from pylimiter.grpc import MemoryLimitInterceptor

    limiter = AsyncSemaphore(64 << 20, timeout=5.0)
    server = grpc.aio.server(interceptors=[MemoryLimitInterceptor(limiter)])
"""

from __future__ import annotations

import collections
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Optional

from . import _admission as adm
from ._common import LimitType

try:
    import grpc
    from grpc import aio as grpc_aio
except ImportError as exc:  # pragma: no cover - depends on the install
    raise adm.missing_extra("grpc", "grpc", exc) from exc

__all__ = ["MemoryLimitInterceptor"]

#: The retry hint sent with RESOURCE_EXHAUSTED (gRFC A6's pushback trailer:
#: a client retry policy waits this long before its next attempt).
RETRY_PUSHBACK_MS = "1000"
_TRAILER = (("grpc-retry-pushback-ms", RETRY_PUSHBACK_MS),)
_DETAILS = "pylimiter: too many request bytes in flight, retry later"


def message_size(message: object) -> int:
    """A message's serialized size: protobuf's ``ByteSize()``, or the length
    of raw bytes (a method without a deserializer)."""
    byte_size = getattr(message, "ByteSize", None)
    if byte_size is not None:
        return int(byte_size())
    if isinstance(message, (bytes, bytearray, memoryview)):
        return len(message)
    return 0


class MemoryLimitInterceptor(grpc_aio.ServerInterceptor):
    """A ``grpc.aio`` server interceptor holding each call's request bytes in
    ``limiter`` (a semaphore, or a dual memory limiter: its heap pool).

    A unary request holds its message's serialized size (protobuf
    ``ByteSize()``) from before the handler runs until the call ends (the
    response sent, or the call failed or cancelled).  A request stream holds
    the messages received and not yet answered: each message is charged
    before the handler gets it (one permit, grown with ``update()``), and
    each response message the handler sends answers the oldest one held
    (a stream-to-unary call answers them all at its end).  A wait past
    ``timeout`` (None: the limiter's own) or a full queue ends the call with
    ``RESOURCE_EXHAUSTED`` and the trailer ``grpc-retry-pushback-ms: 1000``
    (a retry hint).  A message larger than the whole limit is charged the
    whole limit.  Handlers may be coroutines, async generators, or
    synchronous functions run by the server's thread pool (those wait with
    ``acquire_blocking``/``update_blocking``).
    """

    def __init__(self, limiter: Any, *, timeout: Optional[float] = None) -> None:
        self.limiter = limiter
        self._pool = adm.semaphore_of(limiter, LimitType.HEAP_MEMORY, "limiter")
        self.timeout = adm.check_timeout(timeout)

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        kw = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
        rs, ss = handler.request_streaming, handler.response_streaming
        if not rs and not ss:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary), **kw)
        if not rs:
            return grpc.unary_stream_rpc_method_handler(self._unary(handler.unary_stream), **kw)
        if not ss:
            return grpc.stream_unary_rpc_method_handler(
                self._streaming(handler.stream_unary, False), **kw)
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(handler.stream_stream, True), **kw)

    # ---- one request message -------------------------------------------

    def _unary(self, behavior: Callable[..., Any]) -> Callable[..., Any]:
        pool, timeout = self._pool, self.timeout
        if inspect.isasyncgenfunction(behavior):
            async def unary_to_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                held = _Held(pool)
                await held.grow_async(message_size(request), timeout, context)
                held.release_at_end(context)
                async for response in behavior(request, context):
                    yield response
            return unary_to_stream
        if inspect.iscoroutinefunction(behavior):
            async def unary(request: Any, context: Any) -> Any:
                held = _Held(pool)
                await held.grow_async(message_size(request), timeout, context)
                held.release_at_end(context)
                return await behavior(request, context)
            return unary

        def unary_sync(request: Any, context: Any) -> Any:
            held = _Held(pool)
            held.grow_blocking(message_size(request), timeout, context)
            try:
                result = behavior(request, context)
                if inspect.isgenerator(result):
                    return _sync_stream(result, held)
                held.release()
                return result
            except BaseException:
                held.release()
                raise
        return unary_sync

    # ---- a stream of request messages ------------------------------------

    def _streaming(self, behavior: Callable[..., Any], answers: bool) -> Callable[..., Any]:
        pool, timeout = self._pool, self.timeout
        if inspect.isasyncgenfunction(behavior):
            async def stream_to_stream(request_iterator: Any, context: Any
                                       ) -> AsyncIterator[Any]:
                held = _Held(pool)
                held.release_at_end(context)
                proxy = _Context(context, held, timeout, answers)
                async for response in behavior(held.iterate(request_iterator, timeout,
                                                            context), proxy):
                    yield response
                    await held.answer()
            return stream_to_stream
        if inspect.iscoroutinefunction(behavior):
            async def streaming(request_iterator: Any, context: Any) -> Any:
                held = _Held(pool)
                held.release_at_end(context)
                proxy = _Context(context, held, timeout, answers)
                return await behavior(held.iterate(request_iterator, timeout, context), proxy)
            return streaming

        def streaming_sync(request_iterator: Any, context: Any) -> Any:
            held = _Held(pool)
            try:
                result = behavior(held.iterate_blocking(request_iterator, timeout, context),
                                  context)
                if inspect.isgenerator(result):
                    return _sync_stream(result, held, answers)
                held.release()
                return result
            except BaseException:
                held.release()
                raise
        return streaming_sync


def _sync_stream(responses: Iterator[Any], held: _Held,
                 answers: bool = False) -> Iterator[Any]:
    try:
        for response in responses:
            yield response
            if answers:
                held.answer_blocking()
    finally:
        held.release()


class _Held:
    """One call's permit and the sizes of the messages it holds, oldest
    first."""

    __slots__ = ("pool", "permit", "sizes", "total")

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.permit: Any = None
        self.sizes: collections.deque[int] = collections.deque()
        self.total = 0

    async def grow_async(self, n: int, timeout: Optional[float], context: Any) -> None:
        """Hold ``n`` more bytes (one more message), waiting for room;
        RESOURCE_EXHAUSTED when there is none in time."""
        self.sizes.append(n)
        self.total += n
        want = adm.clamp(self.pool, self.total)
        kw = adm.timeout_kw(adm.deadline_of(timeout))
        try:
            if self.permit is None:
                self.permit = await self.pool.acquire(want, **kw)
            elif want > self.permit.permits:
                await self.pool.update(self.permit, want, **kw)
        except adm.BUSY_ERRORS:
            self.sizes.pop()
            self.total -= n
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _DETAILS,
                                trailing_metadata=_TRAILER)

    def grow_blocking(self, n: int, timeout: Optional[float], context: Any) -> None:
        self.sizes.append(n)
        self.total += n
        want = adm.clamp(self.pool, self.total)
        kw = adm.timeout_kw(adm.deadline_of(timeout))
        try:
            if self.permit is None:
                self.permit = self.pool.acquire_blocking(want, **kw)
            elif want > self.permit.permits:
                self.pool.update_blocking(self.permit, want, **kw)
        except adm.BUSY_ERRORS:
            self.sizes.pop()
            self.total -= n
            context.set_trailing_metadata(_TRAILER)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, _DETAILS)

    async def iterate(self, requests: Any, timeout: Optional[float],
                      context: Any) -> AsyncIterator[Any]:
        async for message in requests:
            await self.grow_async(message_size(message), timeout, context)
            yield message

    def iterate_blocking(self, requests: Any, timeout: Optional[float],
                         context: Any) -> Iterator[Any]:
        for message in requests:
            self.grow_blocking(message_size(message), timeout, context)
            yield message

    def _shrink_oldest(self) -> Optional[int]:
        if not self.sizes or self.permit is None:
            return None
        self.total -= self.sizes.popleft()
        return adm.clamp(self.pool, self.total)

    async def answer(self) -> None:
        """A response went out: the oldest message held is answered."""
        n = self._shrink_oldest()
        if n is not None and n < self.permit.permits:
            await self.pool.update(self.permit, n)   # shrinking never waits

    def answer_blocking(self) -> None:
        n = self._shrink_oldest()
        if n is not None and n < self.permit.permits:
            self.pool.update_blocking(self.permit, n)

    def release(self) -> None:
        permit, self.permit = self.permit, None
        self.sizes.clear()
        self.total = 0
        if permit is not None:
            self.pool.release(permit)

    def release_at_end(self, context: Any) -> None:
        """Release when the call ends (its response sent, or it failed or
        was cancelled), not when the handler returns."""
        context.add_done_callback(lambda _ctx: self.release())


class _Context:
    """The servicer context a streaming handler gets: the server's own,
    except that ``read()`` charges each message before handing it on and
    ``write()`` answers the oldest message held (stream-to-stream)."""

    def __init__(self, context: Any, held: _Held, timeout: Optional[float],
                 answers: bool) -> None:
        self._context = context
        self._held = held
        self._timeout = timeout
        self._answers = answers

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    async def read(self) -> Any:
        message = await self._context.read()
        if message is not grpc_aio.EOF:
            await self._held.grow_async(message_size(message), self._timeout, self._context)
        return message

    async def write(self, message: Any) -> None:
        await self._context.write(message)
        if self._answers:
            await self._held.answer()
