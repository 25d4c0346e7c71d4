"""Replaying one trace against one policy: the simulator's unit of work (one
Spark task).  The simulated clock drives the cache manager's clock and the
eviction passes (one every managedLedgerCacheEvictionIntervalMs of simulated
time); reads go through the same lookup as EntryReader (a hit or a miss per
position, one storage read per run of misses, whose entries are inserted).
"""

from __future__ import annotations

import time

from ._common import CacheSettings
from .policies import POLICIES
from .reader import lookup
from .workloads import (
    ADD,
    LEDGER,
    MARK_DELETE,
    READ,
    REPLAY_ADD,
    REPLAY_READ,
    SLOWEST_READ,
    Trace,
)

__all__ = ["replay", "RESULT_FIELDS"]

#: One result row: name and Spark SQL type.
RESULT_FIELDS = [
    ("workload", "string"), ("policy", "string"), ("cache_mb", "double"), ("seed", "int"),
    ("topics", "int"), ("sim_seconds", "double"), ("events", "long"), ("reads", "long"),
    ("hits", "long"), ("misses", "long"), ("hit_rate", "double"),
    ("storage_reads", "long"), ("storage_bytes", "long"), ("inserts", "long"),
    ("evicted_entries", "long"), ("evicted_bytes", "long"), ("requeues", "long"),
    ("invalidated_entries", "long"), ("peak_bytes", "long"),
    ("eviction_passes", "long"), ("eviction_cpu_ns", "long"), ("eviction_ns_per_pass", "double"),
    ("max_pass_ns", "long"), ("replay_seconds", "double"), ("failure", "string"),
]

_ZEROS = bytes(1 << 22)
_views: dict[int, memoryview] = {}


def _payload(size: int) -> memoryview:
    """A payload of `size` bytes without allocating one: slices of one zero
    buffer, one view per distinct size."""
    v = _views.get(size)
    if v is None:
        v = _views[size] = memoryview(_ZEROS)[:size]
    return v


class _Clock:
    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def _runs(ids) -> list[tuple[int, int]]:
    """Sorted entry ids as runs of consecutive ids (first, last)."""
    out = []
    ids = sorted(ids)
    start = prev = ids[0]
    for e in ids[1:]:
        if e != prev + 1:
            out.append((start, prev))
            start = e
        prev = e
    out.append((start, prev))
    return out


def replay(trace: Trace, policy: str, cache_bytes: int,
           settings: CacheSettings = CacheSettings()) -> dict:
    """Replay ``trace`` on a fresh ``policy`` manager of ``cache_bytes`` with
    the eviction ``settings`` (the policy fixes the switches) and return the
    result row (RESULT_FIELDS).  Eviction CPU is the thread time of the
    periodic passes alone (inserts evict inline and are not in it)."""
    pol = POLICIES[policy]
    clock = _Clock()
    m = pol.build(cache_bytes, time_threshold_ms=settings.time_threshold_ms,
                  max_requeue=settings.max_requeue,
                  eviction_watermark=settings.eviction_watermark, clock=clock)
    caches = [m.cache(n) for n in trace.names]
    sizes = trace.sizes
    expected = pol.uses_expected_reads
    inv_kind = MARK_DELETE if pol.invalidate_on == "mark_delete" else SLOWEST_READ
    interval = int(settings.eviction_interval_ms * 1_000_000)
    next_tick = interval
    passes = cpu = max_pass = 0
    storage_reads = storage_bytes = invalidated = peak = 0
    tt = time.thread_time_ns
    wall = time.perf_counter()

    def read(cache, sz, first, last, n_expected):
        nonlocal storage_reads, storage_bytes
        _, runs = lookup(cache, LEDGER, first, last)
        for a, b in runs:
            storage_reads += 1
            for eid in range(first + a, first + b + 1):
                s = sz[eid]
                storage_bytes += s
                cache.insert((LEDGER, eid), _payload(s), expected_reads=n_expected)
        for eid in range(first, last + 1):
            cache.mark_read((LEDGER, eid))

    for ev in trace:
        t = ev[0]
        while next_tick <= t:
            clock.now = next_tick
            c0 = tt()
            m.run_eviction()
            d = tt() - c0
            cpu += d
            max_pass = max(max_pass, d)
            passes += 1
            next_tick += interval
        clock.now = t
        kind, i = ev[1], ev[2]
        cache = caches[i]
        if kind == ADD:
            eid = ev[3]
            cache.insert((LEDGER, eid), _payload(sizes[i][eid]),
                         expected_reads=ev[4] if expected else 0)
            s = m.size
            if s > peak:
                peak = s
        elif kind == READ:
            read(cache, sizes[i], ev[3], ev[4], ev[5] if expected else 0)
        elif kind == REPLAY_ADD:
            for eid in ev[3]:
                cache.add_expected_read((LEDGER, eid))
        elif kind == REPLAY_READ:
            for a, b in _runs(ev[3]):
                read(cache, sizes[i], a, b, 0)
        elif kind == inv_kind:
            invalidated += cache.invalidate_up_to((LEDGER, ev[3]))[0]

    st = m.stats()
    return dict(
        workload=trace.workload, policy=policy, cache_mb=cache_bytes / (1 << 20),
        seed=trace.seed, topics=len(trace.topics), sim_seconds=trace.duration,
        events=trace.events_count, reads=trace.reads, hits=st.hits, misses=st.misses,
        hit_rate=st.hits / trace.reads if trace.reads else 0.0,
        storage_reads=storage_reads, storage_bytes=storage_bytes, inserts=st.inserts,
        evicted_entries=st.evicted_entries, evicted_bytes=st.evicted_bytes,
        requeues=st.requeues, invalidated_entries=invalidated, peak_bytes=peak,
        eviction_passes=passes, eviction_cpu_ns=cpu,
        eviction_ns_per_pass=cpu / passes if passes else 0.0, max_pass_ns=max_pass,
        replay_seconds=time.perf_counter() - wall, failure=None)
