"""pylimiter.pulsar.balance.shedding: ThresholdShedder (Pulsar's
ThresholdShedderTest), lower boundary shedding included."""

from __future__ import annotations

import pytest

from pylimiter.pulsar.balance import (
    BrokerLoad,
    BundleLoad,
    ResourceUsage,
    ThresholdShedder,
)

MIB = 1024 * 1024


def _ten_bundle_cluster(cpu=ResourceUsage()):
    """ThresholdShedderTest's cluster: broker-1 at 99.9% bandwidth owns
    bundle-1..10 of i MiB/s in and out; broker2 owns ten of its own."""
    bundles, own1, own2 = {}, [], []
    total = 0.0
    for i in range(1, 11):
        load = BundleLoad(msg_throughput_in=i * MIB, msg_throughput_out=i * MIB)
        bundles[f"bundle-{i}"] = load
        bundles[f"broker2-bundle-{10 + i}"] = load
        own1.append(f"bundle-{i}")
        own2.append(f"broker2-bundle-{10 + i}")
        total += i * MIB
    hot = ResourceUsage(999, 1000)
    brokers = {"broker-1": BrokerLoad(cpu=cpu, bandwidth_in=hot, bandwidth_out=hot,
                                      msg_throughput_in=total, msg_throughput_out=total,
                                      bundles=frozenset(own1)),
               "broker2": BrokerLoad(bundles=frozenset(own2))}
    return brokers, bundles


def test_threshold_shedder_takes_the_heaviest_bundles_first():
    brokers, bundles = _ten_bundle_cluster()
    got = ThresholdShedder().find_bundles_for_unloading(brokers, bundles)
    assert got == {"broker-1": ["bundle-10", "bundle-9", "bundle-8"]}


def test_threshold_shedder_skips_recently_unloaded():
    brokers, bundles = _ten_bundle_cluster()
    got = ThresholdShedder().find_bundles_for_unloading(brokers, bundles,
                                                        recently_unloaded={"bundle-10", "bundle-9"})
    assert got == {"broker-1": ["bundle-8", "bundle-7", "bundle-6", "bundle-5"]}


def test_threshold_shedder_does_not_cap_usage_above_100_percent():
    # A CPU signal at 1000% counts as it is (the "within limit" rule was
    # reverted upstream): the gap to the mean is huge, so everything goes.
    brokers, bundles = _ten_bundle_cluster(cpu=ResourceUsage(1000, 100))
    got = ThresholdShedder().find_bundles_for_unloading(brokers, bundles)
    assert got["broker-1"] == [f"bundle-{i}" for i in range(10, 0, -1)]


def test_threshold_shedder_keeps_the_mapping_order_on_equal_throughput():
    names = ["z", "a", "m", "b"]
    bundles = {n: BundleLoad(msg_throughput_in=MIB) for n in names}
    brokers = {"hot": BrokerLoad(bandwidth_in=ResourceUsage(99, 100), msg_throughput_in=4 * MIB,
                                 bundles=frozenset(names)), "idle": BrokerLoad()}
    got = ThresholdShedder(min_throughput_mb=0).find_bundles_for_unloading(brokers, bundles)
    assert got == {"hot": ["z", "a"]}      # 4 MiB/s * (0.99 - 0.495 - 0.1 + 0.05) = 1.78 MiB/s


def test_threshold_shedder_quiet_cases():
    s = ThresholdShedder()
    assert s.find_bundles_for_unloading({}, {}) == {}                               # testNoBrokers
    hot = ResourceUsage(999, 1000)
    alone = {"broker-1": BrokerLoad(bandwidth_in=hot, bandwidth_out=hot)}
    assert ThresholdShedder().find_bundles_for_unloading(alone, {}) == {}  # no bundles
    single = {"b1": BrokerLoad(bandwidth_in=hot, msg_throughput_in=1e9,
                               bundles=frozenset({"bundle-1"})), "b2": BrokerLoad()}
    one = {"bundle-1": BundleLoad(msg_throughput_in=1e9)}
    assert ThresholdShedder().find_bundles_for_unloading(single, one) == {}       # sole bundle
    both_busy = {"b1": BrokerLoad(bandwidth_in=ResourceUsage(50, 100),
                                  bundles=frozenset({"x", "y"}), msg_throughput_in=1e9),
                 "b2": BrokerLoad(bandwidth_in=ResourceUsage(45, 100))}
    xy = {"x": BundleLoad(msg_throughput_in=5e8), "y": BundleLoad(msg_throughput_in=5e8)}
    assert ThresholdShedder().find_bundles_for_unloading(both_busy, xy) == {}       # within 10%
    # Over the threshold but the traffic to move is under 10 MiB/s.
    small = {"b1": BrokerLoad(bandwidth_in=ResourceUsage(90, 100), msg_throughput_in=20 * MIB,
                              bundles=frozenset({"x", "y"})), "b2": BrokerLoad()}
    assert ThresholdShedder().find_bundles_for_unloading(small, xy) == {}
    assert ThresholdShedder(min_throughput_mb=1).find_bundles_for_unloading(small, xy) == \
        {"b1": ["x"]}
    all_idle = {"a": BrokerLoad(), "b": BrokerLoad()}
    assert ThresholdShedder().find_bundles_for_unloading(all_idle, {}) == {}          # mean 0


