"""What the broker and the proxy share: the listener, the per-connection
read loop, the memory-limited write path, keep-alive, the guards against
hostile clients, and the admin/metrics HTTP API.

Memory accounting follows PIP-442 and Pulsar's merge of it:
  * heap permit of an estimate per (namespace, mode) (10 KiB at first, then
    the last actual size) before listing; `update` to the actual size once
    known; the broker releases it once the list is serialized (it then lives
    in the frame), the proxy only with the direct permit, once the write to
    the client has completed (PIP-442's proxy flow, proxy.py);
  * direct permit of the serialized frame size before writing, released only
    when the transport has flushed the frame (write buffer high-water mark 0,
    so drain() returns once the bytes are in the kernel), and on every error;
  * every wait is cancelled when the client's connection closes
    (is_cancelled), and a wait that fails answers TooManyRequests.
A request larger than a whole pool is capped at the pool's size: it can still
be served, alone.

What one client can make the service hold is bounded besides (issue 19):
  * topic-list requests in flight per connection (requests_per_connection):
    more are answered TooManyRequests at once, holding nothing, so a client
    that does not read pins the memory of that many responses at most, and
    for write_timeout_ms at most (below);
  * every frame, control frames too, is written in turn and drained before
    the next; pending output that does not drain within write_timeout_ms
    closes the connection (its permits return), whatever the client sends;
    while a control answer waits, the connection's read loop waits too;
  * a frame larger than READ_AHEAD is read only with memory from the
    inbound budget (inbound_mb), shared by all connections; a connection
    that cannot have it within write_timeout_ms is closed;
  * names are length-checked and must be text; ERROR messages are cut;
  * CPU-heavy steps take turns (fair.FairShare), least-served connection
    first, and a read loop lets others run every READ_BATCH commands, so no
    client, however many requests or watchers it makes, keeps the others
    from being accepted and served.

The admin/metrics HTTP API is bounded the same way (admin.py, issue 32):
deadlines for a request's head and body, a cap on its connections (so it
cannot take the file descriptors the binary port needs), and every body
it reads answered 400 when it is not JSON it can use, whatever it holds.

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
from typing import Optional

from pylimiter import (
    AsyncSemaphore,
    PermitAcquireAlreadyClosedError,
    PermitAcquireCancelledError,
    PermitAcquireError,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
)

from ...spark.settings import check_value
from . import protocol
from .admin import (
    AdminGate,
    AdminGuards,
    BadRequest,
    describe,
    make_middleware,
    make_site,
    read_json,
)
from .fair import FairShare, Owner
from .limits import (
    DIRECT,
    HEAP,
    ConfigError,
    LimitFailed,
    TopicListConfig,
    TopicListLimiter,
)
from .protocol import CommandType, ServerError

log = logging.getLogger("pylimiter.pulsar.topiclist")

INITIAL_ESTIMATE = 10 * 1024
LOOPBACK = "127.0.0.1"
#: How a request ended, for /admin/stats: requests == the sum of these
#: plus in_flight at any moment.
OUTCOMES = ("responses", "too_many_requests", "errors", "cancelled")
LIVE_LIMITS = ("heap_mb", "direct_mb")
#: The requests /admin/stats counts (and requests_per_connection caps).
TOPIC_LIST_REQUESTS = (CommandType.GET_TOPICS_OF_NAMESPACE, CommandType.WATCH_TOPIC_LIST)
#: What a connection may read ahead of the frame it is on, outside the
#: inbound budget: the stream's buffer limit (it pauses reading at twice
#: this) and the size of one socket read.  Larger frames take budget.
READ_AHEAD = 16 * 1024
#: Commands a read loop handles before it waits for a fair turn.
READ_BATCH = 16
#: The most one batch is charged (s): 16 commands with megabyte frames.
MAX_BATCH_CHARGE = 0.1
#: Watch creations listing and matching at once (see ServiceBase).
WATCH_INITS = 4
#: How long stop() lets connections finish their teardown (what stop()
#: waits for in all stays under 3 s, so SIGTERM exits within 5 s).
STOP_GRACE = 2.0


async def _close_listener(server: asyncio.AbstractServer) -> None:
    """``server.close()``, without asyncio's accept/close race (CPython
    gh-109564).  An accept callback hands each new socket to a task whose
    first step builds its transport; when close() lands between the two,
    3.13+ refuses the late transport, drops it unclosed, and its finaliser
    wakes the server's closers a second time: "TypeError: 'NoneType' object
    is not iterable" on stderr for every such connection (seen on SIGTERM
    during a connection storm).  So the listening sockets stop being
    watched first, and one pass of the loop lets every accepted socket get
    its transport (our handler then closes it, as _stopping says) before
    close()."""
    loop = asyncio.get_running_loop()
    for sock in server.sockets:
        try:
            loop.remove_reader(sock.fileno())   # a selector loop's accept callback
        except (NotImplementedError, RuntimeError, ValueError, OSError):
            pass   # no selector (proactor), or a loop whose listener is its own (uvloop)
    await asyncio.sleep(0)
    server.close()


class RateLimitedLog:
    """Log lines a client can trigger, at most one per key per interval; the
    next line says how many were left out.  A client sending bad requests
    must not be able to fill the disk (issue 19, finding 5)."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0):
        self.logger, self.interval = logger, interval
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def __call__(self, level: int, key: str, msg: str, *args, **kwargs) -> bool:
        """Log unless `key` logged within the interval; True if logged."""
        now = time.monotonic()
        if now - self._last.get(key, -self.interval) < self.interval:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            msg += f" (and {dropped} like it in the last {self.interval:g} s)"
        self.logger.log(level, msg, *args, **kwargs)
        return True


