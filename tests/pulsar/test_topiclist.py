"""The PIP-442 topic-list service: the official pulsar-client through the
broker and the proxy, every error path over the raw protocol, and the memory
bound under concurrent load.  All servers bind 127.0.0.1 on free ports.

The service uses pylimiter's public AsyncDualMemoryLimiter, so `make test`
runs this file against the C implementation and again, under
PYLIMITER_NO_EXTENSIONS=1, against the pure-Python one."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import subprocess
import sys
import threading
import time

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist import protocol  # noqa: E402
from pylimiter.pulsar.topiclist.broker import Broker, generated_topics  # noqa: E402
from pylimiter.pulsar.topiclist.limits import (  # noqa: E402
    IN_PLACE_LIMITS,
    ConfigError,
    TopicListConfig,
)
from pylimiter.pulsar.topiclist.protocol import CommandType  # noqa: E402
from pylimiter.pulsar.topiclist.proxy import Proxy  # noqa: E402

from .topiclist_kit import (  # noqa: E402
    DIRECT,
    HEAP,
    NS,
    TOPICS,
    ahttp,
    assert_all_back,
    http,
    pool,
    running,
    store_with,
    tiny,
    until,
)

# ---- config --------------------------------------------------------------------


def test_config_file_and_defaults(tmp_path):
    d = TopicListConfig()
    assert (d.heap_mb, d.direct_mb, d.heap_timeout_ms, d.direct_timeout_ms,
            d.heap_queue, d.direct_queue) == (100, 100, 25000, 25000, 10000, 10000)
    f = tmp_path / "broker.conf"
    f.write_text("# PIP-442\nclusterName=x\nmaxTopicListInFlightHeapMemSizeMB=0.5\n"
                 "maxTopicListInFlightDirectMemSizeMB = 0\n"
                 "maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMillis=100\n"
                 "maxTopicListInFlightDirectMemSizePermitsAcquireTimeoutMillis=200\n"
                 "maxTopicListInFlightHeapMemSizePermitsAcquireQueueSize=3\n"
                 "maxTopicListInFlightDirectMemSizePermitsAcquireQueueSize=4\n")
    c = TopicListConfig.from_properties(f)
    assert c.heap_bytes == 512 * 1024 and c.direct_bytes == 0
    assert (c.heap_timeout_ms, c.direct_timeout_ms, c.heap_queue, c.direct_queue) == \
        (100, 200, 3, 4)
    f.write_text("maxTopicListInFlightHeapMemSizeMB=lots\n")
    with pytest.raises(ConfigError, match="must be a number"):
        TopicListConfig.from_properties(f)
    with pytest.raises(ConfigError):
        TopicListConfig(heap_mb=-1)


def test_each_setting_declared_once_reaches_file_flags_startup_and_admin(tmp_path):
    """One declaration per setting: the Pulsar key read from the file, the
    flag, the start-up line and the admin API all come from it."""
    import argparse

    from pylimiter.pulsar._settings import add_setting_flags, setting_overrides

    decl = TopicListConfig.settings()
    assert [f.name for f in decl] == ["heap_mb", "direct_mb", "heap_timeout_ms",
                                      "direct_timeout_ms", "heap_queue", "direct_queue",
                                      "max_message_size", "pattern_max_length", "keep_alive_s",
                                      "requests_per_connection", "write_timeout_ms",
                                      "inbound_mb", "watchers_mb", "watchers_per_connection",
                                      "consumers_per_connection", "lookups_per_connection",
                                      "name_max_length"]
    limits = [d for d in decl if d.metadata["group"] == "limits"]
    assert len(limits) == 6
    f = tmp_path / "broker.conf"
    f.write_text("".join(f"{d.metadata['key']}={i + 1}\n" for i, d in enumerate(decl)))
    cfg = TopicListConfig.from_properties(f)
    assert [getattr(cfg, d.name) for d in decl] == list(range(1, len(decl) + 1))
    ap = argparse.ArgumentParser()
    add_setting_flags(ap, TopicListConfig)
    flags = ["--heap-mb", "0.5", "--direct-timeout-ms", "7", "--heap-queue", "9",
             "--keep-alive-s", "3"]
    over = setting_overrides(ap.parse_args(flags), TopicListConfig)
    assert over == {"heap_mb": 0.5, "direct_timeout_ms": 7, "heap_queue": 9, "keep_alive_s": 3}
    help_text = "".join(ap.format_help().split())    # argparse wraps long keys
    for d in decl:
        assert d.metadata["key"] in help_text
    line = cfg.describe()
    assert all(f"{d.name} {i + 1} {d.metadata['unit']}" in line for i, d in enumerate(decl))

    async def admin():
        async with running(Broker(cfg, store=store_with())) as b:
            st, body = await ahttp("GET", f"{b.admin_url}/admin/limits")
            assert st == 200 and json.loads(body) == {d.name: i + 1 for i, d in enumerate(limits)}
            assert b.max_frame == 7 + 10 * 1024 and b.config.keep_alive_s == 9
    asyncio.run(admin())


@pytest.mark.slow
def test_cli_broker_starts_with_no_arguments():
    proc = subprocess.Popen([sys.executable, "-m", "pylimiter.pulsar.topiclist", "broker"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        m = re.search(r"broker: pulsar://127\.0\.0\.1:(\d+)\s+admin: http://127\.0\.0\.1:(\d+)",
                      lines[1])
        assert m, lines
        assert "public/default (1000 topics)" in lines[0]
        assert lines[2].startswith("limits: heap_mb 100 MB, direct_mb 100 MB"), lines
        status, body = http("GET", f"http://127.0.0.1:{m[2]}/admin/namespaces/public/default/topics")
        assert status == 200 and len(json.loads(body)) == 1000
    finally:
        proc.terminate()
        proc.communicate(timeout=10)   # also closes the pipes


# ---- raw protocol: the happy paths -----------------------------------------------


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
    asyncio.run(main())


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
    asyncio.run(main())


# ---- raw protocol: error paths ---------------------------------------------------


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
    asyncio.run(main())


def test_queue_full_answers_too_many_requests():
    async def main():
        async with running(Broker(tiny(), store=store_with())) as b:
            heap = pool(b, HEAP)
            hold = await b.limiter.dual.acquire(heap.max_permits, HEAP)  # the pool is taken
            c = await protocol.ClientConnection.open(b.service_url)
            first = asyncio.ensure_future(c.get_topics(NS))
            await until(lambda: heap.queue_size == 1, what="first request queued")
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics(NS)
            assert e.value.code == protocol.ServerError.TooManyRequests
            assert "queue being full" in e.value.server_message
            b.limiter.dual.release(hold)
            r, _ = await first                     # the queued one is served
            assert len(r.topics) == 3
            await c.close()
            assert_all_back(b)
            assert b.counters["too_many_requests"] == 1
    asyncio.run(main())


def test_permit_timeout_answers_too_many_requests_and_counts():
    async def main():
        async with running(Broker(tiny(heap_timeout_ms=50, heap_queue=10),
                                  store=store_with())) as b:
            hold = await b.limiter.dual.acquire(pool(b, HEAP).max_permits, HEAP)
            c = await protocol.ClientConnection.open(b.service_url)
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics(NS)
            assert e.value.code == protocol.ServerError.TooManyRequests
            assert "timeout acquiring heap memory" in e.value.server_message
            _, text = await ahttp("GET", f"{b.admin_url}/metrics")
            assert 'pulsar_broker_topic_list_heap_timeout_total{cluster="standalone"} 1.0' in text
            b.limiter.dual.release(hold)
            await c.close()
            assert_all_back(b)
    asyncio.run(main())


def test_client_disconnect_while_waiting_leaks_nothing():
    async def main():
        async with running(Broker(tiny(heap_queue=10), store=store_with())) as b:
            heap = pool(b, HEAP)
            hold = await b.limiter.dual.acquire(heap.max_permits, HEAP)
            c = await protocol.ClientConnection.open(b.service_url)
            for _ in range(3):
                asyncio.ensure_future(c.get_topics(NS, timeout=None))
            await until(lambda: heap.queue_size == 3, what="3 queued")
            await c.close()
            await until(lambda: heap.queue_size == 0, what="waits cancelled on disconnect")
            b.limiter.dual.release(hold)
            await until(lambda: not b.connections, what="connection gone")
            assert_all_back(b)
            assert b.counters["responses"] == 0
    asyncio.run(main())


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
    asyncio.run(main())


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
    asyncio.run(main())


def test_response_larger_than_the_direct_pool_is_capped_and_served():
    async def main():
        topics = generated_topics(NS, 200)            # ~7 KB response
        cfg = tiny(heap_mb=1, direct_mb=1 / 1024)
        async with running(Broker(cfg, store=store_with(topics))) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            r, size = await c.get_topics(NS)
            assert len(r.topics) == 200 and size > 1024
            assert b.limiter.peak["direct"] == 1024          # held the whole pool, no more
            await c.close()
            assert_all_back(b)
    asyncio.run(main())


# ---- admin: limits at run time, metrics --------------------------------------------


def test_limits_change_at_run_time_and_metrics_names():
    async def main():
        cfg = TopicListConfig(heap_mb=1, direct_mb=0)
        async with running(Broker(cfg, store=store_with())) as b:
            st, body = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"heap_mb": 2})
            assert st == 200 and json.loads(body)["heap_mb"] == 2
            assert pool(b, HEAP).max_permits == 2 * 1024 * 1024
            old = b.limiter.dual
            st, _ = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"direct_mb": 0.5})
            # enabling: the same limiter where the core switches in place, else a new one
            assert st == 200 and (b.limiter.dual is old) == IN_PLACE_LIMITS
            assert pool(b, DIRECT).max_permits == 512 * 1024
            st, body = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"heap_mb": -1})
            assert st == 400 and "heap_mb" in body
            st, _ = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"heap_timeout_ms": 5})
            assert st == 400
            c = await protocol.ClientConnection.open(b.service_url)
            await c.get_topics(NS)
            await c.close()
            _, text = await ahttp("GET", f"{b.admin_url}/metrics")
            names = set(re.findall(r"^(pulsar_broker_topic_list_\w+?)(?:_bucket|_count|_sum)?\{",
                                   text, re.M))
            for pool_ in ("heap", "direct"):
                for m in ("memory_used_bytes", "memory_limit_bytes", "queue_size",
                          "queue_max_size", "wait_time_ms", "timeout_total"):
                    assert f"pulsar_broker_topic_list_{pool_}_{m}" in names, m
            assert 'direct_memory_limit_bytes{cluster="standalone"} 524288.0' in text
    asyncio.run(main())


# ---- the proxy ---------------------------------------------------------------------


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
    asyncio.run(main())


# ---- the memory bound under load -----------------------------------------------------


@pytest.mark.parametrize("via_proxy", [False, True], ids=["broker", "proxy"])
def test_memory_bound_holds_under_concurrent_load(via_proxy):
    async def main():
        topics = generated_topics(NS, 2000)           # ~66 KB actual heap estimate
        cfg = TopicListConfig(heap_mb=48 / 1024, direct_mb=40 / 1024, heap_timeout_ms=2000,
                              direct_timeout_ms=2000, heap_queue=20, direct_queue=20)
        async with running(Broker(cfg if not via_proxy else TopicListConfig(),
                                  store=store_with(topics))) as b, \
                running(Proxy(cfg, broker_url=b.service_url)) as px:
            svc = px if via_proxy else b
            limits = {t: pool(svc, t).max_permits for t in (HEAP, DIRECT)}
            seen = {HEAP: 0, DIRECT: 0}
            stop = asyncio.Event()

            async def sample():
                while not stop.is_set():
                    for t in (HEAP, DIRECT):
                        seen[t] = max(seen[t], pool(svc, t).acquired_permits)
                    await asyncio.sleep(0)

            outcomes = {"ok": 0, "tmr": 0}

            async def client():
                c = await protocol.ClientConnection.open(svc.service_url)
                for _ in range(3):
                    try:
                        r, _ = await c.get_topics(NS)
                        assert len(r.topics) == 2000
                        outcomes["ok"] += 1
                    except protocol.RequestError as e:
                        assert e.code == protocol.ServerError.TooManyRequests, e
                        outcomes["tmr"] += 1
                await c.close()

            sampler = asyncio.ensure_future(sample())
            await asyncio.gather(*(client() for _ in range(40)))
            stop.set()
            await sampler
            assert outcomes["ok"] + outcomes["tmr"] == 120   # every request answered
            assert outcomes["ok"] > 0
            # seen: sampled between steps; peak: recorded at every grant.
            for t, name in ((HEAP, "heap"), (DIRECT, "direct")):
                assert seen[t] <= limits[t], (t, seen[t], limits[t])
                peak = svc.limiter.peak[name]
                assert 0 < peak <= limits[t], (t, peak, limits[t])
            await until(lambda: not svc.connections, what="clients gone")
            assert_all_back(svc)
            assert_all_back(b)
    asyncio.run(main())


# ---- the official client -------------------------------------------------------------

pulsar = pytest.importorskip("pulsar")


class _Background:
    """Servers on a loop in a thread: pulsar-client blocks the calling thread."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout=30):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self):
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def pulsar_services():
    bg = _Background()
    b = bg.run(Broker(TopicListConfig(), store=store_with()).start())
    px = bg.run(Proxy(TopicListConfig(), broker_url=b.service_url).start())
    yield bg, b, px
    bg.run(px.stop())
    bg.run(b.stop())
    bg.close()


