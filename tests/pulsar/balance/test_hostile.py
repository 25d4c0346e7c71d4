"""The balance library under misuse (issue 18): the hostile-argument matrix
over every public constructor and method, NaN and infinities wherever a
rate, load, usage or threshold is taken (a NaN message rate once won
placement), BundleSplitter's "-1 disables the sessions threshold", and
exceptions (KeyboardInterrupt included) from the caller's objects."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

import pytest

from pylimiter.pulsar.balance import (
    BrokerLoad,
    Bundle,
    BundleLoad,
    BundleSplitter,
    LeastLongTermMessageRate,
    LoadWeights,
    NamespaceBundles,
    ResourceUsage,
    ThresholdShedder,
    TopicStats,
    UniformRandom,
    split_boundaries,
    topic_hash,
)
from pylimiter.pulsar.balance.bundles import bundle_namespace

from ..hostile import hostile_values, memory_cap, outcome

NS = "tenant/ns"


def broker(rate=100.0, cpu=10.0, bundles=()):
    return BrokerLoad(cpu=ResourceUsage(cpu, 100), msg_rate_in=rate, msg_rate_out=rate,
                      msg_throughput_in=rate * 1e5, msg_throughput_out=rate * 1e5,
                      long_term_msg_rate_in=rate, long_term_msg_rate_out=rate,
                      bundles=frozenset(bundles))


def bundles_of(n=4):
    return {f"{NS}/0x{i:08x}_0x{i + 1:08x}": BundleLoad(
        msg_throughput_in=2e7 * (i + 1), msg_throughput_out=1e7, long_term_msg_rate_in=5e4,
        long_term_msg_rate_out=1e3, long_term_throughput_in=1e6, long_term_throughput_out=1e6,
        topics=10, sessions=50 * i) for i in range(n)}


def _targets():
    """(label, call(x)) for every public constructor and method."""
    nb = NamespaceBundles.default(4)
    b = nb.bundles[0]
    topics = {f"persistent://{NS}/t{i}": TopicStats(msg_rate_in=1e4 * i) for i in range(8)}
    shedder = ThresholdShedder()
    brokers = {"a": broker(100, 90, list(bundles_of())), "b": broker(5, 5)}
    placement = LeastLongTermMessageRate(rng=random.Random(1))
    splitter = BundleSplitter()
    return [
        ("topic_hash", lambda x: topic_hash(x)),
        ("Bundle(lower)", lambda x: Bundle(x, 10)),
        ("Bundle(upper)", lambda x: Bundle(0, x)),
        ("Bundle(last)", lambda x: Bundle(0, 10, x)),
        ("Bundle.contains", lambda x: b.contains(x)),
        ("NamespaceBundles(boundaries)", lambda x: NamespaceBundles(x)),
        ("NamespaceBundles(a boundary)", lambda x: NamespaceBundles([0, x, 0xFFFFFFFF])),
        ("NamespaceBundles.default", lambda x: NamespaceBundles.default(x)),
        ("NamespaceBundles.index", lambda x: nb.index(x)),
        ("NamespaceBundles.find", lambda x: nb.find(x)),
        ("NamespaceBundles.split(bundle)", lambda x: nb.split(x, [5])),
        ("NamespaceBundles.split(boundaries)", lambda x: nb.split(b, x)),
        ("NamespaceBundles.split(a boundary)", lambda x: nb.split(b, [x])),
        ("NamespaceBundles ==", lambda x: nb == x),
        ("bundle_namespace", lambda x: bundle_namespace(x)),
        ("split_boundaries(algorithm)", lambda x: split_boundaries(x, b, topics)),
        ("split_boundaries(bundle)", lambda x: split_boundaries("range_equally_divide", x, [])),
        ("split_boundaries(topics)", lambda x: split_boundaries("topic_count_equally_divide",
                                                                b, x)),
        ("split_boundaries(a topic)", lambda x: split_boundaries("topic_count_equally_divide",
                                                                 b, ["t", x])),
        ("split_boundaries(positions)", lambda x: split_boundaries(
            "specified_positions_divide", b, topics, positions=x)),
        ("split_boundaries(a position)", lambda x: split_boundaries(
            "specified_positions_divide", b, topics, positions=[5, x])),
        ("split_boundaries(stats)", lambda x: split_boundaries(
            "flow_or_qps_equally_divide", b, {"persistent://t/n/x": x, **topics})),
        ("split_boundaries(max_msg_rate)", lambda x: split_boundaries(
            "flow_or_qps_equally_divide", b, topics, max_msg_rate=x)),
        ("split_boundaries(threshold_pct)", lambda x: split_boundaries(
            "flow_or_qps_equally_divide", b, topics, threshold_pct=x)),
        ("TopicStats(msg_rate_in)", lambda x: TopicStats(msg_rate_in=x)),
        ("TopicStats(producers)", lambda x: TopicStats(producers=x)),
        ("ResourceUsage(usage)", lambda x: ResourceUsage(x, 100)),
        ("ResourceUsage(limit)", lambda x: ResourceUsage(50, x)),
        ("LoadWeights(cpu)", lambda x: LoadWeights(cpu=x)),
        ("BrokerLoad(cpu)", lambda x: BrokerLoad(cpu=x)),
        ("BrokerLoad(msg_rate_in)", lambda x: BrokerLoad(msg_rate_in=x)),
        ("BrokerLoad(preallocated_msg_rate)", lambda x: BrokerLoad(preallocated_msg_rate=x)),
        ("BrokerLoad(bundles)", lambda x: BrokerLoad(bundles=x)),
        ("BrokerLoad.preallocated_msg_rate=",
         lambda x: setattr(brokers["b"], "preallocated_msg_rate", x)),
        ("BrokerLoad.max_resource_usage_with_weight",
         lambda x: brokers["a"].max_resource_usage_with_weight(x, 1, 1, 1, 1)),
        ("BrokerLoad.weighted_usage", lambda x: brokers["a"].weighted_usage(x)),
        ("BundleLoad(msg_throughput_in)", lambda x: BundleLoad(msg_throughput_in=x)),
        ("BundleLoad(topics)", lambda x: BundleLoad(topics=x)),
        ("BundleLoad.sessions=", lambda x: setattr(BundleLoad(), "sessions", x)),
        ("BundleSplitter(max_topics)", lambda x: BundleSplitter(max_topics=x)),
        ("BundleSplitter(max_sessions)", lambda x: BundleSplitter(max_sessions=x)),
        ("BundleSplitter(max_msg_rate)", lambda x: BundleSplitter(max_msg_rate=x)),
        ("BundleSplitter(max_bandwidth_mbytes)", lambda x: BundleSplitter(
            max_bandwidth_mbytes=x)),
        ("BundleSplitter(max_bundles)", lambda x: BundleSplitter(max_bundles=x)),
        ("BundleSplitter.max_msg_rate=", lambda x: setattr(splitter, "max_msg_rate", x)),
        ("BundleSplitter.over_threshold", lambda x: splitter.over_threshold(x)),
        ("BundleSplitter.find_bundles_to_split(load)", lambda x: splitter.find_bundles_to_split(
            {f"{NS}/0x0_0x1": x})),
        ("BundleSplitter.find_bundles_to_split(name)", lambda x: splitter.find_bundles_to_split(
            Pairs([(x, BundleLoad(topics=5, sessions=5000))]))),
        ("BundleSplitter.find_bundles_to_split", lambda x: splitter.find_bundles_to_split(x)),
        ("LeastLongTermMessageRate(overload)", lambda x: LeastLongTermMessageRate(x)),
        ("LeastLongTermMessageRate(weights)", lambda x: LeastLongTermMessageRate(85, x)),
        ("LeastLongTermMessageRate(rng)", lambda x: LeastLongTermMessageRate(85, rng=x)),
        ("LeastLongTermMessageRate.overload_threshold_pct=",
         lambda x: setattr(LeastLongTermMessageRate(), "overload_threshold_pct", x)),
        ("LeastLongTermMessageRate.score", lambda x: placement.score(x)),
        ("LeastLongTermMessageRate.select(candidate)", lambda x: placement.select(["a", x],
                                                                                  brokers)),
        ("LeastLongTermMessageRate.select(candidates)", lambda x: placement.select(x, brokers)),
        ("LeastLongTermMessageRate.select(brokers)", lambda x: placement.select(["a"], x)),
        ("LeastLongTermMessageRate.select(a broker)", lambda x: placement.select(
            ["a", "c"], {**brokers, "c": x})),
        ("UniformRandom(rng)", lambda x: UniformRandom(x)),
        ("UniformRandom.select(candidate)", lambda x: UniformRandom(random.Random(1)).select(
            ["a", x], brokers)),
        ("ThresholdShedder(threshold_pct)", lambda x: ThresholdShedder(threshold_pct=x)),
        ("ThresholdShedder(history)", lambda x: ThresholdShedder(history=x)),
        ("ThresholdShedder(min_throughput_mb)", lambda x: ThresholdShedder(min_throughput_mb=x)),
        ("ThresholdShedder(weights)", lambda x: ThresholdShedder(weights=x)),
        ("ThresholdShedder.history=", lambda x: setattr(ThresholdShedder(), "history", x)),
        ("ThresholdShedder.find(brokers)", lambda x: shedder.find_bundles_for_unloading(
            x, bundles_of())),
        ("ThresholdShedder.find(a broker)", lambda x: shedder.find_bundles_for_unloading(
            {**brokers, "c": x}, bundles_of())),
        ("ThresholdShedder.find(a broker name)", lambda x: shedder.find_bundles_for_unloading(
            Pairs([*brokers.items(), (x, broker())]), bundles_of())),
        ("ThresholdShedder.find(a bundle)", lambda x: shedder.find_bundles_for_unloading(
            brokers, {**bundles_of(), f"{NS}/x": x})),
        ("ThresholdShedder.find(recent)", lambda x: shedder.find_bundles_for_unloading(
            brokers, bundles_of(), x)),
        ("ThresholdShedder.find(a recent)", lambda x: shedder.find_bundles_for_unloading(
            brokers, bundles_of(), ["r", x])),
    ], shedder


class Pairs(Mapping):
    """A mapping kept as a list of pairs, so any key fits."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __getitem__(self, key):
        for k, v in self.pairs:
            if k is key:
                return v
        raise KeyError(key)

    def __iter__(self):
        return (k for k, _ in self.pairs)

    def __len__(self):
        return len(self.pairs)


