"""Pieces both implementations share: stats, limit types, argument checks."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

#: The largest max_permits and the largest single request (the C core's
#: PLIM_MAX_PERMITS); bigger values would overflow its 62-bit counter field.
MAX_PERMITS = (1 << 60) - 1
#: What an unbounded semaphore can have handed out at once (PLIM_MAX_ACQUIRED).
MAX_ACQUIRED = (1 << 61) - 1
#: available_permits of an unbounded semaphore.
UNBOUNDED_AVAILABLE = 2**63 - 1

#: Upper bounds (seconds) of the wait-time histogram: prometheus_client's
#: defaults with finer steps at the low end, where immediate grants land.
WAIT_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    60.0,
    math.inf,
)


def bucket_index(seconds: float) -> int:
    """Return the index of the first bucket whose bound is >= seconds."""
    for i, bound in enumerate(WAIT_BUCKETS):
        if seconds <= bound:
            return i
    return len(WAIT_BUCKETS) - 1


@dataclass(frozen=True)
class SemaphoreStats:
    """A consistent snapshot of one semaphore's gauges and counters.

    ``wait_seconds_buckets`` is cumulative, Prometheus style:
    ``((upper_bound_seconds, count_of_waits_<=_bound), ...)`` ending at ``inf``.
    Every grant enters the histogram, immediate ones as 0 seconds.
    """

    max_permits: int
    acquired_permits: int
    available_permits: int
    queue_size: int
    max_queue_size: int
    acquired_total: int
    timeout_total: int
    queue_full_total: int
    cancelled_total: int
    wait_seconds_sum: float
    wait_seconds_count: int
    wait_seconds_buckets: tuple[tuple[float, int], ...]


def cumulative_buckets(counts) -> tuple[tuple[float, int], ...]:
    out = []
    running = 0
    for bound, n in zip(WAIT_BUCKETS, counts):
        running += n
        out.append((bound, running))
    return tuple(out)


class LimitType(enum.Enum):
    """Which pool of an AsyncDualMemoryLimiter a permit draws from."""

    HEAP_MEMORY = "heap"
    DIRECT_MEMORY = "direct"


def check_permits(value, max_permits: int, bounded: bool) -> int:
    """Validate a permit count at the call site; return it as an int."""
    if type(value) is bool or not isinstance(value, int):
        raise TypeError(
            f"pylimiter: permits must be an int, not {type(value).__name__}"
        )
    value = int(value)
    if value < 0:
        raise ValueError(f"Invalid negative permits value: {value}")
    if bounded and value > max_permits:
        raise ValueError(
            f"Requested permits={value} is larger than max_permits={max_permits}"
        )
    if value > MAX_PERMITS:
        raise OverflowError(
            f"pylimiter: permits={value} exceeds the maximum of {MAX_PERMITS}"
        )
    return value


_NO_TIMEOUT = object()


def check_timeout(timeout, default):
    """Resolve the timeout argument: <default> sentinel, None, or seconds >= 0."""
    if timeout is _NO_TIMEOUT:
        return default
    if timeout is None:
        return None
    if type(timeout) is bool or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"pylimiter: timeout must be a number or None, not {type(timeout).__name__}"
        )
    timeout = float(timeout)
    if timeout < 0 or math.isnan(timeout):
        raise ValueError(f"pylimiter: timeout must be >= 0 or None, got {timeout}")
    return timeout


def ask_cancelled(is_cancelled):
    """Evaluate an is_cancelled callable: (cancelled?, exception it raised).
    A check that raises counts as cancelled; the exception becomes the
    __cause__ of the PermitAcquireCancelledError."""
    try:
        return bool(is_cancelled()), None
    except Exception as exc:
        return True, exc


def check_is_cancelled(is_cancelled):
    if is_cancelled is not None and not callable(is_cancelled):
        raise TypeError("pylimiter: is_cancelled must be callable or None")
    return is_cancelled
