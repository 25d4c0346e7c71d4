"""OpenTelemetry metrics for any semaphore or dual memory limiter (extra
``[otel]``: the API; the SDK and its exporters are the application's).

::

    from opentelemetry import metrics
    from pylimiter.otel import instrument

    instrument(limiter, metrics.get_meter("myapp"), "myapp_uploads")

The instruments carry the names of the Prometheus collector's samples
(``pylimiter.prometheus``), ``_`` separated, so dashboards and alerts work
unchanged whichever way the numbers leave the process.  Every value is read
from the limiter's ``stats()`` when the SDK collects: nothing runs on the
acquire path.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Iterable

from . import _admission as adm
from ._common import LimitType

try:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation
except ImportError as exc:  # pragma: no cover - depends on the install
    raise adm.missing_extra("otel", "otel", exc) from exc

__all__ = ["instrument"]

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_POOLS = ((LimitType.HEAP_MEMORY, "heap"), (LimitType.DIRECT_MEMORY, "direct"))


def _le(bound: float) -> str:
    """A bucket's bound as the Prometheus collector writes it."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def instrument(limiter: Any, meter: Meter, name: str) -> list:
    """Register observable instruments for ``limiter`` on ``meter`` under
    the metric names of ``LimiterCollector().track(name, limiter)``'s
    samples, and return them.

    A semaphore (``AsyncSemaphore``, ``SharedSemaphore``) gets gauges
    ``<name>_permits_used``, ``_permits_limit`` (0: unbounded),
    ``_queue_size``, ``_queue_max_size`` (0: unbounded) and monotonic
    counters ``<name>_acquired_total``, ``_timeout_total``,
    ``_queue_full_total``, ``_cancelled_total``; its wait-time histogram is
    three monotonic counters, as Prometheus exposes it:
    ``<name>_wait_seconds_bucket`` (attribute ``le``), ``_count``, ``_sum``.

    A dual memory limiter gets, per pool (``heap``, ``direct``),
    PIP-442's names: gauges ``<name>_<pool>_memory_used_bytes``,
    ``_memory_limit_bytes``, ``_queue_size``, ``_queue_max_size``; counters
    ``<name>_<pool>_timeout_total``, ``_queue_full_total``,
    ``_cancelled_total``, ``_acquired_total``; and
    ``<name>_<pool>_wait_time_ms_bucket``/``_count``/``_sum`` (milliseconds).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"pylimiter: invalid metric name {name!r}")
    if adm.is_dual(limiter):
        out: list = []
        for limit_type, pool in _POOLS:
            sem = limiter.get_limiter(limit_type)
            out += _instruments(meter, f"{name}_{pool}_", sem.stats, _pool_names(pool))
        return out
    stats = getattr(limiter, "stats", None)
    if not callable(stats) or not hasattr(type(limiter), "max_permits"):
        raise TypeError("pylimiter: limiter must be a semaphore or a dual memory limiter, "
                        f"not {type(limiter).__name__}")
    return _instruments(meter, f"{name}_", stats, _SEMAPHORE_NAMES)


#: (suffix, kind, stats field, description, unit); kind: g gauge, c counter.
_SEMAPHORE_NAMES = (
    ("permits_used", "g", "acquired_permits", "Permits held now", ""),
    ("permits_limit", "g", "max_permits", "Most permits held at once (0: unbounded)", ""),
    ("queue_size", "g", "queue_size", "Requests waiting for permits", ""),
    ("queue_max_size", "g", "max_queue_size", "Most requests that may wait (0: unbounded)", ""),
    ("acquired_total", "c", "acquired_total", "Requests granted", ""),
    ("timeout_total", "c", "timeout_total", "Requests that timed out waiting", ""),
    ("queue_full_total", "c", "queue_full_total", "Requests refused by a full queue", ""),
    ("cancelled_total", "c", "cancelled_total", "Requests cancelled while waiting", ""),
    ("wait_seconds", "h", 1.0, "Time from request to grant, seconds", ""),
)


def _pool_names(pool: str) -> tuple:
    return (
        ("memory_used_bytes", "g", "acquired_permits", f"Current {pool} memory used", "By"),
        ("memory_limit_bytes", "g", "max_permits",
         f"Configured {pool} memory limit (0: disabled)", "By"),
        ("queue_size", "g", "queue_size", f"Current {pool} memory limiter queue size", ""),
        ("queue_max_size", "g", "max_queue_size",
         f"Maximum {pool} memory limiter queue size (0: unbounded)", ""),
        ("timeout_total", "c", "timeout_total", f"Total {pool} memory permit timeouts", ""),
        ("queue_full_total", "c", "queue_full_total",
         f"Total {pool} memory requests refused by a full queue", ""),
        ("cancelled_total", "c", "cancelled_total",
         f"Total {pool} memory requests cancelled", ""),
        ("acquired_total", "c", "acquired_total", f"Total {pool} memory permits granted", ""),
        ("wait_time_ms", "h", 1000.0, f"Wait time for {pool} memory permits, milliseconds", ""),
    )


def _instruments(meter: Meter, prefix: str, stats: Callable[[], Any], names: tuple) -> list:
    out = []
    for suffix, kind, field, doc, unit in names:
        if kind == "h":
            scale = field
            for part, cb in (("bucket", _buckets(stats, scale)), ("count", _count(stats)),
                             ("sum", _sum(stats, scale))):
                out.append(meter.create_observable_counter(
                    f"{prefix}{suffix}_{part}", callbacks=[cb], description=doc))
            continue
        cb = _field(stats, field)
        create = meter.create_observable_gauge if kind == "g" \
            else meter.create_observable_counter
        out.append(create(prefix + suffix, callbacks=[cb], description=doc, unit=unit))
    return out


def _field(stats: Callable[[], Any], field: str) -> Callable[[CallbackOptions],
                                                            Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        # Limits and queue bounds <= 0 mean "none": exported as 0, as the
        # Prometheus collector does.
        return [Observation(max(getattr(stats(), field), 0))]
    return observe


def _buckets(stats: Callable[[], Any], scale: float) -> Callable[[CallbackOptions],
                                                                 Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(count, {"le": _le(bound * scale)})
                for bound, count in stats().wait_seconds_buckets]
    return observe


def _count(stats: Callable[[], Any]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(stats().wait_seconds_count)]
    return observe


def _sum(stats: Callable[[], Any], scale: float) -> Callable[[CallbackOptions],
                                                             Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(stats().wait_seconds_sum * scale)]
    return observe
