"""Which broker gets a bundle: Pulsar's default ``ModularLoadManagerStrategy``
(``loadBalancerLoadPlacementStrategy`` = ``LeastLongTermMessageRate``), and a
uniform random choice to compare it with."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from typing import Optional

from ._checks import number
from .load import BrokerLoad, LoadWeights

__all__ = ["LeastLongTermMessageRate", "UniformRandom"]


class LeastLongTermMessageRate:
    """LeastLongTermMessageRate picks the broker with the least long-term
    message rate, counting what was just assigned to it.

    A broker's score is ``preallocated_msg_rate + long_term_msg_rate_in +
    long_term_msg_rate_out``, or +inf when its weighted usage
    (``max_resource_usage_with_weight``) is above ``overload_threshold_pct``
    (``loadBalancerBrokerOverloadedThresholdPercentage``, 85).  The lowest
    score wins; ties, all-overloaded included, are broken at random among the
    tied candidates.  ``weights`` are the ``loadBalancer*ResourceWeight``
    settings; ``rng`` makes the tie-break reproducible."""

    def __init__(self, overload_threshold_pct: float = 85, weights: LoadWeights = LoadWeights(),
                 rng: Optional[random.Random] = None):
        self.overload_threshold_pct = float(number("overload_threshold_pct",
                                                   overload_threshold_pct))
        if not isinstance(weights, LoadWeights):
            raise TypeError(f"weights must be a LoadWeights, not {type(weights).__name__}")
        self.weights = weights
        self.rng = rng if rng is not None else random.Random()

    def score(self, broker: BrokerLoad) -> float:
        """The broker's score: its long-term plus preallocated message rate,
        +inf when overloaded."""
        if broker.weighted_usage(self.weights) > self.overload_threshold_pct / 100.0:
            return math.inf
        return (broker.preallocated_msg_rate + broker.long_term_msg_rate_in
                + broker.long_term_msg_rate_out)

    def select(self, candidates: Iterable[str], brokers: Mapping[str, BrokerLoad]) -> Optional[str]:
        """The chosen broker among ``candidates`` (those missing from
        ``brokers`` are skipped), or None when none is left."""
        best: list[str] = []
        best_score = math.inf
        for name in candidates:
            data = brokers.get(name)
            if data is None:
                continue
            s = self.score(data)
            if not best or s < best_score:
                best, best_score = [name], s
            elif s == best_score:
                best.append(name)
        if not best:
            return None
        return best[0] if len(best) == 1 else self.rng.choice(best)


class UniformRandom:
    """UniformRandom picks any candidate broker with equal probability,
    ignoring load: the baseline that shows what LeastLongTermMessageRate buys.
    (Not a Pulsar strategy.)"""

    def __init__(self, rng: Optional[random.Random] = None):
        self.rng = rng if rng is not None else random.Random()

    def select(self, candidates: Iterable[str], brokers: Mapping[str, BrokerLoad]) -> Optional[str]:
        """A random broker among ``candidates`` present in ``brokers``, or
        None when none is."""
        present = [c for c in candidates if c in brokers]
        return self.rng.choice(present) if present else None