class ServiceBase:
    """One listener (broker or proxy) with its limiter, metrics and admin.
    `admin_guards` (admin.AdminGuards) bounds the admin API's connections
    and request deadlines; admin_port None serves no admin API."""

    role = "broker"
    advertise_watchers = True

    def __init__(self, config: TopicListConfig, *, host: str = LOOPBACK, port: int = 0,
                 admin_port: Optional[int] = 0, cluster: str = "standalone",
                 admin_guards: Optional[AdminGuards] = None):
        self.host, self.port, self.admin_port = host, port, admin_port
        #: what bounds the admin server's connections and requests (admin.py)
        self.admin_guards = admin_guards or AdminGuards()
        self.admin_gate: Optional[AdminGate] = None
        self.cluster = cluster
        self.config = config
        self.max_frame = protocol.max_frame_for(config.max_message_size)
        self.limiter = TopicListLimiter(config)
        #: frames being received, across connections (READ_AHEAD and up)
        self.inbound = AsyncSemaphore(config.inbound_bytes, max_queue_size=0,
                                      timeout=config.write_timeout_ms / 1000.0)
        #: the topic sets watchers keep, across connections
        self.watcher_memory = AsyncSemaphore(
            config.watchers_bytes, max_queue_size=config.heap_queue,
            timeout=config.heap_timeout_ms / 1000.0)
        self.fair = FairShare()
        #: watch creations holding heap memory at once: each holds it over
        #: several fair turns, so a storm of them would keep the heap pool
        #: full for every listing
        self.watch_inits = AsyncSemaphore(WATCH_INITS, max_queue_size=0, timeout=None)
        self.client_log = RateLimitedLog(log)
        #: what the guards did, for /admin/stats
        self.guards = {"refused_over_request_cap": 0, "write_timeouts": 0,
                       "inbound_closes": 0, "refused_names": 0,
                       "admin_connections_refused": 0, "admin_header_timeouts": 0,
                       "admin_body_timeouts": 0, "admin_bad_requests": 0}
        #: last actual heap size of a listing, by (namespace, mode)
        self.estimates: dict[tuple[str, int], int] = {}
        self.connections: set["ConnectionBase"] = set()
        self.counters = {"requests": 0, **{k: 0 for k in OUTCOMES}}
        self._server: Optional[asyncio.AbstractServer] = None
        self._handlers: set[asyncio.Task] = set()
        self._stopping = False
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
                                                  limit=READ_AHEAD)
        self.port = self._server.sockets[0].getsockname()[1]
        if self.admin_port is not None:
            await self._start_admin()
        return self

    async def stop(self):
        """Stop listening, close every connection and let each finish its
        teardown (requests in flight end as cancelled, permits go back).
        A connection accepted meanwhile is closed too; what has not ended
        after STOP_GRACE is cancelled."""
        self._stopping = True
        if self._server is not None:
            await _close_listener(self._server)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STOP_GRACE
        while self._handlers and loop.time() < deadline:
            for conn in list(self.connections):
                conn.abort()
            self.fair.drop_closed()
            await asyncio.wait(list(self._handlers),
                               timeout=min(0.2, max(0.0, deadline - loop.time())))
        left = list(self._handlers)
        for t in left:
            t.cancel()
        if left:
            await asyncio.wait(left, timeout=0.5)
        if self._server is not None:
            # From 3.12 this also waits for every connection to be closed,
            # which the aborts above have done.
            try:
                await asyncio.wait_for(self._server.wait_closed(), 0.5)
            except asyncio.TimeoutError:
                pass
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _accept(self, reader, writer):
        if self._stopping:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        self._handlers.add(task)
        conn = self.make_connection(reader, writer)
        self.connections.add(conn)
        try:
            await conn.run()
        except asyncio.CancelledError:
            # Only stop() cancels a handler, its teardown done (run() ends
            # in it).  Before 3.12 asyncio's streams report a cancelled
            # handler as an unhandled error on stderr, so it ends quietly.
            if sys.version_info >= (3, 12):
                raise
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

        guards = self.admin_guards
        gate = self.admin_gate = AdminGate(guards, self.guards, self.client_log)
        app = web.Application(client_max_size=guards.max_body,
                              middlewares=[make_middleware(gate, self.client_log)])
        app.router.add_get("/metrics", make_aiohttp_handler(self.registry))
        app.router.add_get("/admin/stats", self._h_stats)
        app.router.add_get("/admin/limits", self._h_get_limits)
        app.router.add_put("/admin/limits", self._h_put_limits)
        self.add_admin_routes(app)
        # lingering_time: how long a body the API did not read is read and
        # dropped after the answer before the connection closes (aiohttp's
        # default is 10 s).  Idle keep-alive connections are closed by the
        # gate's header deadline.  auto_decompress off: the API takes plain
        # JSON, and a compressed body (a few KB inflating to gigabytes) is
        # then just not JSON, a 400.
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5,
                                     lingering_time=min(2.0, guards.body_timeout),
                                     auto_decompress=False)
        await self._runner.setup()
        await make_site(self._runner, self.host, self.admin_port, gate).start()
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
                "in_flight": self.counters["requests"] - done,
                "inbound": _budget(self.inbound), "watcher_memory": _budget(self.watcher_memory),
                "guards": dict(self.guards)}

    async def _h_stats(self, request):
        from aiohttp import web

        return web.json_response(self.stats())

    async def _h_get_limits(self, request):
        from aiohttp import web

        return web.json_response(self.limiter.config.as_dict("limits"))

    async def _h_put_limits(self, request):
        try:
            self.limiter.set_limits(**await live_limits(request, self.admin_gate))
        except ConfigError as exc:
            raise BadRequest(str(exc)) from None    # 400, one log line (admin.py)
        return await self._h_get_limits(request)


