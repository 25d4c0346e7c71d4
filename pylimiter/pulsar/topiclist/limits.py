"""PIP-442 configuration and the dual memory limiter built from it (with the
service's accounting: caps, peaks, live limit changes).

Each setting is declared once, as a field of TopicListConfig carrying its
Pulsar key, unit and help; the config-file reader, the command-line flags,
the start-up line and the admin API are all derived from those fields.
The metrics come from pylimiter.prometheus (see server.py).
"""

from __future__ import annotations

import argparse
import difflib
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Optional

from pylimiter import (
    MAX_PERMITS,
    AsyncDualMemoryLimiter,
    AsyncSemaphore,
    LimitType,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
)

MB = 1024 * 1024
HEAP, DIRECT = LimitType.HEAP_MEMORY, LimitType.DIRECT_MEMORY
POOL_NAMES = {HEAP: "heap", DIRECT: "direct"}
#: Pulsar declares these settings as Java ints.
JAVA_INT_MAX = 2**31 - 1
#: The largest pool the limiter can count, in MB.
MAX_POOL_MB = MAX_PERMITS // MB


class ConfigError(ValueError):
    """A setting that cannot be used: the CLI says so in one line (exit 2),
    the admin API answers 400."""


def setting(key: str, default, unit: str, doc: str, *, group: str = "limits",
            maximum=JAVA_INT_MAX):
    """One setting: its broker.conf/proxy.conf key, default, unit, help
    text, group ("limits": the six PIP-442 keys; "service") and largest
    value (the flag is the field name in kebab case)."""
    return field(default=default, metadata={"key": key, "unit": unit, "doc": doc,
                                            "group": group, "maximum": maximum})


@dataclass(frozen=True)
class TopicListConfig:
    """The six PIP-442 settings and three Pulsar service settings the
    topic-list service honours.  Sizes in MB (decimals allowed, so tests can
    use kilobyte limits; Pulsar itself takes integers); 0 disables that
    limit.  Queue defaults follow the issue (10000); the PIP text says 1000.
    Every other value is an integer, as in Pulsar."""

    heap_mb: float = setting("maxTopicListInFlightHeapMemSizeMB", 100.0, "MB",
                             "heap memory for topic lists in flight (0 disables)",
                             maximum=MAX_POOL_MB)
    direct_mb: float = setting("maxTopicListInFlightDirectMemSizeMB", 100.0, "MB",
                               "direct memory for responses being written (0 disables)",
                               maximum=MAX_POOL_MB)
    heap_timeout_ms: int = setting(
        "maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMillis", 25000, "ms",
        "longest wait for heap permits")
    direct_timeout_ms: int = setting(
        "maxTopicListInFlightDirectMemSizePermitsAcquireTimeoutMillis", 25000, "ms",
        "longest wait for direct permits")
    heap_queue: int = setting("maxTopicListInFlightHeapMemSizePermitsAcquireQueueSize",
                              10000, "requests",
                              "most requests waiting for heap permits (0: unbounded)")
    direct_queue: int = setting("maxTopicListInFlightDirectMemSizePermitsAcquireQueueSize",
                                10000, "requests",
                                "most requests waiting for direct permits (0: unbounded)")
    max_message_size: int = setting(
        "maxMessageSize", 5 * MB, "bytes",
        "largest message; a frame may carry 10 KiB more, larger frames close the connection",
        group="service")
    pattern_max_length: int = setting(
        "subscriptionPatternMaxLength", 50, "chars",
        "longest topics pattern evaluated (longer: listed unfiltered, watch refused)",
        group="service")
    keep_alive_s: int = setting(
        "keepAliveIntervalSeconds", 30, "s",
        "ping a connection idle this long, close it if still silent after as long "
        "again (0 disables)", group="service")

    def __post_init__(self):
        for f in fields(self):
            check_value(f, getattr(self, f.name))
        if self.max_message_size < 1:
            raise ConfigError("max_message_size must be at least 1 byte")

    @property
    def heap_bytes(self) -> int:
        """The heap pool in bytes (0: disabled)."""
        return _bytes(self.heap_mb)

    @property
    def direct_bytes(self) -> int:
        """The direct pool in bytes (0: disabled)."""
        return _bytes(self.direct_mb)

    def as_dict(self, group: Optional[str] = None) -> dict:
        """Settings by field name (of one group, if given)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if group is None or f.metadata["group"] == group}

    def describe(self) -> str:
        """One line with every setting and its unit (the start-up print)."""
        return ", ".join(f"{f.name} {_num(getattr(self, f.name))} {f.metadata['unit']}"
                         for f in fields(self)) + " (0 MB: disabled)"

    @classmethod
    def from_properties(cls, path: Path, base: Optional["TopicListConfig"] = None
                        ) -> "TopicListConfig":
        """Read the settings from a broker.conf-style file (key=value, '#'
        comments).  Keys of other settings are ignored, as a broker.conf
        holds many; a key close to one of ours (a misspelling) is an error
        naming the key it resembles."""
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
                near = closest_key(key, by_key)
                if near:
                    raise ConfigError(f"{path}:{n}: unknown key {key}; did you mean {near}?")
                continue
            try:
                values[f.name] = parse_value(f, value)
            except ConfigError as exc:
                raise ConfigError(f"{path}:{n}: {key}: {exc}") from None
        try:
            return replace(base or cls(), **values)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None


def _bytes(mb: float) -> int:
    # A positive size never rounds down to 0, which would disable the limit.
    return max(1, int(mb * MB)) if mb > 0 else 0


def _num(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def closest_key(key: str, known) -> Optional[str]:
    """The known key `key` looks like a misspelling of, if any: a close
    match, the same letters in another case, or a PIP-442 key prefix."""
    folded = {k.lower(): k for k in known}
    if key.lower() in folded:
        return folded[key.lower()]
    near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.85)
    if near:
        return near[0]
    if key.startswith("maxTopicListInFlight"):
        return difflib.get_close_matches(key, list(known), n=1, cutoff=0.0)[0]
    return None


def _is_float(f) -> bool:
    return isinstance(f.default, float)


def check_value(f, v) -> None:
    """ConfigError unless v suits setting f: a number (an integer for the
    integer settings), finite, from 0 to the setting's maximum."""
    kind = "a number" if _is_float(f) else "an integer"
    if isinstance(v, bool) or not isinstance(v, (int, float)) or \
            (not _is_float(f) and not isinstance(v, int)):
        raise ConfigError(f"{f.name} must be {kind}, not {v!r}")
    if not math.isfinite(v) or v < 0 or v > f.metadata["maximum"]:
        raise ConfigError(f"{f.name} must be {kind} from 0 to {f.metadata['maximum']} "
                          f"{f.metadata['unit']}, not {v!r}")


