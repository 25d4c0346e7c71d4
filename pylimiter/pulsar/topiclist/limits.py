"""PIP-442 configuration and the dual memory limiter built from it (with the
service's accounting: caps, peaks, live limit changes).

Each setting is declared once, as a field of TopicListConfig made by
pylimiter.spark.settings.setting (Pulsar key, unit, help, range); the
config-file reader, the command-line flags, the start-up line and the admin
API are all derived from those fields.  The metrics come from
pylimiter.prometheus (see server.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from pylimiter import (
    MAX_PERMITS,
    AsyncDualMemoryLimiter,
    AsyncSemaphore,
    LimitType,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
)

from ...spark.settings import ConfigError, Settings, setting

MB = 1024 * 1024
HEAP, DIRECT = LimitType.HEAP_MEMORY, LimitType.DIRECT_MEMORY
POOL_NAMES = {HEAP: "heap", DIRECT: "direct"}
#: The largest pool the limiter can count, in MB.
MAX_POOL_MB = MAX_PERMITS // MB


@dataclass(frozen=True)
class TopicListConfig(Settings):
    """The six PIP-442 settings, three Pulsar service settings the
    topic-list service honours, and the guards that keep one client from
    starving the others or growing memory past the budgets (issue 19).
    Sizes in MB (decimals allowed, so tests can use kilobyte limits; Pulsar
    itself takes integers); 0 disables that limit.  Queue defaults follow the
    issue (10000); the PIP text says 1000.  Every other value is an integer,
    as in Pulsar."""

    KEY_FAMILIES = ("maxTopicList",)

    heap_mb: float = setting("maxTopicListInFlightHeapMemSizeMB", 100.0, "MB",
                             "heap memory for topic lists in flight (0 disables)",
                             group="limits", maximum=MAX_POOL_MB)
    direct_mb: float = setting("maxTopicListInFlightDirectMemSizeMB", 100.0, "MB",
                               "direct memory for responses being written (0 disables)",
                               group="limits", maximum=MAX_POOL_MB)
    heap_timeout_ms: int = setting(
        "maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMillis", 25000, "ms",
        "longest wait for heap permits", group="limits")
    direct_timeout_ms: int = setting(
        "maxTopicListInFlightDirectMemSizePermitsAcquireTimeoutMillis", 25000, "ms",
        "longest wait for direct permits", group="limits")
    heap_queue: int = setting("maxTopicListInFlightHeapMemSizePermitsAcquireQueueSize",
                              10000, "requests",
                              "most requests waiting for heap permits (0: unbounded)",
                              group="limits")
    direct_queue: int = setting("maxTopicListInFlightDirectMemSizePermitsAcquireQueueSize",
                                10000, "requests",
                                "most requests waiting for direct permits (0: unbounded)",
                                group="limits")
    max_message_size: int = setting(
        "maxMessageSize", 5 * MB, "bytes",
        "largest message; a frame from a client may carry 10 KiB more, larger frames "
        "close the connection", group="service")
    pattern_max_length: int = setting(
        "subscriptionPatternMaxLength", 50, "chars",
        "longest topics pattern evaluated (longer: listed unfiltered, watch refused)",
        group="service")
    keep_alive_s: int = setting(
        "keepAliveIntervalSeconds", 30, "s",
        "ping a connection idle this long, close it if still silent after as long "
        "again (0 disables)", group="service")
    # ---- guards against hostile clients (not Pulsar settings) -------------------
    requests_per_connection: int = setting(
        "maxTopicListRequestsPerConnection", 32, "requests",
        "topic-list requests (listings, watch creations) one connection may have in "
        "flight; more are answered TooManyRequests at once", group="guards", minimum=1)
    write_timeout_ms: int = setting(
        "connectionWriteTimeoutMillis", 30000, "ms",
        "close a connection whose pending output has not drained for this long; its "
        "permits return", group="guards", minimum=1)
    inbound_mb: float = setting(
        "maxInboundFrameMemSizeMB", 64.0, "MB",
        "memory for frames being received, across connections: a frame over 16 KiB "
        "waits for it, and its connection closes if it cannot be had (0 disables)",
        group="guards", maximum=MAX_POOL_MB)
    watchers_mb: float = setting(
        "maxTopicListWatchersMemSizeMB", 100.0, "MB",
        "memory for the topic sets that watchers keep, across connections; a watcher "
        "waits for it as for heap permits (0 disables)", group="guards",
        maximum=MAX_POOL_MB)
    watchers_per_connection: int = setting(
        "maxTopicListWatchersPerConnection", 100, "watchers",
        "watchers one connection may hold; more are refused with NotAllowedError",
        group="guards", minimum=1)
    consumers_per_connection: int = setting(
        "maxConsumersPerConnection", 10000, "consumers",
        "consumers one connection may subscribe; more are refused with NotAllowedError",
        group="guards", minimum=1)
    lookups_per_connection: int = setting(
        "maxLookupRequestsPerConnection", 1000, "requests",
        "lookups and partition-metadata requests one proxy connection may have "
        "forwarded and unanswered; more are answered TooManyRequests at once",
        group="guards", minimum=1)
    name_max_length: int = setting(
        "topicNameMaxLength", 1024, "chars",
        "longest topic, namespace or subscription name accepted (longer: "
        "InvalidTopicName, nothing kept)", group="guards", minimum=1)

    def __post_init__(self):
        super().__post_init__()
        if self.max_message_size < 1:
            raise ConfigError("max_message_size must be at least 1 byte")

    @property
    def heap_bytes(self) -> int:
        """The heap pool in bytes (0: disabled)."""
        return mb_to_bytes(self.heap_mb)

    @property
    def direct_bytes(self) -> int:
        """The direct pool in bytes (0: disabled)."""
        return mb_to_bytes(self.direct_mb)

    @property
    def inbound_bytes(self) -> int:
        """The inbound frame budget in bytes (0: disabled)."""
        return mb_to_bytes(self.inbound_mb)

    @property
    def watchers_bytes(self) -> int:
        """The watchers' budget in bytes (0: disabled)."""
        return mb_to_bytes(self.watchers_mb)

    def describe(self) -> str:
        """One line with every setting and its unit (the start-up print)."""
        return super().describe() + " (0 MB: disabled)"


