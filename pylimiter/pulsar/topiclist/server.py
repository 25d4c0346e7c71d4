"""What the broker and the proxy share: the listener, the per-connection
read loop, the memory-limited write path, keep-alive, and the admin/metrics
HTTP API.

Memory accounting follows PIP-442 and Pulsar's merge of it:
  * heap permit of an estimate per (namespace, mode) (10 KiB at first, then
    the last actual size) before listing; `update` to the actual size once
    known;
  * direct permit of the serialized frame size before writing, released only
    when the transport has flushed the frame (write buffer high-water mark 0,
    so drain() returns once the bytes are in the kernel), and on every error;
  * every wait is cancelled when the client's connection closes
    (is_cancelled), and a wait that fails answers TooManyRequests.
A request larger than a whole pool is capped at the pool's size: it can still
be served, alone.

Every request gets an answer or an error frame carrying its request id,
whatever fails, unless its client has gone; /admin/stats counts each request
exactly once under how it ended.  A closed connection gives its memory back
at once: nothing it allocated is kept alive by a reference cycle (buffers,
watchers), so the garbage collector is not needed for it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
import time
from dataclasses import fields
from typing import Optional

from pylimiter import PermitAcquireAlreadyClosedError, PermitAcquireCancelledError

from . import protocol
from .limits import (
    DIRECT,
    HEAP,
    ConfigError,
    LimitFailed,
    TopicListConfig,
    TopicListLimiter,
    check_value,
)
from .protocol import CommandType, ServerError

log = logging.getLogger("pylimiter.pulsar.topiclist")

INITIAL_ESTIMATE = 10 * 1024
LOOPBACK = "127.0.0.1"
#: How a request ended, for /admin/stats: requests == the sum of these
#: plus in_flight at any moment.
OUTCOMES = ("responses", "too_many_requests", "errors", "cancelled")
LIVE_LIMITS = ("heap_mb", "direct_mb")


class ServiceBase:
    """One listener (broker or proxy) with its limiter, metrics and admin."""

    role = "broker"
    advertise_watchers = True

    def __init__(self, config: TopicListConfig, *, host: str = LOOPBACK, port: int = 0,
                 admin_port: Optional[int] = 0, cluster: str = "standalone"):
        self.host, self.port, self.admin_port = host, port, admin_port
        self.cluster = cluster
        self.config = config
        self.max_frame = protocol.max_frame_for(config.max_message_size)
        self.limiter = TopicListLimiter(config)
        #: last actual heap size of a listing, by (namespace, mode)
        self.estimates: dict[tuple[str, int], int] = {}
        self.connections: set["ConnectionBase"] = set()
        self.counters = {"requests": 0, **{k: 0 for k in OUTCOMES}}
        self._server: Optional[asyncio.AbstractServer] = None
        self._handlers: set[asyncio.Task] = set()
        self._runner = None
        from prometheus_client import CollectorRegistry

        from pylimiter.prometheus import LimiterCollector

        self.registry = CollectorRegistry(auto_describe=False)
        metrics = LimiterCollector(f"pulsar_{self.role}", labels={"cluster": cluster})
        # Read at each scrape: the limiter may be rebuilt by a limit change.
        metrics.track("topic_list", lambda: self.limiter.dual)
        self.registry.register(metrics)
        self.registry.register(_ExtraCollector(self))

    # ---- lifecycle ---------------------------------------------------------------

    @property
    def service_url(self) -> str:
        """pulsar://host:port of the binary protocol listener."""
        return f"pulsar://{self.host}:{self.port}"

    @property
    def admin_url(self) -> str:
        """http://host:port of the admin and metrics API."""
        return f"http://{self.host}:{self.admin_port}"

    async def start(self):
        """Listen (and serve the admin API); the bound ports are then known."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port,
                                                  limit=2 ** 16)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.admin_port is not None:
            await self._start_admin()
        return self

    async def stop(self):
        """Stop listening, close every connection and let each finish its
        teardown (requests in flight end as cancelled, permits go back)."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.abort()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5.0)
        if self._server is not None:
            await self._server.wait_closed()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _accept(self, reader, writer):
        task = asyncio.current_task()
        self._handlers.add(task)
        conn = self.make_connection(reader, writer)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            self._handlers.discard(task)

    def make_connection(self, reader, writer) -> "ConnectionBase":
        """The connection object for an accepted client (per role)."""
        raise NotImplementedError

    # ---- admin HTTP (aiohttp, loopback only) -----------------------------------

    async def _start_admin(self):
        from aiohttp import web
        from prometheus_client.aiohttp import make_aiohttp_handler

        app = web.Application()
        app.router.add_get("/metrics", make_aiohttp_handler(self.registry))
        app.router.add_get("/admin/stats", self._h_stats)
        app.router.add_get("/admin/limits", self._h_get_limits)
        app.router.add_put("/admin/limits", self._h_put_limits)
        self.add_admin_routes(app)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.admin_port)
        await site.start()
        self.admin_port = self._runner.addresses[0][1]

    def add_admin_routes(self, app):
        """Routes a role adds to the admin API."""
        pass

    def stats(self) -> dict:
        """Limits, peaks, connections and request outcomes."""
        done = sum(self.counters[k] for k in OUTCOMES)
        return {"role": self.role, "limits": self.limiter.snapshot(),
                "peak_permits": self.limiter.peak, "peak_rss_bytes": peak_rss_bytes(),
                "connections": len(self.connections), **self.counters,
                "in_flight": self.counters["requests"] - done}

    async def _h_stats(self, request):
        from aiohttp import web

        return web.json_response(self.stats())

    async def _h_get_limits(self, request):
        from aiohttp import web

        return web.json_response(self.limiter.config.as_dict("limits"))

    async def _h_put_limits(self, request):
        from aiohttp import web

        try:
            self.limiter.set_limits(**await live_limits(request))
        except ConfigError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return await self._h_get_limits(request)


