"""One subscription's message lifecycle replayed minute by minute on the
cursor library: the pipeline's unit of work, one parameter point per Spark
task (no Spark here; ``pipeline`` spreads the points over the tasks), as
``replay`` is in the cache and balance packages.

The model
---------
A producer publishes ``rate`` messages a minute for ``publish_min`` minutes
into ledgers that roll over after ``rollover_entries`` entries or
``rollover_max_min`` minutes (Pulsar's managedLedgerMaxEntriesPerLedger and
managedLedgerMaxLedgerRolloverTimeMinutes).  A share of the messages is
delayed, by a uniform delay of up to 2 x TTL.  One consumer keeps up: it
receives a message when it becomes deliverable and its ack is lost with
probability ``ack_fail`` (an acknowledgment hole).

Every ``ttl_check_min`` minutes an Expirer (Pulsar's rule or ours) expires
messages; every minute a BacklogQuota is checked on the holes' bytes
(``producer_*``: the producer publishes nothing that minute and catches up
when released; ``consumer_backlog_eviction``: the oldest holes are
acknowledged down to 0.9 x the limit); with the compensator on, every
``compensate_every_min`` minutes the holes sent more than
``compensate_age_min`` ago are redelivered.  Every ``retention_check_min``
minutes closed ledgers are deleted from the oldest while they are wholly at
or below mark-delete and their close time is ``retention_min`` old (Pulsar
measures retention from the ledger's close time); a message's lifetime runs
from its publish time to its ledger's deletion.

The ledger the producer writes into is registered with the cursor at its
full size; when it closes early (time-based rollover) the cursor is rebuilt
with the ledger's real size and recovered from its own records, as a broker
does on restart.
"""

from __future__ import annotations

import heapq
import random
import statistics
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ...spark.settings import Settings, setting
from .cursor import Cursor, HoleCompensator
from .lifecycle import POLICIES, BacklogQuota, Expirer

MIN_MS = 60_000
VARIANTS = [("publish", False), ("publish", True), ("deliverable", False), ("deliverable", True)]

#: The sweep's tables, a row per point and variant (summary), per sample
#: (series) and per fate (lifetimes): name and Spark SQL type.
SUMMARY_FIELDS = [
    ("point", "int"), ("ttl_min", "double"), ("retention_min", "double"),
    ("delayed_share", "double"), ("ack_fail", "double"), ("rollover_entries", "int"),
    ("rule", "string"), ("compensator", "boolean"), ("published", "long"), ("delayed", "long"),
    ("lost_before_delivery", "long"), ("evicted_before_delivery", "long"), ("expired", "long"),
    ("evicted", "long"), ("consumed", "long"), ("redelivered", "long"),
    ("quota_actions", "long"), ("blocked_min", "long"), ("peak_ranges", "long"),
    ("peak_range_bytes", "long"), ("peak_holes", "long"), ("peak_backlog_bytes", "long"),
    ("cursor_rebuilds", "long"), ("not_deleted", "long"), ("seconds", "double"),
]
SERIES_FIELDS = [("point", "int"), ("rule", "string"), ("compensator", "boolean"),
                  ("minute", "int"), ("holes", "long"), ("ranges", "long"),
                  ("range_bytes", "long"), ("backlog_bytes", "long")]
LIFETIME_FIELDS = [("point", "int"), ("ttl_min", "double"), ("retention_min", "double"),
                    ("rollover_entries", "int"), ("rule", "string"), ("compensator", "boolean"),
                    ("fate", "string"), ("messages", "long"), ("measured_median_min", "double"),
                    ("measured_p95_min", "double"), ("seed_rule_min", "double"),
                    ("pulsar_rule_median_min", "double"), ("seed_rule_mae_min", "double"),
                    ("pulsar_rule_mae_min", "double")]
TABLES = {"summary": SUMMARY_FIELDS, "series": SERIES_FIELDS, "lifetimes": LIFETIME_FIELDS}


