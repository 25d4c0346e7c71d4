"""PIP-442 configuration, the dual memory limiter built from it (with the
service's accounting: caps and peaks), and its twelve Prometheus metrics.

Each setting is declared once, as a field of TopicListConfig carrying its
Pulsar key, unit and help; the config-file reader, the command-line flags,
the start-up line and the admin API are all derived from those fields.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Optional

from pylimiter import (
    AsyncDualMemoryLimiter,
    LimitType,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
)

MB = 1024 * 1024
HEAP, DIRECT = LimitType.HEAP_MEMORY, LimitType.DIRECT_MEMORY
POOL_NAMES = {HEAP: "heap", DIRECT: "direct"}


class ConfigError(ValueError):
    pass


def setting(key: str, default, unit: str, doc: str):
    """One PIP-442 setting: its broker.conf/proxy.conf key, default, unit
    and help text (the flag is the field name in kebab case)."""
    return field(default=default, metadata={"key": key, "unit": unit, "doc": doc})


@dataclass(frozen=True)
class TopicListConfig:
    """The six PIP-442 settings.  Sizes in MB (decimals allowed, so tests can
    use kilobyte limits; Pulsar itself takes integers); 0 disables that
    limit.  Queue defaults follow the issue (10000); the PIP text says 1000."""

    heap_mb: float = setting("maxTopicListInFlightHeapMemSizeMB", 100.0, "MB",
                             "heap memory for topic lists in flight (0 disables)")
    direct_mb: float = setting("maxTopicListInFlightDirectMemSizeMB", 100.0, "MB",
                               "direct memory for responses being written (0 disables)")
    heap_timeout_ms: int = setting(
        "maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMillis", 25000, "ms",
        "longest wait for heap permits")
    direct_timeout_ms: int = setting(
        "maxTopicListInFlightDirectMemSizePermitsAcquireTimeoutMillis", 25000, "ms",
        "longest wait for direct permits")
    heap_queue: int = setting("maxTopicListInFlightHeapMemSizePermitsAcquireQueueSize",
                              10000, "requests", "most requests waiting for heap permits")
    direct_queue: int = setting("maxTopicListInFlightDirectMemSizePermitsAcquireQueueSize",
                                10000, "requests", "most requests waiting for direct permits")

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or \
                    (isinstance(v, float) and not math.isfinite(v)):
                raise ConfigError(f"{f.name} must be a number >= 0, not {v!r}")

    @property
    def heap_bytes(self) -> int:
        return int(self.heap_mb * MB)

    @property
    def direct_bytes(self) -> int:
        return int(self.direct_mb * MB)

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One line with every setting and its unit (the start-up print)."""
        return ", ".join(f"{f.name} {getattr(self, f.name):g} {f.metadata['unit']}"
                         for f in fields(self)) + " (0 MB: disabled)"

    @classmethod
    def from_properties(cls, path: Path, base: Optional["TopicListConfig"] = None
                        ) -> "TopicListConfig":
        """Read the six keys from a broker.conf-style file (key=value, '#'
        comments); other keys are ignored, as a broker.conf holds many."""
        by_key = {f.metadata["key"]: f for f in fields(cls)}
        values = {}
        for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                key, sep, value = line.partition(":")
            key, value = key.strip(), value.strip()
            f = by_key.get(key)
            if f is None:
                continue
            try:
                values[f.name] = type(f.default)(float(value))
            except ValueError:
                raise ConfigError(f"{path}:{n}: {key} must be a number, not {value!r}") from None
        return replace(base or cls(), **values)


def add_setting_flags(group) -> None:
    """One command-line flag per setting (`--heap-mb` ...), default None so
    that only what is given overrides the config file."""
    for f in fields(TopicListConfig):
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=type(f.default),
                           default=None, metavar=f.metadata["unit"].upper(),
                           help=f"{f.metadata['doc']}; overrides {f.metadata['key']} "
                                f"(default {f.default:g})")


def setting_overrides(namespace) -> dict:
    """The settings given on the command line, by field name."""
    return {f.name: getattr(namespace, f.name) for f in fields(TopicListConfig)
            if getattr(namespace, f.name, None) is not None}


class LimitFailed(Exception):
    """A permit wait failed: answered with TooManyRequests."""


def too_many_requests_message(pool: LimitType, exc: Exception) -> str:
    what = POOL_NAMES[pool]
    if isinstance(exc, PermitAcquireTimeoutError):
        return f"Failed due to timeout acquiring {what} memory permits for topic list"
    return f"Failed due to {what} memory permit queue being full for topic list"


