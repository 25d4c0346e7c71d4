"""The contract both cache implementations share: the stats record, the
argument checks and their messages, Pulsar's settings (CacheSettings: each
declared once with its key and default).

A check or a message lives here once, so the C binding (``_cache_c``) and the
pure-Python twin (``_cache_py``) cannot drift apart; the tests run every case
against both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...spark.settings import Settings, setting
from ...spark.show import show

#: Pulsar's fixed size-eviction trigger (evictionTriggerThresholdPercent).
DEFAULT_EVICTION_TRIGGER = 0.98


@dataclass(frozen=True)
class CacheSettings(Settings):
    """The broker.conf settings of the entry cache (PIP-430), each declared
    once with its key and Pulsar's default: the library's defaults below,
    ``python -m pylimiter.pulsar.cache simulate``'s flags and the report's
    settings come from here.  Groups: "size"; "eviction" (what the
    simulator's flags set); "policy" (the switches each simulated policy
    fixes).  ``cache_size_mb`` is the library's ``max_size_bytes`` in MiB;
    Pulsar's default is a fifth of the broker's direct memory, at least 64."""

    KEY_FAMILIES = ("managedLedgerCache", "cacheEviction")

    cache_size_mb: float = setting(
        "managedLedgerCacheSizeMB", 64.0, "MB", "entry cache size (0 disables caching)",
        group="size")
    eviction_watermark: float = setting(
        "managedLedgerCacheEvictionWatermark", 0.9, "",
        "size eviction frees down to this fraction of the cache size", group="eviction",
        maximum=DEFAULT_EVICTION_TRIGGER)
    time_threshold_ms: float = setting(
        "managedLedgerCacheEvictionTimeThresholdMillis", 1000.0, "ms",
        "an entry this old is evicted (or requeued)", group="eviction")
    eviction_interval_ms: float = setting(
        "managedLedgerCacheEvictionIntervalMs", 10.0, "ms",
        "time between eviction passes", group="eviction", minimum=0.001)
    max_requeue: int = setting(
        "managedLedgerCacheEvictionExtendTTLOfEntriesWithRemainingExpectedReadsMaxTimes", 5,
        "times", "requeues of an entry that still has expected reads", group="eviction")
    extend_ttl_of_recently_accessed: bool = setting(
        "managedLedgerCacheEvictionExtendTTLOfRecentlyAccessed", True, "",
        "requeue an entry read since it was queued", group="policy")
    eviction_by_expected_read_count: bool = setting(
        "cacheEvictionByExpectedReadCount", True, "",
        "keep entries that cursors are expected to read", group="policy")


#: broker.conf key -> Pulsar's default, for every setting this package models.
SETTINGS = {f.metadata["key"]: f.default for f in CacheSettings.settings()}
DEFAULT_EVICTION_WATERMARK = CacheSettings.eviction_watermark
DEFAULT_TIME_THRESHOLD_MS = CacheSettings.time_threshold_ms
DEFAULT_MAX_REQUEUE = CacheSettings.max_requeue
#: The read path's per-entry size estimate before any entry was inserted
#: (Pulsar's default average entry size for read permits).
DEFAULT_ENTRY_SIZE_ESTIMATE = 10 * 1024

#: Positions are (ledger_id, entry_id) with both ids in [0, 2**63).
MAX_ID = (1 << 63) - 1
#: evicted_bytes is a 64-bit unsigned counter in the C core: both
#: implementations saturate it here.
MAX_U64 = (1 << 64) - 1


#: What an entry costs in memory beyond its payload, in the C implementation
#: at its largest (the entry object with its links and position, plus its
#: slot in a sparse index page); EntryCacheManager counts it against
#: max_size_bytes for every cached entry unless told otherwise
#: (``entry_overhead_bytes``), so a million empty payloads cannot hold memory
#: that no limit sees.  Measured in benchmarks/README.md ("memory per entry").
ENTRY_OVERHEAD_BYTES = 192


class NotInitialisedError(RuntimeError, AttributeError):
    """An object built with ``cls.__new__(cls)`` alone was used: every method
    and attribute raises this until ``__init__`` ran (EntryCache objects come
    from ``EntryCacheManager.cache(name)`` only).  A RuntimeError; also an
    AttributeError, so ``hasattr``, ``getattr(obj, name, default)`` and
    ``inspect.getmembers`` treat the object as having no state yet."""


def not_initialised_error(cls_name: str) -> NotInitialisedError:
    how = ("made by EntryCacheManager.cache(name)" if cls_name == "EntryCache"
           else f"built with {cls_name}.__new__ without __init__")
    return NotInitialisedError(f"this {cls_name} object is not initialised ({how})")


def already_initialised_error(cls_name: str) -> RuntimeError:
    return RuntimeError(f"{cls_name}.__init__ called on an object that is already "
                        f"initialised; make a new {cls_name}")


def copy_error(cls_name: str) -> TypeError:
    return TypeError(f"{cls_name} objects cannot be copied or pickled: they are linked "
                     f"into a removal queue and caches that a copy would corrupt")


def not_initialised_entry_error() -> ValueError:
    return ValueError("entry is not initialised (built with CacheEntry.__new__ without "
                      "__init__)")


def total_bytes_error(what: str) -> ValueError:
    return ValueError(f"{what} would hold more than 2**63 - 1 bytes")


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
    if type(value) is int:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    # An int subclass: its value, without calling methods it may override.
    return int.__index__(value)


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


def check_entry_overhead(n) -> int:
    return _byte_count(n, "entry_overhead_bytes")


def check_key(key):
    """A hashable key: anything whose hash() works (a hash() that raises,
    whatever it raises, is a TypeError here, except MemoryError, which is
    no fault of the key and propagates)."""
    try:
        hash(key)
    except MemoryError:
        raise
    except Exception as exc:
        raise TypeError(f"key must be hashable: hash() of a {type(key).__name__} "
                        f"raised {type(exc).__name__}") from exc
    return key


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


def threshold_bytes(max_size: int, fraction: float) -> int:
    """``floor(max_size * fraction)`` in float arithmetic, as Pulsar computes
    it, kept within int64 (a float of 2**63 - 1 rounds up to 2**63)."""
    return min(int(max_size * fraction), MAX_ID)


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
    in [0, 2**63): a TypeError unless it is a tuple of two plain ints."""
    if (type(position) is not tuple or len(position) != 2
            or any(type(x) is not int for x in position)):
        return TypeError(f"position must be a (ledger_id, entry_id) tuple of ints, "
                         f"got {show(position)}")
    return ValueError(f"position ids must be in [0, 2**63), got {show(position)}")


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
    """The payload size in bytes (len of bytes, nbytes of a memoryview); a
    released memoryview is a ValueError."""
    if type(data) is bytes:
        return len(data)
    if type(data) is memoryview:
        try:
            return data.nbytes
        except ValueError:
            raise ValueError("data is a released memoryview") from None
    raise data_error(data)


def clock_error(value) -> Exception:
    """The error for a clock reading that is not an int in the signed 64-bit
    range: TypeError for another type, ValueError for an int outside."""
    if type(value) is int:
        return ValueError(f"clock() must return nanoseconds in [-2**63, 2**63), got {value}")
    return TypeError(f"clock() must return an int of nanoseconds, got {show(value)}")


def check_clock_value(value) -> int:
    if type(value) is int and MIN_I64 <= value <= MAX_ID:
        return value
    raise clock_error(value)


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
        err = ValueError(f"position ids must fit in 64 bits, got {show(position)}")
    raise err