async def live_limits(request) -> dict:
    """The body of PUT /admin/limits, checked: a JSON object with heap_mb
    and/or direct_mb, each a size in MB.  ConfigError says what is wrong."""
    example = 'e.g. {"heap_mb": 64, "direct_mb": 0}'
    try:
        body = json.loads(await request.read())
    except ValueError as exc:
        raise ConfigError(f"the body is not JSON ({exc}); {example}") from None
    if not isinstance(body, dict) or not body:
        raise ConfigError(f"expected a JSON object with heap_mb and/or direct_mb, "
                          f"not {json.dumps(body)[:60]}; {example}")
    unknown = sorted(set(body) - set(LIVE_LIMITS))
    if unknown:
        raise ConfigError(f"only heap_mb and direct_mb change at run time, not {unknown}")
    by_name = {f.name: f for f in fields(TopicListConfig)}
    for k, v in body.items():
        check_value(by_name[k], v)
    return {k: float(v) for k, v in body.items()}


class _ExtraCollector:
    """Peaks the load generator reads (not among the seed's twelve)."""

    def __init__(self, service: ServiceBase):
        self.s = service

    def collect(self):
        """Peak permits per pool and the process's peak RSS."""
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
    """The process's peak resident set size (getrusage), in bytes."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r if sys.platform == "darwin" else r * 1024


def _forget_traceback(exc: Optional[BaseException]) -> None:
    """Drop an exception's frames.  A StreamReader keeps the error that
    ended it and raises that same object again; its traceback holds the
    reader's own frame, a cycle that would keep the reader's buffer (up to
    a whole frame) alive until the garbage collector runs."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__context__


