"""The admin/metrics HTTP server of a topic-list broker or proxy (aiohttp on
loopback), guarded like the binary port against clients that stall or send
what it cannot use (issue 32, G3 and G8).

* Connections: at most AdminGuards.max_connections open at once (by default
  256, and never more than a quarter of the process's file-descriptor
  limit).  One more is answered 503 and closed as soon as it is accepted,
  so a flood of admin connections cannot take the descriptors the binary
  port needs to accept its clients.
* Deadlines: a request's head (request line and headers) must be complete
  within header_timeout of the connection opening or of the previous
  request ending (which also closes idle keep-alive connections), and a
  body the API reads within body_timeout (408).  A stalled request is
  closed, not kept for ever.  aiohttp has no header deadline of its own in
  every version we support (3.14 arms its keep-alive timer at connect, 3.9
  does not), so the deadline is kept here, around aiohttp's protocol.
* Bodies: JSON is read by read_json, whatever it holds: not JSON, not UTF-8,
  compressed (bodies are not decompressed: no decompression bomb), too
  large (413, aiohttp's client_max_size) or nested too deeply for the parser
  (RecursionError) is a 400 with a message and one rate-limited log line,
  never a 500 with a traceback.  A handler's unforeseen error is a 500
  with one rate-limited log line.

aiohttp is imported by the functions that need it, as the rest of the
service does, so that importing this module needs nothing beyond pylimiter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import dataclass
from typing import Any, Callable, Optional

#: Connections the admin server keeps open at once, at most.
MAX_ADMIN_CONNECTIONS = 256
#: The share of the file-descriptor limit the admin server may hold.
FD_SHARE = 4
#: What an admin connection over the cap is told before it is closed.
_BUSY_BODY = b'{"error": "too many admin connections; try again later"}'
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


@dataclass(frozen=True)
class AdminGuards:
    """How the admin server bounds what one client can make it hold.

    max_connections: connections open at once (None: MAX_ADMIN_CONNECTIONS,
    or a quarter of RLIMIT_NOFILE if that is lower); header_timeout: seconds
    for a request's head, from the connection or the previous request;
    body_timeout: seconds to read a body the API uses; max_body: bytes of a
    body (413 above)."""

    max_connections: Optional[int] = None
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    max_body: int = 1024 * 1024

    def __post_init__(self):
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError("pylimiter: max_connections must be at least 1")
        for name in ("header_timeout", "body_timeout"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and 0 < v < float("inf")):
                raise ValueError(f"pylimiter: {name} must be a positive number of seconds")
        if self.max_body < 1:
            raise ValueError("pylimiter: max_body must be at least 1 byte")

    def connection_cap(self) -> int:
        """max_connections, or the default for this process's fd limit."""
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or soft <= 0:
            return MAX_ADMIN_CONNECTIONS
        return max(1, min(MAX_ADMIN_CONNECTIONS, soft // FD_SHARE))


class BadRequest(ValueError):
    """A request the admin API cannot use: answered 400 with this message."""


class _Connection:
    """One accepted admin connection: aiohttp's protocol inside, the
    header deadline outside.  Implements asyncio.Protocol by delegation."""

    __slots__ = ("gate", "inner", "transport", "timer", "busy")

    def __init__(self, gate: "AdminGate"):
        self.gate = gate
        self.inner = None
        self.transport = None
        self.timer: Optional[asyncio.TimerHandle] = None
        #: requests of this connection inside the API (pipelined: one at a time)
        self.busy = 0

    def connection_made(self, transport):
        gate = self.gate
        if len(gate.open) >= gate.cap:
            gate.counts["admin_connections_refused"] += 1
            gate.log(logging.WARNING, "admin-cap", "admin connection refused: %d are "
                     "open, the cap", gate.cap)
            transport.write(_BUSY)
            transport.close()
            return
        self.transport = transport
        gate.open[transport] = self
        self.inner = gate.make_protocol()
        self.arm()
        self.inner.connection_made(transport)

    def data_received(self, data):
        if self.inner is not None:
            self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.inner is not None else False

    def pause_writing(self):
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self):
        if self.inner is not None:
            self.inner.resume_writing()

    def connection_lost(self, exc):
        self.disarm()
        self.gate.open.pop(self.transport, None)
        inner, self.inner = self.inner, None
        if inner is not None:
            inner.connection_lost(exc)

    def arm(self):
        """Start the header deadline (no request is inside the API)."""
        self.disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.gate.guards.header_timeout, self._expired)

    def disarm(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self):
        self.timer = None
        if self.busy == 0 and self.transport is not None and not self.transport.is_closing():
            self.gate.counts["admin_header_timeouts"] += 1
            self.gate.log(logging.INFO, "admin-header-timeout", "admin connection closed: "
                          "no complete request within %g s", self.gate.guards.header_timeout)
            self.transport.abort()


