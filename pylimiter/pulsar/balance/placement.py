"""Which broker gets a bundle: Pulsar's default ``ModularLoadManagerStrategy``
(``loadBalancerLoadPlacementStrategy`` = ``LeastLongTermMessageRate``), and a
uniform random choice to compare it with."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from typing import Optional

from ._checks import instance, number
from ._checks import name as _name
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
        self.overload_threshold_pct = overload_threshold_pct
        self.weights = weights
        self.rng = rng if rng is not None else random.Random()

    def __setattr__(self, attr, value):
        # Settings are checked whenever they are set, not only by __init__.
        if attr == "overload_threshold_pct":
            value = float(number("overload_threshold_pct", value))
        elif attr == "weights":
            instance("weights", value, LoadWeights)
        elif attr == "rng":
            _check_rng(value)
        object.__setattr__(self, attr, value)

    def score(self, broker: BrokerLoad) -> float:
        """The broker's score: its long-term plus preallocated message rate,
        +inf when overloaded.  ValueError if the broker's data gives NaN (a
        NaN score would win or lose every comparison at random)."""
        instance("broker", broker, BrokerLoad)
        usage = broker.weighted_usage(self.weights)
        if usage != usage:
            raise ValueError(f"the broker's weighted usage is NaN: {broker.format_usage()}")
        if usage > self.overload_threshold_pct / 100.0:
            return math.inf
        s = (broker.preallocated_msg_rate + broker.long_term_msg_rate_in
             + broker.long_term_msg_rate_out)
        if s != s:
            raise ValueError("the broker's message rates add up to NaN")
        return s

    def select(self, candidates: Iterable[str], brokers: Mapping[str, BrokerLoad]) -> Optional[str]:
        """The chosen broker among ``candidates`` (names; those missing from
        ``brokers`` are skipped), or None when none is left."""
        instance("brokers", brokers, Mapping)
        best: list[str] = []
        best_score = math.inf
        for cand in candidates:
            data = brokers.get(_name("a candidate", cand))
            if data is None:
                continue
            s = self.score(data)
            if not best or s < best_score:
                best, best_score = [cand], s
            elif s == best_score:
                best.append(cand)
        if not best:
            return None
        return best[0] if len(best) == 1 else self.rng.choice(best)


def _check_rng(rng) -> None:
    if not callable(getattr(rng, "choice", None)):
        raise TypeError(f"rng must be a random.Random (or have its choice()), not "
                        f"{type(rng).__name__}")


class UniformRandom:
    """UniformRandom picks any candidate broker with equal probability,
    ignoring load: the baseline that shows what LeastLongTermMessageRate buys.
    (Not a Pulsar strategy.)"""

    def __init__(self, rng: Optional[random.Random] = None):
        rng = rng if rng is not None else random.Random()
        _check_rng(rng)
        self.rng = rng

    def select(self, candidates: Iterable[str], brokers: Mapping[str, BrokerLoad]) -> Optional[str]:
        """A random broker among ``candidates`` (names) present in
        ``brokers``, or None when none is."""
        instance("brokers", brokers, Mapping)
        present = [c for c in candidates if _name("a candidate", c) in brokers]
        return self.rng.choice(present) if present else None