class TopicListLimiter:
    """The AsyncDualMemoryLimiter of one broker or proxy, replaceable at run
    time, and the accounting every request goes through (caps, the
    TooManyRequests mapping, peaks).

    Changing a size between two non-zero values adjusts the live pool
    (set_max_permits); turning a limit on or off builds a new limiter, since
    a disabled (unbounded) pool has no limit to adjust.  Requests in flight
    keep and release their permits on the limiter they came from, so every
    method takes the request's own `dual`."""

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

    async def granted(self, pool: LimitType, dual: AsyncDualMemoryLimiter, wait):
        """Await a permit wait on `pool`; a timeout or a full queue becomes
        LimitFailed (answered TooManyRequests), and the grant is counted in
        the pool's peak."""
        try:
            permit = await wait
        except (PermitAcquireTimeoutError, PermitAcquireQueueFullError) as exc:
            raise LimitFailed(too_many_requests_message(pool, exc)) from exc
        self.note_peak(pool, dual)
        return permit

    async def acquire(self, pool: LimitType, n: int, dual: AsyncDualMemoryLimiter, is_cancelled):
        """A permit of n bytes (capped) from `pool`; raises LimitFailed."""
        return await self.granted(pool, dual, dual.acquire(self.cap(pool, n, dual), pool,
                                                           is_cancelled=is_cancelled))

    async def update(self, permit, n: int, dual: AsyncDualMemoryLimiter, is_cancelled):
        """Resize a permit to n bytes (capped); raises LimitFailed."""
        pool = permit.limit_type
        return await self.granted(pool, dual, dual.update(permit, self.cap(pool, n, dual),
                                                          is_cancelled=is_cancelled))

    def set_limits(self, heap_mb: Optional[float] = None, direct_mb: Optional[float] = None):
        new = replace(self.config,
                      heap_mb=self.config.heap_mb if heap_mb is None else heap_mb,
                      direct_mb=self.config.direct_mb if direct_mb is None else direct_mb)
        old = self.config
        live = all((o > 0) == (n > 0) for o, n in
                   ((old.heap_bytes, new.heap_bytes), (old.direct_bytes, new.direct_bytes)))
        if live:
            for t, o, n in ((HEAP, old.heap_bytes, new.heap_bytes),
                            (DIRECT, old.direct_bytes, new.direct_bytes)):
                if n > 0 and n != o:
                    self.dual.get_limiter(t).set_max_permits(n)
        else:
            self.dual = self._build(new)
        self.config = new

    def snapshot(self) -> dict:
        out = {}
        for t, name in POOL_NAMES.items():
            s = self.dual.get_limiter(t).stats()
            out[name] = {"used": s.acquired_permits, "limit": max(s.max_permits, 0),
                         "queue": s.queue_size, "queue_max": s.max_queue_size,
                         "timeouts": s.timeout_total, "queue_full": s.queue_full_total,
                         "granted": s.acquired_total}
        return out


class LimiterCollector:
    """The seed's twelve metrics, read from the limiter's own stats at scrape
    time (no second set of counters to drift from the truth)."""

    def __init__(self, limiter: TopicListLimiter, prefix: str, cluster: str):
        self.limiter, self.prefix, self.cluster = limiter, prefix, cluster

    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        p, lab = self.prefix, [self.cluster]
        for t, name in POOL_NAMES.items():
            s = self.limiter.dual.get_limiter(t).stats()
            for metric, value, doc in (
                ("memory_used_bytes", s.acquired_permits,
                 f"Current {name} memory used by topic listings"),
                ("memory_limit_bytes", max(s.max_permits, 0),
                 f"Configured {name} memory limit (0: disabled)"),
                ("queue_size", s.queue_size, f"Current {name} memory limiter queue size"),
                ("queue_max_size", max(s.max_queue_size, 0),
                 f"Maximum {name} memory limiter queue size"),
            ):
                g = GaugeMetricFamily(f"{p}{name}_{metric}", doc, labels=["cluster"])
                g.add_metric(lab, value)
                yield g
            h = HistogramMetricFamily(f"{p}{name}_wait_time_ms",
                                      f"Wait time for {name} memory permits", labels=["cluster"])
            h.add_metric(lab, [(_ms(b), c) for b, c in s.wait_seconds_buckets],
                         sum_value=s.wait_seconds_sum * 1000.0)
            yield h
            c = CounterMetricFamily(f"{p}{name}_timeout", f"Total {name} memory permit timeouts",
                                    labels=["cluster"])
            c.add_metric(lab, s.timeout_total)
            yield c


def _ms(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound * 1000.0)
