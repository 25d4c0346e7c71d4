"""The proxy: a client-facing Pulsar endpoint in front of one broker.

Lookups and partition metadata are forwarded to the broker and answered
with proxy_through_service_url set, so clients open their topic connections
through the proxy too (CONNECT with proxy_to_broker_url), which the proxy
then pipes byte for byte to the broker, as Pulsar's proxy does.
GET_TOPICS_OF_NAMESPACE is forwarded and its response decoded and
re-encoded under PIP-442's proxy limits: a heap permit (estimate, then the
broker's response frame size) for the decoded list and a direct permit for
the re-encoded write, both held until the write to the client completes and
released together after it (the broker, by contrast, gives its heap permit
back once the list is serialized).  Topic-list watchers are not offered
through the proxy (the CONNECTED feature flag says so; clients fall back to
periodic re-discovery).

The frame cap (maxMessageSize) guards what clients send; responses from the
broker may be larger (a 100,000-topic namespace is several MB) and are
bounded by the memory permits instead (issue 19, finding 4): the first
listing of a (namespace, mode) goes alone, so that its size is known before
others are forwarded, and after it each forwarded listing holds a heap permit
of the last response's size, so the responses the broker can have in flight
to the proxy fit the heap pool.  At most requests_per_connection listings go
to the broker at once over the shared connection (the broker caps each
connection so).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

from . import protocol
from .protocol import CommandType, ServerError
from .server import ConnectionBase, ServiceBase, log


class Proxy(ServiceBase):
    """A client-facing endpoint in front of one broker, with its own limits."""

    role = "proxy"
    advertise_watchers = False

    def __init__(self, config, *, broker_url: str, **kw):
        super().__init__(config, **kw)
        protocol.parse_url(broker_url)
        self.broker_url = broker_url
        self._backend: Optional[protocol.ClientConnection] = None
        self._backend_lock = asyncio.Lock()
        #: listings forwarded and unanswered, within the broker's cap
        self.forward_slots = asyncio.Semaphore(config.requests_per_connection)
        #: (namespace, mode) -> set while its first listing learns its size
        self.learning: dict[tuple[str, int], asyncio.Event] = {}

    def make_connection(self, reader, writer):
        """A ProxyConnection for an accepted client."""
        return ProxyConnection(self, reader, writer)

    async def backend(self) -> protocol.ClientConnection:
        """The shared connection to the broker, reopened when it drops."""
        async with self._backend_lock:
            if self._backend is None or self._backend.closed.is_set():
                # The broker is trusted: its frames are not capped by
                # maxMessageSize (see the module doc).
                self._backend = await protocol.ClientConnection.open(
                    self.broker_url, max_frame=protocol.ANY_FRAME)
            return self._backend

    async def stop(self):
        """Stop serving, then close the connection to the broker."""
        await super().stop()
        if self._backend is not None:
            await self._backend.close()


class ProxyConnection(ConnectionBase):
    """One client of the proxy: forwarded requests, or a pipe to the broker."""

    service: Proxy

    def __init__(self, service, reader, writer):
        super().__init__(service, reader, writer)
        #: lookups and partition-metadata requests forwarded, unanswered
        self.lookups = 0

    async def dispatch(self, command, size):
        """Answer one command; forwarded requests run as tasks."""
        kind = command.type
        if kind == CommandType.CONNECT:
            target = command.connect.proxy_to_broker_url
            if target:
                return await self.pipe_to_broker(command, target)
            self.connected = True
            await self.reply(protocol.connected(False, self.config.max_message_size))
        elif kind == CommandType.PING:
            await self.reply(protocol.cmd(CommandType.PONG, "pong"))
        elif kind == CommandType.PONG:
            pass
        elif kind == CommandType.LOOKUP:
            self.name(command.lookupTopic.topic, "topic name")
            self._start_lookup(command.lookupTopic.request_id, self.forward_lookup(command))
        elif kind == CommandType.PARTITIONED_METADATA:
            self.name(command.partitionMetadata.topic, "topic name")
            self._start_lookup(command.partitionMetadata.request_id,
                               self.forward_metadata(command))
        elif kind == CommandType.GET_TOPICS_OF_NAMESPACE:
            upstream = self._upstream_listing(command.getTopicsOfNamespace)
            rid = command.getTopicsOfNamespace.request_id
            self.start_request(rid, lambda: self.get_topics(rid, upstream))
        elif kind == CommandType.WATCH_TOPIC_LIST:
            await self.reply(protocol.error(command.watchTopicList.request_id,
                                            ServerError.NotAllowedError,
                                            "topic list watchers are not supported through "
                                            "the proxy"))
        else:
            await self.unsupported(command)

    def _start_lookup(self, request_id: int, coro) -> None:
        """Forward as a task, unless lookups_per_connection are in flight:
        then TooManyRequests at once."""
        cap = self.config.lookups_per_connection
        if self.lookups >= cap:
            coro.close()
            self.service.guards["refused_over_request_cap"] += 1
            raise protocol.RequestError(ServerError.TooManyRequests,
                                        f"Failed due to too many pending lookup requests on "
                                        f"this connection (max {cap})")
        self.lookups += 1
        # The lookup is the task's own coroutine, counted down when the task
        # ends: a wrapper coroutine cancelled before its first step (the
        # connection closing) would never await, nor close, the lookup.
        self.spawn(coro).add_done_callback(self._lookup_done)

    def _lookup_done(self, _task) -> None:
        self.lookups -= 1

    def _upstream_listing(self, body):
        """The listing to forward, rebuilt from checked fields (not a copy
        of the client's frame, which may carry unknown fields)."""
        up = protocol.cmd(CommandType.GET_TOPICS_OF_NAMESPACE, "getTopicsOfNamespace",
                          request_id=0, namespace=self.name(body.namespace, "namespace"),
                          mode=body.mode)
        if body.HasField("topics_pattern"):
            pattern = body.topics_pattern
            if not isinstance(pattern, str):
                self.service.client_log(logging.INFO, "pattern-utf8",
                                        "refused a topics pattern that is not valid UTF-8")
                raise protocol.RequestError(ServerError.InvalidTopicName,
                                            "Invalid topics pattern: the pattern is not "
                                            "valid UTF-8")
            if len(pattern) <= self.config.name_max_length:
                # Longer ones the broker would not evaluate either: the
                # list goes back unfiltered and the client filters it.
                up.getTopicsOfNamespace.topics_pattern = pattern
        if body.HasField("topics_hash") and isinstance(body.topics_hash, str) \
                and len(body.topics_hash) <= protocol.MAX_HASH_LENGTH:
            up.getTopicsOfNamespace.topics_hash = body.topics_hash
        return up

    async def _forward(self, command, field: str, client_rid: int):
        """Send command to the broker under a backend request id; return the
        broker's answer re-addressed to the client's request id."""
        backend = await self.service.backend()
        rid = next(backend.ids)
        getattr(command, field).request_id = rid
        try:
            resp, size = await backend.request(command, rid)
        except protocol.RequestError as exc:
            return protocol.error(client_rid, exc.code, exc.server_message), 0
        for f in ("lookupTopicResponse", "partitionMetadataResponse",
                  "getTopicsOfNamespaceResponse"):
            if resp.HasField(f):
                getattr(resp, f).request_id = client_rid
        return resp, size

    async def forward_lookup(self, command):
        """LOOKUP through the broker, answered with proxy_through_service_url."""
        rid = command.lookupTopic.request_id
        try:
            resp, _ = await self._forward(command, "lookupTopic", rid)
        except (ConnectionError, OSError, protocol.ProtocolError) as exc:
            resp = protocol.cmd(CommandType.LOOKUP_RESPONSE, "lookupTopicResponse",
                                request_id=rid, response=2, error=ServerError.ServiceNotReady,
                                message=f"broker unreachable: {exc}")
        if resp.type == CommandType.LOOKUP_RESPONSE:
            resp.lookupTopicResponse.proxy_through_service_url = True
        await self.reply(resp)

    async def forward_metadata(self, command):
        """PARTITIONED_METADATA through the broker."""
        rid = command.partitionMetadata.request_id
        try:
            resp, _ = await self._forward(command, "partitionMetadata", rid)
        except (ConnectionError, OSError, protocol.ProtocolError) as exc:
            resp = protocol.cmd(CommandType.PARTITIONED_METADATA_RESPONSE,
                                "partitionMetadataResponse", request_id=rid, response=1,
                                error=ServerError.ServiceNotReady,
                                message=f"broker unreachable: {exc}")
        await self.reply(resp)

    async def _learned(self, key) -> Optional[asyncio.Event]:
        """Wait while another request learns the response size of `key`;
        return the event to set if this request is the one to learn it."""
        svc = self.service
        while key not in svc.estimates:
            gate = svc.learning.get(key)
            if gate is None:
                gate = svc.learning[key] = asyncio.Event()
                return gate
            await gate.wait()
        return None

    async def get_topics(self, client_rid: int, upstream):
        """Forward a listing under the proxy's own limits: a heap permit of
        the estimate for (namespace, mode), resized to the broker's response
        frame, and a direct permit for the write; both held until the write
        has completed (the transport handed the frame to the kernel, or the
        connection failed), then released together."""
        svc = self.service
        body = upstream.getTopicsOfNamespace
        key = (body.namespace, body.mode)
        gate = await self._learned(key)
        try:
            dual = self.limiter.dual
            heap = await self.limited_heap(key, dual)
            try:
                async with svc.forward_slots:
                    resp, frame = await self._forward(upstream, "getTopicsOfNamespace",
                                                      client_rid)
                if resp.type == CommandType.ERROR:
                    raise protocol.RequestError(resp.error.error, resp.error.message)
                # The decoded list is now in our heap: account for it by the
                # size of the frame it came in (PIP-442's cmdSize).
                svc.estimates[key] = frame
                await self.heap_update(dual, heap, frame)
                box = [resp]
                del resp
                # PIP-442's proxy flow: heap and direct are released together
                # once the write to the client completes.  Unlike the broker,
                # the proxy does not hand its heap permit to write_limited
                # (which gives it back before the write): a client that
                # reads slowly would then hold direct memory only, and the
                # heap pool would no longer bound the answers in flight.
                await self.write_limited(box, dual)
            finally:
                dual.release(heap)
        finally:
            if gate is not None:
                del svc.learning[key]
                gate.set()

    async def pipe_to_broker(self, connect_cmd, target: str):
        # Clients send host:port here (Pulsar's clients do), some a URL.
        """Hand the connection to the broker byte for byte (CONNECT with
        proxy_to_broker_url); only this proxy's broker is allowed."""
        want = protocol.parse_url(self.service.broker_url)
        try:
            got = protocol.parse_url(target if "://" in target else f"pulsar://{target}")
        except ValueError:
            got = None
        if got != want:
            # An open relay to anywhere would be a security hole.
            await self.reply(protocol.error(0, ServerError.AuthorizationError,
                                            f"proxy_to_broker_url {target} is not this "
                                            "proxy's broker"))
            return None
        try:
            br, bw = await asyncio.open_connection(*want)
        except (OSError, ValueError) as exc:
            await self.reply(protocol.error(0, ServerError.ServiceNotReady,
                                            f"broker unreachable: {exc}"))
            return None
        connect_cmd.connect.ClearField("proxy_to_broker_url")
        bw.write(protocol.encode(connect_cmd))
        # From here the bytes are the client's and the broker's: the broker
        # keeps this connection alive, a proxy PING would corrupt the stream.
        self.stop_keepalive()
        self.writer.transport.set_write_buffer_limits()  # plain pipe from here on

        async def pump(src, dst):
            try:
                while True:
                    data = await src.read(65536)
                    if not data:
                        break
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        log.debug("piping a client to %s", target)
        await asyncio.gather(pump(self.reader, bw), pump(br, self.writer))
        return False