def parse_value(f, text: str):
    """A setting's value from its text: int() for the integer settings, so
    '2.9' and 'inf' are refused rather than truncated; checked."""
    try:
        v = float(text) if _is_float(f) else int(text)
    except ValueError:
        kind = "a number" if _is_float(f) else "an integer"
        raise ConfigError(f"must be {kind}, not {text!r}") from None
    check_value(f, v)
    return v


def add_setting_flags(group) -> None:
    """One command-line flag per setting (`--heap-mb` ...), default None so
    that only what is given overrides the config file."""
    for f in fields(TopicListConfig):
        group.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_flag_type(f),
                           default=None, metavar=f.metadata["unit"].upper(),
                           help=f"{f.metadata['doc']}; overrides {f.metadata['key']} "
                                f"(default {_num(f.default)} {f.metadata['unit']})")


def _flag_type(f):
    def parse(text: str):
        try:
            return parse_value(f, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = "number" if _is_float(f) else "integer"
    return parse


def setting_overrides(namespace) -> dict:
    """The settings given on the command line, by field name."""
    return {f.name: getattr(namespace, f.name) for f in fields(TopicListConfig)
            if getattr(namespace, f.name, None) is not None}


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
        """Per pool: use, limit (0: none), queue and counters."""
        out = {}
        for t, name in POOL_NAMES.items():
            s = self.dual.get_limiter(t).stats()
            out[name] = {"used": s.acquired_permits, "limit": max(s.max_permits, 0),
                         "queue": s.queue_size, "queue_max": max(s.max_queue_size, 0),
                         "timeouts": s.timeout_total, "queue_full": s.queue_full_total,
                         "granted": s.acquired_total}
        return out