async def live_limits(request, gate: AdminGate) -> dict:
    """The body of PUT /admin/limits, checked: a JSON object with heap_mb
    and/or direct_mb, each a size in MB.  ConfigError says what is wrong."""
    example = 'e.g. {"heap_mb": 64, "direct_mb": 0}'
    try:
        body = await read_json(request, gate)
    except BadRequest as exc:
        raise ConfigError(f"{exc}; {example}") from None
    if not isinstance(body, dict) or not body:
        raise ConfigError(f"expected a JSON object with heap_mb and/or direct_mb, "
                          f"not {describe(body)}; {example}")
    unknown = sorted(set(body) - set(LIVE_LIMITS))
    if unknown:
        raise ConfigError(f"only heap_mb and direct_mb change at run time, not "
                          f"{_cut_list(unknown)}")
    for k, v in body.items():
        if isinstance(v, (dict, list, str)):
            # check_value would quote it: it may be megabytes, or nested
            # too deeply to print.
            raise ConfigError(f"{k} must be a number, not {describe(v)}")
        check_value(TopicListConfig.setting_named(k), v)
    return {k: float(v) for k, v in body.items()}


def _cut_list(names: list) -> str:
    text = json.dumps(names[:5])
    return text if len(names) <= 5 else f"{text[:-1]}, ... ({len(names)} in all)]"


