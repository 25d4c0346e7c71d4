"""The proxy: a client-facing Pulsar endpoint in front of one broker.

Lookups and partition metadata are forwarded to the broker and answered
with proxy_through_service_url set, so clients open their topic connections
through the proxy too (CONNECT with proxy_to_broker_url), which the proxy
then pipes byte for byte to the broker, as Pulsar's proxy does.
GET_TOPICS_OF_NAMESPACE is forwarded and its response decoded and
re-encoded under PIP-442's proxy limits: a heap permit (estimate, then the
broker's response frame size) while it holds the decoded list, and a direct
permit for the re-encoded write.  Topic-list watchers are not offered
through the proxy (the CONNECTED feature flag says so; clients fall back to
periodic re-discovery).
"""

from __future__ import annotations

import asyncio
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

    def make_connection(self, reader, writer):
        """A ProxyConnection for an accepted client."""
        return ProxyConnection(self, reader, writer)

    async def backend(self) -> protocol.ClientConnection:
        """The shared connection to the broker, reopened when it drops."""
        async with self._backend_lock:
            if self._backend is None or self._backend.closed.is_set():
                self._backend = await protocol.ClientConnection.open(self.broker_url)
            return self._backend

    async def stop(self):
        """Stop serving, then close the connection to the broker."""
        await super().stop()
        if self._backend is not None:
            await self._backend.close()


class ProxyConnection(ConnectionBase):
    """One client of the proxy: forwarded requests, or a pipe to the broker."""

    service: Proxy

    async def dispatch(self, command, size):
        """Answer one command; forwarded requests run as tasks."""
        kind = command.type
        if kind == CommandType.CONNECT:
            target = command.connect.proxy_to_broker_url
            if target:
                return await self.pipe_to_broker(command, target)
            self.connected = True
            self.send(protocol.connected(False, self.service.config.max_message_size))
        elif kind == CommandType.PING:
            self.send(protocol.cmd(CommandType.PONG, "pong"))
        elif kind == CommandType.PONG:
            pass
        elif kind == CommandType.LOOKUP:
            self.spawn(self.forward_lookup(command))
        elif kind == CommandType.PARTITIONED_METADATA:
            self.spawn(self.forward_metadata(command))
        elif kind == CommandType.GET_TOPICS_OF_NAMESPACE:
            get_topics = command.getTopicsOfNamespace
            self.spawn(self.guarded(get_topics.request_id, lambda: self.get_topics(get_topics)))
        elif kind == CommandType.WATCH_TOPIC_LIST:
            self.send(protocol.error(command.watchTopicList.request_id,
                                     ServerError.NotAllowedError,
                                     "topic list watchers are not supported through the proxy"))
        else:
            self.unsupported(command)

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
            self.send(protocol.cmd(CommandType.LOOKUP_RESPONSE, "lookupTopicResponse",
                                   request_id=rid, response=2, error=ServerError.ServiceNotReady,
                                   message=f"broker unreachable: {exc}"))
            return
        if resp.type == CommandType.LOOKUP_RESPONSE:
            resp.lookupTopicResponse.proxy_through_service_url = True
        self.send(resp)

    async def forward_metadata(self, command):
        """PARTITIONED_METADATA through the broker."""
        rid = command.partitionMetadata.request_id
        try:
            resp, _ = await self._forward(command, "partitionMetadata", rid)
        except (ConnectionError, OSError, protocol.ProtocolError) as exc:
            self.send(protocol.cmd(CommandType.PARTITIONED_METADATA_RESPONSE,
                                   "partitionMetadataResponse", request_id=rid, response=1,
                                   error=ServerError.ServiceNotReady,
                                   message=f"broker unreachable: {exc}"))
            return
        self.send(resp)

    async def get_topics(self, request):
        """Forward a listing under the proxy's own limits: a heap permit of
        the estimate for (namespace, mode), resized to the broker's response
        frame, and a direct permit for the write."""
        svc = self.service
        key = (request.namespace, request.mode)
        dual = self.limiter.dual
        heap = await self.limited_heap(key, dual)
        try:
            upstream = protocol.BaseCommand(type=CommandType.GET_TOPICS_OF_NAMESPACE)
            upstream.getTopicsOfNamespace.CopyFrom(request)
            resp, frame = await self._forward(upstream, "getTopicsOfNamespace",
                                              request.request_id)
            if resp.type == CommandType.ERROR:
                raise protocol.RequestError(resp.error.error, resp.error.message)
            # The decoded list is now in our heap: account for it by the
            # size of the frame it came in (PIP-442's cmdSize).
            svc.estimates[key] = frame
            await self.heap_update(dual, heap, frame)
            await self.write_limited(resp, dual)
        finally:
            dual.release(heap)

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
            self.send(protocol.error(0, ServerError.AuthorizationError,
                              f"proxy_to_broker_url {target} is not this proxy's broker"))
            return None
        try:
            br, bw = await asyncio.open_connection(*want)
        except (OSError, ValueError) as exc:
            self.send(protocol.error(0, ServerError.ServiceNotReady,
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