def _subscribed(b):
    return sorted(t for c in list(b.connections) for t in c.consumers.values())


def _wait(pred, timeout=20.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("via_proxy", [False, True], ids=["broker", "proxy"])
def test_pulsar_client_regex_subscription(pulsar_services, via_proxy):
    bg, b, px = pulsar_services
    url = px.service_url if via_proxy else b.service_url
    client = pulsar.Client(url, operation_timeout_seconds=15,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    try:
        # The documented API: exactly the matching (persistent) topics.
        consumer = client.subscribe(re.compile("persistent://public/default/orders-.*"), "sub")
        assert _wait(lambda: _subscribed(b) == TOPICS[:2]), _subscribed(b)
        consumer.close()
        assert _wait(lambda: _subscribed(b) == [])
        # Re-discovery of a topic created later.  The Python wrapper of
        # pulsar-client 3.x drops `pattern_auto_discovery_period` (it never
        # reaches the C++ configuration), so set it on that configuration
        # directly instead of waiting the default 60 s.
        import _pulsar

        conf = _pulsar.ConsumerConfiguration()
        conf.pattern_auto_discovery_period(1)
        low = client._client.subscribe_pattern("persistent://public/default/orders-.*", "sub2",
                                               conf)
        assert _wait(lambda: _subscribed(b) == TOPICS[:2])
        st, _ = http("POST", f"{b.admin_url}/admin/topics?name=persistent://public/default/orders-3")
        assert st == 201
        want = TOPICS[:2] + ["persistent://public/default/orders-3"]
        assert _wait(lambda: _subscribed(b) == want), \
            _subscribed(b)
        assert (px if via_proxy else b).counters["requests"] >= 2   # listed again
        low.close()
    finally:
        client.close()
    assert _wait(lambda: not any(c.consumers for c in list(b.connections)))
    for svc in (b, px):
        assert _wait(lambda: pool(svc, HEAP).acquired_permits == 0
                     and pool(svc, DIRECT).acquired_permits == 0)


# ---- the load generator ------------------------------------------------------------


def test_load_generator_counts_responses_rejections_and_reads_server_peaks():
    from pylimiter.pulsar.topiclist.loadgen import run_load

    async def main():
        async with running(Broker(tiny(heap_mb=1, heap_timeout_ms=50, heap_queue=100),
                                  store=store_with(generated_topics(NS, 300)))) as b:
            res = await run_load(b.service_url, NS, 3, 30.0, admin_url=b.admin_url,
                                 max_requests=12, read_delay=0.01)
            assert res.requests == 12 and res.responses == 12
            assert res.too_many_requests == 0 and res.other_errors == 0
            assert res.bytes > 12 * 300 * 30
            s = res.summary()
            assert 0 < s["p50_ms"] <= s["p99_ms"] <= s["max_ms"]
            assert res.server["heap_memory_peak_bytes"] > 0
            assert res.server["process_peak_rss_bytes"] > 0
            hold = await b.limiter.dual.acquire(pool(b, HEAP).max_permits, HEAP)
            res = await run_load(b.service_url, NS, 2, 30.0, max_requests=4)
            assert res.too_many_requests == 4 and res.responses == 0
            b.limiter.dual.release(hold)
            await until(lambda: not b.connections, what="load clients gone")
            assert_all_back(b)
    asyncio.run(main())