@dataclass(frozen=True)
class Point(Settings):
    """One parameter point of the sweep (times in minutes): what is swept
    (TTL, retention, the delayed share, the ack-failure rate, entries per
    ledger: Pulsar's ttlDurationDefaultInSeconds, defaultRetentionTimeInMinutes
    and managedLedgerMaxEntriesPerLedger, in the sweep's units), the traffic
    and the compensator, and the broker settings every point shares, each
    declared once with its broker.conf key and Pulsar's default
    (``python -m pylimiter.pulsar.cursor simulate`` derives their flags from
    these declarations).  ``retention_check_min`` is Pulsar's
    retentionCheckIntervalInSeconds (120) in minutes; the backlog quota is
    checked every minute (backlogQuotaCheckIntervalInSeconds, 60)."""

    ttl_min: float
    retention_min: float
    delayed_share: float
    ack_fail: float
    rollover_entries: int
    rate: int = 20
    publish_min: int = 720
    rollover_max_min: int = setting(
        "managedLedgerMaxLedgerRolloverTimeMinutes", 240, "min",
        "a ledger with entries rolls over at this age", minimum=1)
    ttl_check_min: int = setting(
        "messageExpiryCheckIntervalInMinutes", 5, "min",
        "time between expiry checks", minimum=1)
    retention_check_min: int = 2
    compensate_every_min: int = 5
    compensate_age_min: int = 10
    msg_bytes: int = 1024
    quota_bytes: int = setting(
        "backlogQuotaDefaultLimitBytes", -1, "bytes",
        "backlog quota on the holes' bytes (-1: no quota)", minimum=-1, maximum=2**63 - 1)
    quota_policy: str = setting(
        "backlogQuotaDefaultRetentionPolicy", "producer_request_hold", "",
        "what the backlog quota does when the holes' bytes reach it: producer_request_hold "
        "and producer_exception: the producer publishes nothing that minute and catches up "
        "when released; consumer_backlog_eviction acknowledges the oldest holes down to "
        "0.9 x the quota", choices=POLICIES)
    sample_min: int = 10
    seed: int = 1

    @property
    def horizon_min(self) -> int:
        """Long enough after the last publish for every ledger to close, the
        last delayed message to expire and retention to run out."""
        return int(self.publish_min + 3 * self.ttl_min + self.retention_min
                   + self.rollover_max_min + 3 * max(self.ttl_check_min,
                                                     self.retention_check_min) + 30)


class _ConstSizes(Mapping):
    """Every entry has the same size (BacklogQuota.evict's backlog_entries)."""

    def __init__(self, size: int):
        self.size = size

    def __getitem__(self, key):
        return self.size

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0


@dataclass
class _Ledger:
    lid: int
    cap: int                    # entry count the cursor knows
    created_min: int
    pub: list = field(default_factory=list)       # publish time (ms) per entry
    dlv: list = field(default_factory=list)       # deliver_at (ms) or None
    closed_ms: int = -1
    deleted_ms: int = -1


