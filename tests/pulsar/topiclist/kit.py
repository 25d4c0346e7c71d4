"""What the topic-list test modules share: a small namespace, running
services (on this loop, or on a loop in a thread for clients that block),
raw protocol and HTTP helpers, and the permit checks.  Imported after the
`topiclist` extra is known to be there (each module checks NEEDS first)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import asynccontextmanager
from pathlib import Path

from pylimiter import LimitType
from pylimiter.pulsar.topiclist import protocol
from pylimiter.pulsar.topiclist.broker import TopicStore
from pylimiter.pulsar.topiclist.limits import TopicListConfig
from pylimiter.pulsar.topiclist.protocol import CommandType
from tests._helpers import run

HEAP, DIRECT = LimitType.HEAP_MEMORY, LimitType.DIRECT_MEMORY
NS = "public/default"
TOPICS = ["persistent://public/default/orders-1", "persistent://public/default/orders-2",
          "persistent://public/default/other", "non-persistent://public/default/orders-np"]


def store_with(topics=TOPICS):
    s = TopicStore()
    s.add_many(topics)
    return s


@asynccontextmanager
async def running(service):
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


def http(method, url, body=None, *, raw: bytes = None):
    """(status, text) of one request; `body` is sent as JSON, `raw` as is."""
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        # The error holds the response open: 3.14 warns when it is left for
        # the collector (ResourceWarning, an error under the suite's filters).
        with e:
            return e.code, e.read().decode()


async def ahttp(method, url, body=None, *, raw: bytes = None):
    return await asyncio.to_thread(http, method, url, body, raw=raw)


def run_bounded(coro, timeout: float = 120.0):
    """The suite's bounded runner (tests._helpers.run) with the topic-list
    tests' longer bound: a stuck case fails with the await it was stuck in
    instead of hanging the suite."""
    return run(coro, timeout)


async def until(pred, timeout=10.0, what="condition"):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def pool(service, t):
    return service.limiter.dual.get_limiter(t)


def assert_all_back(service):
    for t in (HEAP, DIRECT):
        s = pool(service, t)
        assert s.acquired_permits == 0 and s.queue_size == 0, (t, s.stats())


def tiny(**kw):
    """Small pools and long waits: one 1 KiB heap permit, queue of 1."""
    base = dict(heap_mb=1 / 1024, direct_mb=1, heap_timeout_ms=10_000, direct_timeout_ms=10_000,
                heap_queue=1, direct_queue=100)
    base.update(kw)
    return TopicListConfig(**base)


async def raw_connect(port: int):
    """A bare protocol connection after CONNECT/CONNECTED."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    w.write(protocol.encode(protocol.cmd(CommandType.CONNECT, "connect", client_version="t")))
    first, _ = await protocol.read_command(r)
    assert first.type == CommandType.CONNECTED
    return r, w, first.connected


def get_topics_cmd(rid: int, ns: str = NS, **kw):
    """A GET_TOPICS_OF_NAMESPACE command."""
    return protocol.cmd(CommandType.GET_TOPICS_OF_NAMESPACE, "getTopicsOfNamespace",
                        request_id=rid, namespace=ns, **kw)


def outcomes_add_up(service) -> bool:
    """Whether /admin/stats counts every request exactly once, none in flight."""
    s = service.stats()
    return s["in_flight"] == 0 and s["requests"] == sum(s[k] for k in (
        "responses", "too_many_requests", "errors", "cancelled"))


class Background:
    """Services on a loop in a thread: pulsar-client blocks the calling thread."""

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


def subscribed(broker):
    """The topics the broker's clients are subscribed to, sorted."""
    return sorted(t for c in list(broker.connections) for t in c.consumers.values())


def wait_for(pred, timeout=20.0) -> bool:
    """Whether pred() became true within timeout s (polled, blocking)."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            return False
        time.sleep(0.05)
    return True


async def read_frame(r, timeout: float = 30.0):
    """The next command and its size, any frame size; a test that waits
    for an answer that never comes fails instead of hanging."""
    return await asyncio.wait_for(protocol.read_command(r, protocol.ANY_FRAME), timeout)


def close_client(client, timeout: float = 30.0) -> None:
    """pulsar.Client.close(), which can block for as long as a broker
    leaves it waiting: bounded, so that a test fails instead of hanging."""
    t = threading.Thread(target=client.close, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"pulsar.Client.close() still blocked after {timeout} s"


# ---- the official pulsar-client -------------------------------------------------

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


def official_client_factory():
    """A factory of official clients (the `pulsar_client` fixture, conftest):
    in this process, or in the interpreter ${PYLIMITER_PULSAR_CLIENT_PYTHON}
    names when this one has none; the test is skipped when neither exists."""
    import pytest

    other = os.environ.get(CLIENT_PYTHON_VAR)
    if pulsar is not None:
        return _InProcessClient
    if other:
        return lambda url: _DriverClient(other, url)
    pytest.skip(f"pulsar-client is not installed (and {CLIENT_PYTHON_VAR} is not set)")
