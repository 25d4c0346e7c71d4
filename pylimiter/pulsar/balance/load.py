"""The load data the leader broker decides on: per-broker resource usage and
message rates (Pulsar's ``LocalBrokerData`` + ``TimeAverageBrokerData``),
per-bundle rates (``BundleData``), and the resource weights
(``loadBalancer*ResourceWeight``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ._checks import instance, number
from ._checks import name as _name

__all__ = ["BrokerLoad", "BundleLoad", "LoadWeights", "ResourceUsage"]


@dataclass(frozen=True)
class ResourceUsage:
    """One resource of a broker: ``usage`` out of ``limit`` (any unit, the
    same for both)."""

    usage: float = 0.0
    limit: float = 0.0

    def __post_init__(self):
        # Finite (ValueError; a negative value, Pulsar's "unknown", gives 0%),
        # and a usage/limit ratio a float can hold: every weighted usage
        # stays a number the leader can compare.
        usage = number("usage", self.usage, low=None)
        limit = number("limit", self.limit, low=None)
        if usage > 0 and limit > 0 and not math.isfinite(100.0 * usage / limit):
            raise ValueError(f"usage {usage} over limit {limit} overflows a float")
        object.__setattr__(self, "usage", usage)
        object.__setattr__(self, "limit", limit)

    @property
    def percent(self) -> float:
        """``100 * usage / limit``, or 0.0 without a limit or a usage
        (``ResourceUsage.percentUsage``)."""
        if self.limit > 0 and self.usage > 0:
            return 100.0 * self.usage / self.limit
        return 0.0


@dataclass(frozen=True)
class LoadWeights:
    """How much each resource counts in a broker's usage: Pulsar's current
    defaults of ``loadBalancerCPUResourceWeight`` (1.0),
    ``loadBalancerMemoryResourceWeight`` (0.0),
    ``loadBalancerDirectMemoryResourceWeight`` (0.0),
    ``loadBalancerBandwithInResourceWeight`` (1.0) and
    ``loadBalancerBandwithOutResourceWeight`` (1.0)."""

    cpu: float = 1.0
    memory: float = 0.0
    direct_memory: float = 0.0
    bandwidth_in: float = 1.0
    bandwidth_out: float = 1.0

    def __post_init__(self):
        for f in ("cpu", "memory", "direct_memory", "bandwidth_in", "bandwidth_out"):
            object.__setattr__(self, f, number(f"weight {f}", getattr(self, f)))

    def astuple(self) -> tuple[float, float, float, float, float]:
        """(cpu, memory, direct_memory, bandwidth_in, bandwidth_out)."""
        return (self.cpu, self.memory, self.direct_memory, self.bandwidth_in,
                self.bandwidth_out)


@dataclass
class BrokerLoad:
    """What one broker reports, as the leader sees it.

    Resource usages and the ``msg_*`` rates are short-term (the latest
    report); the ``long_term_*`` rates are time averages over the broker's
    bundles; ``preallocated_msg_rate`` is the long-term in+out rate of bundles
    the leader has assigned to the broker but that it has not reported yet.
    ``bundles`` holds the full names of the bundles the broker owns."""

    cpu: ResourceUsage = field(default_factory=ResourceUsage)
    memory: ResourceUsage = field(default_factory=ResourceUsage)
    direct_memory: ResourceUsage = field(default_factory=ResourceUsage)
    bandwidth_in: ResourceUsage = field(default_factory=ResourceUsage)
    bandwidth_out: ResourceUsage = field(default_factory=ResourceUsage)
    msg_rate_in: float = 0.0
    msg_rate_out: float = 0.0
    msg_throughput_in: float = 0.0
    msg_throughput_out: float = 0.0
    long_term_msg_rate_in: float = 0.0
    long_term_msg_rate_out: float = 0.0
    preallocated_msg_rate: float = 0.0
    bundles: frozenset = field(default_factory=frozenset)

    def __setattr__(self, attr, value):
        # Checked on every assignment, not only by __init__: the leader adds
        # to preallocated_msg_rate as it assigns bundles.  Rates are finite
        # numbers >= 0 (a NaN rate once won every placement), usages are
        # ResourceUsage, bundles a set of names (stored as a frozenset).
        if attr in _RESOURCES:
            instance(attr, value, ResourceUsage)
        elif attr == "bundles":
            if isinstance(value, (str, bytes)):
                raise TypeError("bundles must be a set of bundle names, not one name")
            value = frozenset(_name("a bundle name", b) for b in value)
        else:
            value = number(attr, value)
        object.__setattr__(self, attr, value)

    def max_resource_usage(self) -> float:
        """The highest of the cpu, direct memory, bandwidth in and bandwidth
        out usages, as a fraction (``LocalBrokerData.getMaxResourceUsage``;
        memory is left out, as in Pulsar's current version).  The leader
        checks it against ``loadBalancerBrokerOverloadedThresholdPercentage``
        after placing a bundle."""
        return max(self.cpu.percent, self.direct_memory.percent, self.bandwidth_in.percent,
                   self.bandwidth_out.percent) / 100.0

    def max_resource_usage_with_weight(self, cpu: float, memory: float, direct_memory: float,
                                       bandwidth_in: float, bandwidth_out: float) -> float:
        """The highest weighted usage, as a fraction
        (``LocalBrokerData.getMaxResourceUsageWithWeight``).  Usages above
        100% are not capped.  The weights are finite numbers >= 0."""
        return self._weighted(*LoadWeights(cpu, memory, direct_memory, bandwidth_in,
                                           bandwidth_out).astuple())

    def _weighted(self, cpu, memory, direct_memory, bandwidth_in, bandwidth_out) -> float:
        return max(self.cpu.percent * cpu, self.memory.percent * memory,
                   self.direct_memory.percent * direct_memory,
                   self.bandwidth_in.percent * bandwidth_in,
                   self.bandwidth_out.percent * bandwidth_out) / 100.0

    def weighted_usage(self, weights: LoadWeights) -> float:
        """``max_resource_usage_with_weight`` with a LoadWeights."""
        return self._weighted(*instance("weights", weights, LoadWeights).astuple())

    def format_usage(self) -> str:
        """``LocalBrokerData.printResourceUsage``: ``"cpu: 10.00%, memory:
        50.00%, directMemory: 90.00%, bandwidthIn: 30.00%, bandwidthOut:
        20.00%"``."""
        return ("cpu: %.2f%%, memory: %.2f%%, directMemory: %.2f%%, bandwidthIn: %.2f%%, "
                "bandwidthOut: %.2f%%" % (self.cpu.percent, self.memory.percent,
                                           self.direct_memory.percent,
                                           self.bandwidth_in.percent,
                                           self.bandwidth_out.percent))


@dataclass
class BundleLoad:
    """What the leader knows of one bundle (``BundleData``): the short-term
    throughputs in bytes/s (``shortTermData``), the long-term rates in msg/s
    and throughputs in bytes/s (``longTermData``), and the topic and session
    (producers + consumers) counts of the latest report."""

    msg_throughput_in: float = 0.0
    msg_throughput_out: float = 0.0
    long_term_msg_rate_in: float = 0.0
    long_term_msg_rate_out: float = 0.0
    long_term_throughput_in: float = 0.0
    long_term_throughput_out: float = 0.0
    topics: int = 0
    sessions: int = 0

    def __setattr__(self, attr, value):
        # Checked on every assignment: rates finite numbers >= 0, counts ints >= 0.
        object.__setattr__(self, attr, number(attr, value, integer=attr in _COUNTS))


_RESOURCES = frozenset(("cpu", "memory", "direct_memory", "bandwidth_in", "bandwidth_out"))
_COUNTS = frozenset(("topics", "sessions"))
