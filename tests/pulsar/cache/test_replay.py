"""The simulator's unit of work: the reference policies (legacy, LRU), the
replayer (pylimiter.pulsar.cache.replay) and the idle-pass measurement
(scan)."""

from __future__ import annotations

import pytest

from pylimiter.pulsar.cache.policies import (
    POLICIES,
    LegacyCacheManager,
    LRUCacheManager,
)
from pylimiter.pulsar.cache.replay import replay
from pylimiter.pulsar.cache.scan import idle_pass_ns
from pylimiter.pulsar.cache.workloads import (
    WORKLOADS,
    Trace,
)

from .kit import FakeClock, release_only

SMALL = dict(scale=0.05, duration=4.0)


def test_legacy_refuses_inserts_when_full_and_scans_by_position():
    clock = FakeClock(0)
    m = LegacyCacheManager(1000, time_threshold_ms=1, clock=clock)
    c = m.cache("t")
    # Out of position order in time: position 5 is the oldest entry.
    clock.now = 0
    assert c.insert((1, 5), b"x" * 100)
    clock.now = 10_000_000
    assert c.insert((1, 1), b"x" * 100)
    clock.now = 10_500_000
    # Only entries from the lowest position on, stopping at the first young
    # one: (1, 1) is young, so the expired (1, 5) survives (PIP-430's point).
    assert m.run_eviction() == (0, 0) and (1, 5) in c
    legacy_full = LegacyCacheManager(300, time_threshold_ms=1000, clock=clock)
    f = legacy_full.cache("t")
    f.insert((1, 0), b"x" * 290)
    assert f.insert((1, 1), b"x" * 5)                              # 295 < 300
    assert f.insert((1, 2), b"x" * 5) is False or legacy_full.size < 300


def test_legacy_size_eviction_takes_from_the_largest_caches():
    m = LegacyCacheManager(10_000, time_threshold_ms=1000, clock=FakeClock())
    big, small = m.cache("big"), m.cache("small")
    for i in range(30):
        small.insert((1, i), b"x" * 100)                           # 3000, older
    for i in range(68):
        big.insert((1, i), b"x" * 100)                             # 9800: not above 9800
    assert m.stats().evicted_entries == 0
    assert big.insert((1, 68), b"x" * 100)                        # 9900: free 900
    # the largest cache holds half the bytes alone: it pays everything,
    # from its lowest positions
    assert small.size == 3000 and big.size == 6900 - 900
    assert (1, 8) not in big and (1, 9) in big


def test_lru_evicts_least_recently_used_globally():
    m = LRUCacheManager(300, time_threshold_ms=1000, clock=FakeClock())
    a, b = m.cache("a"), m.cache("b")
    a.insert((1, 0), b"x" * 100)
    b.insert((1, 0), b"x" * 100)
    a.insert((1, 1), b"x" * 100)
    assert a.get((1, 0)) is not None                               # a:0 is now recent
    b.insert((1, 1), b"x" * 100)                                   # evicts b:0
    assert b.get((1, 0)) is None and a.get((1, 0)) is not None
    assert m.run_eviction() == (0, 0)
    a.invalidate_up_to((1, 0))
    assert m.stats().entries == 2 and m.size == 200


@release_only
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_replay_accounts_every_read(policy, workload):
    r = replay(Trace(workload, 1, **SMALL), policy, 2 << 20)
    assert r["hits"] + r["misses"] == r["reads"] > 0
    assert r["hit_rate"] == pytest.approx(r["hits"] / r["reads"])
    assert r["storage_reads"] <= r["misses"] and (r["storage_bytes"] > 0) == (r["misses"] > 0)
    assert r["eviction_passes"] == int(4.0 / 0.01) or r["eviction_passes"] > 0
    assert r["peak_bytes"] <= 2 << 20


@release_only
def test_expected_reads_keep_catchup_entries():
    t = dict(scale=0.1, duration=15)
    pip = replay(Trace("catchup", 1, **t), "pip430", 64 << 20)
    fifo = replay(Trace("catchup", 1, **t), "fifo", 64 << 20)
    assert pip["requeues"] > 0 and fifo["requeues"] == 0
    assert pip["storage_bytes"] < fifo["storage_bytes"]


@release_only
def test_idle_pass_measures_without_evicting():
    ns = idle_pass_ns(50, ("pip430", "legacy", "lru"), rounds=3, budget_passes=5000)
    assert set(ns) == {"pip430", "legacy", "lru"} and all(v > 0 for v in ns.values())
