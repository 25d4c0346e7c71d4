"""pylimiter.pulsar.balance, the library: every rule of the issue as a test,
with Pulsar's own unit-test cases restated (NamespaceBundlesTest, the four
*BundleSplitAlgorithmTest classes, ModularLoadManagerStrategyTest,
ThresholdShedderTest) and hypothesis properties for bundles and splits."""

from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pylimiter.pulsar.balance import (
    SPLIT_ALGORITHMS,
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
from pylimiter.pulsar.balance.split import flow_or_qps_equally_divide, topic_count_equally_divide

MIB = 1024 * 1024
FULL = Bundle(0, 0xFFFFFFFF, last=True)


# ---- topic_hash, Bundle, NamespaceBundles ----------------------------------------------


def test_topic_hash_is_unsigned_crc32_of_utf8():
    name = "persistent://tenant/ns/t"
    assert topic_hash(name) == zlib.crc32(name.encode()) & 0xFFFFFFFF
    assert topic_hash("persistent://t/ns/é") == zlib.crc32("persistent://t/ns/é".encode("utf-8"))
    # A name whose signed CRC-32 would be negative still comes back unsigned.
    assert any(topic_hash(f"t{i}") > 0x7FFFFFFF for i in range(20))
    assert all(0 <= topic_hash(f"t{i}") <= 0xFFFFFFFF for i in range(100))
    with pytest.raises(TypeError):
        topic_hash(b"bytes")


def test_bundle_name_and_ranges():
    b = Bundle(0x10, 0x20)
    assert b.name == "0x00000010_0x00000020"
    assert b.contains(0x10) and b.contains(0x1F) and not b.contains(0x20)
    last = Bundle(0x80000000, 0xFFFFFFFF, last=True)
    assert last.contains(0xFFFFFFFF) and last.contains(0x80000000)
    assert not Bundle(0x80000000, 0xFFFFFFFF).contains(0xFFFFFFFF)
    with pytest.raises(ValueError):
        Bundle(5, 5)
    with pytest.raises(ValueError):
        Bundle(-1, 5)
    with pytest.raises(ValueError):
        Bundle(0, 1 << 32)


def test_default_bundles_cut_the_range_evenly():
    four = NamespaceBundles.default(4)
    assert four.boundaries == (0, 0x40000000, 0x80000000, 0xC0000000, 0xFFFFFFFF)
    assert [b.name for b in four.bundles] == [
        "0x00000000_0x40000000", "0x40000000_0x80000000", "0x80000000_0xc0000000",
        "0xc0000000_0xffffffff"]
    assert [b.last for b in four.bundles] == [False, False, False, True]
    assert NamespaceBundles.default(1).boundaries == (0, 0xFFFFFFFF)
    assert NamespaceBundles.default(2).boundaries == (0, 0x80000000, 0xFFFFFFFF)
    three = NamespaceBundles.default(3)
    s = (1 << 32) // 3
    assert three.boundaries == (0, s, 2 * s, 0xFFFFFFFF)
    for n in (0, -1):
        with pytest.raises(ValueError):
            NamespaceBundles.default(n)


@pytest.mark.parametrize("bounds, needle", [
    ([0], "Need to specify at least 2 boundaries"),
    ([], "Need to specify at least 2 boundaries"),
    ([0, 0x80000000, 0x40000000, 0xFFFFFFFF], "unsorted"),
    ([0, 0x40000000, 0x40000000, 0xFFFFFFFF], "duplicated"),
    ([1, 0xFFFFFFFF], "first boundary"),
    ([0, 0xFFFFFFFE], "last boundary"),
    ([0, 1 << 32], "outside the hash range"),
    ([-1, 0xFFFFFFFF], "outside the hash range"),
])
def test_bad_boundaries_are_value_errors(bounds, needle):
    with pytest.raises(ValueError, match=needle):
        NamespaceBundles(bounds)


def test_find_uses_the_largest_boundary_at_or_below_the_hash():
    nb = NamespaceBundles([0, 0x40000000, 0x80000000, 0xFFFFFFFF])
    assert nb.find(0).lower == 0
    assert nb.find(0x3FFFFFFF).lower == 0
    assert nb.find(0x40000000).lower == 0x40000000
    assert nb.find(0x80000000).lower == 0x80000000
    assert nb.find(0xFFFFFFFF) == nb.bundles[-1]       # the last boundary: the last bundle
    name = "persistent://pulsar/use/ns2/topic-1"
    assert nb.find(name) == nb.find(topic_hash(name))
    assert nb.find(name).contains(topic_hash(name))
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError):
            nb.find(bad)
    with pytest.raises(TypeError):
        nb.find(1.5)


