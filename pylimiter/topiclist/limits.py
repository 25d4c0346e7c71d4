"""PIP-442 configuration, the dual memory limiter built from it, and its
twelve Prometheus metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Optional

from .. import AsyncDualMemoryLimiter, LimitType

MB = 1024 * 1024

# broker.conf key -> (field, default).  Sizes in MB (decimals allowed, so
# tests can use kilobyte limits; Pulsar itself takes integers); 0 disables
# that limit.  Queue defaults follow the issue (10000); the PIP text says 1000.
KEYS = {
    "maxTopicListInFlightHeapMemSizeMB": ("heap_mb", 100.0),
    "maxTopicListInFlightDirectMemSizeMB": ("direct_mb", 100.0),
    "maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMillis": ("heap_timeout_ms", 25000),
    "maxTopicListInFlightDirectMemSizePermitsAcquireTimeoutMillis": ("direct_timeout_ms", 25000),
    "maxTopicListInFlightHeapMemSizePermitsAcquireQueueSize": ("heap_queue", 10000),
    "maxTopicListInFlightDirectMemSizePermitsAcquireQueueSize": ("direct_queue", 10000),
}


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class TopicListConfig:
    heap_mb: float = 100.0
    direct_mb: float = 100.0
    heap_timeout_ms: int = 25000
    direct_timeout_ms: int = 25000
    heap_queue: int = 10000
    direct_queue: int = 10000

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

    @classmethod
    def from_properties(cls, path: Path, base: Optional["TopicListConfig"] = None
                        ) -> "TopicListConfig":
        """Read the six keys from a broker.conf-style file (key=value, '#'
        comments); other keys are ignored, as a broker.conf holds many."""
        values = {}
        for n, raw in enumerate(Path(path).read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                key, sep, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key not in KEYS:
                continue
            name, default = KEYS[key]
            try:
                values[name] = type(default)(float(value)) if isinstance(default, int) \
                    else float(value)
            except ValueError:
                raise ConfigError(f"{path}:{n}: {key} must be a number, not {value!r}") from None
        return replace(base or cls(), **values)


class TopicListLimiter:
    """The AsyncDualMemoryLimiter of one broker or proxy, replaceable at run
    time.  Changing a size between two non-zero values adjusts the live pool
    (set_max_permits); turning a limit on or off builds a new limiter, since a
    disabled (unbounded) pool has no limit to adjust.  Requests in flight
    keep and release their permits on the limiter they came from."""

    def __init__(self, config: TopicListConfig):
        self.config = config
        self.dual = self._build(config)

    @staticmethod
    def _build(c: TopicListConfig) -> AsyncDualMemoryLimiter:
        return AsyncDualMemoryLimiter(
            c.heap_bytes, c.direct_bytes,
            heap_max_queue_size=int(c.heap_queue), direct_max_queue_size=int(c.direct_queue),
            heap_timeout=c.heap_timeout_ms / 1000.0, direct_timeout=c.direct_timeout_ms / 1000.0)

    def set_limits(self, heap_mb: Optional[float] = None, direct_mb: Optional[float] = None):
        new = replace(self.config,
                      heap_mb=self.config.heap_mb if heap_mb is None else heap_mb,
                      direct_mb=self.config.direct_mb if direct_mb is None else direct_mb)
        old = self.config
        live = all((o > 0) == (n > 0) for o, n in
                   ((old.heap_bytes, new.heap_bytes), (old.direct_bytes, new.direct_bytes)))
        if live:
            for t, o, n in ((LimitType.HEAP_MEMORY, old.heap_bytes, new.heap_bytes),
                            (LimitType.DIRECT_MEMORY, old.direct_bytes, new.direct_bytes)):
                if n > 0 and n != o:
                    self.dual.get_limiter(t).set_max_permits(n)
        else:
            self.dual = self._build(new)
        self.config = new

    def snapshot(self) -> dict:
        out = {}
        for name, t in (("heap", LimitType.HEAP_MEMORY), ("direct", LimitType.DIRECT_MEMORY)):
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
        for name, t in (("heap", LimitType.HEAP_MEMORY), ("direct", LimitType.DIRECT_MEMORY)):
            s = self.limiter.dual.get_limiter(t).stats()
            what = "heap" if name == "heap" else "direct"
            for metric, value, doc in (
                ("memory_used_bytes", s.acquired_permits,
                 f"Current {what} memory used by topic listings"),
                ("memory_limit_bytes", max(s.max_permits, 0),
                 f"Configured {what} memory limit (0: disabled)"),
                ("queue_size", s.queue_size, f"Current {what} memory limiter queue size"),
                ("queue_max_size", max(s.max_queue_size, 0),
                 f"Maximum {what} memory limiter queue size"),
            ):
                g = GaugeMetricFamily(f"{p}{name}_{metric}", doc, labels=["cluster"])
                g.add_metric(lab, value)
                yield g
            h = HistogramMetricFamily(f"{p}{name}_wait_time_ms",
                                      f"Wait time for {what} memory permits", labels=["cluster"])
            h.add_metric(lab, [(_ms(b), c) for b, c in s.wait_seconds_buckets],
                         sum_value=s.wait_seconds_sum * 1000.0)
            yield h
            c = CounterMetricFamily(f"{p}{name}_timeout", f"Total {what} memory permit timeouts",
                                    labels=["cluster"])
            c.add_metric(lab, s.timeout_total)
            yield c


def _ms(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound * 1000.0)
