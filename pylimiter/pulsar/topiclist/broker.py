"""The discovery broker: namespaces and topics in memory, served to Pulsar
clients over the binary protocol with PIP-442 memory limits."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Callable, Iterable, NamedTuple, Optional

from pylimiter import (
    PermitAcquireCancelledError,
    PermitAcquireError,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
)

from . import protocol
from .admin import BadRequest, read_json
from .limits import LimitFailed
from .patterns import InvalidPattern, PatternTooLong, TopicsPattern
from .protocol import CommandType, Mode, ServerError
from .server import INITIAL_ESTIMATE, ConnectionBase, ServiceBase, log

Listener = Callable[[str, list, list], None]
#: What a watcher costs besides its topics (the object, its event, its
#: sender task), in the watchers' memory budget.
WATCHER_BASE_COST = 2048


def check_topic_text(topic: str) -> None:
    """ValueError unless `topic` is text UTF-8 can encode (see
    protocol.unencodable_at)."""
    at = protocol.unencodable_at(topic)
    if at is not None:
        raise ValueError(f"topic name is not valid UTF-8 text: it holds an unpaired "
                         f"surrogate (U+{ord(topic[at]):04X}) at character {at}")


class TopicStore:
    """Namespace -> topics (insertion-ordered), with change listeners.

    The admin API refuses names that UTF-8 cannot encode (check_topic_text);
    the store keeps whatever it is given, but such a name (put there by
    other code, or by an older version) is left out of every listing with
    one log line and of every watch update, so that it never fails a whole
    listing or watch; remove takes it out."""

    def __init__(self):
        self.namespaces: dict[str, dict[str, None]] = {}
        self.listeners: set[Listener] = set()
        #: stored names left out of listings, each logged once
        self.skipped: set[str] = set()

    def add(self, topic: str) -> bool:
        """Add a topic (firing watch updates); False if it existed.
        ValueError if it is not a topic name."""
        _, ns, _ = protocol.split_topic(topic)
        topics = self.namespaces.setdefault(ns, {})
        if topic in topics:
            return False
        topics[topic] = None
        self._fire(ns, [topic], [])
        return True

    def add_many(self, topics: Iterable[str]) -> None:
        """Add topics in bulk, at start-up (no updates fired).  ValueError
        at the first that is not a topic name."""
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
        self.skipped.discard(topic)
        self._fire(ns, [], [topic])
        return True

    def list(self, ns: str, mode: int = protocol.Mode.ALL) -> list[str]:
        """The namespace's topics of a mode, in insertion order, without
        names that are not UTF-8 text (see the class)."""
        out = [t for t in self.namespaces.get(ns, ()) if protocol.mode_matches(t, mode)]
        if not "".join(out).isascii():
            out = [t for t in out if t.isascii() or self._usable(t)]
        return out

    def _usable(self, topic: str) -> bool:
        at = protocol.unencodable_at(topic)
        if at is None:
            return True
        if topic not in self.skipped:
            self.skipped.add(topic)
            # ascii(): the log's stream could not write the name either.
            log.warning("topic %s left out of listings: not valid UTF-8 text (an unpaired "
                        "surrogate at character %d); delete it", ascii(topic), at)
        return False

    def _fire(self, ns, added, removed):
        # A name that is not UTF-8 text is never in an update: no listing
        # or watcher has it, and a watcher's pattern could not match it.
        added = [t for t in added if protocol.unencodable_at(t) is None]
        removed = [t for t in removed if protocol.unencodable_at(t) is None]
        if not added and not removed:
            return
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

    async def _topic_arg(self, request, *, new: bool):
        """The topic a request names (?name= or a JSON body); BadRequest
        (400) unless it is a topic name, not too long, and, for a `new`
        topic, UTF-8 text (a stored name that is not can still be deleted)."""
        name = request.query.get("name")
        if name is None and request.can_read_body:
            body = await read_json(request, self.admin_gate)
            name = body.get("topic") if isinstance(body, dict) else None
        if not name or not isinstance(name, str):
            raise BadRequest("give the topic as ?name=persistent://tenant/ns/topic "
                             "or a JSON body {\"topic\": ...}")
        if len(name) > self.config.name_max_length:
            raise BadRequest(f"topic name longer than maximum: {self.config.name_max_length}")
        try:
            protocol.split_topic(name)
            if new:
                check_topic_text(name)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        return name

    async def _h_add_topic(self, request):
        from aiohttp import web

        name = await self._topic_arg(request, new=True)
        created = self.store.add(name)
        return web.json_response({"topic": name, "created": created},
                                 status=201 if created else 200)

    async def _h_delete_topic(self, request):
        from aiohttp import web

        name = await self._topic_arg(request, new=False)
        if not self.store.remove(name):
            return web.json_response({"error": f"topic {name} does not exist"}, status=404)
        return web.json_response({"topic": name, "deleted": True})

    async def _h_list(self, request):
        from aiohttp import web

        ns = f"{request.match_info['tenant']}/{request.match_info['ns']}"
        if ns not in self.store.namespaces:
            return web.json_response({"error": f"namespace {ns} does not exist"}, status=404)
        return web.json_response(self.store.list(ns))


class ListRequest(NamedTuple):
    """A GET_TOPICS_OF_NAMESPACE as kept while it runs: checked values, not
    the client's frame (which may carry megabytes of unknown fields)."""

    request_id: int
    namespace: str
    mode: int
    pattern: Optional[TopicsPattern]
    topics_hash: Optional[str]


