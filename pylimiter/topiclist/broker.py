"""The discovery broker: namespaces and topics in memory, served to Pulsar
clients over the binary protocol with PIP-442 memory limits."""

from __future__ import annotations

import asyncio
import re
from typing import Callable, Iterable, Optional

from . import protocol as P
from .server import ConnectionBase, LimitFailed, ServiceBase, log

Listener = Callable[[str, list, list], None]


class TopicStore:
    """Namespace -> topics (insertion-ordered), with change listeners."""

    def __init__(self):
        self.namespaces: dict[str, dict[str, None]] = {}
        self.listeners: set[Listener] = set()

    def add(self, topic: str) -> bool:
        _, ns, _ = P.split_topic(topic)
        topics = self.namespaces.setdefault(ns, {})
        if topic in topics:
            return False
        topics[topic] = None
        self._fire(ns, [topic], [])
        return True

    def add_many(self, topics: Iterable[str]) -> None:
        for t in topics:
            _, ns, _ = P.split_topic(t)
            self.namespaces.setdefault(ns, {})[t] = None

    def remove(self, topic: str) -> bool:
        _, ns, _ = P.split_topic(topic)
        topics = self.namespaces.get(ns)
        if not topics or topic not in topics:
            return False
        del topics[topic]
        self._fire(ns, [], [topic])
        return True

    def list(self, ns: str, mode: int = P.Mode.ALL) -> list[str]:
        return [t for t in self.namespaces.get(ns, ()) if P.mode_matches(t, mode)]

    def _fire(self, ns, added, removed):
        for cb in list(self.listeners):
            cb(ns, added, removed)


def generated_topics(namespace: str, n: int) -> list[str]:
    width = max(5, len(str(max(n - 1, 0))))
    return [f"persistent://{namespace}/topic-{i:0{width}d}" for i in range(n)]


def compile_pattern(pattern: str) -> re.Pattern:
    try:
        return re.compile(P.strip_domain_pattern(pattern))
    except re.error as exc:
        raise ValueError(f"invalid topics pattern {pattern!r}: {exc}") from None


def pattern_filter(topics: list[str], rx: re.Pattern) -> list[str]:
    return [t for t in topics if rx.fullmatch(P.strip_domain_pattern(t))]


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
        P.split_topic(name)
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
            self.queue.put_nowait((a, r, P.topics_hash(self.topics)))


