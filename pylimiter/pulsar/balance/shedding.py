"""Which bundles leave an overloaded broker: Pulsar's default
``LoadSheddingStrategy`` (``loadBalancerLoadSheddingStrategy`` =
``ThresholdShedder``)."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

from ._checks import instance, number
from ._checks import name as _name
from .load import BrokerLoad, BundleLoad, LoadWeights
from .split import MIB

__all__ = ["ThresholdShedder"]

#: ThresholdShedder.ADDITIONAL_THRESHOLD_PERCENT_MARGIN: unload enough to land
#: 5% below the threshold, so the broker does not sit on it.
ADDITIONAL_THRESHOLD_PERCENT_MARGIN = 0.05
#: ThresholdShedder.LOWER_BOUNDARY_THRESHOLD_MARGIN.
LOWER_BOUNDARY_THRESHOLD_MARGIN = 0.5


class ThresholdShedder:
    """ThresholdShedder unloads bundles from brokers whose usage is more than
    ``threshold_pct`` above the cluster's average.

    A broker's usage is its ``max_resource_usage_with_weight(weights)``
    averaged over calls: ``avg = avg * history + usage * (1 - history)``
    (the first sight sets it).  Settings: ``threshold_pct`` is
    ``loadBalancerBrokerThresholdShedderPercentage`` (10), ``history``
    ``loadBalancerHistoryResourcePercentage`` (0.9), ``min_throughput_mb``
    ``loadBalancerBundleUnloadMinThroughputThreshold`` (10 MB/s),
    ``lower_boundary_shedding`` ``lowerBoundarySheddingEnabled`` (false),
    ``weights`` the ``loadBalancer*ResourceWeight`` settings.

    Usage above 100% is taken as it is: Pulsar's recomputation that skipped
    such signals was reverted (apache/pulsar#18645)."""

    def __init__(self, threshold_pct: float = 10, history: float = 0.9,
                 min_throughput_mb: float = 10, lower_boundary_shedding: bool = False,
                 weights: LoadWeights = LoadWeights()):
        self.threshold_pct = threshold_pct
        self.history = history
        self.min_throughput_mb = min_throughput_mb
        self.lower_boundary_shedding = lower_boundary_shedding
        self.weights = weights
        self._avg: dict[str, float] = {}

    def __setattr__(self, attr, value):
        # Settings are checked whenever they are set, not only by __init__.
        if attr == "threshold_pct":
            value = float(number("threshold_pct", value))
        elif attr == "history":
            value = float(number("history", value, 0, 1))
        elif attr == "min_throughput_mb":
            value = float(number("min_throughput_mb", value))
        elif attr == "lower_boundary_shedding":
            value = bool(value)
        elif attr == "weights":
            instance("weights", value, LoadWeights)
        object.__setattr__(self, attr, value)

    @property
    def averages(self) -> dict[str, float]:
        """Each broker's averaged usage (a fraction) after the last call."""
        return dict(self._avg)

    def _average_usage(self, brokers: Mapping[str, BrokerLoad]) -> float:
        # Every usage is checked before any average moves: a bad broker
        # leaves the history as it was.
        usages = []
        for broker, data in brokers.items():
            usage = data.weighted_usage(self.weights)
            if not math.isfinite(usage):
                # inf * (1 - history) is NaN when history is 1: refuse it here.
                raise ValueError(f"broker {broker!r}: weighted usage {usage} is not finite "
                                 f"({data.format_usage()})")
            usages.append((broker, usage))
        total = 0.0
        for broker, usage in usages:
            prev = self._avg.get(broker)
            avg = usage if prev is None else prev * self.history + usage * (1 - self.history)
            self._avg[broker] = avg
            total += avg
        return total / len(brokers) if brokers else 0.0

    @staticmethod
    def _select(data: BrokerLoad, bundles: Mapping[str, BundleLoad], recent: Collection[str],
                minimum: float) -> list[str]:
        # Heaviest first; sorted() is stable, so equal throughputs keep the
        # order of `bundles`.
        owned = [(name, b.msg_throughput_in + b.msg_throughput_out)
                 for name, b in bundles.items() if name in data.bundles and name not in recent]
        owned.sort(key=lambda e: -e[1])
        chosen: list[str] = []
        marked = 0.0
        for name, tput in owned:
            if marked >= minimum and chosen:
                break
            chosen.append(name)
            marked += tput
        return chosen

    def find_bundles_for_unloading(self, brokers: Mapping[str, BrokerLoad],
                                   bundles: Mapping[str, BundleLoad],
                                   recently_unloaded: Collection[str] = ()) -> dict[str, list[str]]:
        """Broker -> bundles to unload, heaviest first; brokers with nothing to
        unload are absent.  Bundles in ``recently_unloaded`` (within
        ``loadBalancerSheddingGracePeriodMinutes``) stay where they are."""
        _check_loads(brokers, bundles)
        if isinstance(recently_unloaded, str):
            raise TypeError("recently_unloaded must be a collection of bundle names, not one")
        recent = {_name("a recently unloaded bundle", r) for r in recently_unloaded}
        threshold = self.threshold_pct / 100.0
        min_tput = self.min_throughput_mb * MIB
        mean = self._average_usage(brokers)
        selected: dict[str, list[str]] = {}
        if mean == 0:
            return selected
        for name, data in brokers.items():
            current = self._avg[name]
            if current < mean + threshold:
                continue
            share = current - mean - threshold + ADDITIONAL_THRESHOLD_PERCENT_MARGIN
            minimum = (data.msg_throughput_in + data.msg_throughput_out) * share
            if minimum < min_tput or len(data.bundles) <= 1:
                continue  # too little to be worth it, or a sole bundle that cannot move
            chosen = self._select(data, bundles, recent, minimum)
            if chosen:
                selected[name] = chosen
        if not selected and self.lower_boundary_shedding:
            self._lower_boundary(brokers, bundles, recent, threshold, min_tput, selected)
        return selected

    def _lower_boundary(self, brokers, bundles, recent, threshold, min_tput, selected) -> None:
        """lowerBoundarySheddingEnabled: when nobody is above the upper bound
        but some broker idles below ``mean - threshold``, take a slice off the
        busiest broker so the idle one gets work."""
        mean = self._average_usage(brokers)  # a second averaging step, as Pulsar does
        below = any(self._avg[n] < mean - threshold for n in brokers)
        if not below:
            return
        busiest, top = None, mean - threshold
        for name, data in brokers.items():
            if self._avg[name] > top and len(data.bundles) > 1:
                busiest, top = name, self._avg[name]
        if busiest is None:
            return
        data = brokers[busiest]
        minimum = ((data.msg_throughput_in + data.msg_throughput_out) * threshold
                   * LOWER_BOUNDARY_THRESHOLD_MARGIN)
        if min_tput > minimum:
            return
        chosen = self._select(data, bundles, recent, minimum)
        if chosen:
            selected[busiest] = chosen


def _check_loads(brokers, bundles) -> None:
    """Names are str and data the right classes, before any average moves."""
    instance("brokers", brokers, Mapping)
    instance("bundles", bundles, Mapping)
    for broker, data in brokers.items():
        _name("a broker name", broker)
        instance(f"brokers[{broker!r}]", data, BrokerLoad)
    for bundle, data in bundles.items():
        _name("a bundle name", bundle)
        instance(f"bundles[{bundle!r}]", data, BundleLoad)
