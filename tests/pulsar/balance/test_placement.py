"""pylimiter.pulsar.balance.placement: LeastLongTermMessageRate (Pulsar's
ModularLoadManagerStrategyTest) and uniform random placement."""

from __future__ import annotations

import random

from pylimiter.pulsar.balance import (
    BrokerLoad,
    LeastLongTermMessageRate,
    LoadWeights,
    ResourceUsage,
    UniformRandom,
)


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
