"""Load generator: N connections listing one namespace for a while."""

from __future__ import annotations

import asyncio
import json
import re
import struct
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Optional

from . import protocol
from .presets import PRESETS, Preset  # noqa: F401  (the presets, as before)
from .protocol import CommandType

_LIST = bytes([0x08, CommandType.GET_TOPICS_OF_NAMESPACE_RESPONSE])
_PING = bytes([0x08, CommandType.PING])


@dataclass
class LoadResult:
    """What a load run saw, and the server's peaks when scraped."""

    connections: int
    duration_s: float
    requests: int = 0
    responses: int = 0
    bytes: int = 0
    too_many_requests: int = 0
    other_errors: int = 0
    latencies_ms: list = field(default_factory=list, repr=False)
    server: dict = field(default_factory=dict)

    @property
    def rps(self) -> float:
        """Responses per second over the run."""
        return self.responses / self.duration_s if self.duration_s else 0.0

    def percentile(self, q: float) -> Optional[float]:
        """A latency percentile in ms (q in 0..1), None without samples."""
        if not self.latencies_ms:
            return None
        s = sorted(self.latencies_ms)
        return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]

    def summary(self) -> dict:
        """The result as a flat dict (latencies as p50/p99/max)."""
        d = asdict(self)
        d.pop("latencies_ms")
        d.update(rps=round(self.rps, 1), p50_ms=self.percentile(0.5),
                 p99_ms=self.percentile(0.99), max_ms=self.percentile(1.0))
        return d


def scrape(admin_url: str, timeout: float = 10.0) -> dict:
    """Peak RSS and peak permits from the server's Prometheus exposition."""
    with urllib.request.urlopen(f"{admin_url}/metrics", timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^pulsar_(broker|proxy)_topic_list_(\w+)\{[^}]*\} ([0-9.e+-]+)$", line)
        if m and m[2] in ("process_peak_rss_bytes", "heap_memory_peak_bytes",
                          "direct_memory_peak_bytes", "heap_memory_limit_bytes",
                          "direct_memory_limit_bytes", "heap_timeout_total",
                          "direct_timeout_total"):
            out[m[2]] = float(m[3])
    return out


async def run_load(url: str, namespace: str, connections: int, duration: float, *,
                   admin_url: Optional[str] = None, request_timeout: float = 120.0,
                   max_requests: Optional[int] = None, read_delay: float = 0.0,
                   retry_delay: float = 0.0, budget: Optional[list] = None) -> LoadResult:
    """Each connection sends GET_TOPICS_OF_NAMESPACE back to back until the
    duration (or max_requests in all) is reached; bounded in time and count.
    read_delay makes each client wait before reading its response, like a
    slow network or a busy client: the server must then hold what it wrote
    until the client takes it, which is where unlimited memory grows.
    retry_delay: how long a client waits after TooManyRequests before its
    next request (Pulsar's clients back off, from 100 ms).  `budget`, a
    one-item list, is a request budget shared with other runs (it then
    replaces max_requests)."""
    res = LoadResult(connections, duration)
    deadline = time.monotonic() + duration
    if budget is None:
        budget = [max_requests if max_requests is not None else float("inf")]

    async def one():
        # A lean client: decoding a 100k-topic response costs the load
        # generator more than the server spends producing it, so responses
        # are recognised by their leading type field (protobuf writes field 1
        # first) and only ERROR frames, which are small, are decoded.
        conn = await protocol.ClientConnection.open(url)
        conn._reader_task.cancel()   # this loop reads the socket itself
        reader, writer = conn.reader, conn.writer
        rid = 0
        try:
            while time.monotonic() < deadline and budget[0] > 0:
                budget[0] -= 1
                res.requests += 1
                rid += 1
                writer.write(protocol.encode(protocol.cmd(
                    CommandType.GET_TOPICS_OF_NAMESPACE, "getTopicsOfNamespace",
                    request_id=rid, namespace=namespace)))
                t0 = time.perf_counter()
                if read_delay:
                    await asyncio.sleep(read_delay)
                try:
                    while True:
                        head = await asyncio.wait_for(reader.readexactly(8), request_timeout)
                        total, cmd_size = struct.unpack(">II", head)
                        body = await asyncio.wait_for(reader.readexactly(total - 4),
                                                      request_timeout)
                        if body[:2] == _PING:
                            writer.write(protocol.encode(protocol.cmd(CommandType.PONG, "pong")))
                            continue
                        break
                except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError,
                        OSError):
                    res.other_errors += 1
                    return
                if body[:2] == _LIST:
                    res.responses += 1
                    res.bytes += total + 4
                    res.latencies_ms.append((time.perf_counter() - t0) * 1000.0)
                else:
                    command = protocol.BaseCommand()
                    command.ParseFromString(body[:cmd_size])
                    if command.type == CommandType.ERROR and \
                            command.error.error == protocol.ServerError.TooManyRequests:
                        res.too_many_requests += 1
                        if retry_delay:
                            await asyncio.sleep(min(retry_delay,
                                                    max(0.0, deadline - time.monotonic())))
                    else:
                        res.other_errors += 1
                del body
        finally:
            await conn.close()

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(connections)))
    res.duration_s = time.monotonic() - t0
    if admin_url:
        res.server = await asyncio.to_thread(scrape, admin_url)  # the server may share this loop
    return res