def mb_to_bytes(mb: float) -> int:
    """A size in MB as bytes; a positive size never rounds down to 0, which
    would disable the limit."""
    return max(1, int(mb * MB)) if mb > 0 else 0


class LimitFailed(Exception):
    """A permit wait failed: answered with TooManyRequests."""


def too_many_requests_message(pool: LimitType, exc: Exception) -> str:
    """Pulsar's TooManyRequests text for a failed wait on a pool."""
    what = POOL_NAMES[pool]
    if isinstance(exc, PermitAcquireTimeoutError):
        return f"Failed due to timeout acquiring {what} memory permits for topic list"
    return f"Failed due to {what} memory permit queue being full for topic list"


def _limits_change_in_place() -> bool:
    """Whether this pylimiter core switches a semaphore between unbounded
    and bounded in place (core v2's set_max_permits contract: n <= 0
    unbounded, n > 0 bounded, held permits carry over).  Tried once, on a
    throwaway semaphore."""
    try:
        probe = AsyncSemaphore(0)
        probe.set_max_permits(1)
        if probe.max_permits != 1:
            return False
        probe.set_max_permits(0)
        return probe.max_permits <= 0
    except (ValueError, TypeError):
        return False


#: True when limits change in place, including 0 <-> N (no second limiter).
IN_PLACE_LIMITS = _limits_change_in_place()


