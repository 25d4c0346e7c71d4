"""The discovery broker: namespaces and topics in memory, served to Pulsar
clients over the binary protocol with PIP-442 memory limits."""

from __future__ import annotations

import asyncio
import random
from typing import Callable, Iterable, Optional

from pylimiter import PermitAcquireCancelledError

from . import protocol
from .limits import LimitFailed
from .patterns import InvalidPattern, PatternTooLong, TopicsPattern
from .protocol import CommandType, Mode, ServerError
from .server import ConnectionBase, ServiceBase, log

Listener = Callable[[str, list, list], None]


class TopicStore:
    """Namespace -> topics (insertion-ordered), with change listeners."""

    def __init__(self):
        self.namespaces: dict[str, dict[str, None]] = {}
        self.listeners: set[Listener] = set()

    def add(self, topic: str) -> bool:
        """Add a topic (firing watch updates); False if it existed."""
        _, ns, _ = protocol.split_topic(topic)
        topics = self.namespaces.setdefault(ns, {})
        if topic in topics:
            return False
        topics[topic] = None
        self._fire(ns, [topic], [])
        return True

    def add_many(self, topics: Iterable[str]) -> None:
        """Add topics in bulk, at start-up (no updates fired)."""
        for t in topics:
            _, ns, _ = protocol.split_topic(t)
            self.namespaces.setdefault(ns, {})[t] = None

    def remove(self, topic: str) -> bool:
        """Remove a topic (firing watch updates); False if absent."""
        _, ns, _ = protocol.split_topic(topic)
        topics = self.namespaces.get(ns)
        if not topics or topic not in topics:
            return False
        del topics[topic]
        self._fire(ns, [], [topic])
        return True

    def list(self, ns: str, mode: int = protocol.Mode.ALL) -> list[str]:
        """The namespace's topics of a mode, in insertion order."""
        return [t for t in self.namespaces.get(ns, ()) if protocol.mode_matches(t, mode)]

    def _fire(self, ns, added, removed):
        for cb in list(self.listeners):
            cb(ns, added, removed)


def generated_topics(namespace: str, n: int) -> list[str]:
    """n topic names persistent://<namespace>/topic-00000 ..."""
    width = max(5, len(str(max(n - 1, 0))))
    return [f"persistent://{namespace}/topic-{i:0{width}d}" for i in range(n)]


class Backoff:
    """Pulsar's Backoff(100 ms, 25 s): each delay doubles up to the
    maximum, less a random 0-10 % so that clients do not retry in step, and
    never below the initial delay; reset() after a success."""

    def __init__(self, initial: float = 0.1, maximum: float = 25.0,
                 rng: Optional[random.Random] = None):
        self.initial, self.maximum = initial, maximum
        self._next = initial
        self._rng = rng or random.Random()

    def next(self) -> float:
        """The next delay, in seconds."""
        current = self._next
        self._next = min(current * 2, self.maximum)
        return max(self.initial, current - self._rng.uniform(0, current / 10))

    def reset(self) -> None:
        """Start again from the initial delay."""
        self._next = self.initial


class Broker(ServiceBase):
    """The discovery broker: a TopicStore served over the binary protocol."""

    role = "broker"
    advertise_watchers = True

    def __init__(self, config, *, store: Optional[TopicStore] = None, **kw):
        super().__init__(config, **kw)
        self.store = store or TopicStore()

    def make_connection(self, reader, writer):
        """A BrokerConnection for an accepted client."""
        return BrokerConnection(self, reader, writer)

    def add_admin_routes(self, app):
        """Topic creation/deletion and listing over HTTP."""
        app.router.add_post("/admin/topics", self._h_add_topic)
        app.router.add_delete("/admin/topics", self._h_delete_topic)
        app.router.add_get("/admin/namespaces/{tenant}/{ns}/topics", self._h_list)

    async def _topic_arg(self, request):
        name = request.query.get("name")
        if name is None and request.can_read_body:
            body = await request.json()
            name = body.get("topic") if isinstance(body, dict) else None
        if not name or not isinstance(name, str):
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
    """One WATCH_TOPIC_LIST: the matching topics, kept up to date by the
    store's listener, and the updates not yet written.  It holds no
    reference to its connection, so nothing of it outlives a closed one."""

    def __init__(self, watcher_id: int, ns: str, pattern: TopicsPattern):
        self.id, self.ns, self.pattern = watcher_id, ns, pattern
        self.topics: set[str] = set()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.sender: Optional[asyncio.Task] = None
        self.ready = False
        self.closed = False

    def on_change(self, ns, added, removed):
        """The store's listener: queue an update if the change matches."""
        if ns != self.ns or self.closed:
            return
        a = [t for t in self.pattern.filter(added) if t not in self.topics]
        r = [t for t in self.pattern.filter(removed) if t in self.topics]
        if a or r:
            self.topics.update(a)
            self.topics.difference_update(r)
            self.queue.put_nowait((a, r, protocol.topics_hash(self.topics)))


