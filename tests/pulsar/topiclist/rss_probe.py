"""RSS of a topic-list broker running in this process with the garbage
collector disabled: before clients arrive, while they hold server memory,
and after they are gone.  Run by test_memory.py in a fresh
interpreter (the measurement must not share a heap with other tests):

    python tests/pulsar/topiclist/rss_probe.py reset|watch

reset: 10 connections each send 7 MiB of an 8 MiB frame, then reset.
watch: 20 connections each watch every topic of a 50,000-topic namespace,
then close.  Prints one JSON line: baseline, loaded and after RSS in bytes
(baseline and after once malloc_trim has returned free heap pages).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import json
import socket
import struct
import sys
import time

import psutil

from pylimiter.pulsar.topiclist import protocol
from pylimiter.pulsar.topiclist.broker import Broker, TopicStore, generated_topics
from pylimiter.pulsar.topiclist.limits import MB, TopicListConfig
from pylimiter.pulsar.topiclist.protocol import CommandType

NS = "public/default"


def rss() -> int:
    return psutil.Process().memory_info().rss


def trim() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise),
    so that RSS shows what is still in use rather than malloc's caching."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


async def settle(broker, seconds=0.5):
    deadline = time.monotonic() + 30
    while broker.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await asyncio.sleep(seconds)


async def reset_scenario(broker) -> int:
    conns = []
    for _ in range(10):
        r, w = await asyncio.open_connection("127.0.0.1", broker.port)
        w.write(protocol.encode(protocol.cmd(CommandType.CONNECT, "connect", client_version="p")))
        await protocol.read_command(r)
        w.write(struct.pack(">I", 8 * MB - 4))
        chunk = b"x" * MB
        for _ in range(7):
            w.write(chunk)
            await w.drain()
        conns.append(w)
    await asyncio.sleep(0.5)          # the server reads what was sent
    loaded = rss()
    for w in conns:
        w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
        w.transport.abort()
    return loaded


async def watch_scenario(broker) -> int:
    clients = []
    for i in range(20):
        c = await protocol.ClientConnection.open(broker.service_url)
        await c.watch(NS, "persistent://public/default/.*", watcher_id=i)
        clients.append(c)
    loaded = rss()
    for c in clients:
        await c.close()
    return loaded


async def main(scenario: str) -> dict:
    store = TopicStore()
    store.add_many(generated_topics(NS, 50_000 if scenario == "watch" else 10))
    # No budgets: this measures that memory comes back, so the clients must
    # be able to make the server hold it first (the budgets that bound it
    # have tests of their own, in test_hostile.py).
    cfg = TopicListConfig(max_message_size=8 * MB, heap_mb=0, direct_mb=0, inbound_mb=0,
                          watchers_mb=0)
    broker = Broker(cfg, store=store, admin_port=None)
    await broker.start()
    try:
        await asyncio.sleep(0.2)
        trim()
        baseline = rss()
        loaded = await (reset_scenario if scenario == "reset" else watch_scenario)(broker)
        await settle(broker)
        trim()
        return {"scenario": scenario, "baseline": baseline, "loaded": loaded, "after": rss(),
                "connections_left": len(broker.connections)}
    finally:
        await broker.stop()


if __name__ == "__main__":
    gc.collect()
    gc.disable()
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