@pytest.mark.parametrize("label", [t[0] for t in _targets()[0]])
def test_hostile_argument_matrix(label):
    """Each call works or raises TypeError/ValueError; the shedder's averages
    stay finite."""
    for _name, value in hostile_values():
        targets, shedder = _targets()
        with memory_cap():
            outcome(dict(targets)[label], value)
        assert all(math.isfinite(v) for v in shedder.averages.values())


# ---- NaN and infinities (item 7) -------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_nan_or_infinite_rate_cannot_enter_load_data(bad):
    for make in (lambda: BrokerLoad(long_term_msg_rate_in=bad),
                 lambda: BrokerLoad(preallocated_msg_rate=bad),
                 lambda: BundleLoad(long_term_msg_rate_out=bad),
                 lambda: TopicStats(msg_throughput_in=bad),
                 lambda: ResourceUsage(bad, 100), lambda: ResourceUsage(1, bad),
                 lambda: LoadWeights(bandwidth_in=bad),
                 lambda: BundleSplitter(max_msg_rate=bad),
                 lambda: ThresholdShedder(threshold_pct=bad),
                 lambda: LeastLongTermMessageRate(bad)):
        with pytest.raises(ValueError):
            make()
    b = broker()
    with pytest.raises(ValueError):
        b.preallocated_msg_rate = bad           # the leader adds to it as it assigns
    assert b.preallocated_msg_rate == 0.0