def run_variant(p: Point, delayed_rule: str, compensate: bool) -> dict:
    """Simulate one subscription under ``delayed_rule`` ("publish": Pulsar,
    "deliverable": ours), with or without the compensator.  Returns the
    summary, the time series and the per-message lifetimes."""
    rng = random.Random(f"{p.seed}/{asdict(p)}")    # same traffic for every variant
    ack_rng = random.Random(f"{p.seed}/acks/{asdict(p)}")
    ledgers = [_Ledger(1, p.rollover_entries, 0)]
    cursor = Cursor([(1, p.rollover_entries)], (1, -1))
    quota = BacklogQuota(limit_size=p.quota_bytes, policy=p.quota_policy)
    sizes = _ConstSizes(p.msg_bytes)
    by_id = {1: ledgers[0]}
    pending = []                 # (deliver_at_ms, ledger, entry) of delayed messages
    delivered = set()
    sent_at = {}                 # hole -> last delivery time (ms)
    fate = {}                    # position -> how it was acknowledged
    out = dict.fromkeys(
        ("published", "delayed", "lost_before_delivery", "evicted_before_delivery", "expired",
         "evicted", "consumed", "redelivered", "quota_actions", "blocked_min", "peak_ranges",
         "peak_range_bytes", "peak_holes", "peak_backlog_bytes", "cursor_rebuilds"), 0)
    series = []
    carry = 0                    # messages the producer could not send yet
    blocked = False

    def tools():
        return (Expirer(cursor, p.ttl_min * 60, delayed=delayed_rule),
                HoleCompensator(cursor, min_age_ms=p.compensate_age_min * MIN_MS))

    expirer, comp = tools()

    def deliver(pos, now_ms):
        sent_at[pos] = now_ms
        if ack_rng.random() >= p.ack_fail:
            if cursor.ack(pos):
                fate[pos] = "consumed"
                out["consumed"] += 1
            sent_at.pop(pos, None)

    def close_current(now_ms, t):
        nonlocal cursor, expirer, comp
        cur = ledgers[-1]
        cur.closed_ms = now_ms
        if len(cur.pub) < cur.cap:      # time-based rollover: tell the cursor the real size
            cur.cap = len(cur.pub)
            md, records = cursor.mark_delete_position, cursor.acked.to_records()
            cursor = Cursor([(led.lid, led.cap) for led in ledgers], md)
            cursor.recover(records)
            expirer, comp = tools()
            out["cursor_rebuilds"] += 1
        nxt = _Ledger(cur.lid + 1, p.rollover_entries, t)
        ledgers.append(nxt)
        by_id[nxt.lid] = nxt
        cursor.append_ledger(nxt.lid, nxt.cap)

    def read_position():
        cur = ledgers[-1]
        return (cur.lid, len(cur.pub))

    def acknowledged(pos):
        return pos <= cursor.mark_delete_position or cursor.acked.contains(pos)

    def settle(holes_before, now_ms, how):
        """Record the fate of holes that an expiry or eviction acknowledged."""
        n = 0
        for pos in holes_before:
            if acknowledged(pos):
                n += 1
                fate[pos] = how
                sent_at.pop(pos, None)
                d = by_id[pos[0]].dlv[pos[1]]
                if d is not None and pos not in delivered:
                    out["lost_before_delivery" if how == "expired"
                        else "evicted_before_delivery"] += 1
        return n

    for t in range(p.horizon_min + 1):
        now = t * MIN_MS
        cur = ledgers[-1]
        if cur.pub and t - cur.created_min >= p.rollover_max_min:
            close_current(now, t)
        # ---- publish
        want = (p.rate if t < p.publish_min else 0) + carry
        if blocked:
            carry, want = want, 0
            out["blocked_min"] += 1
        else:
            carry = 0
        for i in range(want):
            cur = ledgers[-1]
            pub = now + i * MIN_MS // max(want, 1)
            dlv = None
            if rng.random() < p.delayed_share:
                dlv = pub + int(rng.uniform(0, 2 * p.ttl_min) * MIN_MS)
                out["delayed"] += 1
            pos = (cur.lid, len(cur.pub))
            cur.pub.append(pub)
            cur.dlv.append(dlv)
            out["published"] += 1
            if dlv is None:
                delivered.add(pos)
                deliver(pos, pub)
            else:
                heapq.heappush(pending, (dlv, pos))
            if len(cur.pub) == cur.cap:
                close_current(pub, t)
        # ---- delayed messages whose time has come
        while pending and pending[0][0] <= now:
            _, pos = heapq.heappop(pending)
            if not acknowledged(pos):
                delivered.add(pos)
                deliver(pos, now)
        read = read_position()
        # ---- compensation
        if compensate and t % p.compensate_every_min == 0:
            for pos in comp.due(read, now, sent_at):
                out["redelivered"] += 1
                deliver(pos, now)
        # ---- TTL
        if p.ttl_min > 0 and t % p.ttl_check_min == 0:
            holes = list(cursor.holes(read))
            # Publish times rise along the topic, so the holes alone give
            # Pulsar's rule the same newest expired entry as every entry would.
            expirer.expire(_metas(holes, by_id), now)
            out["expired"] += settle(holes, now, "expired")
        # ---- backlog quota
        holes_n = cursor.backlog(read)
        backlog_bytes = holes_n * p.msg_bytes
        blocked = False
        if quota.check(backlog_bytes, 0) is not None:
            out["quota_actions"] += 1
            if p.quota_policy == "consumer_backlog_eviction":
                holes = list(cursor.holes(read))
                quota.evict(cursor, read, sizes, int(0.9 * p.quota_bytes))
                out["evicted"] += settle(holes, now, "evicted")
            else:
                blocked = True
        # ---- retention
        if t % p.retention_check_min == 0:
            md = cursor.mark_delete_position
            for led in ledgers[:-1]:
                if led.deleted_ms >= 0:
                    continue
                if (md[0], md[1]) < (led.lid, len(led.pub) - 1) or \
                        now < led.closed_ms + p.retention_min * MIN_MS:
                    break
                led.deleted_ms = now
        # ---- samples
        acked = cursor.acked
        out["peak_ranges"] = max(out["peak_ranges"], len(acked))
        out["peak_holes"] = max(out["peak_holes"], holes_n)
        out["peak_backlog_bytes"] = max(out["peak_backlog_bytes"], backlog_bytes)
        if t % p.sample_min == 0:
            mem = sys.getsizeof(acked)
            out["peak_range_bytes"] = max(out["peak_range_bytes"], mem)
            series.append((t, holes_n, len(acked), mem, backlog_bytes))

    lifetimes = _lifetimes(p, ledgers, fate)
    out["not_deleted"] = sum(len(led.pub) for led in ledgers if led.deleted_ms < 0)
    return {"summary": out, "series": series, "lifetimes": lifetimes}


