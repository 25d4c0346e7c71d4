"""The contract both cache implementations share: the stats record, the
argument checks and their messages, Pulsar's setting names and defaults.

A check or a message lives here once, so the C binding (``_cache_c``) and the
pure-Python twin (``_cache_py``) cannot drift apart; the tests run every case
against both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Pulsar's broker.conf names for the settings this package models, with
#: Pulsar's defaults (the simulator's flags use the same names).
SETTINGS = {
    "managedLedgerCacheSizeMB": "max_size_bytes (MiB in broker.conf)",
    "managedLedgerCacheEvictionWatermark": 0.9,
    "managedLedgerCacheEvictionTimeThresholdMillis": 1000,
    "managedLedgerCacheEvictionIntervalMs": 10,
    "managedLedgerCacheEvictionExtendTTLOfEntriesWithRemainingExpectedReadsMaxTimes": 5,
    "managedLedgerCacheEvictionExtendTTLOfRecentlyAccessed": True,
    "cacheEvictionByExpectedReadCount": True,
}

#: Pulsar's fixed size-eviction trigger (evictionTriggerThresholdPercent).
DEFAULT_EVICTION_TRIGGER = 0.98
DEFAULT_EVICTION_WATERMARK = 0.9
DEFAULT_TIME_THRESHOLD_MS = 1000.0
DEFAULT_MAX_REQUEUE = 5
#: The read path's per-entry size estimate before any entry was inserted
#: (Pulsar's default average entry size for read permits).
DEFAULT_ENTRY_SIZE_ESTIMATE = 10 * 1024

#: Positions are (ledger_id, entry_id) with both ids in [0, 2**63).
MAX_ID = (1 << 63) - 1


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of one EntryCacheManager's counters and gauges.

    ``hits``/``misses`` count ``EntryCache.get`` calls (and the EntryReader's
    lookups, which use it); ``inserts`` the inserts that returned True;
    ``evicted_entries``/``evicted_bytes`` the removal queue's removals (on
    insert or in ``run_eviction``; invalidation and clear are not evictions);
    ``requeues`` every requeue by either walk; ``size`` and ``entries`` what
    is cached now.
    """

    hits: int
    misses: int
    inserts: int
    evicted_entries: int
    evicted_bytes: int
    requeues: int
    size: int
    entries: int

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses), 0.0 before any lookup."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


# ---- checks (argument and error paths only) -------------------------------------


def check_int(value, name: str) -> int:
    """An int (bool excluded), else TypeError naming the argument."""
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    return int(value)


def _byte_count(value, name: str, note: str = "") -> int:
    """A byte count: an int in [0, 2**63)."""
    n = check_int(value, name)
    if n < 0:
        raise ValueError(f"{name} must be >= 0{note}, got {n}")
    if n > MAX_ID:
        raise ValueError(f"{name} must be < 2**63, got {n}")
    return n


def check_size(size) -> int:
    return _byte_count(size, "size")


def check_expected_reads(n) -> int:
    n = check_int(n, "expected_reads")
    if not -(1 << 31) <= n < (1 << 31):
        raise ValueError(f"expected_reads must fit in 32 bits, got {n}")
    return n


def check_timestamp(ts) -> int:
    ts = check_int(ts, "timestamp_ns")
    if not -(1 << 63) <= ts <= MAX_ID:
        raise ValueError(f"timestamp_ns must fit in 64 bits, got {ts}")
    return ts


def check_max_requeue(n) -> int:
    n = check_int(n, "max_requeue_count_when_expected_reads")
    if not 0 <= n < (1 << 31):
        raise ValueError(f"max_requeue_count_when_expected_reads must be >= 0, got {n}")
    return n


def check_max_size(n) -> int:
    return _byte_count(n, "max_size_bytes", " (0 disables caching)")


def check_fraction(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    value = float(value)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return value


def check_thresholds(watermark, trigger) -> tuple[float, float]:
    """Watermark and trigger fractions; the watermark may not lie above the
    trigger (an eviction would then have nothing to free)."""
    w = check_fraction(watermark, "eviction_watermark")
    t = check_fraction(trigger, "eviction_trigger")
    if w > t:
        raise ValueError(f"eviction_watermark ({w}) must not exceed eviction_trigger ({t})")
    return w, t


def check_time_threshold_ms(ms) -> int:
    """Milliseconds as a number >= 0; returns nanoseconds (rounded)."""
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise TypeError(f"time_threshold_ms must be a number, not {type(ms).__name__}")
    if not (ms >= 0 and math.isfinite(ms)):
        raise ValueError(f"time_threshold_ms must be a finite number >= 0, got {ms}")
    ns = round(ms * 1_000_000)
    if ns > MAX_ID:
        raise ValueError(f"time_threshold_ms must be below 2**63 ns, got {ms}")
    return ns


def check_clock(clock):
    if not callable(clock):
        raise TypeError(f"clock must be callable, not {type(clock).__name__}")
    return clock


#: The smallest int64: a threshold below it (a clock near its start minus a
#: long time threshold) is clamped, as the C core does.
MIN_I64 = -(1 << 63)


def check_size_to_free(n) -> int:
    n = check_int(n, "size_to_free")
    if n <= 0:
        raise ValueError(f"size_to_free must be > 0, got {n}")
    return n


def position_error(position) -> Exception:
    """The error for anything that is not a (ledger_id, entry_id) pair of ints
    in [0, 2**63)."""
    if (type(position) is not tuple or len(position) != 2
            or any(isinstance(x, bool) or not isinstance(x, int) for x in position)):
        return TypeError(f"position must be a (ledger_id, entry_id) tuple of ints, "
                         f"got {position!r}")
    return ValueError(f"position ids must be in [0, 2**63), got {position!r}")


def check_position(position) -> tuple[int, int]:
    """(ledger_id, entry_id) with both ids in [0, 2**63), else TypeError or
    ValueError."""
    if (type(position) is tuple and len(position) == 2 and type(position[0]) is int
            and type(position[1]) is int and 0 <= position[0] <= MAX_ID
            and 0 <= position[1] <= MAX_ID):
        return position
    raise position_error(position)


def data_error(data) -> TypeError:
    return TypeError(f"data must be bytes or memoryview, not {type(data).__name__}")


def data_size(data) -> int:
    """The payload size in bytes (len of bytes, nbytes of a memoryview)."""
    if type(data) is bytes:
        return len(data)
    if type(data) is memoryview:
        return data.nbytes
    raise data_error(data)


def clock_error(value) -> TypeError:
    return TypeError(f"clock() must return an int of nanoseconds, got {value!r}")


def already_queued_error() -> ValueError:
    return ValueError("entry is already in a removal queue")


def removed_error() -> ValueError:
    return ValueError("entry was removed; create a new CacheEntry")


def cache_name_error(name) -> TypeError:
    return TypeError(f"cache name must be a str, not {type(name).__name__}")


def check_bound(position) -> tuple[int, int]:
    """A range bound or an invalidation point: a pair of ints in the signed
    64-bit range, so that Pulsar's "before anything" markers such as
    (ledger_id, -1) are accepted."""
    if (type(position) is tuple and len(position) == 2 and type(position[0]) is int
            and type(position[1]) is int and -(1 << 63) <= position[0] <= MAX_ID
            and -(1 << 63) <= position[1] <= MAX_ID):
        return position
    err = position_error(position)
    if isinstance(err, ValueError):
        err = ValueError(f"position ids must fit in 64 bits, got {position!r}")
    raise err
