"""pylimiter.pulsar.balance.splitter: BundleSplitterTask's thresholds and the
namespace's bundle cap."""

from __future__ import annotations

import pytest

from pylimiter.pulsar.balance import (
    BundleLoad,
    BundleSplitter,
)

MIB = 1024 * 1024


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