def _metas(holes, by_id):
    from .lifecycle import EntryMeta

    return [EntryMeta(pos, by_id[pos[0]].pub[pos[1]], by_id[pos[0]].dlv[pos[1]])
            for pos in holes]


def seed_rule_min(ttl_min: float, retention_min: float) -> float:
    """The seed's rule: TTL + retention if TTL < retention, else TTL."""
    return ttl_min + retention_min if ttl_min < retention_min else ttl_min


def _lifetimes(p: Point, ledgers, fate) -> list:
    """Per fate: count, measured lifetime (median, p95) and the error of the
    seed's rule and of max(TTL, retention) + rollover delay, in minutes."""
    groups = {}
    seed = seed_rule_min(p.ttl_min, p.retention_min)
    for led in ledgers:
        if led.deleted_ms < 0:
            continue
        for e, pub in enumerate(led.pub):
            how = fate.get((led.lid, e), "consumed")
            measured = (led.deleted_ms - pub) / MIN_MS
            pulsar = max(p.ttl_min, p.retention_min) + (led.closed_ms - pub) / MIN_MS
            groups.setdefault(how, []).append((measured, pulsar))
    rows = []
    for how, vals in sorted(groups.items()):
        measured = [m for m, _ in vals]
        rows.append({
            "fate": how, "messages": len(vals),
            "measured_median_min": statistics.median(measured),
            "measured_p95_min": _quantile(measured, 0.95),
            "seed_rule_min": seed,
            "pulsar_rule_median_min": statistics.median(x for _, x in vals),
            "seed_rule_mae_min": statistics.fmean(abs(m - seed) for m in measured),
            "pulsar_rule_mae_min": statistics.fmean(abs(m - x) for m, x in vals),
        })
    return rows


def _quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run_point(p: Point) -> list:
    """Every variant of one point: [(rule, compensate, result), ...]."""
    return [(rule, comp, run_variant(p, rule, comp)) for rule, comp in VARIANTS]