def watcher_cost(topics: Iterable[str]) -> int:
    """What a watcher holding `topics` costs in the watchers' budget:
    PIP-442's heap estimate of the set, plus the watcher itself."""
    return WATCHER_BASE_COST + protocol.estimate_heap(topics)


class _Watcher:
    """One WATCH_TOPIC_LIST: the matching topics as last sent to the client
    (`topics`) and the net change not yet sent (`pending`: topic -> True to
    add, False to remove), kept up to date by the store's listener; changes
    that come in while the initial list is being matched wait in `early`.
    Changes coalesce, so a client that reads slowly costs at most the
    namespace's size in pending changes, not one entry per change.  It
    holds no reference to its connection, so nothing of it outlives a
    closed one."""

    def __init__(self, watcher_id: int, ns: str, pattern: TopicsPattern):
        self.id, self.ns, self.pattern = watcher_id, ns, pattern
        self.topics: set[str] = set()
        self.pending: dict[str, bool] = {}
        self.early: Optional[list] = []
        self.wake = asyncio.Event()
        self.sender: Optional[asyncio.Task] = None
        #: its share of the watchers' memory budget, and what that covers
        self.permit = None
        self.cost = 0
        self.ready = False
        self.closed = False

    def on_change(self, ns, added, removed):
        """The store's listener: note the change if it matches."""
        if ns != self.ns or self.closed:
            return
        a, r = self.pattern.filter(added), self.pattern.filter(removed)
        if not a and not r:
            return
        if self.early is not None:
            self.early.append((a, r))
        else:
            self._merge(a, r)

    def _merge(self, added, removed):
        sent, pending = self.topics, self.pending
        for t in added:
            if t not in sent:
                pending[t] = True
            elif pending.get(t) is False:
                del pending[t]           # removed, then added again
        for t in removed:
            if t in sent:
                pending[t] = False
            else:
                pending.pop(t, None)     # added, then removed again
        if pending:
            self.wake.set()

    def start(self, matching: list) -> None:
        """The initial matching topics are known: replay what changed
        since the listing."""
        self.topics = set(matching)
        early, self.early = self.early, None
        for a, r in early:
            self._merge(a, r)

    def reset(self) -> None:
        """Back to before the listing (it is retried)."""
        self.topics, self.pending, self.early = set(), {}, []

    def take(self) -> tuple[list, list]:
        """The pending change (added, removed), leaving none."""
        pending, self.pending = self.pending, {}
        return ([t for t, add in pending.items() if add],
                [t for t, add in pending.items() if not add])


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
            await self.reply(protocol.connected(self.service.advertise_watchers,
                                                self.config.max_message_size))
        elif kind == CommandType.PING:
            await self.reply(protocol.cmd(CommandType.PONG, "pong"))
        elif kind == CommandType.PONG:
            pass
        elif kind == CommandType.LOOKUP:
            self.topic_name(command.lookupTopic.topic)
            await self.reply(protocol.cmd(CommandType.LOOKUP_RESPONSE, "lookupTopicResponse",
                                          request_id=command.lookupTopic.request_id,
                                          brokerServiceUrl=self.service.service_url,
                                          response=1, authoritative=True))  # Connect
        elif kind == CommandType.PARTITIONED_METADATA:
            self.topic_name(command.partitionMetadata.topic)
            await self.reply(protocol.cmd(CommandType.PARTITIONED_METADATA_RESPONSE,
                                          "partitionMetadataResponse",
                                          request_id=command.partitionMetadata.request_id,
                                          partitions=0, response=0))  # Success: non-partitioned
        elif kind == CommandType.GET_TOPICS_OF_NAMESPACE:
            req = self._list_request(command.getTopicsOfNamespace)
            self.start_request(req.request_id, lambda: self.get_topics(req))
        elif kind == CommandType.WATCH_TOPIC_LIST:
            self._start_watch(command.watchTopicList)
        elif kind == CommandType.WATCH_TOPIC_LIST_CLOSE:
            close = command.watchTopicListClose
            watcher = self.watchers.get(close.watcher_id)
            if watcher is not None:
                self._drop_watcher(watcher)
            await self.reply(protocol.cmd(CommandType.SUCCESS, "success",
                                          request_id=close.request_id))
        elif kind == CommandType.SUBSCRIBE:
            # Accepted; this service holds no messages to deliver.
            sub = command.subscribe
            topic = self.topic_name(sub.topic)
            self.name(sub.subscription, "subscription name")
            cap = self.config.consumers_per_connection
            if sub.consumer_id not in self.consumers and len(self.consumers) >= cap:
                raise protocol.RequestError(ServerError.NotAllowedError,
                                            f"Too many consumers on this connection (max {cap})")
            self.consumers[sub.consumer_id] = topic
            await self.reply(protocol.cmd(CommandType.SUCCESS, "success",
                                          request_id=sub.request_id))
        elif kind == CommandType.FLOW:
            pass
        elif kind in (CommandType.CLOSE_CONSUMER, CommandType.UNSUBSCRIBE):
            sub = (command.close_consumer if kind == CommandType.CLOSE_CONSUMER
                   else command.unsubscribe)
            self.consumers.pop(sub.consumer_id, None)
            await self.reply(protocol.cmd(CommandType.SUCCESS, "success",
                                          request_id=sub.request_id))
        else:
            await self.unsupported(command)

    # ---- what a request asks, checked ---------------------------------------------

    def topic_name(self, value) -> str:
        """A topic name from a client: text, not too long, and a topic."""
        name = self.name(value, "topic name")
        try:
            protocol.split_topic(name)
        except ValueError:
            raise protocol.RequestError(ServerError.InvalidTopicName,
                                        f"Invalid topic name: {name}") from None
        return name

    def _pattern(self, raw, *, watch: bool) -> Optional[TopicsPattern]:
        """A topics pattern, compiled; None when it is longer than
        subscriptionPatternMaxLength and only listed (the list then goes
        back unfiltered, filtered=false, and the client filters it, as
        Pulsar's broker does).  RequestError if it cannot be used."""
        limit = self.config.pattern_max_length
        try:
            return TopicsPattern(raw, limit)
        except PatternTooLong as exc:
            if watch:
                raise protocol.RequestError(ServerError.NotAllowedError,
                                            f"Unable to create topic list watcher: {exc}") \
                    from None
            self.service.client_log(logging.INFO, "long-pattern",
                                    "pattern of %d chars not evaluated "
                                    "(subscriptionPatternMaxLength %d)", len(raw), limit)
            return None
        except InvalidPattern as exc:
            if not isinstance(raw, str):
                self.service.client_log(logging.INFO, "pattern-utf8",
                                        "refused a topics pattern that is not valid UTF-8")
            raise protocol.RequestError(ServerError.InvalidTopicName,
                                        f"Invalid topics pattern: {exc}") from None

    def _hash_of(self, body) -> Optional[str]:
        value = body.topics_hash if body.HasField("topics_hash") else None
        return value if isinstance(value, str) and len(value) <= protocol.MAX_HASH_LENGTH else None

    def _list_request(self, body) -> ListRequest:
        ns = self.name(body.namespace, "namespace")
        pattern = (self._pattern(body.topics_pattern, watch=False)
                   if body.HasField("topics_pattern") else None)
        return ListRequest(body.request_id, ns, body.mode, pattern, self._hash_of(body))

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

    # ---- GET_TOPICS_OF_NAMESPACE ------------------------------------------------------

    async def get_topics(self, req: ListRequest):
        """GET_TOPICS_OF_NAMESPACE under PIP-442's heap and direct limits,
        its heavy steps in fair turns."""
        ns, mode = req.namespace, req.mode
        self._check_namespace(ns)
        dual = self.limiter.dual          # this request's limiter, to the end
        heap = await self.limited_heap((ns, mode), dual)
        try:
            topics, actual = await self.step(self._list_sized, ns, mode)
            await self.heap_update(dual, heap, actual)
            if req.pattern is not None:
                topics = await req.pattern.filter_async(topics, self.step)
            box = [await self.step(_list_response, req, topics)]
            del topics
            await self.write_limited(box, dual, heap)
        finally:
            dual.release(heap)

    # ---- WATCH_TOPIC_LIST -------------------------------------------------------------

    def _start_watch(self, body) -> None:
        """Check a WATCH_TOPIC_LIST and start it.  A new watcher is
        registered at once, so the connection's cap counts it and a
        WATCH_TOPIC_LIST_CLOSE cancels it while it waits."""
        ns = self.name(body.namespace, "namespace")
        pattern = self._pattern(body.topics_pattern, watch=True)
        wid, rid = body.watcher_id, body.request_id
        client_hash = self._hash_of(body)
        watcher = self.watchers.get(wid)
        created = watcher is None
        if created:
            cap = self.config.watchers_per_connection
            if len(self.watchers) >= cap:
                raise protocol.RequestError(
                    ServerError.NotAllowedError,
                    f"Too many topic list watchers on this connection (max {cap})")
            watcher = _Watcher(wid, ns, pattern)
            self.watchers[wid] = watcher
        try:
            self.start_request(rid, lambda: self.watch(rid, watcher, created, client_hash))
        except protocol.RequestError:
            if created:
                self._drop_watcher(watcher)
            raise

    async def watch(self, request_id: int, watcher: _Watcher, created: bool,
                    client_hash: Optional[str]):
        """WATCH_TOPIC_LIST, as Pulsar's TopicListService: lists under the
        heap limit, keeps the matching set under the watchers' budget, then
        answers with the matching topics (none when the client's hash
        already matches) and sends updates as topics come and go.  Waits
        for memory that time out or find the queue full are retried with
        backoff until the connection or the watcher closes; they never fail
        the request."""
        if not created and not watcher.ready:
            raise protocol.RequestError(ServerError.ServiceNotReady,
                                        "Topic list watcher is already present on the connection")
        if created:
            try:
                self._check_namespace(watcher.ns)
                await self._init_watcher(watcher)
            except BaseException:
                self._drop_watcher(watcher)
                raise
        resp = await self.step(_watch_success, request_id, watcher, client_hash)
        await self._write_retrying(watcher, resp)
        del resp
        if watcher.sender is None and not watcher.closed:
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
        self.service.client_log(logging.INFO, "watcher-retry",
                                "watcher %d: %s when %s; retrying in %.0f ms", watcher.id, exc,
                                what, delay * 1000)
        await asyncio.sleep(delay)
        self._check_watcher(watcher)

    def _listen(self, watcher: _Watcher, ns: str, mode: int):
        """List the namespace and register the watcher in one step, so that
        no change is lost between the two."""
        listed = self._list_sized(ns, mode)
        self.service.store.listeners.add(watcher.on_change)
        return listed

    async def _watcher_memory(self, watcher: _Watcher, new_cost: int) -> None:
        """Hold new_cost of the watchers' budget for `watcher` (capped at
        the whole budget); LimitFailed if it cannot be had."""
        sem = self.service.watcher_memory
        n = min(new_cost, sem.max_permits) if sem.max_permits > 0 else new_cost
        is_cancelled = lambda: self._cancelled(watcher)  # noqa: E731
        try:
            if watcher.permit is None:
                watcher.permit = await sem.acquire(n, is_cancelled=is_cancelled)
            else:
                await sem.update(watcher.permit, n, is_cancelled=is_cancelled)
        except PermitAcquireTimeoutError:
            raise LimitFailed("Failed due to timeout acquiring watcher memory permits "
                              "for topic list") from None
        except PermitAcquireQueueFullError:
            raise LimitFailed("Failed due to watcher memory permit queue being full "
                              "for topic list") from None
        watcher.cost = new_cost

    async def _init_watcher(self, watcher: _Watcher) -> None:
        """Take the watchers' budget for the set to come (the last listing's
        size: the set is at most that), then list the namespace under a
        heap permit (registering the watcher in the same step, so that no
        change made meanwhile is lost), match it, and shrink the budget to
        the set; retried with backoff when memory cannot be had.  The budget
        comes first so that a watcher waiting for it holds no heap permit:
        a storm of watchers waits there, not in the heap pool's queue where
        listings wait too; and WATCH_INITS at most list and match at once,
        so that the heap they hold over several turns stays small."""
        ns, mode = watcher.ns, Mode.PERSISTENT
        while True:
            self._check_watcher(watcher)
            failure = None
            dual = self.limiter.dual
            heap = None
            init = None
            try:
                expected = self.service.estimates.get((ns, mode), INITIAL_ESTIMATE)
                await self._watcher_memory(watcher, WATCHER_BASE_COST + expected)
                init = await self.service.watch_inits.acquire(
                    1, is_cancelled=lambda: self._cancelled(watcher))
                heap = await self.limited_heap((ns, mode), dual,
                                               lambda: self._cancelled(watcher))
                topics, actual = await self.step(self._listen, watcher, ns, mode)
                await self.heap_update(dual, heap, actual, lambda: self._cancelled(watcher))
                matching = await watcher.pattern.filter_async(topics, self.step)
                del topics
                await self._watcher_memory(watcher, await self.step(watcher_cost, matching))
                watcher.start(matching)
                del matching
            except LimitFailed as exc:
                self.service.store.listeners.discard(watcher.on_change)
                watcher.reset()
                failure = exc
            finally:
                if heap is not None:
                    dual.release(heap)
                if init is not None:
                    self.service.watch_inits.release(init)
            if failure is None:
                self.backoff.reset()
                watcher.ready = True
                return
            if watcher.permit is not None:
                self.service.watcher_memory.release(watcher.permit)
                watcher.permit = None
            await self._retry_later(watcher, "initializing", failure)

    async def _write_retrying(self, watcher: _Watcher, command) -> None:
        """Write under the direct limit, retrying with backoff (an answer
        or an update must not be lost) until the watcher or the connection
        goes away."""
        while True:
            self._check_watcher(watcher)
            try:
                await self.write_limited([command], self.limiter.dual)
            except LimitFailed as exc:
                await self._retry_later(watcher, "writing", exc)
                continue
            self.backoff.reset()
            return

    async def _send_updates(self, watcher: _Watcher):
        """The pending change as one update at a time, each under the
        watchers' budget (the set grows first) and the direct limiter."""
        try:
            await self._update_loop(watcher)
        except (PermitAcquireError, protocol.RequestError, ConnectionError, OSError):
            pass   # the watcher or its connection closed

    async def _update_loop(self, watcher: _Watcher):
        while not watcher.closed:
            await watcher.wake.wait()
            watcher.wake.clear()
            if not watcher.pending:
                continue
            added, removed = watcher.take()
            cost = watcher.cost + protocol.estimate_heap(added) - protocol.estimate_heap(removed)
            while cost > watcher.cost:
                try:
                    await self._watcher_memory(watcher, cost)
                except LimitFailed as exc:
                    await self._retry_later(watcher, "growing", exc)
            watcher.topics.update(added)
            watcher.topics.difference_update(removed)
            if cost < watcher.cost:
                await self._watcher_memory(watcher, cost)     # shrinking: at once
            update = await self.step(_watch_update, watcher, added, removed)
            del added, removed
            await self._write_retrying(watcher, update)
            del update

    def _drop_watcher(self, watcher: _Watcher):
        """Forget a watcher and let go of everything it holds at once."""
        watcher.closed = True
        if self.watchers.get(watcher.id) is watcher:
            del self.watchers[watcher.id]
        self.service.store.listeners.discard(watcher.on_change)
        sender, watcher.sender = watcher.sender, None
        if sender is not None:
            sender.cancel()
        if watcher.permit is not None:
            self.service.watcher_memory.release(watcher.permit)
        watcher.topics, watcher.pending, watcher.early = set(), {}, None


