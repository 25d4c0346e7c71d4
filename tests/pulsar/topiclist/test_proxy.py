"""The proxy: topic lists forwarded under its own limits, client connections
piped to the broker.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import asyncio

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
    run_bounded,
    NS,
    TOPICS,
    ahttp,
    assert_all_back,
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
