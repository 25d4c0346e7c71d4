"""What the broker and the proxy share: the listener, the per-connection
read loop, the memory-limited write path, and the admin/metrics HTTP API.

Memory accounting follows PIP-442 and Pulsar's merge of it:
  * heap permit of a per-namespace estimate (10 KiB at first, then the last
    actual size) before listing; `update` to the actual size once known;
  * direct permit of the serialized frame size before writing, released only
    when the transport has flushed the frame (write buffer high-water mark 0,
    so drain() returns once the bytes are in the kernel), and on every error;
  * every wait is cancelled when the client's connection closes
    (is_cancelled), and a wait that fails answers TooManyRequests.
A request larger than a whole pool is capped at the pool's size: it can still
be served, alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
from typing import Optional

from pylimiter import PermitAcquireAlreadyClosedError, PermitAcquireCancelledError

from . import protocol
from .limits import (
    DIRECT,
    HEAP,
    LimitFailed,
    LimiterCollector,
    TopicListConfig,
    TopicListLimiter,
)
from .protocol import CommandType

log = logging.getLogger("pylimiter.pulsar.topiclist")

INITIAL_ESTIMATE = 10 * 1024
LOOPBACK = "127.0.0.1"


class ServiceBase:
    """One listener (broker or proxy) with its limiter, metrics and admin."""

    role = "broker"
    advertise_watchers = True

    def __init__(self, config: TopicListConfig, *, host: str = LOOPBACK, port: int = 0,
                 admin_port: Optional[int] = 0, cluster: str = "standalone",
                 max_frame: int = protocol.DEFAULT_MAX_FRAME):
        self.host, self.port, self.admin_port = host, port, admin_port
        self.cluster = cluster
        self.max_frame = max_frame
        self.limiter = TopicListLimiter(config)
        self.estimates: dict[str, int] = {}
        self.connections: set["ConnectionBase"] = set()
        self.counters = {"requests": 0, "responses": 0, "too_many_requests": 0,
                         "errors": 0, "cancelled": 0}
        self._server: Optional[asyncio.AbstractServer] = None
        self._runner = None
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(LimiterCollector(self.limiter, f"pulsar_{self.role}_topic_list_",
                                                cluster))
        self.registry.register(_ExtraCollector(self))

    # ---- lifecycle ---------------------------------------------------------------

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    async def start(self):
        self._server = await asyncio.start_server(self._accept, self.host, self.port,
                                                  limit=2 ** 16)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.admin_port is not None:
            await self._start_admin()
        return self

    async def stop(self):
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort()
        if self._server is not None:
            await self._server.wait_closed()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _accept(self, reader, writer):
        conn = self.make_connection(reader, writer)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    def make_connection(self, reader, writer) -> "ConnectionBase":
        raise NotImplementedError

    # ---- admin HTTP (aiohttp, loopback only) -----------------------------------

    async def _start_admin(self):
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/metrics", self._h_metrics)
        app.router.add_get("/admin/stats", self._h_stats)
        app.router.add_get("/admin/limits", self._h_get_limits)
        app.router.add_put("/admin/limits", self._h_put_limits)
        self.add_admin_routes(app)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.admin_port)
        await site.start()
        self.admin_port = site._server.sockets[0].getsockname()[1]

    def add_admin_routes(self, app):
        pass

    async def _h_metrics(self, request):
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return web.Response(body=generate_latest(self.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    def stats(self) -> dict:
        return {"role": self.role, "limits": self.limiter.snapshot(), "peak_permits": self.limiter.peak,
                "peak_rss_bytes": peak_rss_bytes(), "connections": len(self.connections),
                **self.counters}

    async def _h_stats(self, request):
        from aiohttp import web

        return web.json_response(self.stats())

    async def _h_get_limits(self, request):
        from aiohttp import web

        return web.json_response(self.limiter.config.as_dict())

    async def _h_put_limits(self, request):
        from aiohttp import web

        try:
            body = await request.json()
            unknown = set(body) - {"heap_mb", "direct_mb"}
            if unknown:
                raise ValueError(f"only heap_mb and direct_mb change at run time, not {sorted(unknown)}")
            vals = {}
            for k in ("heap_mb", "direct_mb"):
                if k in body:
                    v = body[k]
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                        raise ValueError(f"{k} must be a number >= 0")
                    vals[k] = float(v)
            self.limiter.set_limits(**vals)
        except (ValueError, json.JSONDecodeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return await self._h_get_limits(request)


class _ExtraCollector:
    """Peaks the load generator reads (not among the seed's twelve)."""

    def __init__(self, service: ServiceBase):
        self.s = service

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        p = f"pulsar_{self.s.role}_topic_list_"
        for k in ("heap", "direct"):
            g = GaugeMetricFamily(f"{p}{k}_memory_peak_bytes",
                                  f"Highest {k} memory permits held at once", labels=["cluster"])
            g.add_metric([self.s.cluster], self.s.limiter.peak[k])
            yield g
        g = GaugeMetricFamily(f"{p}process_peak_rss_bytes", "Peak resident set size of the process",
                              labels=["cluster"])
        g.add_metric([self.s.cluster], peak_rss_bytes())
        yield g


def peak_rss_bytes() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


class ConnectionBase:
    """Read loop and write path of one client connection."""

    def __init__(self, service: ServiceBase, reader, writer):
        self.service = service
        self.limiter = service.limiter
        self.reader, self.writer = reader, writer
        self.connected = False
        self.tasks: set[asyncio.Task] = set()
        self._closed = False
        # drain() returns only once the bytes left the user-space buffer.
        writer.transport.set_write_buffer_limits(high=0)

    def is_closed(self) -> bool:
        return self._closed or self.writer.transport.is_closing()

    def abort(self):
        self._closed = True
        self.writer.transport.abort()

    def spawn(self, coro):
        t = asyncio.ensure_future(coro)
        self.tasks.add(t)
        t.add_done_callback(self._task_done)
        return t

    def _task_done(self, t: asyncio.Task):
        self.tasks.discard(t)
        if not t.cancelled() and t.exception() is not None:
            exc = t.exception()
            if not isinstance(exc, (ConnectionError, OSError)):
                log.error("handler failed: %r", exc, exc_info=exc)
                self.service.counters["errors"] += 1

    async def run(self):
        try:
            while True:
                try:
                    command, size = await protocol.read_command(self.reader,
                                                                self.service.max_frame)
                except protocol.ProtocolError as exc:
                    log.info("closing connection: %s", exc)
                    break
                if command is None:
                    break
                if not self.connected and command.type != CommandType.CONNECT:
                    self.send(protocol.error(0, protocol.ServerError.NotAllowedError,
                                      "expected CONNECT as the first command"))
                    break
                keep = await self.dispatch(command, size)
                if keep is False:
                    return  # the connection was handed off (proxy pipe)
        except (ConnectionError, OSError):
            pass
        finally:
            self._closed = True
            await self.on_close()
            for t in list(self.tasks):
                t.cancel()
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
            self.writer.close()

    async def on_close(self):
        pass

    async def dispatch(self, command, size):
        raise NotImplementedError

    def send(self, command) -> None:
        """A small control frame (CONNECTED, PONG, SUCCESS, ERROR...), not
        memory-limited, as in Pulsar."""
        if not self.is_closed():
            self.writer.write(protocol.encode(command))

    def unsupported(self, command):
        self.send(protocol.error(0, protocol.ServerError.NotAllowedError,
                          f"command {CommandType.Name(command.type)} is not supported by this "
                          f"topic-list {self.service.role}"))

    async def write_limited(self, command, dual) -> None:
        """PIP-442's acquireMaxTopicListInFlightPermitsAndWriteAndFlush:
        direct permit of the frame size, serialize, write, wait for the
        flush, release (also on every error).  Raises LimitFailed."""
        direct = await self.limiter.acquire(DIRECT, protocol.frame_size(command), dual,
                                            self.is_closed)
        try:
            data = protocol.encode(command)
            if self.is_closed():
                raise ConnectionResetError("client went away")
            self.writer.write(data)
            del data
            await self.writer.drain()
        finally:
            dual.release(direct)

    async def limited_heap(self, namespace: str, dual):
        """The initial heap permit for listing a namespace."""
        estimate = self.service.estimates.get(namespace, INITIAL_ESTIMATE)
        return await self.limiter.acquire(HEAP, estimate, dual, self.is_closed)

    async def heap_update(self, dual, permit, actual: int):
        await self.limiter.update(permit, actual, dual, self.is_closed)

    async def guarded(self, request_id: int, work):
        """Run a limited request; map failures to Pulsar's answers."""
        svc = self.service
        svc.counters["requests"] += 1
        try:
            await work()
            svc.counters["responses"] += 1
        except LimitFailed as exc:
            svc.counters["too_many_requests"] += 1
            self.send(protocol.error(request_id, protocol.ServerError.TooManyRequests, str(exc)))
        except (PermitAcquireCancelledError, PermitAcquireAlreadyClosedError):
            svc.counters["cancelled"] += 1   # the client left: nobody to answer
        except protocol.RequestError as exc:   # the proxy's broker said no
            svc.counters["errors"] += 1
            self.send(protocol.error(request_id, exc.code, exc.server_message))
        except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
            if not self.is_closed():
                svc.counters["errors"] += 1
                self.send(protocol.error(request_id, protocol.ServerError.ServiceNotReady,
                                  f"upstream failure: {exc!r}"))