def _list_response(req: ListRequest, topics: list) -> protocol.BaseCommand:
    digest = protocol.topics_hash(topics)
    changed = req.topics_hash != digest
    return protocol.cmd(CommandType.GET_TOPICS_OF_NAMESPACE_RESPONSE,
                        "getTopicsOfNamespaceResponse", request_id=req.request_id,
                        topics=topics if changed else [], filtered=req.pattern is not None,
                        topics_hash=digest, changed=changed)


def _watch_success(request_id: int, watcher: _Watcher, client_hash: Optional[str]
                   ) -> protocol.BaseCommand:
    matching = sorted(watcher.topics)
    digest = protocol.topics_hash(matching)
    if client_hash == digest:
        matching = []
    return protocol.cmd(CommandType.WATCH_TOPIC_LIST_SUCCESS, "watchTopicListSuccess",
                        request_id=request_id, watcher_id=watcher.id, topic=matching,
                        topics_hash=digest)


def _watch_update(watcher: _Watcher, added: list, removed: list) -> protocol.BaseCommand:
    return protocol.cmd(CommandType.WATCH_TOPIC_UPDATE, "watchTopicUpdate",
                        watcher_id=watcher.id, new_topics=added, deleted_topics=removed,
                        topics_hash=protocol.topics_hash(watcher.topics))
