"""pylimiter.pulsar.balance.split: the four split algorithms, with Pulsar's
*BundleSplitAlgorithmTest cases restated and a hypothesis property."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pylimiter.pulsar.balance import (
    SPLIT_ALGORITHMS,
    Bundle,
    NamespaceBundles,
    TopicStats,
    split_boundaries,
    topic_hash,
)
from pylimiter.pulsar.balance.split import (
    flow_or_qps_equally_divide,
    topic_count_equally_divide,
)

MIB = 1024 * 1024
FULL = Bundle(0, 0xFFFFFFFF, last=True)


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


# A real CRC-32 collision (found once by brute force over "t-<n>" names):
# two topics, one hash.  Pulsar's getLongHashCode puts both in the same bundle
# and TopicCountEquallyDivideBundleSplitAlgorithm counts both.
COLLIDING = ("persistent://public/default/t-29685295", "persistent://public/default/t-32060020")
COLLIDING_HASH = 0x9F4081E2
# Topics hashing below and above the collision.
BELOW = ("persistent://public/default/t-1", "persistent://public/default/t-3")
ABOVE = ("persistent://public/default/t-0", "persistent://public/default/t-4")


def test_the_colliding_pair_really_collides():
    assert [zlib.crc32(n.encode()) for n in COLLIDING] == [COLLIDING_HASH] * 2
    assert COLLIDING[0] != COLLIDING[1]
    assert all(topic_hash(n) < COLLIDING_HASH for n in BELOW)
    assert all(topic_hash(n) > COLLIDING_HASH for n in ABOVE)


def test_topic_count_split_of_two_topics_with_one_hash():
    # Two topics: Pulsar's list is [h, h], so the boundary is h itself (a
    # set of hashes saw one topic and did not split).
    assert split_boundaries("topic_count_equally_divide", FULL, list(COLLIDING)) == \
        [COLLIDING_HASH]
    # A name given twice is still one topic; the other name makes two.
    assert split_boundaries("topic_count_equally_divide", FULL,
                            [COLLIDING[0], COLLIDING[0], COLLIDING[1]]) == [COLLIDING_HASH]
    assert split_boundaries("topic_count_equally_divide", FULL,
                            dict.fromkeys(COLLIDING, TopicStats())) == [COLLIDING_HASH]


@pytest.mark.parametrize("others", [
    (BELOW[0],), (ABOVE[0],), (BELOW[0], ABOVE[0]), BELOW, ABOVE,
], ids=["below", "above", "around", "two-below", "two-above"])
def test_topic_count_split_around_a_collision(others):
    names = [*COLLIDING, *others]
    got = split_boundaries("topic_count_equally_divide", FULL, names)
    assert got == [_pulsar_topic_count_boundary(names)]
    h = sorted(topic_hash(n) for n in names)
    n = len(h)
    assert got == [h[max(n // 2 - 1, 0)] + (h[n // 2] - h[max(n // 2 - 1, 0)]) // 2]


def test_specified_positions_counts_colliding_topics_as_two():
    # SpecifiedPositionsBundleSplitAlgorithm refuses one topic, not one hash.
    assert split_boundaries("specified_positions_divide", FULL, list(COLLIDING),
                            positions=[5, 10]) == [5, 10]
    assert split_boundaries("specified_positions_divide", FULL, [COLLIDING[0]] * 2,
                            positions=[5, 10]) is None


def test_topic_names_are_deduplicated_without_their_own_hash_or_eq():
    class Hostile(str):
        def __hash__(self):
            raise RuntimeError("__hash__ says no")

        def __eq__(self, other):
            raise RuntimeError("__eq__ says no")

        __ne__ = __eq__

    names = [Hostile(COLLIDING[0]), Hostile(COLLIDING[0]), Hostile(COLLIDING[1])]
    for algorithm in ("topic_count_equally_divide", "specified_positions_divide"):
        assert split_boundaries(algorithm, FULL, names, positions=[COLLIDING_HASH]) == \
            [COLLIDING_HASH]
    assert split_boundaries("topic_count_equally_divide", FULL, names[:2]) is None
    with pytest.raises(TypeError):
        split_boundaries("topic_count_equally_divide", FULL, ["a", 7])


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