class BrokerConnection(ConnectionBase):
    """One client of the broker: its requests, watchers and consumers."""

    service: Broker

    def __init__(self, service, reader, writer):
        super().__init__(service, reader, writer)
        self.watchers: dict[int, _Watcher] = {}
        self.consumers: dict[int, str] = {}  # consumer id -> topic
        #: Retries of watcher permits, one per connection as in Pulsar.
        self.backoff = Backoff()

    async def on_close(self):
        """Drop every watcher of the connection."""
        for watcher in list(self.watchers.values()):
            self._drop_watcher(watcher)

    async def dispatch(self, command, size):
        """Answer one command (listings and watches run as tasks)."""
        kind = command.type
        if kind == CommandType.CONNECT:
            self.connected = True
            self.send(protocol.connected(self.service.advertise_watchers,
                                         self.service.config.max_message_size))
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

    def _check_namespace(self, ns: str) -> None:
        if ns not in self.service.store.namespaces:
            raise protocol.RequestError(ServerError.MetadataError,
                                        f"Namespace {ns} does not exist")

    def _list_sized(self, ns: str, mode: int) -> tuple[list[str], int]:
        """The namespace's topics and their actual heap size, which becomes
        the next estimate for this (namespace, mode)."""
        topics = self.service.store.list(ns, mode)
        actual = protocol.estimate_heap(topics)
        self.service.estimates[(ns, mode)] = actual
        return topics, actual

    async def get_topics(self, request):
        """GET_TOPICS_OF_NAMESPACE under PIP-442's heap and direct limits.
        A pattern longer than subscriptionPatternMaxLength is not evaluated:
        the list goes back unfiltered (filtered=false) and the client
        filters it, as Pulsar's broker does."""
        ns, mode = request.namespace, request.mode
        self._check_namespace(ns)
        pattern = None
        if request.HasField("topics_pattern"):
            try:
                pattern = TopicsPattern(request.topics_pattern,
                                        self.service.config.pattern_max_length)
            except PatternTooLong:
                log.info("pattern of %d chars not evaluated (subscriptionPatternMaxLength %d)",
                         len(request.topics_pattern), self.service.config.pattern_max_length)
            except InvalidPattern as exc:
                raise protocol.RequestError(ServerError.InvalidTopicName,
                                            f"Invalid topics pattern: {exc}") from None
        dual = self.limiter.dual          # this request's limiter, to the end
        heap = await self.limited_heap((ns, mode), dual)
        try:
            topics, actual = self._list_sized(ns, mode)
            await self.heap_update(dual, heap, actual)
            if pattern is not None:
                topics = await pattern.filter_async(topics)
            digest = protocol.topics_hash(topics)
            changed = not (request.HasField("topics_hash") and request.topics_hash == digest)
            resp = protocol.cmd(CommandType.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                                "getTopicsOfNamespaceResponse",
                                request_id=request.request_id, topics=topics if changed else [],
                                filtered=pattern is not None, topics_hash=digest,
                                changed=changed)
            del topics
            await self.write_limited(resp, dual)
        finally:
            dual.release(heap)

    async def watch(self, request):
        """WATCH_TOPIC_LIST, as Pulsar's TopicListService: the watcher is
        registered at once (so a WATCH_TOPIC_LIST_CLOSE cancels it while it
        waits), lists under the heap limit, then answers with the matching
        topics (none when the client's hash already matches) and sends
        updates as topics come and go.  Waits for memory that time out or
        find the queue full are retried with backoff until the connection
        or the watcher closes; they never fail the request."""
        wid, ns = request.watcher_id, request.namespace
        try:
            pattern = TopicsPattern(request.topics_pattern,
                                    self.service.config.pattern_max_length)
        except PatternTooLong as exc:
            raise protocol.RequestError(ServerError.NotAllowedError,
                                        f"Unable to create topic list watcher: {exc}") from None
        except InvalidPattern as exc:
            raise protocol.RequestError(ServerError.InvalidTopicName,
                                        f"Invalid topics pattern: {exc}") from None
        self._check_namespace(ns)
        watcher = self.watchers.get(wid)
        if watcher is not None and not watcher.ready:
            raise protocol.RequestError(ServerError.ServiceNotReady,
                                        "Topic list watcher is already present on the connection")
        if watcher is None:
            watcher = self.watchers[wid] = _Watcher(wid, ns, pattern)
            try:
                await self._init_watcher(watcher)
            except BaseException:
                self._drop_watcher(watcher)
                raise
        matching = sorted(watcher.topics)
        digest = protocol.topics_hash(matching)
        if request.HasField("topics_hash") and request.topics_hash == digest:
            matching = []
        resp = protocol.cmd(CommandType.WATCH_TOPIC_LIST_SUCCESS, "watchTopicListSuccess",
                            request_id=request.request_id, watcher_id=wid,
                            topic=matching, topics_hash=digest)
        del matching
        await self._write_retrying(watcher, resp)
        if watcher.sender is None:
            watcher.sender = self.spawn(self._send_updates(watcher))

    def _cancelled(self, watcher: _Watcher) -> bool:
        return self.is_closed() or watcher.closed

    def _check_watcher(self, watcher: _Watcher) -> None:
        if self.is_closed():
            raise PermitAcquireCancelledError("the connection closed")
        if watcher.closed:
            raise protocol.RequestError(ServerError.MetadataError,
                                        "Closed watcher before creation was complete")

    async def _retry_later(self, watcher: _Watcher, what: str, exc: Exception) -> None:
        delay = self.backoff.next()
        log.info("watcher %d: %s when %s; retrying in %.0f ms", watcher.id, exc, what,
                 delay * 1000)
        await asyncio.sleep(delay)
        self._check_watcher(watcher)

    async def _init_watcher(self, watcher: _Watcher) -> None:
        """List the namespace under a heap permit and register the watcher
        before the permit is resized, so no change made meanwhile is lost;
        retried with backoff when memory cannot be had."""
        ns, mode = watcher.ns, Mode.PERSISTENT
        store = self.service.store
        while True:
            self._check_watcher(watcher)
            dual = self.limiter.dual
            try:
                heap = await self.limited_heap((ns, mode), dual,
                                               lambda: self._cancelled(watcher))
            except LimitFailed as exc:
                await self._retry_later(watcher, "initializing", exc)
                continue
            try:
                topics, actual = self._list_sized(ns, mode)
                watcher.topics = set(await watcher.pattern.filter_async(topics))
                del topics
                store.listeners.add(watcher.on_change)
                await self.heap_update(dual, heap, actual, lambda: self._cancelled(watcher))
            except LimitFailed as exc:
                store.listeners.discard(watcher.on_change)
                _clear_queue(watcher.queue)
                await self._retry_later(watcher, "initializing", exc)
                continue
            finally:
                dual.release(heap)
            self.backoff.reset()
            watcher.ready = True
            return

    async def _write_retrying(self, watcher: _Watcher, command) -> None:
        """Write under the direct limit, retrying with backoff (an answer
        or an update must not be lost) until the watcher or the connection
        goes away."""
        while True:
            self._check_watcher(watcher)
            try:
                await self.write_limited(command, self.limiter.dual)
            except LimitFailed as exc:
                await self._retry_later(watcher, "writing", exc)
                continue
            self.backoff.reset()
            return

    async def _send_updates(self, watcher: _Watcher):
        """Updates in order, each through the direct limiter."""
        while not watcher.closed:
            added, removed, digest = await watcher.queue.get()
            update = protocol.cmd(CommandType.WATCH_TOPIC_UPDATE, "watchTopicUpdate",
                                  watcher_id=watcher.id, new_topics=added,
                                  deleted_topics=removed, topics_hash=digest)
            await self._write_retrying(watcher, update)

    def _drop_watcher(self, watcher: _Watcher):
        """Forget a watcher and let go of everything it holds at once."""
        watcher.closed = True
        if self.watchers.get(watcher.id) is watcher:
            del self.watchers[watcher.id]
        self.service.store.listeners.discard(watcher.on_change)
        sender, watcher.sender = watcher.sender, None
        if sender is not None:
            sender.cancel()
        watcher.topics = set()
        _clear_queue(watcher.queue)


def _clear_queue(queue: asyncio.Queue) -> None:
    while not queue.empty():
        queue.get_nowait()
