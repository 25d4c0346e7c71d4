"""Prometheus metrics for any AsyncSemaphore or AsyncDualMemoryLimiter, and
for the host-wide SharedSemaphore and SharedDualMemoryLimiter, whose values
are the host's (every process's permits, one set of counters)
(the ``prometheus`` extra: ``pip install '.[prometheus]'`` from a checkout).

::

    from prometheus_client import REGISTRY
    from pylimiter.prometheus import LimiterCollector

    metrics = LimiterCollector("myapp")
    metrics.track("db", sem)          # myapp_db_permits_used, myapp_db_wait_seconds ...
    metrics.track("uploads", dual)    # myapp_uploads_heap_memory_used_bytes ...
    REGISTRY.register(metrics)

Every value is read from the limiter's own ``stats()`` at scrape time, so
there is no second set of counters to drift from the truth and nothing runs
on the acquire path.  A limiter's name is part of its metric names, the way
Pulsar names its PIP-442 metrics; limiters tracked under one name with
different ``labels`` share those families.

Per semaphore ``<ns>_<name>_``: gauges ``permits_used``, ``permits_limit``
(0: unbounded), ``queue_size``, ``queue_max_size`` (0: unbounded); counters
``acquired_total``, ``timeout_total``, ``queue_full_total``,
``cancelled_total``; histogram ``wait_seconds`` (every grant, immediate ones
as 0 s).

Per dual limiter pool (``heap``, ``direct``) ``<ns>_<name>_<pool>_``, PIP-442's
names: gauges ``memory_used_bytes``, ``memory_limit_bytes``, ``queue_size``,
``queue_max_size``; histogram ``wait_time_ms``; counters ``timeout_total``,
and ``queue_full_total``, ``cancelled_total``, ``acquired_total``.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping as _MappingABC
from typing import Any, Callable, Iterator, Mapping, Optional, Union

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )
except ImportError as exc:  # pragma: no cover - depends on the install
    from ._extras import install_hint

    raise ImportError(f"pylimiter.prometheus needs prometheus_client ({exc}); "
                      f"{install_hint('prometheus')}") from exc

from ._common import LimitType, uninitialised_error
from ._dual import DualMemoryLimiterBase

__all__ = ["LimiterCollector"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_POOLS = ((LimitType.HEAP_MEMORY, "heap"), (LimitType.DIRECT_MEMORY, "direct"))

#: A limiter, or a function returning the one to read now (None: skip it).
Source = Union[Any, Callable[[], Any]]


def _is_limiter(obj) -> bool:
    # Looked up on the type: an instance's own __getattr__ never runs.
    tp = type(obj)
    return isinstance(obj, DualMemoryLimiterBase) or (
        hasattr(tp, "stats") and hasattr(tp, "max_permits"))


def _exact_str(value, what: str) -> str:
    """A str argument as a plain str: a subclass's own __eq__, __hash__ or
    __str__ never runs inside the collector (or the scrape)."""
    if not isinstance(value, str):
        raise TypeError(f"pylimiter: {what} must be a str, not {type(value).__name__}")
    return str.__str__(value)


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


class _Families:
    """The families of one tracked name, filled entry by entry."""

    def __init__(self, prefix: str, label_names: list[str]):
        self.prefix, self.label_names = prefix, label_names
        self.out: dict[str, Any] = {}

    def add(self, kind, suffix: str, doc: str, values: list[str], *args, **kw) -> None:
        """Add one sample set to the family `suffix`, creating it once."""
        full = self.prefix + suffix
        fam = self.out.get(full)
        if fam is None:
            fam = self.out[full] = kind(full, doc, labels=self.label_names)
        fam.add_metric(values, *args, **kw)


class LimiterCollector:
    """A prometheus_client collector for semaphores and dual limiters.

    ``namespace`` prefixes every metric name; ``labels`` are constant
    labels on every sample (``{"cluster": "east"}``).  Register it with a
    ``CollectorRegistry`` (or ``prometheus_client.REGISTRY``)."""

    def __init__(self, namespace: str = "", *, labels: Optional[Mapping[str, str]] = None):
        namespace = _exact_str(namespace, "namespace")
        if namespace and not _NAME.match(namespace):
            raise ValueError(f"pylimiter: invalid metric namespace {namespace!r}")
        self.namespace = namespace
        self.labels = self._check_labels(labels)
        self._lock = threading.Lock()
        # name -> {label values: (source, labels)}; name -> label names
        self._tracked: dict[str, dict[tuple, tuple[Source, dict]]] = {}
        self._label_names: dict[str, tuple[str, ...]] = {}
        self._ready = True

    def __new__(cls, *args: Any, **kwargs: Any) -> "LimiterCollector":
        # A collector made by __new__ alone refuses every call.
        self = super().__new__(cls)
        self._ready = False
        return self

    def _check_ready(self) -> None:
        if not self._ready:
            raise uninitialised_error(self)

    @staticmethod
    def _check_labels(labels) -> dict:
        if labels is None:
            return {}
        if not isinstance(labels, _MappingABC):
            raise TypeError(f"pylimiter: labels must be a mapping, not {type(labels).__name__}")
        out = {}
        for k, v in list(labels.items()):
            if not isinstance(k, str):
                raise ValueError(f"pylimiter: invalid label name of type {type(k).__name__}")
            k = str.__str__(k)
            if not _LABEL.match(k) or k.startswith("__"):
                raise ValueError(f"pylimiter: invalid label name {k!r}")
            if not isinstance(v, str):
                raise TypeError(f"pylimiter: label {k} must be a str, not {type(v).__name__}")
            out[k] = str.__str__(v)
        return out

    def track(self, name: str, limiter: Source, *,
              labels: Optional[Mapping[str, str]] = None) -> None:
        """Expose `limiter` (an AsyncSemaphore, AsyncDualMemoryLimiter,
        SharedSemaphore or SharedDualMemoryLimiter of either implementation,
        or a function returning the one to read at each scrape) under `name`;
        tracking the same name and labels again replaces it."""
        if not isinstance(name, str):
            raise ValueError(f"pylimiter: invalid metric name part of type {type(name).__name__}")
        name = str.__str__(name)
        if not _NAME.match(name):
            raise ValueError(f"pylimiter: invalid metric name part {name!r}")
        if not (_is_limiter(limiter) or callable(limiter)):
            raise TypeError("pylimiter: expected an AsyncSemaphore, an AsyncDualMemoryLimiter "
                            f"or a function returning one, not {type(limiter).__name__}")
        extra = self._check_labels(labels)
        clash = set(extra) & set(self.labels)
        if clash:
            raise ValueError(f"pylimiter: labels {sorted(clash)} are the collector's own")
        keys = tuple(sorted(extra))
        self._check_ready()
        with self._lock:
            known = self._label_names.setdefault(name, keys)
            if known != keys:
                raise ValueError(f"pylimiter: {name} is tracked with labels {list(known)}, "
                                 f"not {list(keys)}")
            self._tracked.setdefault(name, {})[tuple(extra[k] for k in keys)] = (limiter, extra)

    def untrack(self, name: str, *, labels: Optional[Mapping[str, str]] = None) -> None:
        """Stop exposing what `track(name, ..., labels=labels)` added
        (KeyError if nothing was)."""
        name = _exact_str(name, "name")
        extra = self._check_labels(labels)
        self._check_ready()
        with self._lock:
            keys = self._label_names[name]
            del self._tracked[name][tuple(extra.get(k) for k in keys)]
            if not self._tracked[name]:
                del self._tracked[name], self._label_names[name]

    def collect(self) -> Iterator:
        """The metric families, from one stats() snapshot per semaphore."""
        self._check_ready()
        with self._lock:
            tracked = [(n, list(e.values()), self._label_names[n])
                       for n, e in self._tracked.items()]
        for name, entries, keys in tracked:
            prefix = f"{self.namespace}_{name}_" if self.namespace else f"{name}_"
            fams = _Families(prefix, list(self.labels) + list(keys))
            for source, extra in entries:
                limiter = source if _is_limiter(source) else source()
                if limiter is None:
                    continue
                if not _is_limiter(limiter):
                    raise TypeError(
                        f"pylimiter: the source of {name} returned a "
                        f"{type(limiter).__name__}, not a semaphore or limiter")
                values = list(self.labels.values()) + [extra[k] for k in keys]
                if isinstance(limiter, DualMemoryLimiterBase):
                    for t, pool in _POOLS:
                        _pool(fams, pool, limiter.get_limiter(t).stats(), values)
                else:
                    _semaphore(fams, limiter.stats(), values)
            yield from fams.out.values()


def _semaphore(fams: _Families, s, values) -> None:
    for suffix, value, doc in (
        ("permits_used", s.acquired_permits, "Permits held now"),
        ("permits_limit", max(s.max_permits, 0), "Most permits held at once (0: unbounded)"),
        ("queue_size", s.queue_size, "Requests waiting for permits"),
        ("queue_max_size", max(s.max_queue_size, 0),
         "Most requests that may wait (0: unbounded)"),
    ):
        fams.add(GaugeMetricFamily, suffix, doc, values, value)
    for suffix, value, doc in (
        ("acquired", s.acquired_total, "Requests granted"),
        ("timeout", s.timeout_total, "Requests that timed out waiting"),
        ("queue_full", s.queue_full_total, "Requests refused by a full queue"),
        ("cancelled", s.cancelled_total, "Requests cancelled while waiting"),
    ):
        fams.add(CounterMetricFamily, suffix, doc, values, value)
    fams.add(HistogramMetricFamily, "wait_seconds", "Time from request to grant", values,
             [(_le(b), c) for b, c in s.wait_seconds_buckets], sum_value=s.wait_seconds_sum)


def _pool(fams: _Families, pool: str, s, values) -> None:
    for suffix, value, doc in (
        ("memory_used_bytes", s.acquired_permits, f"Current {pool} memory used"),
        ("memory_limit_bytes", max(s.max_permits, 0),
         f"Configured {pool} memory limit (0: disabled)"),
        ("queue_size", s.queue_size, f"Current {pool} memory limiter queue size"),
        ("queue_max_size", max(s.max_queue_size, 0),
         f"Maximum {pool} memory limiter queue size (0: unbounded)"),
    ):
        fams.add(GaugeMetricFamily, f"{pool}_{suffix}", doc, values, value)
    fams.add(HistogramMetricFamily, f"{pool}_wait_time_ms",
             f"Wait time for {pool} memory permits", values,
             [(_le(b * 1000.0), c) for b, c in s.wait_seconds_buckets],
             sum_value=s.wait_seconds_sum * 1000.0)
    for suffix, value, doc in (
        ("timeout", s.timeout_total, f"Total {pool} memory permit timeouts"),
        ("queue_full", s.queue_full_total, f"Total {pool} memory requests refused by a full queue"),
        ("cancelled", s.cancelled_total, f"Total {pool} memory requests cancelled"),
        ("acquired", s.acquired_total, f"Total {pool} memory permits granted"),
    ):
        fams.add(CounterMetricFamily, f"{pool}_{suffix}", doc, values, value)
