"""The official pulsar-client against the broker and through the proxy.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

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
    close_client,
    http,
    pool,
    store_with,
    subscribed,
    wait_for,
)

try:
    import pulsar
except ImportError:   # pulsar-client 3.13.0 has wheels for cp310-cp314 only, no sdist
    pulsar = None
# Where this interpreter has no pulsar-client, another one that has it runs
# the client (pulsar_client_driver.py): `make test-pythons` points 3.15 at
# its 3.14 venv.
CLIENT_PYTHON_VAR = "PYLIMITER_PULSAR_CLIENT_PYTHON"


class _InProcessClient:
    def __init__(self, url):
        self.client = pulsar.Client(url, operation_timeout_seconds=15,
                                    logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))

    def subscribe(self, pattern, sub):
        return self.client.subscribe(re.compile(pattern), sub)

    def subscribe_pattern(self, pattern, sub, period):
        # The Python wrapper of pulsar-client 3.x drops
        # `pattern_auto_discovery_period` (it never reaches the C++
        # configuration), so set it on that configuration directly.
        import _pulsar

        conf = _pulsar.ConsumerConfiguration()
        conf.pattern_auto_discovery_period(period)
        return self.client._client.subscribe_pattern(pattern, sub, conf)

    def close_consumer(self, consumer):
        consumer.close()

    def close(self):
        close_client(self.client)


class _DriverClient:
    """The same operations, run by pulsar_client_driver.py in `python`."""

    def __init__(self, python, url):
        driver = Path(__file__).with_name("pulsar_client_driver.py")
        self.proc = subprocess.Popen([python, str(driver)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.ids = 0
        self._do(op="client", url=url)

    def _do(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the pulsar-client driver died (exit {self.proc.poll()})"
        answer = json.loads(line)
        assert answer["ok"], answer["error"]

    def subscribe(self, pattern, sub, op="subscribe", **more):
        self.ids += 1
        self._do(op=op, id=self.ids, pattern=pattern, sub=sub, **more)
        return self.ids

    def subscribe_pattern(self, pattern, sub, period):
        return self.subscribe(pattern, sub, op="subscribe_pattern", period=period)

    def close_consumer(self, consumer):
        self._do(op="close", id=consumer)

    def close(self):
        try:
            self._do(op="close_client")
        finally:
            self.proc.stdin.close()
            self.proc.wait(30)
            self.proc.stdout.close()


@pytest.fixture
def pulsar_client():
    """A factory of official clients: in this process, or in the interpreter
    ${PYLIMITER_PULSAR_CLIENT_PYTHON} names when this one has none."""
    other = os.environ.get(CLIENT_PYTHON_VAR)
    if pulsar is not None:
        return _InProcessClient
    if other:
        return lambda url: _DriverClient(other, url)
    pytest.skip(f"pulsar-client is not installed (and {CLIENT_PYTHON_VAR} is not set)")


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
