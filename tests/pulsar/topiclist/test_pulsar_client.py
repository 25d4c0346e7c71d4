"""The official pulsar-client against the broker and through the proxy.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist.broker import Broker  # noqa: E402
from pylimiter.pulsar.topiclist.limits import TopicListConfig  # noqa: E402
from pylimiter.pulsar.topiclist.proxy import Proxy  # noqa: E402

from .kit import (  # noqa: E402
    DIRECT,
    HEAP,
    TOPICS,
    Background,
    http,
    pool,
    store_with,
    subscribed,
    wait_for,
)


@pytest.fixture
def pulsar_services():
    bg = Background()
    b = bg.run(Broker(TopicListConfig(), store=store_with()).start())
    px = bg.run(Proxy(TopicListConfig(), broker_url=b.service_url).start())
    yield bg, b, px
    bg.run(px.stop())
    bg.run(b.stop())
    bg.close()


@pytest.mark.parametrize("via_proxy", [False, True], ids=["broker", "proxy"])
def test_pulsar_client_regex_subscription(pulsar_client, pulsar_services, via_proxy):
    bg, b, px = pulsar_services
    url = px.service_url if via_proxy else b.service_url
    client = pulsar_client(url)
    try:
        # The documented API: exactly the matching (persistent) topics.
        consumer = client.subscribe("persistent://public/default/orders-.*", "sub")
        assert wait_for(lambda: subscribed(b) == TOPICS[:2]), subscribed(b)
        client.close_consumer(consumer)
        assert wait_for(lambda: subscribed(b) == [])
        # Re-discovery of a topic created later, with a 1 s discovery period
        # instead of the default 60 s.
        low = client.subscribe_pattern("persistent://public/default/orders-.*", "sub2", 1)
        assert wait_for(lambda: subscribed(b) == TOPICS[:2])
        st, _ = http("POST", f"{b.admin_url}/admin/topics?name=persistent://public/default/orders-3")
        assert st == 201
        want = TOPICS[:2] + ["persistent://public/default/orders-3"]
        assert wait_for(lambda: subscribed(b) == want), \
            subscribed(b)
        assert (px if via_proxy else b).counters["requests"] >= 2   # listed again
        client.close_consumer(low)
    finally:
        client.close()
    assert wait_for(lambda: not any(c.consumers for c in list(b.connections)))
    for svc in (b, px):
        assert wait_for(lambda: pool(svc, HEAP).acquired_permits == 0
                     and pool(svc, DIRECT).acquired_permits == 0)
