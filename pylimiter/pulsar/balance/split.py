"""Where to cut a bundle: Pulsar's four ``NamespaceBundleSplitAlgorithm``
classes (``supportedNamespaceBundleSplitAlgorithms``; the automatic splitter
uses ``defaultNamespaceBundleSplitAlgorithm``, ``range_equally_divide``).

Each takes the bundle and its topics and returns the new boundaries, or
None for "do not split".  Only boundaries strictly inside the bundle come
back, so a result can always be given to ``NamespaceBundles.split``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ._checks import number, show
from .bundles import Bundle, topic_hash

__all__ = ["MIB", "SPLIT_ALGORITHMS", "TopicStats", "split_boundaries"]

#: Pulsar's MBytes / LoadManagerShared.MIBI.
MIB = 1024 * 1024

SPLIT_ALGORITHMS = ("range_equally_divide", "topic_count_equally_divide",
                    "specified_positions_divide", "flow_or_qps_equally_divide")


@dataclass(frozen=True)
class TopicStats:
    """What the flow/qps split reads of a topic (Pulsar's ``TopicStatsImpl``):
    message rates in msg/s, throughputs in bytes/s, and client counts."""

    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    msg_throughput_in: float = 0.0
    msg_throughput_out: float = 0.0
    producers: int = 0
    consumers: int = 0

    def __post_init__(self):
        # Rates finite numbers >= 0 (NaN would never pull a boundary), counts
        # ints >= 0.
        for f in ("msg_rate_in", "msg_rate_out", "msg_throughput_in", "msg_throughput_out"):
            object.__setattr__(self, f, number(f, getattr(self, f)))
        for f in ("producers", "consumers"):
            object.__setattr__(self, f, number(f, getattr(self, f), integer=True))


def _inside(bundle: Bundle, boundary: int) -> bool:
    return bundle.lower < boundary < bundle.upper


def _one(bundle: Bundle, boundary: int) -> Optional[list[int]]:
    return [boundary] if _inside(bundle, boundary) else None


def range_equally_divide(bundle: Bundle) -> Optional[list[int]]:
    """``RangeEquallyDivideBundleSplitAlgorithm``: the middle of the range,
    ``lower + (upper - lower) // 2`` (the full bundle gives 0x7fffffff)."""
    return _one(bundle, bundle.lower + (bundle.upper - bundle.lower) // 2)


def topic_count_equally_divide(bundle: Bundle, hashes: list[int]) -> Optional[list[int]]:
    """``TopicCountEquallyDivideBundleSplitAlgorithm``: halfway between the two
    middle topic hashes, so each side gets half the topics (odd counts: the
    lower side gets floor(n/2)).  ``hashes`` has one entry per topic, equal
    hashes included (two names can share a CRC-32): two colliding topics
    give that hash itself.  None for fewer than two topics."""
    if len(hashes) <= 1:
        return None
    h = sorted(hashes)
    n = len(h)
    start, end = h[max(n // 2 - 1, 0)], h[n // 2]
    return _one(bundle, start + (end - start) // 2)


def specified_positions_divide(bundle: Bundle, n_topics: int,
                               positions: Optional[Sequence[int]]) -> Optional[list[int]]:
    """``SpecifiedPositionsBundleSplitAlgorithm``: the operator's positions
    that fall strictly inside the bundle, sorted (and de-duplicated here, so
    the result is a valid split).  Empty positions are an error even for an
    empty bundle, as in Pulsar; None for fewer than two topics."""
    if isinstance(positions, (str, bytes)):
        raise TypeError("split positions must be a sequence of ints")
    if not positions:
        raise ValueError("SplitBoundaries can't be empty")
    checked = []
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"split positions must be ints, not {type(p).__name__}")
        checked.append(int.__index__(p))    # plain ints: no foreign __eq__/__hash__
    positions = checked
    if n_topics <= 1:
        return None
    inside = sorted({p for p in positions if _inside(bundle, p)})
    return inside or None


def flow_or_qps_equally_divide(bundle: Bundle, stats: list[tuple[int, str, TopicStats]], *,
                               max_msg_rate: float, max_bandwidth_mbytes: float,
                               threshold_pct: float) -> Optional[list[int]]:
    """``FlowOrQpsEquallyDivideBundleSplitAlgorithm``: cut the bundle into
    pieces that each stay under ``loadBalancerNamespaceBundleMaxMsgRate`` and
    ``loadBalancerNamespaceBundleMaxBandwidthMbytes``, walking the topics in
    hash order.  Nothing happens unless the bundle exceeds one of them by more
    than ``flowOrQpsDifferenceThresholdPercentage``."""
    if len(stats) <= 1:
        return None
    kept = []
    total_rate = total_tput = 0.0
    for h, name, st in stats:
        rate = st.msg_rate_in + st.msg_rate_out
        tput = st.msg_throughput_in + st.msg_throughput_out
        if rate <= 0 and tput <= 0:
            continue  # Pulsar skips empty topics: they do not pull a boundary
        kept.append((h, name, rate, tput))
        total_rate += rate
        total_tput += tput
    max_rate = float(max_msg_rate)
    max_tput = float(max_bandwidth_mbytes) * MIB
    margin = 1 + threshold_pct / 100.0
    if len(kept) < 2 or (total_rate < max_rate * margin and total_tput < max_tput * margin):
        return None
    kept.sort(key=lambda t: (t[0], t[1]))
    out: list[int] = []
    acc_rate, acc_tput = kept[0][2], kept[0][3]
    for i in range(1, len(kept)):
        h, _name, rate, tput = kept[i]
        if (acc_rate > max_rate or acc_tput > max_tput
                or acc_rate + rate > max_rate or acc_tput + tput > max_tput):
            prev = kept[i - 1][0]
            # Pulsar's "+1": the boundary sits just above the midpoint, so a
            # gap of one hash still puts topic i on the new side.
            cut = prev + (h - prev) // 2 + 1
            if _inside(bundle, cut) and (not out or cut > out[-1]):
                out.append(cut)
            acc_rate, acc_tput = rate, tput
        else:
            acc_rate += rate
            acc_tput += tput
    return out


def split_boundaries(algorithm: str, bundle: Bundle,
                     topics: Union[Mapping[str, TopicStats], Iterable[str]], *,
                     positions: Optional[Sequence[int]] = None, max_msg_rate: float = 30000,
                     max_bandwidth_mbytes: float = 100,
                     threshold_pct: float = 10) -> Optional[list[int]]:
    """split_boundaries runs one of ``SPLIT_ALGORITHMS`` on ``bundle`` and
    returns the boundaries to split it at, or None for "do not split".

    ``topics`` are the bundle's topics (a Mapping's keys are the names; the
    flow/qps algorithm needs a ``TopicStats`` value for each).  Topics whose
    hash lies outside the bundle are ignored.  ``positions`` is read only by
    ``specified_positions_divide``.  ``max_msg_rate``,
    ``max_bandwidth_mbytes`` and ``threshold_pct`` are
    ``loadBalancerNamespaceBundleMaxMsgRate``,
    ``loadBalancerNamespaceBundleMaxBandwidthMbytes`` and
    ``flowOrQpsDifferenceThresholdPercentage``, read only by
    ``flow_or_qps_equally_divide``.  Returned boundaries are strictly inside
    (lower, upper) and ascending.  An unknown algorithm is a ValueError."""
    if type(algorithm) is not str or algorithm not in SPLIT_ALGORITHMS:
        raise ValueError(f"unknown split algorithm {show(algorithm)}; choose from "
                         f"{', '.join(SPLIT_ALGORITHMS)}")
    if not isinstance(bundle, Bundle):
        raise TypeError(f"bundle must be a Bundle, not {type(bundle).__name__}")
    if algorithm == "range_equally_divide":
        return range_equally_divide(bundle)
    if isinstance(topics, str):
        raise TypeError("topics must be a collection of topic names, not one str")
    if algorithm == "flow_or_qps_equally_divide":
        if not isinstance(topics, Mapping):
            raise ValueError("flow_or_qps_equally_divide needs a TopicStats per topic "
                             "(a Mapping of topic name to TopicStats), not names alone")
        stats = []
        for name, st in topics.items():
            if not isinstance(st, TopicStats):
                raise ValueError(f"flow_or_qps_equally_divide needs TopicStats values; "
                                 f"topic {name!r} has {type(st).__name__}")
            h = topic_hash(name)
            if bundle.contains(h):
                stats.append((h, name, st))
        return flow_or_qps_equally_divide(
            bundle, stats, max_msg_rate=number("max_msg_rate", max_msg_rate),
            max_bandwidth_mbytes=number("max_bandwidth_mbytes", max_bandwidth_mbytes),
            threshold_pct=number("threshold_pct", threshold_pct))
    # One entry per topic NAME, then a list of their hashes: two names with
    # the same CRC-32 are two topics (Pulsar sorts a List<Long> of every
    # owned topic's hash), while a name given twice is one.  topic_hash
    # refuses anything but a str first, and the dict is keyed by the plain
    # str value, so no foreign __hash__/__eq__ of a str subclass ever runs.
    by_name: dict[str, int] = {}
    for name in (topics.keys() if isinstance(topics, Mapping) else topics):
        h = topic_hash(name)
        by_name[name if type(name) is str else str.__str__(name)] = h
    hashes = [h for h in by_name.values() if bundle.contains(h)]
    if algorithm == "topic_count_equally_divide":
        return topic_count_equally_divide(bundle, hashes)
    return specified_positions_divide(bundle, len(hashes), positions)
