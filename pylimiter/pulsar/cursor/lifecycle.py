"""Message expiry (TTL) and backlog quotas.

TTL and delayed messages
------------------------
Pulsar expires a message when ``now > publish_time + ttl``
(``MessageImpl.isEntryExpired``), whatever its delivery time: a message
delayed 10 days under a 5-day TTL is acknowledged by the expiry monitor on
day 5 and never reaches a consumer (the seed's lost delayed messages).  Here
the TTL clock starts when a message becomes deliverable,
``max(publish, deliver_at)``, so a delayed message is never expired before it
could be read.  ``delayed="publish"`` keeps Pulsar's rule, to show the loss.

Pulsar's monitor also assumes expiry is monotonic along the ledger: it
binary-searches for the newest expired entry and moves mark-delete there,
acknowledging everything before it.  Delayed messages break that order, so
``Expirer`` scans linearly and acknowledges exactly the expired entries;
unexpired ones in between stay holes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from ._positions import Position, as_position, fmt, show
from .cursor import Cursor, as_cursor

DELAYED_MODES = ("deliverable", "publish")
POLICIES = ("producer_request_hold", "producer_exception", "consumer_backlog_eviction")


class EntryMeta(NamedTuple):
    """What the expiry check reads of an entry: its position, its publish
    time and, for a delayed message, its delivery time (ms since the epoch)."""

    position: Position
    publish_time_ms: int
    deliver_at_ms: int | None = None


def _check_delayed(delayed) -> None:
    # The type first: `in` would call a foreign object's __eq__.
    if type(delayed) is not str or delayed not in DELAYED_MODES:
        raise ValueError(f"delayed must be one of {', '.join(DELAYED_MODES)}; "
                         f"got {show(delayed)}")


#: Times, sizes and limits are Pulsar longs: a value beyond +-2**63 is refused
#: (and keeps int/float arithmetic away from float overflow).
_LIMIT = 2**63


def _number(value, what: str, low=None):
    """``value`` as an int or a float (bool refused: TypeError), finite, within
    +-2**63 and >= ``low`` when given (ValueError).  NaN and infinities are
    refused: a NaN compares false with everything and would silently turn
    every check into "no"."""
    t = type(value)
    if t is not int and t is not float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{what} must be a number, got {show(value)}")
        # A subclass (numpy's float64 is one): its plain value, without
        # calling methods it may override.
        value = int.__index__(value) if isinstance(value, int) else float.__float__(value)
    if not -_LIMIT <= value <= _LIMIT:      # false for NaN
        raise ValueError(f"{what} must be a finite number within +-2**63, got {show(value)}")
    if low is not None and value < low:
        raise ValueError(f"{what} must be >= {low}, got {show(value)}")
    return value


def is_entry_expired(ttl_seconds: float, publish_time_ms: int, now_ms: int, *,
                     deliver_at_ms: int | None = None, delayed: str = "deliverable") -> bool:
    """is_entry_expired says whether a message has outlived its TTL at
    ``now_ms``.  ``ttl_seconds <= 0`` never expires.  Without a delivery time
    (or one not after publish) the rule is strict: ``now > publish + ttl``.
    With ``delayed="deliverable"`` (the default) the TTL clock starts at
    ``max(publish, deliver_at)``; ``delayed="publish"`` is Pulsar's rule,
    ``now > publish + ttl`` whatever ``deliver_at`` says.  ValueError for any
    other ``delayed``; every time must be a finite number (NaN and
    infinities are a ValueError)."""
    _check_delayed(delayed)
    ttl_seconds = _number(ttl_seconds, "ttl_seconds")
    start = _number(publish_time_ms, "publish_time_ms")
    now_ms = _number(now_ms, "now_ms")
    if deliver_at_ms is not None:
        deliver_at_ms = _number(deliver_at_ms, "deliver_at_ms")
    if ttl_seconds <= 0:
        return False
    if delayed == "deliverable" and deliver_at_ms is not None and deliver_at_ms > start:
        start = deliver_at_ms
    return now_ms > start + ttl_seconds * 1000


class Expirer:
    """Expirer acknowledges the expired entries of a cursor, as Pulsar's
    ``PersistentMessageExpiryMonitor`` does every
    ``messageExpiryCheckIntervalInMinutes`` (5 by default)."""

    __slots__ = ("cursor", "delayed", "ttl_seconds")

    def __init__(self, cursor: Cursor, ttl_seconds: float, *, delayed: str = "deliverable"):
        self.cursor = cursor
        self.ttl_seconds = ttl_seconds
        self.delayed = delayed

    def __setattr__(self, name, value):
        # The settings stay valid when changed later, not only at __init__.
        if name == "cursor":
            as_cursor(value)
        elif name == "ttl_seconds":
            value = _number(value, "ttl_seconds")
        elif name == "delayed":
            _check_delayed(value)
        object.__setattr__(self, name, value)

    def expire(self, entries: Iterable[EntryMeta], now_ms: int) -> int:
        """expire looks at ``entries`` (after mark-delete, in position order,
        acknowledged ones skipped) and acknowledges every expired one; returns
        how many this call newly acknowledged.

        With ``delayed="deliverable"``, a linear scan: expired entries before
        the first unexpired one advance mark-delete, later ones become ranges
        and unexpired ones stay holes.  With ``delayed="publish"``, Pulsar:
        mark-delete moves to the last expired entry in the given order and
        everything before it is acknowledged, expired or not."""
        cur, ttl = self.cursor, self.ttl_seconds
        now_ms = _number(now_ms, "now_ms")
        if self.delayed == "publish":
            last = None
            for meta in entries:
                pos, publish, _deliver = _unpack(meta)
                if pos > cur._md and is_entry_expired(ttl, publish, now_ms, delayed="publish"):
                    last = pos
            if last is None:
                return 0
            newly = cur._holes_through(cur._entry(last))
            cur.ack_cumulative(last)
            return newly
        acked = cur._acked
        newly = 0
        for meta in entries:
            pos, publish, deliver = _unpack(meta)
            if pos <= cur._md or acked.contains(pos):
                continue
            if is_entry_expired(ttl, publish, now_ms, deliver_at_ms=deliver):
                newly += cur.ack(pos)
        return newly

    def __repr__(self) -> str:
        return (f"Expirer(ttl_seconds={self.ttl_seconds}, delayed={self.delayed!r}, "
                f"mark_delete={fmt(self.cursor.mark_delete_position)})")


def _unpack(meta):
    try:
        if len(meta) == 3:
            pos, publish, deliver = meta
        else:
            (pos, publish), deliver = meta, None
    except (TypeError, ValueError):
        raise TypeError(f"entries must be EntryMeta(position, publish_time_ms, "
                        f"deliver_at_ms=None), got {show(meta)}") from None
    return as_position(pos), publish, deliver


class BacklogQuota:
    """BacklogQuota is a subscription backlog limit and the policy Pulsar
    applies when it is hit.

    ``limit_size`` (bytes) is hit when the backlog is at least that large
    (Pulsar's ``isSizeBacklogExceeded``); ``limit_time_s`` when the oldest
    unacknowledged message is strictly older.  ``limit_size < 0`` or
    ``limit_time_s <= 0`` disables that limit.  Policies:
    ``producer_request_hold`` (the broker holds producers' sends),
    ``producer_exception`` (it disconnects producers), and
    ``consumer_backlog_eviction`` (it acknowledges the oldest holes, see
    ``evict``).  ValueError for another policy."""

    __slots__ = ("limit_size", "limit_time_s", "policy")

    def __init__(self, limit_size: int = -1, limit_time_s: float = -1,
                 policy: str = "producer_request_hold") -> None:
        self.limit_size = limit_size
        self.limit_time_s = limit_time_s
        self.policy = policy

    def __setattr__(self, name, value):
        # The settings stay valid when changed later, not only at __init__.
        if name == "limit_size":
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"limit_size must be an int (bytes), got {show(value)}")
            value = _number(value, "limit_size")
        elif name == "limit_time_s":
            value = _number(value, "limit_time_s")
        elif name == "policy":
            if type(value) is not str or value not in POLICIES:
                raise ValueError(f"policy must be one of {', '.join(POLICIES)}; "
                                 f"got {show(value)}")
        object.__setattr__(self, name, value)

    def check(self, backlog_size: int, oldest_unacked_age_s: float) -> str | None:
        """check returns the policy name when a limit is hit, else None.
        Both arguments are finite numbers (NaN or an infinity is a
        ValueError: NaN would never hit a limit)."""
        backlog_size = _number(backlog_size, "backlog_size")
        oldest_unacked_age_s = _number(oldest_unacked_age_s, "oldest_unacked_age_s")
        if self.limit_size >= 0 and backlog_size >= self.limit_size:
            return self.policy
        if self.limit_time_s > 0 and oldest_unacked_age_s > self.limit_time_s:
            return self.policy
        return None

    def evict(self, cursor: Cursor, read_position, backlog_entries: Mapping[Position, int],
              target_size: int) -> int:
        """evict is ``consumer_backlog_eviction``: while the summed size of
        ``cursor.holes(read_position)`` (sizes in bytes from
        ``backlog_entries``) is above ``target_size``, it acknowledges the
        oldest hole.  Returns how many it acknowledged.  Pulsar aims at 0.9 x
        the limit; time-based eviction is out of scope.  ValueError when the
        policy is another one, for a target or a size that is negative, NaN
        or infinite, or for a hole whose size ``backlog_entries`` does not
        give; nothing is acknowledged then."""
        if self.policy != "consumer_backlog_eviction":
            raise ValueError(f"evict is the consumer_backlog_eviction action; this quota's "
                             f"policy is {self.policy}")
        as_cursor(cursor)
        if not isinstance(backlog_entries, Mapping):
            raise TypeError(f"backlog_entries must be a Mapping of position to size, got "
                            f"{type(backlog_entries).__name__}")
        read = as_position(read_position, "read_position")
        target = _number(target_size, "target_size", low=0)
        # Lazily: the walk stops at the first hole without a size, so a
        # cursor whose ledgers claim 2**62 entries against a dict of sizes
        # costs what the dict holds, not what the ledgers claim.
        holes, sizes = [], []
        total = 0
        for pos in cursor._holes(read):
            size = backlog_entries.get(pos)
            if size is None:
                raise ValueError(f"backlog_entries has no size for hole {fmt(pos)}")
            size = _number(size, f"the size of hole {fmt(pos)}", low=0)
            holes.append(pos)
            sizes.append(size)
            total += size
        evicted = 0
        for pos, size in zip(holes, sizes):
            if total <= target:
                break
            cursor.ack(pos)
            total -= size
            evicted += 1
        return evicted

    def __repr__(self) -> str:
        return (f"BacklogQuota(limit_size={self.limit_size}, limit_time_s={self.limit_time_s}, "
                f"policy={self.policy!r})")
