"""Pulsar's binary protocol: the happy paths, frames, errors carrying their
request id, keep-alive.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import asyncio
import struct

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
    get_topics_cmd,
    raw_connect,
    run_bounded,
    running,
    store_with,
)


def test_get_topics_modes_pattern_and_hash():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            assert c.connected.feature_flags.supports_topic_watchers
            r, _ = await c.get_topics(NS)
            assert list(r.topics) == TOPICS[:3] and not r.filtered and r.changed
            r, _ = await c.get_topics(NS, mode=protocol.Mode.NON_PERSISTENT)
            assert list(r.topics) == TOPICS[3:]
            r, _ = await c.get_topics(NS, mode=protocol.Mode.ALL)
            assert list(r.topics) == TOPICS
            r, _ = await c.get_topics(NS, pattern="persistent://public/default/orders-.*")
            assert list(r.topics) == TOPICS[:2] and r.filtered
            same, _ = await c.get_topics(NS, pattern="persistent://public/default/orders-.*",
                                         topics_hash=r.topics_hash)
            assert not same.changed and list(same.topics) == []
            assert same.topics_hash == r.topics_hash
            await c.close()
            assert_all_back(b)
    run_bounded(main())


def test_watch_success_update_and_close():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            ok = await c.watch(NS, "persistent://public/default/orders-.*", watcher_id=7)
            assert sorted(ok.topic) == TOPICS[:2] and ok.watcher_id == 7
            assert (await ahttp("POST", f"{b.admin_url}/admin/topics?name="
                                "persistent://public/default/orders-3"))[0] == 201
            await ahttp("POST", f"{b.admin_url}/admin/topics?name=persistent://public/default/zzz")
            u = await asyncio.wait_for(c.updates.get(), 5)
            assert list(u.new_topics) == ["persistent://public/default/orders-3"]
            assert u.topics_hash == protocol.topics_hash(TOPICS[:2] + ["persistent://public/default/orders-3"])
            assert (await ahttp("DELETE", f"{b.admin_url}/admin/topics?name={TOPICS[0]}"))[0] == 200
            u = await asyncio.wait_for(c.updates.get(), 5)
            assert list(u.deleted_topics) == [TOPICS[0]] and not u.new_topics
            await c.close_watch(7)
            await ahttp("POST", f"{b.admin_url}/admin/topics?name=persistent://public/default/orders-4")
            await asyncio.sleep(0.2)
            assert c.updates.empty()
            await c.close()
            assert_all_back(b)
    run_bounded(main())


def test_unknown_namespace_and_bad_pattern():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics("public/nope")
            assert e.value.code == protocol.ServerError.MetadataError
            assert "public/nope does not exist" in e.value.server_message
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics(NS, pattern="persistent://public/default/(")
            assert e.value.code == protocol.ServerError.InvalidTopicName
            r, _ = await c.get_topics(NS)   # the connection still serves
            assert len(r.topics) == 3
            await c.close()
            assert_all_back(b)
    run_bounded(main())


def _raw_frame(total: int, cmd_size: int, body: bytes) -> bytes:
    return struct.pack(">II", total, cmd_size) + body


@pytest.mark.parametrize("junk", [
    pytest.param(b"\xff\xff\xff\xff", id="huge-frame"),
    pytest.param(_raw_frame(10, 6, b"\x08\xff\xff\xff\xff\xff"), id="undecodable"),
    pytest.param(_raw_frame(8, 4, b"\x10\x01\x10\x01"), id="missing-type"),
    pytest.param(_raw_frame(8, 40, b"abcd"), id="command-larger-than-frame"),
    pytest.param(b"\x00\x00", id="truncated"),
])
def test_malformed_frames_close_the_connection_not_the_server(junk):
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            r, w = await asyncio.open_connection("127.0.0.1", b.port)
            w.write(protocol.encode(protocol.cmd(CommandType.CONNECT, "connect",
                                                 client_version="t")))
            first, _ = await protocol.read_command(r)
            assert first.type == CommandType.CONNECTED
            w.write(junk)
            if junk == b"\x00\x00":
                w.write_eof()
            assert await asyncio.wait_for(r.read(), 5) == b""   # closed by the server
            w.close()
            c = await protocol.ClientConnection.open(b.service_url)  # still serving
            assert len((await c.get_topics(NS))[0].topics) == 3
            await c.close()
    run_bounded(main())


def test_unknown_command_and_missing_connect_get_errors():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            r, w = await asyncio.open_connection("127.0.0.1", b.port)
            w.write(protocol.encode(protocol.cmd(CommandType.PING, "ping")))      # before CONNECT
            resp, _ = await protocol.read_command(r)
            assert resp.type == CommandType.ERROR and "CONNECT" in resp.error.message
            assert await asyncio.wait_for(r.read(), 5) == b""
            w.close()
            r, w = await asyncio.open_connection("127.0.0.1", b.port)
            w.write(protocol.encode(protocol.cmd(CommandType.CONNECT, "connect",
                                                 client_version="t")))
            w.write(protocol.encode(protocol.cmd(CommandType.PRODUCER, "producer",
                                                 request_id=7)))   # not offered here
            w.write(protocol.encode(protocol.cmd(CommandType.PING, "ping")))
            kinds = [(await protocol.read_command(r))[0] for _ in range(3)]
            assert [k.type for k in kinds] == [CommandType.CONNECTED, CommandType.ERROR,
                                               CommandType.PONG]
            assert kinds[1].error.error == protocol.ServerError.NotAllowedError
            assert "PRODUCER is not supported" in kinds[1].error.message
            assert kinds[1].error.request_id == 7    # the failed request's own id
            w.close()
    run_bounded(main())


def test_connected_advertises_max_message_size_and_larger_frames_close_unbuffered():
    async def main():
        cfg = TopicListConfig(max_message_size=64 * 1024)
        async with running(Broker(cfg, store=store_with())) as b:
            max_frame = 64 * 1024 + protocol.FRAME_PADDING
            assert b.max_frame == max_frame
            r, w, connected = await raw_connect(b.port)
            assert connected.max_message_size == 64 * 1024
            # Exactly the largest frame: a command followed by filler.
            body = get_topics_cmd(5).SerializeToString()
            total = max_frame - 4
            w.write(struct.pack(">II", total, len(body)) + body + bytes(total - 4 - len(body)))
            resp, _ = await protocol.read_command(r)
            assert resp.getTopicsOfNamespaceResponse.request_id == 5
            # One byte more: closed on the header, before any body is sent.
            w.write(struct.pack(">I", total + 1))
            assert await asyncio.wait_for(r.read(), 5) == b""
            w.close()
    run_bounded(main())


@pytest.mark.parametrize("via_proxy", [False, True], ids=["broker", "proxy"])
def test_errors_echo_the_request_id_of_the_failed_command(via_proxy):
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b, \
                running(Proxy(TopicListConfig(), broker_url=b.service_url)) as px:
            svc = px if via_proxy else b
            r, w, _ = await raw_connect(svc.port)
            sent = [
                protocol.cmd(CommandType.PRODUCER, "producer", request_id=11),
                protocol.cmd(CommandType.SEEK, "seek", request_id=12),
                protocol.cmd(CommandType.GET_SCHEMA, "getSchema", request_id=13),
                protocol.cmd(CommandType.NEW_TXN, "newTxn", request_id=14),
                protocol.cmd(CommandType.GET_LAST_MESSAGE_ID, "getLastMessageId",
                             request_id=15),
            ]
            for command in sent:
                w.write(protocol.encode(command))
            got = [(await protocol.read_command(r))[0] for _ in sent]
            assert [g.type for g in got] == [CommandType.ERROR] * len(sent)
            assert [g.error.request_id for g in got] == [11, 12, 13, 14, 15]
            # No body at all: an error, and the connection still serves.
            w.write(protocol.encode(protocol.BaseCommand(
                type=CommandType.GET_TOPICS_OF_NAMESPACE)))
            err, _ = await protocol.read_command(r)
            assert err.type == CommandType.ERROR and "has no body" in err.error.message
            w.write(protocol.encode(get_topics_cmd(21)))
            ok, _ = await protocol.read_command(r)
            assert ok.getTopicsOfNamespaceResponse.request_id == 21
            w.close()
    run_bounded(main())


def test_a_request_before_connect_is_refused_with_its_id():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            r, w = await asyncio.open_connection("127.0.0.1", b.port)
            w.write(protocol.encode(get_topics_cmd(31)))
            resp, _ = await protocol.read_command(r)
            assert resp.type == CommandType.ERROR and resp.error.request_id == 31
            w.close()
    run_bounded(main())


def test_request_id_of_every_request_type():
    assert protocol.request_id_of(protocol.cmd(CommandType.ACK, "ack", request_id=3)) == 3
    assert protocol.request_id_of(get_topics_cmd(4)) == 4
    assert protocol.request_id_of(protocol.cmd(CommandType.FLOW, "flow", consumer_id=1,
                                               messagePermits=1)) == 0
    assert protocol.request_id_of(protocol.BaseCommand(type=CommandType.SEND)) == 0


def test_idle_connections_are_pinged_and_closed_when_silent():
    async def main():
        async with running(Broker(TopicListConfig(keep_alive_s=1), store=store_with())) as b:
            silent_r, silent_w, _ = await raw_connect(b.port)
            alive = await protocol.ClientConnection.open(b.service_url)   # answers PINGs
            ping, _ = await asyncio.wait_for(protocol.read_command(silent_r), 5)
            assert ping.type == CommandType.PING
            assert await asyncio.wait_for(silent_r.read(), 5) == b""     # closed: no PONG
            never = await asyncio.open_connection("127.0.0.1", b.port)   # no CONNECT at all
            assert await asyncio.wait_for(never[0].read(), 5) == b""
            await asyncio.sleep(1.5)
            assert not alive.closed.is_set()
            r, _ = await alive.get_topics(NS)
            assert len(r.topics) == 3
            await alive.close()
            silent_w.close()
            never[1].close()
    run_bounded(main())