class AdminGate:
    """The admin server's connections: the cap, the deadlines and what they
    did (counts, merged into the service's guard events)."""

    def __init__(self, guards: AdminGuards, counts: dict,
                 log: Optional[Callable[..., Any]] = None):
        self.guards = guards
        #: log(level, key, msg, *args): rate-limited (server.RateLimitedLog)
        self.log = log or (lambda *a, **k: None)
        self.cap = guards.connection_cap()
        #: aiohttp's protocol factory (the runner's server), set by make_site
        self.make_protocol: Optional[Callable[[], Any]] = None
        self.open: dict = {}
        self.counts = counts
        for k in ("admin_connections_refused", "admin_header_timeouts",
                  "admin_body_timeouts", "admin_bad_requests"):
            counts.setdefault(k, 0)

    def protocol(self) -> _Connection:
        """The protocol factory for the listening socket."""
        return _Connection(self)

    def request_started(self, transport) -> None:
        """A request's head is in (the API is handling it): no deadline
        until it ends, other than the body's."""
        conn = self.open.get(transport)
        if conn is not None:
            conn.busy += 1
            conn.disarm()

    def request_ended(self, transport) -> None:
        """The API is done with a request: the next head has header_timeout."""
        conn = self.open.get(transport)
        if conn is not None:
            conn.busy -= 1
            if conn.busy == 0:
                conn.arm()


async def read_json(request, gate: AdminGate) -> Any:
    """The request's body as JSON: read within body_timeout (else 408, and
    the connection closes) and parsed; BadRequest if it is not UTF-8 JSON or is
    nested deeper than the parser goes."""
    from aiohttp import web

    try:
        raw = await asyncio.wait_for(request.read(), gate.guards.body_timeout)
    except asyncio.TimeoutError:
        # 408; aiohttp then closes the connection, its body unfinished
        # (after lingering_time at most, see ServiceBase._start_admin).
        gate.counts["admin_body_timeouts"] += 1
        gate.log(logging.INFO, "admin-body-timeout", "admin %s: 408, no body within %g s",
                 _route(request), gate.guards.body_timeout)
        raise web.HTTPRequestTimeout(
            text=json.dumps({"error": f"the body did not arrive within "
                                      f"{gate.guards.body_timeout:g} s"}),
            content_type="application/json") from None
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadRequest("the body is nested too deeply to read as JSON") from None
    except ValueError as exc:       # UnicodeDecodeError too
        raise BadRequest(f"the body is not JSON ({_cut(str(exc))})") from None


def describe(value: Any) -> str:
    """A JSON value in a few words, for a message: never its whole text
    (which may be megabytes, or nested too deeply to print)."""
    if isinstance(value, dict):
        return "a JSON object"
    if isinstance(value, list):
        return "a JSON array"
    if isinstance(value, str):
        return json.dumps(value) if len(value) <= 40 else "a string"
    return _cut(json.dumps(value))


def _cut(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


def make_middleware(gate: AdminGate, client_log: Callable[..., bool]):
    """The API's middleware: marks each request inside the API (the header
    deadline pauses), answers BadRequest with 400 and one rate-limited log
    line, and an unforeseen error with 500 and one rate-limited log line."""
    from aiohttp import web

    @web.middleware
    async def guarded(request, handler):
        transport = request.transport
        gate.request_started(transport)
        try:
            return await handler(request)
        except BadRequest as exc:
            gate.counts["admin_bad_requests"] += 1
            route = _route(request)
            client_log(logging.INFO, f"admin-400 {route}", "admin %s: 400, %s", route, exc)
            return web.json_response({"error": str(exc)}, status=400)
        except web.HTTPException:
            raise
        except Exception as exc:
            route = _route(request)
            client_log(logging.ERROR, f"admin-500 {route}", "admin %s failed: %r", route, exc,
                       exc_info=exc)
            return web.json_response({"error": f"internal error: {type(exc).__name__}"},
                                     status=500)
        finally:
            gate.request_ended(transport)

    return guarded


def _route(request) -> str:
    """METHOD and the route's pattern (not the client's path, which is
    not bounded): a log key from a fixed set."""
    try:
        canonical = request.match_info.route.resource.canonical
    except AttributeError:
        canonical = "?"
    return f"{request.method} {canonical}"


def make_site(runner, host: str, port: int, gate: AdminGate):
    """An aiohttp site (for `runner`, set up) listening on host:port with
    `gate` between the listener and aiohttp's protocol."""
    from aiohttp import web

    class GatedSite(web.BaseSite):
        """TCPSite's listener with the AdminGate between it and aiohttp."""

        @property
        def name(self) -> str:
            return f"http://{host}:{port}"

        async def start(self) -> None:
            await super().start()
            gate.make_protocol = self._runner.server
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(gate.protocol, host, port,
                                                    backlog=self._backlog)

    return GatedSite(runner)
