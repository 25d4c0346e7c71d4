"""Which bundles are too hot or too big: Pulsar's ``BundleSplitterTask``
(run when ``loadBalancerAutoBundleSplitEnabled``, every
``loadBalancerSplitIntervalMinutes``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from ._checks import instance, number
from ._checks import name as _name
from .bundles import bundle_namespace
from .load import BundleLoad
from .split import MIB

__all__ = ["BundleSplitter"]


class BundleSplitter:
    """BundleSplitter finds the bundles over any split threshold.

    ``max_topics`` is ``loadBalancerNamespaceBundleMaxTopics`` (1000),
    ``max_sessions`` ``loadBalancerNamespaceBundleMaxSessions`` (1000; any
    value <= 0 turns the check off, as Pulsar's -1 does), ``max_msg_rate``
    ``loadBalancerNamespaceBundleMaxMsgRate`` (30000 msg/s, long-term
    in+out), ``max_bandwidth_mbytes``
    ``loadBalancerNamespaceBundleMaxBandwidthMbytes`` (100 MB/s, long-term
    in+out) and ``max_bundles`` ``loadBalancerNamespaceMaximumBundles`` (128
    per namespace).  Every setting is checked when set: NaN and infinities
    are a ValueError."""

    def __init__(self, max_topics: int = 1000, max_sessions: int = 1000,
                 max_msg_rate: float = 30000, max_bandwidth_mbytes: float = 100,
                 max_bundles: int = 128):
        self.max_topics = max_topics
        self.max_sessions = max_sessions
        self.max_msg_rate = max_msg_rate
        self.max_bandwidth_mbytes = max_bandwidth_mbytes
        self.max_bundles = max_bundles

    def __setattr__(self, attr, value):
        # Settings are checked whenever they are set, not only by __init__.
        # max_sessions has no floor: <= 0 disables that threshold.
        low = None if attr == "max_sessions" else 0
        integer = attr in ("max_topics", "max_sessions", "max_bundles")
        object.__setattr__(self, attr, number(attr, value, low=low, integer=integer))

    def over_threshold(self, load: BundleLoad) -> bool:
        """True if the bundle (with two topics or more) is over any threshold."""
        instance("load", load, BundleLoad)
        if load.topics < 2:
            return False  # a lone topic cannot be divided
        rate = load.long_term_msg_rate_in + load.long_term_msg_rate_out
        tput = load.long_term_throughput_in + load.long_term_throughput_out
        return (load.topics > self.max_topics
                or (self.max_sessions > 0 and load.sessions > self.max_sessions)
                or rate > self.max_msg_rate
                or tput > self.max_bandwidth_mbytes * MIB)

    def find_bundles_to_split(self, bundles: Mapping[str, BundleLoad]) -> list[str]:
        """Full bundle names to split, in the mapping's order.  A bundle is
        picked only while its namespace's bundles (those in the mapping plus
        those already picked in this call) stay under ``max_bundles``."""
        instance("bundles", bundles, Mapping)
        for bundle, load in bundles.items():
            _name("a bundle name", bundle)
            instance(f"bundles[{bundle!r}]", load, BundleLoad)
        per_ns = Counter(bundle_namespace(name) for name in bundles)
        picked: Counter = Counter()
        out: list[str] = []
        for name, load in bundles.items():
            if not self.over_threshold(load):
                continue
            ns = bundle_namespace(name)
            if per_ns[ns] + picked[ns] < self.max_bundles:
                out.append(name)
                picked[ns] += 1
        return out
