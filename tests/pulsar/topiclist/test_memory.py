"""A closed connection gives its memory back at once, without the garbage
collector.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys
import weakref
from pathlib import Path

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist import protocol  # noqa: E402
from pylimiter.pulsar.topiclist.broker import Broker, generated_topics  # noqa: E402
from pylimiter.pulsar.topiclist.limits import MB  # noqa: E402

from .kit import (  # noqa: E402
    HEAP,
    NS,
    assert_all_back,
    pool,
    raw_connect,
    run_bounded,
    running,
    store_with,
    tiny,
    until,
)

HERE = Path(__file__).resolve().parent


class _TrackingBroker(Broker):
    """Remembers weak references to each connection and its reader."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.refs = []

    def make_connection(self, reader, writer):
        conn = super().make_connection(reader, writer)
        self.refs += [weakref.ref(conn), weakref.ref(reader)]
        return conn


async def _reset_mid_frame(b):
    for _ in range(3):
        r, w, _ = await raw_connect(b.port)
        w.write(struct.pack(">I", 512 * 1024) + bytes(300 * 1024))
        await w.drain()
        await until(lambda: any(len(getattr(ref(), "_buffer", b"")) > 0 for ref in b.refs
                                if ref() is not None), what="server buffering")
        w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
        w.transport.abort()


async def _watchers_then_close(b):
    for _ in range(3):
        c = await protocol.ClientConnection.open(b.service_url)
        for wid in range(3):
            await c.watch(NS, "persistent://public/default/.*", watcher_id=wid)
        conn = next(iter(b.connections))
        b.refs += [weakref.ref(w) for w in conn.watchers.values()]
        await c.close()
        await until(lambda: not b.connections)


async def _queued_then_vanish(b):
    heap = pool(b, HEAP)
    hold = await b.limiter.dual.acquire(heap.max_permits, HEAP)
    for _ in range(3):
        c = await protocol.ClientConnection.open(b.service_url)
        for _ in range(3):
            asyncio.ensure_future(c.get_topics(NS, timeout=None))
        await until(lambda: heap.queue_size == 3)
        await c.close()
        await until(lambda: heap.queue_size == 0)
    b.limiter.dual.release(hold)


@pytest.mark.parametrize("scenario", [_reset_mid_frame, _watchers_then_close,
                                      _queued_then_vanish],
                         ids=["reset-mid-frame", "watchers", "queued-then-vanish"])
def test_closed_connections_are_freed_without_the_garbage_collector(gc_disabled, scenario):
    async def main():
        cfg = tiny(heap_mb=1, heap_queue=10)
        async with running(_TrackingBroker(cfg, store=store_with(generated_topics(NS, 500)),
                                           admin_port=None)) as b:
            await scenario(b)
            await until(lambda: not b.connections, what="connections closed")
            for _ in range(5):
                await asyncio.sleep(0.01)
            alive = [type(ref()).__name__ for ref in b.refs if ref() is not None]
            assert alive == [], f"kept alive by a reference cycle: {alive}"
            assert_all_back(b)
    run_bounded(main())


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["reset", "watch"])
def test_rss_returns_when_connections_go_with_the_collector_disabled(scenario):
    """In a fresh interpreter with gc disabled: 10 resets mid-way through
    8 MiB frames (70 MiB buffered), or 20 watchers of 50,000 topics; RSS
    must come back to within 10% of what the clients made the server hold."""
    proc = subprocess.run([sys.executable, str(HERE / "rss_probe.py"), scenario],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    held = r["loaded"] - r["baseline"]
    assert held > 40 * MB, r                  # the clients did make it hold memory
    assert r["after"] - r["baseline"] < 0.1 * held, r
