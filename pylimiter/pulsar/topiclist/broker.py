"""The discovery broker: namespaces and topics in memory, served to Pulsar
clients over the binary protocol with PIP-442 memory limits."""

from __future__ import annotations

import asyncio
import re
from typing import Callable, Iterable, Optional

from . import protocol
from .protocol import CommandType
from .limits import LimitFailed
from .server import ConnectionBase, ServiceBase, log

Listener = Callable[[str, list, list], None]


class TopicStore:
    """Namespace -> topics (insertion-ordered), with change listeners."""

    def __init__(self):
        self.namespaces: dict[str, dict[str, None]] = {}
        self.listeners: set[Listener] = set()

    def add(self, topic: str) -> bool:
        _, ns, _ = protocol.split_topic(topic)
        topics = self.namespaces.setdefault(ns, {})
        if topic in topics:
            return False
        topics[topic] = None
        self._fire(ns, [topic], [])
        return True

    def add_many(self, topics: Iterable[str]) -> None:
        for t in topics:
            _, ns, _ = protocol.split_topic(t)
            self.namespaces.setdefault(ns, {})[t] = None

    def remove(self, topic: str) -> bool:
        _, ns, _ = protocol.split_topic(topic)
        topics = self.namespaces.get(ns)
        if not topics or topic not in topics:
            return False
        del topics[topic]
        self._fire(ns, [], [topic])
        return True

    def list(self, ns: str, mode: int = protocol.Mode.ALL) -> list[str]:
        return [t for t in self.namespaces.get(ns, ()) if protocol.mode_matches(t, mode)]

    def _fire(self, ns, added, removed):
        for cb in list(self.listeners):
            cb(ns, added, removed)


def generated_topics(namespace: str, n: int) -> list[str]:
    width = max(5, len(str(max(n - 1, 0))))
    return [f"persistent://{namespace}/topic-{i:0{width}d}" for i in range(n)]


def compile_pattern(pattern: str) -> re.Pattern:
    try:
        return re.compile(protocol.strip_domain_pattern(pattern))
    except re.error as exc:
        raise ValueError(f"invalid topics pattern {pattern!r}: {exc}") from None


def pattern_filter(topics: list[str], rx: re.Pattern) -> list[str]:
    return [t for t in topics if rx.fullmatch(protocol.strip_domain_pattern(t))]


class Broker(ServiceBase):
    role = "broker"
    advertise_watchers = True

    def __init__(self, config, *, store: Optional[TopicStore] = None, **kw):
        super().__init__(config, **kw)
        self.store = store or TopicStore()

    def make_connection(self, reader, writer):
        return BrokerConnection(self, reader, writer)

    def add_admin_routes(self, app):
        app.router.add_post("/admin/topics", self._h_add_topic)
        app.router.add_delete("/admin/topics", self._h_delete_topic)
        app.router.add_get("/admin/namespaces/{tenant}/{ns}/topics", self._h_list)

    async def _topic_arg(self, request):
        name = request.query.get("name")
        if name is None and request.can_read_body:
            body = await request.json()
            name = body.get("topic") if isinstance(body, dict) else None
        if not name:
            raise ValueError("give the topic as ?name=persistent://tenant/ns/topic "
                             "or a JSON body {\"topic\": ...}")
        protocol.split_topic(name)
        return name

    async def _h_add_topic(self, request):
        from aiohttp import web

        try:
            name = await self._topic_arg(request)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        created = self.store.add(name)
        return web.json_response({"topic": name, "created": created},
                                 status=201 if created else 200)

    async def _h_delete_topic(self, request):
        from aiohttp import web

        try:
            name = await self._topic_arg(request)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if not self.store.remove(name):
            return web.json_response({"error": f"topic {name} does not exist"}, status=404)
        return web.json_response({"topic": name, "deleted": True})

    async def _h_list(self, request):
        from aiohttp import web

        ns = f"{request.match_info['tenant']}/{request.match_info['ns']}"
        if ns not in self.store.namespaces:
            return web.json_response({"error": f"namespace {ns} does not exist"}, status=404)
        return web.json_response(self.store.list(ns))