class ConnectionBase:
    """Read loop, keep-alive and write path of one client connection."""

    def __init__(self, service: ServiceBase, reader, writer):
        self.service = service
        self.limiter = service.limiter
        self.reader, self.writer = reader, writer
        self.connected = False
        self.tasks: set[asyncio.Task] = set()
        self._closed = False
        self._last_read = time.monotonic()
        self._awaiting_pong = False
        self._keepalive: Optional[asyncio.TimerHandle] = None
        # drain() returns only once the bytes left the user-space buffer.
        writer.transport.set_write_buffer_limits(high=0)

    def is_closed(self) -> bool:
        """Whether the connection is closed or closing."""
        return self._closed or self.writer.transport.is_closing()

    def abort(self):
        """Close at once, dropping unsent bytes."""
        self._closed = True
        self.writer.transport.abort()

    def spawn(self, coro):
        """Run a handler as a task of this connection (cancelled at close)."""
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

    # ---- keep-alive (Pulsar's keepAliveIntervalSeconds) --------------------------

    def stop_keepalive(self):
        """No more pings (the connection closes, or is piped elsewhere)."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    def _schedule_keepalive(self):
        interval = self.service.config.keep_alive_s
        if interval > 0 and not self.is_closed():
            self._keepalive = asyncio.get_running_loop().call_later(interval, self._keepalive_tick)

    def _keepalive_tick(self):
        """Every interval: a connection that sent nothing since the last
        tick is pinged; one that has not answered that ping by the next
        tick is closed, as Pulsar's broker does; so is one that has not
        completed its handshake by the first tick."""
        if not self.connected:
            log.info("closing connection: no CONNECT within the keep-alive interval")
            self.abort()
            return
        idle = time.monotonic() - self._last_read >= self.service.config.keep_alive_s * 0.99
        if idle and self._awaiting_pong:
            log.info("closing connection: no answer to keep-alive ping")
            self.abort()
            return
        if idle:
            self._awaiting_pong = True
            self.send(protocol.cmd(CommandType.PING, "ping"))
        self._schedule_keepalive()

    # ---- the read loop -------------------------------------------------------------

    async def run(self):
        """Read and dispatch commands until the client goes, then tear down."""
        self._schedule_keepalive()
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
                self._last_read, self._awaiting_pong = time.monotonic(), False
                if not self.connected and command.type != CommandType.CONNECT:
                    self.send(protocol.error(protocol.request_id_of(command),
                                             ServerError.NotAllowedError,
                                             "expected CONNECT as the first command"))
                    break
                if not protocol.has_body(command):
                    self.send(protocol.error(0, ServerError.NotAllowedError,
                                             f"command {CommandType.Name(command.type)} "
                                             "has no body"))
                    continue
                keep = await self.dispatch(command, size)
                if keep is False:
                    return  # the connection was handed off (proxy pipe)
        except (ConnectionError, OSError) as exc:
            _forget_traceback(exc)
        finally:
            await self._teardown()

    async def _teardown(self):
        """Close, end every task of this connection, and drop what it held."""
        self._closed = True
        self.stop_keepalive()
        await self.on_close()
        for t in list(self.tasks):
            t.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        self.writer.close()
        _forget_traceback(self.reader.exception())

    async def on_close(self):
        """What a role releases when its connection closes."""
        pass

    async def dispatch(self, command, size):
        """Answer one command; False hands the connection off."""
        raise NotImplementedError

    def send(self, command) -> None:
        """A small control frame (CONNECTED, PONG, SUCCESS, ERROR...), not
        memory-limited, as in Pulsar."""
        if not self.is_closed():
            self.writer.write(protocol.encode(command))

    def unsupported(self, command):
        """ERROR for a command this service does not serve, with its request id."""
        self.send(protocol.error(protocol.request_id_of(command), ServerError.NotAllowedError,
                                 f"command {CommandType.Name(command.type)} is not supported by "
                                 f"this topic-list {self.service.role}"))

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

    async def limited_heap(self, key: tuple[str, int], dual, is_cancelled=None):
        """The initial heap permit for listing: the last actual size of
        this (namespace, mode), 10 KiB the first time."""
        estimate = self.service.estimates.get(key, INITIAL_ESTIMATE)
        return await self.limiter.acquire(HEAP, estimate, dual, is_cancelled or self.is_closed)

    async def heap_update(self, dual, permit, actual: int, is_cancelled=None):
        """Resize the heap permit to the actual size; raises LimitFailed."""
        await self.limiter.update(permit, actual, dual, is_cancelled or self.is_closed)

    async def guarded(self, request_id: int, work):
        """Run a request; answer whatever it raises with an error frame
        carrying request_id (unless the client has gone) and count how it
        ended under exactly one of OUTCOMES."""
        counters = self.service.counters
        counters["requests"] += 1
        outcome = "cancelled"
        try:
            await work()
            outcome = "responses"
        except BaseException as exc:
            if isinstance(exc, Exception):
                outcome = self._failed(request_id, exc)
            # The failed request's frames (this connection, the limiter's
            # waiter) must not stay reachable from the exception, which the
            # task or the limiter may keep: that cycle would hold the
            # connection until the garbage collector runs.
            _forget_traceback(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            counters[outcome] += 1

    def _failed(self, request_id: int, exc: Exception) -> str:
        """Answer a request that raised exc; return its outcome."""
        if isinstance(exc, LimitFailed):
            return self._answer(request_id, ServerError.TooManyRequests, str(exc),
                                "too_many_requests")
        if isinstance(exc, (PermitAcquireCancelledError, PermitAcquireAlreadyClosedError)):
            return "cancelled"   # the client left: nobody to answer
        if isinstance(exc, protocol.RequestError):
            return self._answer(request_id, exc.code, exc.server_message, "errors")
        if isinstance(exc, (ConnectionError, OSError, asyncio.TimeoutError)):
            return self._answer(request_id, ServerError.ServiceNotReady,
                                f"upstream failure: {exc!r}", "errors")
        log.error("request %d failed: %r", request_id, exc, exc_info=exc)
        return self._answer(request_id, ServerError.UnknownError,
                            f"{type(exc).__name__}: {exc}", "errors")

    def _answer(self, request_id: int, code: int, message: str, outcome: str) -> str:
        if self.is_closed():
            return "cancelled"
        self.send(protocol.error(request_id, code, message))
        return outcome
