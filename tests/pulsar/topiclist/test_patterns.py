"""Topics patterns as Pulsar matches them: RE2 (linear time), capped length,
the loop never frozen.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import asyncio
import time

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist import protocol  # noqa: E402
from pylimiter.pulsar.topiclist.broker import Broker, generated_topics  # noqa: E402
from pylimiter.pulsar.topiclist.limits import TopicListConfig  # noqa: E402
from pylimiter.pulsar.topiclist.patterns import (  # noqa: E402
    InvalidPattern,
    PatternTooLong,
    TopicsPattern,
    java_length,
)
from pylimiter.pulsar.topiclist.protocol import CommandType, ServerError  # noqa: E402

from .kit import (  # noqa: E402
    NS,
    TOPICS,
    assert_all_back,
    run_bounded,
    running,
    store_with,
    until,
)


def test_pathological_pattern_is_answered_in_under_100ms_of_cpu():
    """'(.*.*)*X' took Python's backtracking re over 10 s at 300 topics."""
    async def main():
        topics = [f"persistent://public/default/{'a' * 40}-{i}" for i in range(300)]
        async with running(Broker(TopicListConfig(), store=store_with(topics))) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            pattern = "persistent://public/default/(.*.*)*X"
            assert len(pattern) == 36
            cpu = time.thread_time()
            r, _ = await c.get_topics(NS, pattern=pattern)
            assert time.thread_time() - cpu < 0.1      # server and client share this thread
            assert r.filtered and list(r.topics) == []
            await c.close()
    run_bounded(main())


def test_matching_a_large_namespace_lets_other_clients_be_served():
    async def main():
        topics = generated_topics(NS, 100_000)
        async with running(Broker(TopicListConfig(), store=store_with(topics))) as b:
            slow = await protocol.ClientConnection.open(b.service_url)
            other = await protocol.ClientConnection.open(b.service_url)
            order = []

            async def listing():
                r, _ = await slow.get_topics(NS, pattern="persistent://public/default/.*9$")
                order.append("listing")
                return r

            async def served():
                await until(lambda: b.counters["requests"] >= 1)
                for _ in range(3):
                    await other.request(protocol.cmd(CommandType.PARTITIONED_METADATA,
                                                     "partitionMetadata", topic=TOPICS[0],
                                                     request_id=99), 99)
                order.append("other")

            r, _ = await asyncio.gather(listing(), served())
            assert len(r.topics) == 10_000
            assert order == ["other", "listing"]
            await slow.close()
            await other.close()
    run_bounded(main())


def test_patterns_re2_cannot_take_are_refused_with_invalid_topic_name():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            for bad in ("persistent://public/default/(a)\\1", "public/default/(?=x)y",
                        "persistent://public/default/("):
                with pytest.raises(protocol.RequestError) as e:
                    await c.get_topics(NS, pattern=bad)
                assert e.value.code == ServerError.InvalidTopicName
                assert e.value.server_message.startswith("Invalid topics pattern: ")
                with pytest.raises(protocol.RequestError) as e:
                    await c.watch(NS, bad, watcher_id=1)
                assert e.value.code == ServerError.InvalidTopicName
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics(NS, pattern="http://public/default/.*")
            assert "Does not support topic domain: http" in e.value.server_message
            await c.close()
            assert_all_back(b)
    run_bounded(main())


def test_patterns_longer_than_the_cap_list_unfiltered_and_refuse_watches():
    async def main():
        cfg = TopicListConfig(pattern_max_length=20)
        async with running(Broker(cfg, store=store_with())) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            fits = "persistent://public/default/orders-.*"          # 24 chars after scheme
            r, _ = await c.get_topics(NS, pattern=fits)
            assert not r.filtered and list(r.topics) == TOPICS[:3]   # the client filters
            with pytest.raises(protocol.RequestError) as e:
                await c.watch(NS, fits, watcher_id=3)
            assert e.value.code == ServerError.NotAllowedError
            assert e.value.server_message == ("Unable to create topic list watcher: "
                                              "Pattern longer than maximum: 20")
            r, _ = await c.get_topics(NS, pattern="persistent://public/default/o.*")
            assert r.filtered and list(r.topics) == TOPICS[:3]
            await c.close()
    run_bounded(main())


def test_pattern_rules_follow_pulsar():
    assert protocol.strip_domain_pattern("persistent://public/default/a.*") == "public/default/a.*"
    assert protocol.strip_domain_pattern("^non-persistent://p/d/x") == "^p/d/x"
    assert protocol.strip_domain_pattern("public/default/.*") == "public/default/.*"
    with pytest.raises(ValueError, match="Does not support topic domain: kafka"):
        protocol.strip_domain_pattern("kafka://p/d/x")
    assert java_length("a\U0001F600") == 3       # a surrogate pair counts twice
    with pytest.raises(PatternTooLong):
        TopicsPattern("\U0001F600" * 3, max_length=5)
    with pytest.raises(InvalidPattern):
        TopicsPattern("a{1001}", max_length=50)
    p = TopicsPattern("persistent://public/default/orders-.*", max_length=50)
    assert p.matches(TOPICS[0]) and not p.matches(TOPICS[2])
    assert p.matches("non-persistent://public/default/orders-np")   # the scheme is not matched
