"""pylimiter.grpc.MemoryLimitInterceptor in a real grpc.aio server (on
127.0.0.1, in the test's loop) called through grpc.aio channels: unary and
streaming calls, coroutine, async-generator, reader/writer and thread-pool
handlers, against both implementations (`mod`).  The messages are
protobuf's BytesValue (no generated code needed)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests._helpers import run

from . import need

grpc = need("grpc")
wrappers_pb2 = need("google.protobuf.wrappers_pb2")

from pylimiter.grpc import MemoryLimitInterceptor, message_size  # noqa: E402

BV = wrappers_pb2.BytesValue
SVC = "pylimiter.test.Bytes"


def msg(n: int):
    return BV(value=b"x" * n)


class Service:
    """Echo (unary), Stream (unary -> stream), Upload (stream -> unary),
    Chat (stream -> stream, async generator), ChatRW (stream -> stream,
    context.read/write), EchoSync (unary, thread pool).  Each records what
    the limiter held as it went."""

    def __init__(self, sem, **kw):
        self.sem = sem
        self.seen: list[int] = []
        self.gate: asyncio.Event | None = None
        self.interceptor = MemoryLimitInterceptor(sem, **kw)

    def held(self):
        sem = self.sem
        if hasattr(sem, "get_limiter"):
            from pylimiter import LimitType

            sem = sem.get_limiter(LimitType.HEAP_MEMORY)
        return sem.acquired_permits

    async def echo(self, request, context):
        self.seen.append(self.held())
        if self.gate is not None:
            await self.gate.wait()
        return BV(value=request.value[:10])

    def echo_sync(self, request, context):
        self.seen.append(self.held())
        return BV(value=request.value[:10])

    async def stream(self, request, context):
        for _ in range(3):
            self.seen.append(self.held())
            yield msg(5)

    async def upload(self, request_iterator, context):
        n = 0
        async for m in request_iterator:
            n += len(m.value)
            self.seen.append(self.held())
        return msg(n)

    async def chat(self, request_iterator, context):
        async for m in request_iterator:
            self.seen.append(self.held())
            yield msg(1)

    async def chat_rw(self, request_iterator, context):
        while True:
            m = await context.read()
            if m is grpc.aio.EOF:
                return
            self.seen.append(self.held())
            await context.write(msg(1))
            self.seen.append(self.held())

    def chat_sync(self, request_iterator, context):
        for m in request_iterator:
            self.seen.append(self.held())
            yield msg(1)

    def upload_sync(self, request_iterator, context):
        n = 0
        for m in request_iterator:
            n += len(m.value)
            self.seen.append(self.held())
        return msg(n)

    def handlers(self):
        kw = {"request_deserializer": BV.FromString, "response_serializer": BV.SerializeToString}
        return grpc.method_handlers_generic_handler(SVC, {
            "Echo": grpc.unary_unary_rpc_method_handler(self.echo, **kw),
            "EchoSync": grpc.unary_unary_rpc_method_handler(self.echo_sync, **kw),
            "Stream": grpc.unary_stream_rpc_method_handler(self.stream, **kw),
            "Upload": grpc.stream_unary_rpc_method_handler(self.upload, **kw),
            "Chat": grpc.stream_stream_rpc_method_handler(self.chat, **kw),
            "ChatRW": grpc.stream_stream_rpc_method_handler(self.chat_rw, **kw),
            "ChatSync": grpc.stream_stream_rpc_method_handler(self.chat_sync, **kw),
            "UploadSync": grpc.stream_unary_rpc_method_handler(self.upload_sync, **kw),
        })

    async def __aenter__(self):
        self.pool = ThreadPoolExecutor(2)
        self.server = grpc.aio.server(interceptors=[self.interceptor],
                                      migration_thread_pool=self.pool)
        self.server.add_generic_rpc_handlers((self.handlers(),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        return self

    def call(self, kind, name):
        kw = {"request_serializer": BV.SerializeToString, "response_deserializer": BV.FromString}
        return getattr(self.channel, kind)(f"/{SVC}/{name}", **kw)

    async def __aexit__(self, *exc):
        await self.channel.close()
        await self.server.stop(None)
        self.pool.shutdown()


def test_a_unary_call_holds_its_message_size_until_it_ends(mod):
    sem = mod.AsyncSemaphore(100_000)

    async def main():
        async with Service(sem) as svc:
            r = await svc.call("unary_unary", "Echo")(msg(1000))
            r2 = await svc.call("unary_unary", "EchoSync")(msg(2000))
            return svc.seen, r, r2

    seen, r, r2 = run(main())
    assert seen == [message_size(msg(1000)), message_size(msg(2000))] == [1003, 2003]
    assert r.value == b"x" * 10 and r2.value == b"x" * 10
    assert sem.acquired_permits == 0 and sem.stats().acquired_total == 2


@pytest.mark.parametrize("name", ["Echo", "EchoSync"])
def test_no_room_is_resource_exhausted_with_a_retry_hint(mod, name):
    sem = mod.AsyncSemaphore(100, timeout=60)

    async def main():
        async with Service(sem, timeout=0.05) as svc:
            held = sem.try_acquire(100)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await svc.call("unary_unary", name)(msg(10))
            sem.release(held)
            return svc, info.value

    svc, err = run(main())
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("grpc-retry-pushback-ms", "1000") in tuple(err.trailing_metadata())
    assert svc.seen == [] and sem.acquired_permits == 0 and sem.queue_size == 0


def test_a_full_queue_is_resource_exhausted_at_once(mod):
    sem = mod.AsyncSemaphore(100, max_queue_size=1, timeout=60)

    async def main():
        async with Service(sem) as svc:
            held = sem.try_acquire(100)
            queued = asyncio.ensure_future(svc.call("unary_unary", "Echo")(msg(10)))
            while sem.queue_size == 0:
                await asyncio.sleep(0.01)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await asyncio.wait_for(svc.call("unary_unary", "Echo")(msg(10)), 5)
            sem.release(held)
            await queued
            return info.value

    assert run(main()).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert sem.stats().queue_full_total == 1 and sem.acquired_permits == 0


def test_a_client_cancelling_while_queued_leaves_the_queue(mod):
    sem = mod.AsyncSemaphore(100, timeout=60)

    async def main():
        async with Service(sem) as svc:
            held = sem.try_acquire(100)
            call = svc.call("unary_unary", "Echo")(msg(10))
            while sem.queue_size == 0:
                await asyncio.sleep(0.01)
            call.cancel()
            for _ in range(200):
                if sem.queue_size == 0:
                    break
                await asyncio.sleep(0.01)
            left = sem.queue_size
            sem.release(held)
            return svc, left

    svc, left = run(main())
    assert left == 0 and svc.seen == [] and sem.acquired_permits == 0


def test_unary_to_stream_holds_the_request_while_streaming(mod):
    sem = mod.AsyncSemaphore(100_000)

    async def main():
        async with Service(sem) as svc:
            out = [r async for r in svc.call("unary_stream", "Stream")(msg(500))]
            return svc.seen, len(out)

    assert run(main()) == ([503, 503, 503], 3)
    assert sem.acquired_permits == 0


def test_stream_to_unary_holds_every_message_until_the_call_ends(mod):
    sem = mod.AsyncSemaphore(100_000)

    async def main():
        async with Service(sem) as svc:
            r = await svc.call("stream_unary", "Upload")(iter([msg(100), msg(200), msg(300)]))
            return svc.seen, len(r.value)

    assert run(main()) == ([102, 102 + 203, 102 + 203 + 303], 600)
    assert sem.acquired_permits == 0


@pytest.mark.parametrize("name", ["Chat", "ChatRW"])
def test_stream_to_stream_holds_the_messages_not_yet_answered(mod, name):
    sem = mod.AsyncSemaphore(100_000)

    async def main():
        async with Service(sem) as svc:
            call = svc.call("stream_stream", name)()
            seen_by_client = []
            for n in (100, 200):
                await call.write(msg(n))
                await call.read()
                seen_by_client.append(sem.acquired_permits)
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
            return svc.seen, seen_by_client

    seen, by_client = run(main())
    if name == "Chat":
        # each message is held while the handler works on it, and answered
        # once its response is written
        assert seen == [102, 203]
    else:
        assert seen == [102, 0, 203, 0]
    assert by_client[-1] in (0, 203) and sem.acquired_permits == 0


def test_a_message_in_a_stream_with_no_room_ends_the_call(mod):
    sem = mod.AsyncSemaphore(1000, timeout=60)

    async def main():
        async with Service(sem, timeout=0.05) as svc:
            async def requests():
                yield msg(100)
                while sem.acquired_permits < 102:
                    await asyncio.sleep(0.01)
                held.append(sem.try_acquire(800))
                yield msg(100)

            held = []
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await svc.call("stream_unary", "Upload")(requests())
            sem.release(held[0])
            return info.value

    err = run(main())
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for _ in range(100):
        if sem.acquired_permits == 0:
            break
        run(asyncio.sleep(0.01))
    assert sem.acquired_permits == 0


def test_a_dual_limiter_charges_its_heap_pool(mod):
    dual = mod.AsyncDualMemoryLimiter(100_000, 100_000)

    async def main():
        async with Service(dual) as svc:
            await svc.call("unary_unary", "Echo")(msg(1000))
            return svc.seen

    assert run(main()) == [1003]
    direct = dual.get_limiter(mod.LimitType.DIRECT_MEMORY)
    assert direct.stats().acquired_total == 0


def test_message_size_and_bad_arguments(mod):
    assert message_size(msg(0)) == 0 and message_size(b"abc") == 3 and message_size(None) == 0
    with pytest.raises(TypeError, match="^pylimiter: limiter must be"):
        MemoryLimitInterceptor(object())
    with pytest.raises(ValueError, match="^pylimiter: timeout must be >= 0"):
        MemoryLimitInterceptor(mod.AsyncSemaphore(1), timeout=-1)


def test_thread_pool_stream_handlers_are_charged_the_same(mod):
    sem = mod.AsyncSemaphore(100_000)

    async def main():
        async with Service(sem) as svc:
            r = await svc.call("stream_unary", "UploadSync")(iter([msg(100), msg(200)]))
            call = svc.call("stream_stream", "ChatSync")(iter([msg(100), msg(200)]))
            out = [m async for m in call]
            return svc.seen, len(r.value), len(out)

    seen, uploaded, answers = run(main())
    # stream -> unary holds both; stream -> stream answers each in turn
    assert (seen, uploaded, answers) == ([102, 305, 102, 203], 300, 2)
    assert sem.acquired_permits == 0
