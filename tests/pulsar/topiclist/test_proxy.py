"""The proxy: topic lists forwarded under its own limits, client connections
piped to the broker.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import asyncio
import socket

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist import protocol  # noqa: E402
from pylimiter.pulsar.topiclist.broker import Broker  # noqa: E402
from pylimiter.pulsar.topiclist.limits import TopicListConfig  # noqa: E402
from pylimiter.pulsar.topiclist.protocol import CommandType  # noqa: E402
from pylimiter.pulsar.topiclist.proxy import Proxy  # noqa: E402

from .kit import (  # noqa: E402
    NS,
    TOPICS,
    ahttp,
    assert_all_back,
    run_bounded,
    running,
    store_with,
    tiny,
)


def test_proxy_forwards_topic_lists_under_its_own_limits():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b, \
                running(Proxy(tiny(heap_mb=1, heap_queue=10), broker_url=b.service_url)) as px:
            c = await protocol.ClientConnection.open(px.service_url)
            assert not c.connected.feature_flags.supports_topic_watchers
            r, _ = await c.get_topics(NS, pattern="persistent://public/default/orders-.*")
            assert list(r.topics) == TOPICS[:2] and r.filtered
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics("public/nope")
            assert e.value.code == protocol.ServerError.MetadataError
            with pytest.raises(protocol.RequestError) as e:
                await c.watch(NS, ".*", 1)
            assert e.value.code == protocol.ServerError.NotAllowedError
            assert px.limiter.peak["heap"] > 0 and px.limiter.peak["direct"] > 0
            _, text = await ahttp("GET", f"{px.admin_url}/metrics")
            assert "pulsar_proxy_topic_list_heap_memory_used_bytes" in text
            await c.close()
            assert_all_back(px)
            assert_all_back(b)
    run_bounded(main())


def test_the_proxy_does_not_ping_connections_it_pipes_to_the_broker():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b, \
                running(Proxy(TopicListConfig(keep_alive_s=1), broker_url=b.service_url)) as px:
            r, w = await asyncio.open_connection("127.0.0.1", px.port)
            w.write(protocol.encode(protocol.cmd(
                CommandType.CONNECT, "connect", client_version="t",
                proxy_to_broker_url=f"127.0.0.1:{b.port}")))
            first, _ = await protocol.read_command(r)
            assert first.type == CommandType.CONNECTED          # the broker's answer
            await asyncio.sleep(2.5)                             # 2.5 proxy keep-alive ticks
            w.write(protocol.encode(protocol.cmd(CommandType.PING, "ping")))
            frame, _ = await asyncio.wait_for(protocol.read_command(r), 5)
            assert frame.type == CommandType.PONG                # no stray PING, not closed
            w.close()
    run_bounded(main())


def test_slow_readers_keep_the_proxys_heap_pool_bounded():
    """PIP-442's proxy flow: the heap permit (the decoded list) and the
    direct permit (the re-encoded frame) are released together once the
    write to the client completes.  With a heap pool that fits one answer,
    three clients that do not read get one answer in flight between them:
    the one being written holds its heap permit, the other two wait for
    heap.  (Releasing heap before the write let all three through, the
    heap pool bounding nothing while the writes were pending.)"""
    from pylimiter.pulsar.topiclist import hostile
    from pylimiter.pulsar.topiclist.broker import generated_topics
    from pylimiter.pulsar.topiclist.limits import MB

    from .kit import DIRECT, HEAP, pool, read_frame, until

    async def main():
        cfg = TopicListConfig(heap_mb=8, direct_mb=8, heap_timeout_ms=60_000,
                              write_timeout_ms=60_000)
        store = store_with(generated_topics(NS, 5_000))
        async with running(Broker(TopicListConfig(), store=store)) as b, \
                running(Proxy(cfg, broker_url=b.service_url)) as px:
            learn = await protocol.ClientConnection.open(px.service_url,
                                                         max_frame=protocol.ANY_FRAME)
            await learn.get_topics(NS)               # the proxy learns the answer's size
            await learn.close()
            frame = px.estimates[(NS, protocol.Mode.PERSISTENT)]
            assert frame > 100_000
            px.limiter.set_limits(heap_mb=1.5 * frame / MB)    # one answer fits, two do not
            heap, direct = pool(px, HEAP), pool(px, DIRECT)

            clients = [await hostile.connect(px.service_url, rcvbuf=hostile.SMALL_RCVBUF)
                       for _ in range(3)]
            await until(lambda: len(px.connections) == 3)
            for c in px.connections:
                # A slow network: without this the kernel's loopback buffers
                # (autotuned up to 4 MiB) take a whole answer and the write
                # completes at once.
                c.writer.transport.get_extra_info("socket").setsockopt(
                    socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            for i, (_, w) in enumerate(clients):
                w.write(hostile.list_frame(i + 1, NS))

            def writing():
                return [c for c in px.connections
                        if c.writer.transport.get_write_buffer_size() > 0]
            await until(writing, timeout=30, what="an answer being written")
            await asyncio.sleep(0.5)                  # room for anything else to start
            assert heap.acquired_permits == frame     # held while the write is pending
            assert heap.queue_size == 2               # the other two wait for it
            assert len(writing()) == 1 and direct.acquired_permits > 0
            assert px.limiter.peak["heap"] <= heap.max_permits

            answers = await asyncio.gather(*(read_frame(r) for r, _ in clients))
            assert [len(c.getTopicsOfNamespaceResponse.topics) for c, _ in answers] == \
                [5_000] * 3
            await until(lambda: heap.acquired_permits == 0 and direct.acquired_permits == 0)
            for _, w in clients:
                w.close()
            await until(lambda: len(px.connections) == 0)
            assert_all_back(px)
            assert px.limiter.peak["heap"] <= heap.max_permits
    run_bounded(main())


def test_a_lookup_cancelled_before_it_starts_is_closed_and_uncounted():
    """A connection that closes right after a LOOKUP cancels the lookup's
    task before its first step: the lookup coroutine is closed (no "never
    awaited" warning) and the per-connection count goes back to 0."""
    import gc
    import types
    import warnings

    from pylimiter.pulsar.topiclist.proxy import ProxyConnection

    conn = ProxyConnection.__new__(ProxyConnection)
    conn.config = types.SimpleNamespace(lookups_per_connection=4)
    conn.lookups = 0
    conn.tasks = set()
    conn.service = types.SimpleNamespace(guards={}, client_log=lambda *a, **k: None)
    ran = []

    async def lookup():
        ran.append(True)

    async def main():
        conn._start_lookup(1, lookup())
        assert conn.lookups == 1
        for t in list(conn.tasks):
            t.cancel()          # what closing the connection does
        for _ in range(3):
            await asyncio.sleep(0)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert ran == [] and conn.lookups == 0 and not conn.tasks
    assert not [w for w in caught if "never awaited" in str(w.message)], caught