def test_threshold_shedder_averages_usage_over_calls():
    s = ThresholdShedder(history=0.9)
    brokers = {"a": BrokerLoad(cpu=ResourceUsage(80, 100)), "b": BrokerLoad()}
    s.find_bundles_for_unloading(brokers, {})
    assert s.averages == pytest.approx({"a": 0.8, "b": 0.0})   # first sight: the usage itself
    brokers["a"].cpu = ResourceUsage(30, 100)
    brokers["b"].cpu = ResourceUsage(50, 100)
    s.find_bundles_for_unloading(brokers, {})
    assert s.averages == pytest.approx({"a": 0.8 * 0.9 + 0.3 * 0.1, "b": 0.05})


def test_threshold_shedder_history_keeps_an_old_peak_alive():
    # The averaged usage, not the current one, decides: a broker that just
    # cooled down is still shed from, a broker that just heated up is not.
    s = ThresholdShedder(history=0.9, min_throughput_mb=0)
    bundles = {f"x{i}": BundleLoad(msg_throughput_in=MIB) for i in range(4)}
    hot = {"a": BrokerLoad(cpu=ResourceUsage(90, 100), msg_throughput_in=4 * MIB,
                           bundles=frozenset(bundles)), "b": BrokerLoad(cpu=ResourceUsage(10, 100))}
    assert "a" in s.find_bundles_for_unloading(hot, bundles)
    hot["a"].cpu = ResourceUsage(10, 100)
    hot["b"].cpu = ResourceUsage(90, 100)
    assert "a" in s.find_bundles_for_unloading(hot, bundles)     # avg a 0.82, b 0.18


def _eleven_brokers(many_bundles_only=None, low=10):
    brokers, bundles = {}, {}
    for i in range(11):
        n_bundles = 10 if many_bundles_only in (None, i) else 1
        tput = 0 if i == low else 100 * MIB
        names = set()
        for j in range(n_bundles):
            name = f"broker-{i}-bundle-{j}"
            bundles[name] = BundleLoad(msg_throughput_in=tput, msg_throughput_out=tput)
            names.add(name)
            if many_bundles_only is None:
                names.add(f"bundle-{j}")        # as in Pulsar's test: owned, never reported
        usage = ResourceUsage(0 if i == low else 80, 100)
        brokers[f"broker-{i}"] = BrokerLoad(bandwidth_in=usage, bandwidth_out=usage,
                                            msg_throughput_in=tput, msg_throughput_out=tput,
                                            bundles=frozenset(names))
    return brokers, bundles


def test_lower_boundary_shedding():
    # ThresholdShedderTest.testLowerBoundaryShedding: 10 brokers at 80%, one
    # at 0%: the mean is 72.7%, nobody is above 82.7%, so only the lower
    # boundary rule moves something off the busiest broker (the first).
    brokers, bundles = _eleven_brokers()
    assert ThresholdShedder().find_bundles_for_unloading(brokers, bundles) == {}
    on = ThresholdShedder(lower_boundary_shedding=True)
    assert on.find_bundles_for_unloading(brokers, bundles) == \
        {"broker-0": ["broker-0-bundle-0"]}


def test_lower_boundary_shedding_without_an_idle_broker():
    # testLowerBoundarySheddingNoBrokerToOffload: everyone at 80%.
    brokers, bundles = _eleven_brokers(low=-1)
    on = ThresholdShedder(lower_boundary_shedding=True)
    assert on.find_bundles_for_unloading(brokers, bundles) == {}


def test_lower_boundary_shedding_skips_single_bundle_brokers():
    # testLowerBoundarySheddingBrokerWithOneBundle: only broker-3 has more
    # than one bundle, so it is the one that gives.
    brokers, bundles = _eleven_brokers(many_bundles_only=3, low=5)
    on = ThresholdShedder(lower_boundary_shedding=True)
    got = on.find_bundles_for_unloading(brokers, bundles)
    assert list(got) == ["broker-3"] and len(got["broker-3"]) == 1


def test_lower_boundary_shedding_respects_min_throughput():
    brokers, bundles = _eleven_brokers()
    on = ThresholdShedder(lower_boundary_shedding=True, min_throughput_mb=11)
    assert on.find_bundles_for_unloading(brokers, bundles) == {}


@pytest.mark.parametrize("kwargs", [dict(threshold_pct=-1), dict(history=1.5),
                                    dict(min_throughput_mb=-2), dict(history="x")])
def test_threshold_shedder_rejects_bad_settings(kwargs):
    with pytest.raises(ValueError):
        ThresholdShedder(**kwargs)
