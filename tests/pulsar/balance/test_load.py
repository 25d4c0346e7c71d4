"""pylimiter.pulsar.balance.load: resource usage, broker and bundle load,
weights."""

from __future__ import annotations

import pytest

from pylimiter.pulsar.balance import (
    BrokerLoad,
    BundleLoad,
    LoadWeights,
    ResourceUsage,
)


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