class BrokerConnection(ConnectionBase):
    service: Broker

    def __init__(self, service, reader, writer):
        super().__init__(service, reader, writer)
        self.watchers: dict[int, _Watcher] = {}
        self.consumers: dict[int, str] = {}  # consumer id -> topic

    async def on_close(self):
        for w in list(self.watchers.values()):
            self._drop_watcher(w)

    async def dispatch(self, c, size):
        T = P.T
        t = c.type
        if t == T.CONNECT:
            self.connected = True
            self.send(P.connected(self.service.advertise_watchers, self.service.max_frame))
        elif t == T.PING:
            self.send(P.cmd(T.PONG, "pong"))
        elif t == T.PONG:
            pass
        elif t == T.LOOKUP:
            self.send(P.cmd(T.LOOKUP_RESPONSE, "lookupTopicResponse",
                            request_id=c.lookupTopic.request_id,
                            brokerServiceUrl=self.service.service_url,
                            response=1, authoritative=True))  # Connect
        elif t == T.PARTITIONED_METADATA:
            self.send(P.cmd(T.PARTITIONED_METADATA_RESPONSE, "partitionMetadataResponse",
                            request_id=c.partitionMetadata.request_id, partitions=0,
                            response=0))  # Success: non-partitioned
        elif t == T.GET_TOPICS_OF_NAMESPACE:
            g = c.getTopicsOfNamespace
            self.spawn(self.guarded(g.request_id, lambda: self.get_topics(g)))
        elif t == T.WATCH_TOPIC_LIST:
            w = c.watchTopicList
            self.spawn(self.guarded(w.request_id, lambda: self.watch(w)))
        elif t == T.WATCH_TOPIC_LIST_CLOSE:
            w = self.watchers.get(c.watchTopicListClose.watcher_id)
            if w is not None:
                self._drop_watcher(w)
            self.send(P.cmd(T.SUCCESS, "success", request_id=c.watchTopicListClose.request_id))
        elif t == T.SUBSCRIBE:
            # Accepted; this service holds no messages to deliver.
            self.consumers[c.subscribe.consumer_id] = c.subscribe.topic
            self.send(P.cmd(T.SUCCESS, "success", request_id=c.subscribe.request_id))
        elif t == T.FLOW:
            pass
        elif t in (T.CLOSE_CONSUMER, T.UNSUBSCRIBE):
            sub = c.close_consumer if t == T.CLOSE_CONSUMER else c.unsubscribe
            self.consumers.pop(sub.consumer_id, None)
            self.send(P.cmd(T.SUCCESS, "success", request_id=sub.request_id))
        else:
            self.unsupported(c)

    async def _list_accounted(self, ns: str, mode: int, dual, heap) -> list[str]:
        """List the namespace while holding `heap` (the estimate), then grow
        or shrink that permit to the actual size, which also becomes the
        namespace's next estimate (PIP-442's update step)."""
        topics = self.service.store.list(ns, mode)
        actual = P.estimate_heap(topics)
        self.service.estimates[ns] = actual
        await self.heap_update(dual, heap, actual)
        return topics

    def _pattern(self, request_id: int, pattern: str):
        """The compiled pattern, or None after answering InvalidTopicName."""
        try:
            return compile_pattern(pattern)
        except ValueError as exc:
            self.send(P.error(request_id, P.ServerError.InvalidTopicName, str(exc)))
            return None

    def _namespace_error(self, request_id: int, ns: str) -> bool:
        if ns not in self.service.store.namespaces:
            self.send(P.error(request_id, P.ServerError.MetadataError,
                              f"Namespace {ns} does not exist"))
            return True
        return False

    async def get_topics(self, g):
        svc = self.service
        if self._namespace_error(g.request_id, g.namespace):
            return
        rx = None
        if g.HasField("topics_pattern"):
            rx = self._pattern(g.request_id, g.topics_pattern)
            if rx is None:
                return
        dual = svc.limiter.dual          # this request's limiter, to the end
        heap = await self.limited_heap(g.namespace, dual)
        try:
            topics = await self._list_accounted(g.namespace, g.mode, dual, heap)
            if rx is not None:
                topics = pattern_filter(topics, rx)
            h = P.topics_hash(topics)
            changed = not (g.HasField("topics_hash") and g.topics_hash == h)
            resp = P.cmd(P.T.GET_TOPICS_OF_NAMESPACE_RESPONSE, "getTopicsOfNamespaceResponse",
                         request_id=g.request_id, topics=topics if changed else [],
                         filtered=rx is not None, topics_hash=h, changed=changed)
            del topics
            await self.write_limited(resp, dual)
        finally:
            dual.release(heap)

    async def watch(self, w):
        svc = self.service
        if w.watcher_id in self.watchers:
            self.send(P.error(w.request_id, P.ServerError.NotAllowedError,
                              f"watcher {w.watcher_id} already exists on this connection"))
            return
        if self._namespace_error(w.request_id, w.namespace):
            return
        rx = self._pattern(w.request_id, w.topics_pattern)
        if rx is None:
            return
        watcher = _Watcher(self, w.watcher_id, w.namespace, rx)
        dual = svc.limiter.dual
        heap = await self.limited_heap(w.namespace, dual)
        try:
            topics = await self._list_accounted(w.namespace, P.Mode.PERSISTENT, dual, heap)
            matching = pattern_filter(topics, rx)
            watcher.topics = set(matching)
            # Registered before the success is written, so no change made
            # meanwhile is lost; the sender starts after the success.
            self.watchers[w.watcher_id] = watcher
            svc.store.listeners.add(watcher.on_change)
            resp = P.cmd(P.T.WATCH_TOPIC_LIST_SUCCESS, "watchTopicListSuccess",
                         request_id=w.request_id, watcher_id=w.watcher_id, topic=matching,
                         topics_hash=P.topics_hash(matching))
            try:
                await self.write_limited(resp, dual)
            except BaseException:
                self._drop_watcher(watcher)
                raise
        finally:
            dual.release(heap)
        watcher.sender = self.spawn(self._send_updates(watcher))

    async def _send_updates(self, w: _Watcher):
        """Updates in order, each through the direct limiter; like Pulsar's
        broker, a failed permit wait retries with backoff (an update must
        not be lost) until the watcher or the connection goes away."""
        while not w.closed:
            added, removed, h = await w.queue.get()
            delay = 0.05
            while not w.closed and not self.is_closed():
                cmd = P.cmd(P.T.WATCH_TOPIC_UPDATE, "watchTopicUpdate", watcher_id=w.id,
                            new_topics=added, deleted_topics=removed, topics_hash=h)
                try:
                    await self.write_limited(cmd, self.service.limiter.dual)
                    break
                except LimitFailed as exc:
                    log.info("watcher %s: %s; retrying in %.2fs", w.id, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)

    def _drop_watcher(self, w: _Watcher):
        w.closed = True
        self.watchers.pop(w.id, None)
        self.service.store.listeners.discard(w.on_change)
        if w.sender is not None:
            w.sender.cancel()
