"""Load generator: N connections listing one namespace for a while."""

from __future__ import annotations

import asyncio
import re
import struct
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Optional

from . import protocol
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
                   max_requests: Optional[int] = None, read_delay: float = 0.0
                   ) -> LoadResult:
    """Each connection sends GET_TOPICS_OF_NAMESPACE back to back until the
    duration (or max_requests in all) is reached; bounded in time and count.
    read_delay makes each client wait before reading its response, like a
    slow network or a busy client: the server must then hold what it wrote
    until the client takes it, which is where unlimited memory grows."""
    res = LoadResult(connections, duration)
    deadline = time.monotonic() + duration
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