def test_a_nan_rate_does_not_win_placement():
    # Listed first, a NaN score used to be kept as the best: every later
    # comparison with NaN is false.
    nan_broker = broker(rate=1.0)
    object.__setattr__(nan_broker, "long_term_msg_rate_in", math.nan)   # past the checks
    brokers = {"nan": nan_broker, "idle": broker(rate=0.0)}
    with pytest.raises(ValueError, match="NaN"):
        LeastLongTermMessageRate(rng=random.Random(1)).select(["nan", "idle"], brokers)
    assert LeastLongTermMessageRate(rng=random.Random(1)).select(["idle"], brokers) == "idle"


def test_an_overflowing_usage_is_refused_before_it_averages():
    with pytest.raises(ValueError, match="overflows"):
        ResourceUsage(1e300, 1e-300)
    shedder = ThresholdShedder(history=1.0)
    ok = {"a": broker(cpu=50), "b": broker(cpu=10)}
    shedder.find_bundles_for_unloading(ok, {})
    before = shedder.averages
    usage = ResourceUsage(1, 1)
    object.__setattr__(usage, "usage", 1e308)                    # past the checks: 1e310 %
    heavy = broker()
    object.__setattr__(heavy, "cpu", usage)
    with pytest.raises(ValueError, match="not finite"):
        shedder.find_bundles_for_unloading({**ok, "c": heavy}, {})
    assert shedder.averages == before


# ---- the sessions threshold (item 10) --------------------------------------------------------


@pytest.mark.parametrize("off", [-1, 0, -1000])
def test_max_sessions_at_or_below_zero_disables_the_sessions_threshold(off):
    # Pulsar documents -1 as "disable"; the contract says "sessions >
    # max_sessions when max_sessions > 0".
    s = BundleSplitter(max_sessions=off)
    assert s.max_sessions == off
    crowded = BundleLoad(topics=5, sessions=10**9)
    assert not s.over_threshold(crowded)
    assert BundleSplitter(max_sessions=1000).over_threshold(crowded)


# ---- exceptions from the caller's objects (item 5) -------------------------------------------


def test_keyboard_interrupt_from_the_random_source_changes_nothing():
    class Interrupting(random.Random):
        def choice(self, seq):
            raise KeyboardInterrupt

    brokers = {"a": broker(rate=1.0), "b": broker(rate=1.0)}
    for strategy in (LeastLongTermMessageRate(rng=Interrupting()), UniformRandom(Interrupting())):
        with pytest.raises(KeyboardInterrupt):
            strategy.select(["a", "b"], brokers)
    assert brokers["a"] == broker(rate=1.0)


def test_keyboard_interrupt_from_the_brokers_leaves_the_averages():
    shedder = ThresholdShedder()
    brokers = {"a": broker(cpu=80, bundles=list(bundles_of())), "b": broker(cpu=10)}
    shedder.find_bundles_for_unloading(brokers, bundles_of())
    before = shedder.averages

    class Interrupting(Mapping):
        def __init__(self, n):
            self.n = n

        def __getitem__(self, key):
            return brokers[key]

        def __iter__(self):
            for i, k in enumerate(brokers):
                if i == self.n:
                    raise KeyboardInterrupt
                yield k

        def __len__(self):
            return len(brokers)

    for n in (0, 1):
        with pytest.raises(KeyboardInterrupt):
            shedder.find_bundles_for_unloading(Interrupting(n), bundles_of())
        assert shedder.averages == before