class _Watcher:
    def __init__(self, conn: "BrokerConnection", watcher_id: int, ns: str, rx: re.Pattern):
        self.conn, self.id, self.ns, self.rx = conn, watcher_id, ns, rx
        self.topics: set[str] = set()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.sender: Optional[asyncio.Task] = None
        self.closed = False

    def on_change(self, ns, added, removed):
        if ns != self.ns or self.closed:
            return
        a = [t for t in pattern_filter(added, self.rx) if t not in self.topics]
        r = [t for t in pattern_filter(removed, self.rx) if t in self.topics]
        if a or r:
            self.topics.update(a)
            self.topics.difference_update(r)
            self.queue.put_nowait((a, r, protocol.topics_hash(self.topics)))


class BrokerConnection(ConnectionBase):
    service: Broker

    def __init__(self, service, reader, writer):
        super().__init__(service, reader, writer)
        self.watchers: dict[int, _Watcher] = {}
        self.consumers: dict[int, str] = {}  # consumer id -> topic

    async def on_close(self):
        for watcher in list(self.watchers.values()):
            self._drop_watcher(watcher)

    async def dispatch(self, command, size):
        kind = command.type
        if kind == CommandType.CONNECT:
            self.connected = True
            self.send(protocol.connected(self.service.advertise_watchers, self.service.max_frame))
        elif kind == CommandType.PING:
            self.send(protocol.cmd(CommandType.PONG, "pong"))
        elif kind == CommandType.PONG:
            pass
        elif kind == CommandType.LOOKUP:
            self.send(protocol.cmd(CommandType.LOOKUP_RESPONSE, "lookupTopicResponse",
                                   request_id=command.lookupTopic.request_id,
                                   brokerServiceUrl=self.service.service_url,
                                   response=1, authoritative=True))  # Connect
        elif kind == CommandType.PARTITIONED_METADATA:
            self.send(protocol.cmd(CommandType.PARTITIONED_METADATA_RESPONSE,
                                   "partitionMetadataResponse",
                                   request_id=command.partitionMetadata.request_id, partitions=0,
                                   response=0))  # Success: non-partitioned
        elif kind == CommandType.GET_TOPICS_OF_NAMESPACE:
            get_topics = command.getTopicsOfNamespace
            self.spawn(self.guarded(get_topics.request_id, lambda: self.get_topics(get_topics)))
        elif kind == CommandType.WATCH_TOPIC_LIST:
            watch = command.watchTopicList
            self.spawn(self.guarded(watch.request_id, lambda: self.watch(watch)))
        elif kind == CommandType.WATCH_TOPIC_LIST_CLOSE:
            close = command.watchTopicListClose
            watcher = self.watchers.get(close.watcher_id)
            if watcher is not None:
                self._drop_watcher(watcher)
            self.send(protocol.cmd(CommandType.SUCCESS, "success", request_id=close.request_id))
        elif kind == CommandType.SUBSCRIBE:
            # Accepted; this service holds no messages to deliver.
            self.consumers[command.subscribe.consumer_id] = command.subscribe.topic
            self.send(protocol.cmd(CommandType.SUCCESS, "success",
                                   request_id=command.subscribe.request_id))
        elif kind == CommandType.FLOW:
            pass
        elif kind in (CommandType.CLOSE_CONSUMER, CommandType.UNSUBSCRIBE):
            sub = (command.close_consumer if kind == CommandType.CLOSE_CONSUMER
                   else command.unsubscribe)
            self.consumers.pop(sub.consumer_id, None)
            self.send(protocol.cmd(CommandType.SUCCESS, "success", request_id=sub.request_id))
        else:
            self.unsupported(command)

    async def _list_accounted(self, ns: str, mode: int, dual, heap) -> list[str]:
        """List the namespace while holding `heap` (the estimate), then grow
        or shrink that permit to the actual size, which also becomes the
        namespace's next estimate (PIP-442's update step)."""
        topics = self.service.store.list(ns, mode)
        actual = protocol.estimate_heap(topics)
        self.service.estimates[ns] = actual
        await self.heap_update(dual, heap, actual)
        return topics

    def _pattern(self, request_id: int, pattern: str):
        """The compiled pattern, or None after answering InvalidTopicName."""
        try:
            return compile_pattern(pattern)
        except ValueError as exc:
            self.send(protocol.error(request_id, protocol.ServerError.InvalidTopicName, str(exc)))
            return None

    def _namespace_error(self, request_id: int, ns: str) -> bool:
        if ns not in self.service.store.namespaces:
            self.send(protocol.error(request_id, protocol.ServerError.MetadataError,
                                     f"Namespace {ns} does not exist"))
            return True
        return False

    async def get_topics(self, request):
        """GET_TOPICS_OF_NAMESPACE under PIP-442's heap and direct limits."""
        if self._namespace_error(request.request_id, request.namespace):
            return
        rx = None
        if request.HasField("topics_pattern"):
            rx = self._pattern(request.request_id, request.topics_pattern)
            if rx is None:
                return
        dual = self.limiter.dual          # this request's limiter, to the end
        heap = await self.limited_heap(request.namespace, dual)
        try:
            topics = await self._list_accounted(request.namespace, request.mode, dual, heap)
            if rx is not None:
                topics = pattern_filter(topics, rx)
            digest = protocol.topics_hash(topics)
            changed = not (request.HasField("topics_hash") and request.topics_hash == digest)
            resp = protocol.cmd(CommandType.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                                "getTopicsOfNamespaceResponse",
                                request_id=request.request_id, topics=topics if changed else [],
                                filtered=rx is not None, topics_hash=digest, changed=changed)
            del topics
            await self.write_limited(resp, dual)
        finally:
            dual.release(heap)

    async def watch(self, request):
        """WATCH_TOPIC_LIST: the matching list now (limited like a listing),
        then updates as topics come and go."""
        if request.watcher_id in self.watchers:
            self.send(protocol.error(request.request_id, protocol.ServerError.NotAllowedError,
                                     f"watcher {request.watcher_id} already exists on this "
                                     "connection"))
            return
        if self._namespace_error(request.request_id, request.namespace):
            return
        rx = self._pattern(request.request_id, request.topics_pattern)
        if rx is None:
            return
        watcher = _Watcher(self, request.watcher_id, request.namespace, rx)
        dual = self.limiter.dual
        heap = await self.limited_heap(request.namespace, dual)
        try:
            topics = await self._list_accounted(request.namespace, protocol.Mode.PERSISTENT,
                                                dual, heap)
            matching = pattern_filter(topics, rx)
            watcher.topics = set(matching)
            # Registered before the success is written, so no change made
            # meanwhile is lost; the sender starts after the success.
            self.watchers[request.watcher_id] = watcher
            self.service.store.listeners.add(watcher.on_change)
            resp = protocol.cmd(CommandType.WATCH_TOPIC_LIST_SUCCESS, "watchTopicListSuccess",
                                request_id=request.request_id, watcher_id=request.watcher_id,
                                topic=matching, topics_hash=protocol.topics_hash(matching))
            try:
                await self.write_limited(resp, dual)
            except BaseException:
                self._drop_watcher(watcher)
                raise
        finally:
            dual.release(heap)
        watcher.sender = self.spawn(self._send_updates(watcher))

    async def _send_updates(self, watcher: _Watcher):
        """Updates in order, each through the direct limiter; like Pulsar's
        broker, a failed permit wait retries with backoff (an update must
        not be lost) until the watcher or the connection goes away."""
        while not watcher.closed:
            added, removed, digest = await watcher.queue.get()
            delay = 0.05
            while not watcher.closed and not self.is_closed():
                update = protocol.cmd(CommandType.WATCH_TOPIC_UPDATE, "watchTopicUpdate",
                                      watcher_id=watcher.id, new_topics=added,
                                      deleted_topics=removed, topics_hash=digest)
                try:
                    await self.write_limited(update, self.limiter.dual)
                    break
                except LimitFailed as exc:
                    log.info("watcher %s: %s; retrying in %.2fs", watcher.id, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)

    def _drop_watcher(self, watcher: _Watcher):
        watcher.closed = True
        self.watchers.pop(watcher.id, None)
        self.service.store.listeners.discard(watcher.on_change)
        if watcher.sender is not None:
            watcher.sender.cancel()