class _ExtraCollector:
    """Metrics beyond the seed's twelve: the peaks the load generator reads,
    the inbound and watchers' budgets, and what the guards did."""

    def __init__(self, service: ServiceBase):
        self.s = service

    def collect(self):
        """Peak permits per pool, the process's peak RSS, the two budgets
        and the guards' counters."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
        for name, sem, what in (("inbound", self.s.inbound, "frames being received"),
                                ("watchers", self.s.watcher_memory, "watchers' topic sets")):
            for k, v, text in (("used", sem.acquired_permits, "held by"),
                               ("limit", max(sem.max_permits, 0), "limit for")):
                g = GaugeMetricFamily(f"{p}{name}_memory_{k}_bytes",
                                      f"Memory {text} {what} (0: no limit)"
                                      if k == "limit" else f"Memory {text} {what}",
                                      labels=["cluster"])
                g.add_metric([self.s.cluster], v)
                yield g
        c = CounterMetricFamily(f"{p}guard_events", "What the guards against hostile "
                                "clients did, by kind", labels=["cluster", "kind"])
        for kind, n in self.s.guards.items():
            c.add_metric([self.s.cluster, kind], n)
        yield c


def _budget(sem: AsyncSemaphore) -> dict:
    return {"used": sem.acquired_permits, "limit": max(sem.max_permits, 0),
            "queue": sem.queue_size}


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



#: dispatch() results: go on reading, or close the connection.
CLOSE = "close"


class ConnectionBase(Owner):
    """Read loop, keep-alive, guards and write path of one client connection."""

    def __init__(self, service: ServiceBase, reader, writer):
        super().__init__()
        self.service = service
        self.config = service.config
        self.limiter = service.limiter
        self.reader, self.writer = reader, writer
        self.connected = False
        self.tasks: set[asyncio.Task] = set()
        #: topic-list requests accepted and not yet answered
        self.in_flight = 0
        self._out = asyncio.Lock()
        self._closed = False
        self._last_read = time.monotonic()
        self._awaiting_pong = False
        self._keepalive: Optional[asyncio.TimerHandle] = None
        transport = writer.transport
        # drain() returns only once the bytes left the user-space buffer.
        transport.set_write_buffer_limits(high=0)
        # One socket read is at most READ_AHEAD (asyncio's default is 256
        # KiB): bytes read ahead of the current frame are outside the
        # inbound budget, so keep them small.  Only selector transports
        # have this knob; elsewhere the default stays.
        if isinstance(getattr(transport, "max_size", None), int):
            transport.max_size = READ_AHEAD

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
                self.service.client_log(logging.ERROR, "handler", "handler failed: %r", exc,
                                        exc_info=exc)

    def step(self, fn, *args):
        """Awaitable: run the synchronous step fn(*args) in this
        connection's fair turn (see fair.py)."""
        return self.service.fair.run(self, fn, *args)

    # ---- keep-alive (Pulsar's keepAliveIntervalSeconds) --------------------------

    def stop_keepalive(self):
        """No more pings (the connection closes, or is piped elsewhere)."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    def _schedule_keepalive(self):
        interval = self.config.keep_alive_s
        if interval > 0 and not self.is_closed():
            self._keepalive = asyncio.get_running_loop().call_later(interval, self._keepalive_tick)

    def _keepalive_tick(self):
        """Every interval: a connection that sent nothing since the last
        tick is pinged; one that has not answered that ping by the next
        tick is closed, as Pulsar's broker does; so is one that has not
        completed its handshake by the first tick.  (A client that sends
        but never reads is closed by the write deadline instead.)"""
        if not self.connected:
            log.info("closing connection: no CONNECT within the keep-alive interval")
            self.abort()
            return
        idle = time.monotonic() - self._last_read >= self.config.keep_alive_s * 0.99
        if idle and self._awaiting_pong:
            log.info("closing connection: no answer to keep-alive ping")
            self.abort()
            return
        if idle:
            self._awaiting_pong = True
            self.spawn(self._ping())
        self._schedule_keepalive()

    async def _ping(self):
        try:
            await self.reply(protocol.cmd(CommandType.PING, "ping"))
        except (ConnectionError, OSError):
            pass

    # ---- the read loop -------------------------------------------------------------

    async def run(self):
        """Read and dispatch commands until the client goes, then tear down."""
        self._schedule_keepalive()
        handled = 0
        batch_start = time.perf_counter()
        try:
            while True:
                try:
                    command, size, permit = await self._read()
                except protocol.ProtocolError as exc:
                    self.service.client_log(logging.INFO, "protocol",
                                            "closing connection: %s", exc)
                    break
                if command is None:
                    break
                try:
                    outcome = await self._handle(command, size)
                finally:
                    del command           # a large frame's strings go now
                    if permit is not None:
                        self.service.inbound.release(permit)
                if outcome is CLOSE:
                    break
                if outcome is False:
                    return  # the connection was handed off (proxy pipe)
                handled += 1
                if handled % READ_BATCH == 0:
                    # Pipelined commands are all in the buffer: without this
                    # one connection would run them all in one iteration.
                    # Its next batch waits for a fair turn, charged with
                    # what this one took: wall time, awaits included, so
                    # capped, lest a wait for a slow reader's drain count
                    # as CPU and push the connection back for long.
                    self.cpu_used += min(time.perf_counter() - batch_start, MAX_BATCH_CHARGE)
                    await self.service.fair.pace(self)
                    batch_start = time.perf_counter()
        except (ConnectionError, OSError) as exc:
            _forget_traceback(exc)
        finally:
            await self._teardown()

    async def _read(self):
        """(command, frame size, inbound permit or None); (None, 0, None) at
        the end of the stream.  A frame over READ_AHEAD is read only once
        the inbound budget holds twice its size (the stream's buffer and
        the frame cut from it coexist for a moment)."""
        total = await protocol.read_frame_header(self.reader, self.service.max_frame)
        if total is None:
            return None, 0, None
        permit = None
        if total > READ_AHEAD:
            permit = await self._inbound_permit(total)
        try:
            command, size = await protocol.read_frame_body(self.reader, total)
        except BaseException:
            if permit is not None:
                self.service.inbound.release(permit)
            raise
        return command, size, permit

    async def _inbound_permit(self, total: int):
        sem = self.service.inbound
        need = 2 * total
        if sem.max_permits > 0:
            need = min(need, sem.max_permits)
        try:
            return await sem.acquire(need, is_cancelled=self.is_closed)
        except (PermitAcquireTimeoutError, PermitAcquireQueueFullError):
            self.service.guards["inbound_closes"] += 1
            raise protocol.ProtocolError(
                f"no inbound buffer memory for a {total + 4}-byte frame within "
                f"{self.config.write_timeout_ms} ms") from None
        except PermitAcquireError as exc:
            raise ConnectionResetError(f"closed while waiting for inbound memory: {exc}") \
                from None

    async def _handle(self, command, size):
        """One command: checks common to every role, then dispatch()."""
        self._last_read, self._awaiting_pong = time.monotonic(), False
        if not self.connected and command.type != CommandType.CONNECT:
            await self.reply(protocol.error(protocol.request_id_of(command),
                                            ServerError.NotAllowedError,
                                            "expected CONNECT as the first command"))
            return CLOSE
        if not protocol.has_body(command):
            await self.reply(protocol.error(0, ServerError.NotAllowedError,
                                            f"command {CommandType.Name(command.type)} "
                                            "has no body"))
            return None
        try:
            return await self.dispatch(command, size)
        except protocol.RequestError as exc:
            # Refused before any work (a bad name, a cap): answered at once.
            if command.type in TOPIC_LIST_REQUESTS:
                counters = self.service.counters
                counters["requests"] += 1
                counters["too_many_requests" if exc.code == ServerError.TooManyRequests
                         else "errors"] += 1
            await self.reply(protocol.error(protocol.request_id_of(command), exc.code,
                                            exc.server_message))
            return None

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
        """Answer one command: None to go on, CLOSE to close, False when
        the connection was handed off; RequestError answers the command's
        request id."""
        raise NotImplementedError

    # ---- what clients send ------------------------------------------------------------

    def name(self, value, what: str) -> str:
        """A name a client sent (topic, namespace, subscription...), checked
        before anything keeps or quotes it: text (protobuf hands over the
        bytes of a string field that is not UTF-8) no longer than
        name_max_length.  RequestError(InvalidTopicName) otherwise."""
        limit = self.config.name_max_length
        if not isinstance(value, str):
            self.service.guards["refused_names"] += 1
            raise protocol.RequestError(ServerError.InvalidTopicName,
                                        f"{what} is not valid UTF-8")
        if len(value) > limit:
            self.service.guards["refused_names"] += 1
            raise protocol.RequestError(ServerError.InvalidTopicName,
                                        f"{what} longer than maximum: {limit}")
        return value

    def start_request(self, request_id: int, work) -> None:
        """Run a topic-list request as a task, unless the connection already
        has requests_per_connection in flight: then RequestError
        (TooManyRequests), answered at once, holding nothing."""
        cap = self.config.requests_per_connection
        if self.in_flight >= cap:
            self.service.guards["refused_over_request_cap"] += 1
            raise protocol.RequestError(
                ServerError.TooManyRequests,
                f"Failed due to too many topic list requests in flight on this "
                f"connection (max {cap})")
        self.in_flight += 1
        self.spawn(self.guarded(request_id, work))

    # ---- writing ----------------------------------------------------------------------

    async def reply(self, command) -> None:
        """A control frame (CONNECTED, PONG, SUCCESS, ERROR, LOOKUP...): not
        memory-limited, as in Pulsar, but written in turn with every other
        frame and drained before the next, so a client that does not read
        makes the server hold one such frame at most, and its read loop,
        which awaits this, stops reading it."""
        await self.write_frame([protocol.encode(command)])

    async def write_frame(self, box: list) -> None:
        """Write the frame in `box` (taken out of it, so that it is freed
        once the transport has sent it) after every frame before it, and
        wait until the transport has handed it to the kernel; raises
        ConnectionResetError if the client has gone or does not read."""
        async with self._out:
            if self.is_closed():
                raise ConnectionResetError("client went away")
            self.writer.write(box.pop())
            await self._drained()

    async def _drained(self):
        transport = self.writer.transport
        if transport.get_write_buffer_size() == 0 and not transport.is_closing():
            return
        timeout = self.config.write_timeout_ms / 1000.0
        try:
            await asyncio.wait_for(self.writer.drain(), timeout)
        except asyncio.TimeoutError:
            self.service.guards["write_timeouts"] += 1
            self.service.client_log(logging.INFO, "write-timeout",
                                    "closing connection: output not drained within %d ms",
                                    self.config.write_timeout_ms)
            self.abort()
            raise ConnectionResetError("output not drained within the write timeout") from None

    async def unsupported(self, command):
        """ERROR for a command this service does not serve, with its request id."""
        await self.reply(protocol.error(protocol.request_id_of(command),
                                        ServerError.NotAllowedError,
                                        f"command {CommandType.Name(command.type)} is not "
                                        f"supported by this topic-list {self.service.role}"))

    async def write_limited(self, box: list, dual, heap=None) -> None:
        """PIP-442's acquireMaxTopicListInFlightPermitsAndWriteAndFlush for
        the command in `box` (taken out of it: this holds its only
        reference): direct permit of the frame size, serialize (in a fair
        turn), release `heap` (the list now lives in the frame), write, wait
        for the flush, release (also on every error).  Raises LimitFailed.

        Passing `heap` is the broker's flow (its heap permit covers the
        list until it is serialized).  The proxy passes none: it holds its
        heap permit across this call and releases it after, with the direct
        one, as PIP-442's proxy flow does."""
        command = box.pop()
        direct = await self.limiter.acquire(DIRECT, protocol.frame_size(command), dual,
                                            self.is_closed)
        try:
            data = [await self.step(protocol.encode, command)]
            del command
            if heap is not None:
                dual.release(heap)
            await self.write_frame(data)
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
        """Run a request started by start_request; answer whatever it
        raises with an error frame carrying request_id (unless the client
        has gone) and count how it ended under exactly one of OUTCOMES."""
        counters = self.service.counters
        counters["requests"] += 1
        outcome = "cancelled"
        try:
            await work()
            outcome = "responses"
        except BaseException as exc:
            try:
                if isinstance(exc, Exception):
                    outcome = await self._failed(request_id, exc)
            finally:
                # The failed request's frames (this connection, the
                # limiter's waiter) must not stay reachable from the
                # exception, which the task or the limiter may keep: that
                # cycle would hold the connection until the garbage
                # collector runs.
                _forget_traceback(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            counters[outcome] += 1
            self.in_flight -= 1

    async def _failed(self, request_id: int, exc: Exception) -> str:
        """Answer a request that raised exc; return its outcome."""
        if isinstance(exc, LimitFailed):
            return await self._answer(request_id, ServerError.TooManyRequests, str(exc),
                                      "too_many_requests")
        if isinstance(exc, (PermitAcquireCancelledError, PermitAcquireAlreadyClosedError)):
            return "cancelled"   # the client left: nobody to answer
        if isinstance(exc, protocol.RequestError):
            return await self._answer(request_id, exc.code, exc.server_message, "errors")
        if isinstance(exc, (ConnectionError, OSError, asyncio.TimeoutError)):
            return await self._answer(request_id, ServerError.ServiceNotReady,
                                      f"upstream failure: {exc!r}", "errors")
        self.service.client_log(logging.ERROR, "request-failed", "request %d failed: %r",
                                request_id, exc, exc_info=exc)
        return await self._answer(request_id, ServerError.UnknownError,
                                  f"{type(exc).__name__}: {exc}", "errors")

    async def _answer(self, request_id: int, code: int, message: str, outcome: str) -> str:
        if self.is_closed():
            return "cancelled"
        try:
            await self.reply(protocol.error(request_id, code, message))
        except (ConnectionError, OSError):
            return "cancelled"
        return outcome