def test_split_replaces_one_bundle():
    nb = NamespaceBundles([0, 0x80000000, 0xFFFFFFFF])
    first = nb.bundles[0]
    after = nb.split(first, [0x40000000])
    # The blog's example: [0x0000, 0x8000, 0xFFFF] split at 0x4000.
    assert after.boundaries == (0, 0x40000000, 0x80000000, 0xFFFFFFFF)
    assert nb.boundaries == (0, 0x80000000, 0xFFFFFFFF)          # immutable
    assert len(nb.split(nb.bundles[1], [0x90000000, 0xA0000000])) == 4
    assert nb.split(nb.bundles[1], [0x90000000]).bundles[-1].last


@pytest.mark.parametrize("cuts", [[], [0], [0x80000000], [0x50000000, 0x40000000],
                                  [0x40000000, 0x40000000], [0x90000000]])
def test_split_rejects_boundaries_not_strictly_inside_and_ascending(cuts):
    nb = NamespaceBundles([0, 0x80000000, 0xFFFFFFFF])
    with pytest.raises(ValueError):
        nb.split(nb.bundles[0], cuts)


def test_split_rejects_a_foreign_bundle():
    nb = NamespaceBundles([0, 0x80000000, 0xFFFFFFFF])
    for foreign in (Bundle(0, 0x40000000), Bundle(0x80000000, 0xFFFFFFFF)):
        with pytest.raises(ValueError, match="not a bundle of this namespace"):
            nb.split(foreign, [0x20000000 if foreign.lower == 0 else 0x90000000])


_hashes = st.integers(0, 0xFFFFFFFF)


@st.composite
def _namespace_and_split(draw):
    inner = draw(st.lists(st.integers(1, 0xFFFFFFFE), unique=True, max_size=12))
    nb = NamespaceBundles([0, *sorted(inner), 0xFFFFFFFF])
    i = draw(st.integers(0, len(nb) - 1))
    b = nb.bundles[i]
    assume(b.upper - b.lower >= 2)
    cuts = draw(st.lists(st.integers(b.lower + 1, b.upper - 1), unique=True, min_size=1,
                         max_size=5))
    return nb, b, sorted(cuts)


@settings(max_examples=300, deadline=None)
@given(_namespace_and_split(), st.lists(_hashes, max_size=30))
def test_every_hash_lies_in_exactly_one_bundle_before_and_after_a_split(case, hashes):
    nb, bundle, cuts = case
    after = nb.split(bundle, cuts)
    probes = hashes + list(nb.boundaries) + list(after.boundaries) + [c - 1 for c in cuts]
    for layout in (nb, after):
        for h in probes:
            holders = [b for b in layout.bundles if b.contains(h)]
            assert len(holders) == 1
            assert layout.find(h) == holders[0]
    assert len(after) == len(nb) + len(cuts)


# ---- the split algorithms --------------------------------------------------------------


def test_unknown_algorithm_names_the_four():
    with pytest.raises(ValueError) as e:
        split_boundaries("hash_equally_divide", FULL, [])
    for name in SPLIT_ALGORITHMS:
        assert name in str(e.value)