def merged(a: LoadResult, b: LoadResult) -> LoadResult:
    """Two runs that went on at the same time, as one (the server's figures
    are b's, else a's)."""
    return LoadResult(
        a.connections + b.connections, max(a.duration_s, b.duration_s),
        requests=a.requests + b.requests, responses=a.responses + b.responses,
        bytes=a.bytes + b.bytes, too_many_requests=a.too_many_requests + b.too_many_requests,
        other_errors=a.other_errors + b.other_errors,
        latencies_ms=a.latencies_ms + b.latencies_ms, server=b.server or a.server)


# ---- presets: a server of their own and a load that shows the limiter acting ---------


async def run_preset(preset: Preset, namespace: str, *, topics: Optional[int] = None,
                     connections: Optional[int] = None, duration: Optional[float] = None,
                     read_delay: Optional[float] = None,
                     max_requests: Optional[int] = None) -> dict:
    """Run `preset` (arguments given override its own): start its broker,
    run the load, read the broker's pools and memory, stop it.  The result
    as a JSON-able dict: the settings, the clients' view (as
    LoadResult.summary), each pool's limit, peak, grants, waits and
    refusals, and the broker's RSS before the load and at its peak."""
    from .hostile import ServiceProcess

    topics = preset.topics if topics is None else topics
    connections = preset.connections if connections is None else connections
    duration = preset.duration if duration is None else duration
    read_delay = preset.read_delay if read_delay is None else read_delay
    limits = preset.limits(namespace, topics, connections)
    flags = ["--topics", str(topics), "--namespace", namespace]
    for key in ("heap_mb", "direct_mb", "heap_timeout_ms", "direct_timeout_ms",
                "heap_queue", "direct_queue"):
        flags += [f"--{key.replace('_', '-')}", f"{limits[key]:.9g}"]
    broker = await asyncio.to_thread(ServiceProcess, "broker", *flags)
    try:
        rss_before = _or_none(broker.rss)
        slow = min(connections - 1, round(connections * preset.slow_share)) \
            if read_delay > 0 else 0
        budget = [max_requests if max_requests is not None else float("inf")]
        runs = [run_load(broker.url, namespace, connections - slow, duration,
                         retry_delay=preset.retry_delay, budget=budget)]
        if slow:
            runs.append(run_load(broker.url, namespace, slow, duration, read_delay=read_delay,
                                 retry_delay=preset.retry_delay, budget=budget))
        results = await asyncio.gather(*runs)
        load = results[0] if len(results) == 1 else merged(*results)
        stats = await asyncio.to_thread(_get_json, f"{broker.admin}/admin/stats")
        rss_peak = _or_none(broker.peak)
    finally:
        await asyncio.to_thread(broker.stop)
    pools = {}
    for name, p in stats["limits"].items():
        pools[name] = dict(p, peak=stats["peak_permits"][name])
    return {"preset": preset.name, "namespace": namespace, "topics": topics,
            "connections": connections, "slow_readers": slow, "read_delay_s": read_delay,
            "retry_delay_s": preset.retry_delay, "duration_s": duration,
            "timeout_ms": preset.timeout_ms, "queue": limits["heap_queue"],
            "heap_listings": preset.heap_listings, "direct_answers": preset.direct_answers,
            "listing_heap_bytes": limits["listing_heap_bytes"],
            "answer_frame_bytes": limits["answer_frame_bytes"],
            "clients": load.summary(), "pools": pools,
            "rss_before_bytes": rss_before, "rss_peak_bytes": rss_peak}


def _or_none(read):
    """read(), or None where /proc is not there to read it (not Linux)."""
    try:
        return read()
    except (OSError, RuntimeError):
        return None


def _get_json(url: str, timeout: float = 10.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())