class TopicListLimiter:
    """The AsyncDualMemoryLimiter of one broker or proxy, its limits
    changeable at run time, and the accounting every request goes through
    (caps, the TooManyRequests mapping, peaks).

    A size change adjusts the live pools (set_max_permits).  On a core that
    cannot switch a pool between unbounded and bounded in place (see
    IN_PLACE_LIMITS), turning a limit on or off builds a new limiter
    instead; requests in flight keep and release their permits on the
    limiter they came from, so every method takes the request's own
    `dual`."""

    def __init__(self, config: TopicListConfig):
        self.config = config
        self.dual = self._build(config)
        #: highest permits held at once, per pool name
        self.peak = {"heap": 0, "direct": 0}

    @staticmethod
    def _build(c: TopicListConfig) -> AsyncDualMemoryLimiter:
        return AsyncDualMemoryLimiter(
            c.heap_bytes, c.direct_bytes,
            heap_max_queue_size=int(c.heap_queue), direct_max_queue_size=int(c.direct_queue),
            heap_timeout=c.heap_timeout_ms / 1000.0, direct_timeout=c.direct_timeout_ms / 1000.0)

    def cap(self, pool: LimitType, n: int, dual: AsyncDualMemoryLimiter) -> int:
        """A request larger than a whole pool takes the whole pool: it can
        still be served, alone."""
        m = dual.get_limiter(pool).max_permits
        return min(n, m) if m > 0 else n

    def note_peak(self, pool: LimitType, dual: AsyncDualMemoryLimiter) -> None:
        """Called at every grant: a pool's use only rises at its own grants,
        so this sees every peak.  One property read, not a stats snapshot,
        since it is on every request's path."""
        key = POOL_NAMES[pool]
        self.peak[key] = max(self.peak[key], dual.get_limiter(pool).acquired_permits)

    async def granted(self, pool: LimitType, dual: AsyncDualMemoryLimiter, make_wait):
        """Await the permit wait `make_wait()` builds; a timeout or a full
        queue becomes LimitFailed (answered TooManyRequests).  A queued
        request that a lowered limit made too large (the limiter fails it
        with ValueError) queues again, capped by the new limit: it was valid
        when it came.  The grant is counted in the pool's peak."""
        sem = dual.get_limiter(pool)
        while True:
            limit = sem.max_permits
            try:
                permit = await make_wait()
            except (PermitAcquireTimeoutError, PermitAcquireQueueFullError) as exc:
                raise LimitFailed(too_many_requests_message(pool, exc)) from exc
            except ValueError:
                if sem.max_permits == limit:
                    raise
                continue
            self.note_peak(pool, dual)
            return permit

    async def acquire(self, pool: LimitType, n: int, dual: AsyncDualMemoryLimiter, is_cancelled):
        """A permit of n bytes (capped) from `pool`; raises LimitFailed."""
        return await self.granted(pool, dual, lambda: dual.acquire(
            self.cap(pool, n, dual), pool, is_cancelled=is_cancelled))

    async def update(self, permit, n: int, dual: AsyncDualMemoryLimiter, is_cancelled):
        """Resize a permit to n bytes (capped); raises LimitFailed."""
        pool = permit.limit_type
        return await self.granted(pool, dual, lambda: dual.update(
            permit, self.cap(pool, n, dual), is_cancelled=is_cancelled))

    def set_limits(self, heap_mb: Optional[float] = None, direct_mb: Optional[float] = None):
        """Change the pool sizes (MB, 0 disables); ConfigError if a value is
        not a size.  In place where the core allows it, see the class."""
        new = replace(self.config,
                      heap_mb=self.config.heap_mb if heap_mb is None else heap_mb,
                      direct_mb=self.config.direct_mb if direct_mb is None else direct_mb)
        old = self.config
        pairs = ((HEAP, old.heap_bytes, new.heap_bytes),
                 (DIRECT, old.direct_bytes, new.direct_bytes))
        if IN_PLACE_LIMITS or all((o > 0) == (n > 0) for _, o, n in pairs):
            for t, o, n in pairs:
                if n != o:
                    self.dual.get_limiter(t).set_max_permits(n)
        else:
            self.dual = self._build(new)
        self.config = new

    def snapshot(self) -> dict:
        """Per pool: use, limit (0: none), queue and counters, and the
        waits: grants that queued (`waited`; an immediate grant counts as a
        0 s wait, so these are the ones over the histogram's first bound,
        0.1 ms), their total (`wait_s`) and the histogram's bound under
        which 99% of all grants fall (`wait_p99_le_s`, None with no
        grant)."""
        out = {}
        for t, name in POOL_NAMES.items():
            s = self.dual.get_limiter(t).stats()
            buckets = s.wait_seconds_buckets
            out[name] = {"used": s.acquired_permits, "limit": max(s.max_permits, 0),
                         "queue": s.queue_size, "queue_max": max(s.max_queue_size, 0),
                         "timeouts": s.timeout_total, "queue_full": s.queue_full_total,
                         "granted": s.acquired_total,
                         "waited": s.wait_seconds_count - (buckets[0][1] if buckets else 0),
                         "wait_s": s.wait_seconds_sum,
                         "wait_p99_le_s": _quantile_bound(buckets, s.wait_seconds_count, 0.99)}
        return out


def _quantile_bound(buckets, count: int, q: float) -> Optional[float]:
    """The least histogram bound under which a share q of the observations
    fall (cumulative buckets); None without observations, and None too for
    the +Inf bucket (JSON has no infinity)."""
    if count <= 0:
        return None
    need = q * count
    for bound, n in buckets:
        if n >= need:
            return None if bound == float("inf") else bound
    return None