def test_range_split_of_the_full_bundle():
    # RangeEquallyDivideBundleSplitAlgorithmTest
    assert split_boundaries("range_equally_divide", FULL, []) == [0x7FFFFFFF]
    assert split_boundaries("range_equally_divide", Bundle(10, 0xFFFFFFFF, True), []) == \
        [10 + (0xFFFFFFFF - 10) // 2]
    assert split_boundaries("range_equally_divide", Bundle(0, 0x80000000), []) == [0x40000000]
    assert split_boundaries("range_equally_divide", Bundle(7, 8), []) is None   # width 1


def _pulsar_topic_count_boundary(names):
    h = sorted(zlib.crc32(n.encode()) for n in names)
    start, end = h[max(len(h) // 2 - 1, 0)], h[len(h) // 2]
    return start + (end - start) // 2


@pytest.mark.parametrize("names", [["a", "b", "c"], ["a", "b", "c", "d", "e"]])
def test_topic_count_split_of_3_and_5_topics(names):
    # TopicCountEquallyDivideBundleSplitAlgorithmTest.testAlgorithmReturnCorrectResult
    got = split_boundaries("topic_count_equally_divide", FULL, names)
    assert got == [_pulsar_topic_count_boundary(names)]
    below = sum(topic_hash(n) < got[0] for n in names)
    assert below == len(names) // 2     # odd n: the lower half gets floor(n/2)


def test_topic_count_split_blog_example():
    # The six hashes of the StreamNative article: the boundary is 0x0012.
    hashes = [0x0000, 0x0005, 0x0010, 0x0015, 0x0020, 0x0025]
    assert topic_count_equally_divide(Bundle(0, 0x8000), hashes) == [0x0012]


def test_topic_count_split_needs_two_topics_and_ignores_outsiders():
    assert split_boundaries("topic_count_equally_divide", FULL, ["a"]) is None
    assert split_boundaries("topic_count_equally_divide", FULL, []) is None
    # Names given twice are one topic.
    assert split_boundaries("topic_count_equally_divide", FULL, ["a", "a"]) is None
    inside = Bundle(0, 0x80000000)
    names = [f"t{i}" for i in range(40)]
    mine = [n for n in names if inside.contains(topic_hash(n))]
    assert split_boundaries("topic_count_equally_divide", inside, names) == \
        [_pulsar_topic_count_boundary(mine)]
    # Middle hashes at `lower`: the boundary would be lower itself, so no split.
    assert topic_count_equally_divide(Bundle(100, 200), [100, 100, 150]) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=60, unique=True))
def test_topic_count_split_balances_within_one_topic(names):
    h = sorted(topic_hash(n) for n in names)
    n = len(h)
    assume(h[n // 2] - h[max(n // 2 - 1, 0)] >= 2)
    cut = split_boundaries("topic_count_equally_divide", FULL, names)
    assert cut is not None and len(cut) == 1
    lower = sum(x < cut[0] for x in h)
    assert lower == n // 2 and n - lower - lower in (0, 1)


# Two topics hashing inside [1, 1000]: Pulsar's test mocks the bundle and its
# topic list, here the topics must really hash into the bundle.
IN_1_1000 = ["persistent://t/ns/topic-3531356", "persistent://t/ns/topic-13133512"]


def test_specified_positions_on_bundle_1_1000():
    # SpecifiedPositionsBundleSplitAlgorithmTest.testAlgorithmReturnCorrectResult
    assert all(1 <= topic_hash(t) < 1000 for t in IN_1_1000)
    got = split_boundaries("specified_positions_divide", Bundle(1, 1000), IN_1_1000,
                           positions=[-1, 0, 1, 100, 200, 500, 800, 1000, 1100])
    assert got == [100, 200, 500, 800]


def test_specified_positions_rules():
    for empty in (None, []):
        with pytest.raises(ValueError, match="SplitBoundaries can't be empty"):
            split_boundaries("specified_positions_divide", FULL, [], positions=empty)
    # testTotalTopicsSizeLessThan1
    assert split_boundaries("specified_positions_divide", FULL, ["a"], positions=[1, 2]) is None
    assert split_boundaries("specified_positions_divide", FULL, ["a", "b"],
                            positions=[500, 9, 500, 9]) == [9, 500]      # sorted, de-duplicated
    assert split_boundaries("specified_positions_divide", FULL, ["a", "b"],
                            positions=[0, 0xFFFFFFFF]) is None          # none strictly inside


def _flow_topics(named):
    return {n: TopicStats(msg_rate_in=ri, msg_rate_out=ro, msg_throughput_in=ti,
                          msg_throughput_out=to) for n, (ri, ro, ti, to) in named.items()}


def test_flow_split_first_topic_over_the_limit_gets_the_plus_one_boundary():
    # FlowOrQpsEquallyDivideBundleSplitAlgorithmTest.testFirstPositionIsOverLoad
    names = [f"persistent://test-tenant1/test-namespace1/test-partition-{i}" for i in range(5)]
    by_hash = sorted(names, key=topic_hash)
    stats = {by_hash[0]: (1000, 1000, 1000, 1000)}
    stats.update({n: (24.5, 25, 1000, 1000) for n in by_hash[1:]})
    got = split_boundaries("flow_or_qps_equally_divide", FULL, _flow_topics(stats),
                           max_msg_rate=1010, max_bandwidth_mbytes=100, threshold_pct=10)
    h0, h1 = topic_hash(by_hash[0]), topic_hash(by_hash[1])
    assert got[0] == h0 + (h1 - h0) // 2 + 1


def test_flow_split_pieces_stay_under_the_limits():
    # FlowOrQpsEquallyDivideBundleSplitAlgorithmTest.testSplitBundleByFlowOrQps
    stats = {}
    for i in range(1, 13):
        rate_in = 24.5 if i < 6 else 25.5
        for j in range(20):
            stats[f"persistent://test-tenant1/test-namespace1/test{i}-partition-{j}"] = \
                (rate_in, 25, 1000, 1000)
    stats["persistent://test-tenant1/test-namespace1/test695-partition-0"] = (25, 35, 1000, 1000)
    cuts = split_boundaries("flow_or_qps_equally_divide", FULL, _flow_topics(stats),
                            max_msg_rate=1010, max_bandwidth_mbytes=100, threshold_pct=10)
    assert cuts and cuts == sorted(set(cuts))
    by_hash = sorted((topic_hash(n), sum(v[:2])) for n, v in stats.items())
    edges = [0, *cuts, 1 << 32]
    for lo, hi in zip(edges, edges[1:]):
        assert sum(r for h, r in by_hash if lo <= h < hi) < 1010


def test_flow_split_rules():
    t = {"a": (10, 10, 10, 10), "b": (10, 10, 10, 10)}
    assert split_boundaries("flow_or_qps_equally_divide", FULL, _flow_topics(t)) is None  # small
    assert split_boundaries("flow_or_qps_equally_divide", FULL,
                            _flow_topics({"a": (1e6, 0, 0, 0)})) is None           # one topic
    idle = {"a": (1e6, 0, 0, 0), "b": (0, 0, 0, 0)}
    assert split_boundaries("flow_or_qps_equally_divide", FULL, _flow_topics(idle)) is None
    # Over the limit by less than the threshold: no split.
    near = {"a": (16000, 0, 0, 0), "b": (16000, 0, 0, 0)}
    assert split_boundaries("flow_or_qps_equally_divide", FULL, _flow_topics(near)) is None
    hot = {"a": (20000, 0, 0, 0), "b": (20000, 0, 0, 0)}
    cut = split_boundaries("flow_or_qps_equally_divide", FULL, _flow_topics(hot))
    ha, hb = sorted([topic_hash("a"), topic_hash("b")])
    assert cut == [ha + (hb - ha) // 2 + 1]
    # Bandwidth alone triggers it too.
    fat = {"a": (1, 0, 60 * MIB, 0), "b": (1, 0, 60 * MIB, 0)}
    assert split_boundaries("flow_or_qps_equally_divide", FULL, _flow_topics(fat)) == cut
    with pytest.raises(ValueError, match="TopicStats"):
        split_boundaries("flow_or_qps_equally_divide", FULL, ["a", "b"])
    with pytest.raises(ValueError, match="TopicStats"):
        split_boundaries("flow_or_qps_equally_divide", FULL, {"a": 1.0, "b": 2.0})


def test_flow_split_drops_boundaries_at_the_edge_or_not_ascending():
    hot = TopicStats(msg_rate_in=40000)
    # Equal hashes give the same boundary twice: the second is dropped.
    same = [(5, "a", hot), (5, "b", hot), (5, "c", hot)]
    assert flow_or_qps_equally_divide(Bundle(0, 100), same, max_msg_rate=30000,
                                      max_bandwidth_mbytes=100, threshold_pct=10) == [6]
    # A boundary on the upper edge (possible in a last bundle) is dropped.
    edge = [(98, "a", hot), (99, "b", hot)]
    assert flow_or_qps_equally_divide(Bundle(0, 99, last=True), edge, max_msg_rate=30000,
                                      max_bandwidth_mbytes=100, threshold_pct=10) == []


def test_split_algorithms_and_topic_stats_defaults():
    assert SPLIT_ALGORITHMS == ("range_equally_divide", "topic_count_equally_divide",
                                "specified_positions_divide", "flow_or_qps_equally_divide")
    assert TopicStats() == TopicStats(0, 0, 0, 0, 0, 0)
    # Only specified_positions_divide reads positions.
    for algorithm in ("range_equally_divide", "topic_count_equally_divide"):
        assert split_boundaries(algorithm, FULL, ["a", "b"], positions=[5]) == \
            split_boundaries(algorithm, FULL, ["a", "b"])


_stats = st.builds(TopicStats, msg_rate_in=st.floats(0, 5e4), msg_rate_out=st.floats(0, 5e4),
                   msg_throughput_in=st.floats(0, 2e8), msg_throughput_out=st.floats(0, 2e8))


@st.composite
def _bundle(draw):
    lo = draw(st.integers(0, 0xFFFFFFFE))
    hi = draw(st.integers(lo + 1, 0xFFFFFFFF))
    return Bundle(lo, hi, last=hi == 0xFFFFFFFF and draw(st.booleans()))


@settings(max_examples=300, deadline=None)
@given(_bundle(), st.dictionaries(st.text(min_size=1, max_size=8), _stats, max_size=40),
       st.lists(st.integers(-10, (1 << 32) + 10), min_size=1, max_size=8))
def test_split_boundaries_are_strictly_inside_and_ascending(bundle, topics, positions):
    for algorithm in SPLIT_ALGORITHMS:
        cuts = split_boundaries(algorithm, bundle, topics, positions=positions,
                                max_msg_rate=1000, max_bandwidth_mbytes=1)
        if cuts is None:
            continue
        assert all(bundle.lower < c < bundle.upper for c in cuts)
        assert all(a < b for a, b in zip(cuts, cuts[1:]))
        layout = NamespaceBundles(sorted({0, bundle.lower, bundle.upper, 0xFFFFFFFF}))
        if cuts and bundle in layout.bundles:      # the result is a valid split
            assert len(layout.split(bundle, cuts)) == len(layout) + len(cuts)


# ---- broker and bundle load ------------------------------------------------------------


def test_resource_usage_percent():
    assert ResourceUsage(50, 200).percent == 25.0
    assert ResourceUsage(1000, 100).percent == 1000.0
    assert ResourceUsage(10, 0).percent == 0.0
    assert ResourceUsage(-5, 100).percent == 0.0
    assert ResourceUsage().percent == 0.0


def test_format_usage():
    # ThresholdShedderTest.testPrintResourceUsage
    data = BrokerLoad(cpu=ResourceUsage(10, 100), memory=ResourceUsage(50, 100),
                      direct_memory=ResourceUsage(90, 100), bandwidth_in=ResourceUsage(30, 100),
                      bandwidth_out=ResourceUsage(20, 100))
    assert data.format_usage() == ("cpu: 10.00%, memory: 50.00%, directMemory: 90.00%, "
                                   "bandwidthIn: 30.00%, bandwidthOut: 20.00%")


def test_max_resource_usage_skips_memory_and_weights_multiply():
    data = BrokerLoad(cpu=ResourceUsage(10, 100), memory=ResourceUsage(99, 100),
                      direct_memory=ResourceUsage(20, 100), bandwidth_in=ResourceUsage(30, 100),
                      bandwidth_out=ResourceUsage(40, 100))
    assert data.max_resource_usage() == pytest.approx(0.40)
    assert data.max_resource_usage_with_weight(1, 1, 1, 1, 1) == pytest.approx(0.99)
    assert data.max_resource_usage_with_weight(5, 0, 0, 1, 1) == pytest.approx(0.50)
    assert data.max_resource_usage_with_weight(0, 0, 0, 0, 0) == 0.0
    assert BrokerLoad(cpu=ResourceUsage(300, 100)).max_resource_usage() == pytest.approx(3.0)
    assert BrokerLoad().bundles == frozenset() and BundleLoad().topics == 0
    assert LoadWeights().astuple() == (1.0, 0.0, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        LoadWeights(cpu=-1)


# ---- placement ---------------------------------------------------------------------------


def test_least_long_term_message_rate():
    # ModularLoadManagerStrategyTest.testLeastLongTermMessageRate
    brokers = {str(i): BrokerLoad(long_term_msg_rate_in=100.0 * i) for i in (1, 2, 3)}
    strategy = LeastLongTermMessageRate(rng=random.Random(1))
    assert strategy.select(brokers, brokers) == "1"
    brokers["1"].long_term_msg_rate_in = 400
    assert strategy.select(brokers, brokers) == "2"
    brokers["2"].cpu = ResourceUsage(90, 100)
    assert strategy.select(brokers, brokers) == "3"


def test_least_long_term_message_rate_counts_preallocation_and_out_rate():
    brokers = {"a": BrokerLoad(long_term_msg_rate_in=100),
               "b": BrokerLoad(long_term_msg_rate_in=50, long_term_msg_rate_out=60),
               "c": BrokerLoad(long_term_msg_rate_in=10, preallocated_msg_rate=95)}
    assert LeastLongTermMessageRate().select(["a", "b", "c"], brokers) == "a"


def test_least_long_term_message_rate_ties_and_missing():
    rng = random.Random(7)
    brokers = {"a": BrokerLoad(), "b": BrokerLoad(), "c": BrokerLoad(long_term_msg_rate_in=1)}
    strategy = LeastLongTermMessageRate(rng=rng)
    picks = {strategy.select(["a", "b", "c", "zz"], brokers) for _ in range(200)}
    assert picks == {"a", "b"}
    assert strategy.select(["zz"], brokers) is None and strategy.select([], brokers) is None
    # Same seed, same choices.
    seq = [LeastLongTermMessageRate(rng=random.Random(3)).select("ab", brokers) for _ in range(5)]
    assert len(set(seq)) == 1


def test_least_long_term_message_rate_all_overloaded_is_random():
    hot = ResourceUsage(95, 100)
    brokers = {n: BrokerLoad(bandwidth_in=hot, long_term_msg_rate_in=i)
               for i, n in enumerate("abc")}
    strategy = LeastLongTermMessageRate(rng=random.Random(2))
    assert {strategy.select("abc", brokers) for _ in range(300)} == set("abc")
    # Weights decide what counts: with the bandwidth weight at 0, nobody is overloaded.
    calm = LeastLongTermMessageRate(weights=LoadWeights(bandwidth_in=0))
    assert calm.select("abc", brokers) == "a"
    assert LeastLongTermMessageRate(overload_threshold_pct=96).select("abc", brokers) == "a"


def test_uniform_random_placement():
    brokers = {n: BrokerLoad() for n in "abcd"}
    u = UniformRandom(random.Random(0))
    assert {u.select("abcdz", brokers) for _ in range(400)} == set("abcd")
    assert u.select(["z"], brokers) is None


# ---- ThresholdShedder --------------------------------------------------------------------


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


# ---- BundleSplitter ----------------------------------------------------------------------


def test_bundle_splitter_thresholds():
    s = BundleSplitter()
    cases = {
        "t/a/0x00000000_0x40000000": BundleLoad(topics=1001),                           # topics
        "t/a/0x40000000_0x80000000": BundleLoad(topics=2, sessions=1001),               # sessions
        "t/a/0x80000000_0xc0000000": BundleLoad(topics=2, long_term_msg_rate_in=20000,
                                                long_term_msg_rate_out=10001),          # rate
        "t/b/0x00000000_0x80000000": BundleLoad(topics=2, long_term_throughput_in=60 * MIB,
                                                long_term_throughput_out=40 * MIB + 1),  # bytes
        "t/b/0x80000000_0xffffffff": BundleLoad(topics=1000, sessions=1000,
                                                long_term_msg_rate_in=30000,
                                                long_term_throughput_in=100 * MIB),     # at limit
        "t/c/0x00000000_0xffffffff": BundleLoad(topics=1, long_term_msg_rate_in=1e9),   # 1 topic
    }
    assert s.find_bundles_to_split(cases) == list(cases)[:4]
    no_sessions = BundleSplitter(max_sessions=0)
    assert "t/a/0x40000000_0x80000000" not in no_sessions.find_bundles_to_split(cases)


def test_bundle_splitter_respects_max_bundles_per_namespace():
    hot = BundleLoad(topics=5000)
    bundles = {f"t/a/0x{i:08x}_0x{i + 1:08x}": hot for i in range(3)}
    bundles["t/b/0x00000000_0xffffffff"] = hot
    assert BundleSplitter(max_bundles=5).find_bundles_to_split(bundles) == list(bundles)[:2] + \
        ["t/b/0x00000000_0xffffffff"]
    assert BundleSplitter(max_bundles=3).find_bundles_to_split(bundles) == \
        ["t/b/0x00000000_0xffffffff"]
    assert BundleSplitter(max_bundles=4).find_bundles_to_split(bundles) == \
        [list(bundles)[0], "t/b/0x00000000_0xffffffff"]
    with pytest.raises(ValueError, match="no namespace"):
        BundleSplitter().find_bundles_to_split({"0x0_0x1": hot})
    with pytest.raises(ValueError):
        BundleSplitter(max_topics=-1)
