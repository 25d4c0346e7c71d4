"""pylimiter.otel.instrument with the OpenTelemetry SDK's in-memory reader:
the names, kinds and values are the Prometheus collector's samples, for a
semaphore and a dual limiter of both implementations (`mod`)."""

from __future__ import annotations

import asyncio

import pytest

from tests._helpers import run

from . import need

need("opentelemetry.sdk.metrics")
need("prometheus_client")
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import (  # noqa: E402
    Gauge,
    InMemoryMetricReader,
    Sum,
)

from pylimiter.otel import instrument  # noqa: E402
from pylimiter.prometheus import LimiterCollector  # noqa: E402


def otel_samples(limiter, name):
    """{(metric name, attributes): value} as the SDK reads them, and the
    kinds {name: "gauge" | "counter"}."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrument(limiter, provider.get_meter("pylimiter-tests"), name)
    data = reader.get_metrics_data()
    samples, kinds = {}, {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if isinstance(m.data, Gauge):
                    kinds[m.name] = "gauge"
                else:
                    assert isinstance(m.data, Sum) and m.data.is_monotonic
                    kinds[m.name] = "counter"
                for p in m.data.data_points:
                    samples[(m.name, tuple(sorted(p.attributes.items())))] = p.value
    provider.shutdown()
    return samples, kinds


def prometheus_samples(limiter, name):
    collector = LimiterCollector()
    collector.track(name, limiter)
    samples, kinds = {}, {}
    for family in collector.collect():
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
            kinds[s.name] = "gauge" if family.type == "gauge" else "counter"
    return samples, kinds


async def traffic(sem, n):
    """Grants and timeouts (one at once, one after waiting), so that the
    counters and the histogram move."""
    held = sem.try_acquire(n)
    waiter = asyncio.ensure_future(sem.acquire(1, timeout=0.01))
    await asyncio.sleep(0)
    with pytest.raises(Exception):
        await sem.acquire(1, timeout=0)
    with pytest.raises(Exception):
        await waiter
    sem.release(held)
    async with sem.acquire(2):
        pass


def test_a_semaphore_exports_the_collectors_samples(mod):
    sem = mod.AsyncSemaphore(10, max_queue_size=5)
    run(traffic(sem, 10))
    held = sem.try_acquire(3)
    ours, kinds = otel_samples(sem, "uploads")
    theirs, their_kinds = prometheus_samples(sem, "uploads")
    assert ours == theirs and kinds == their_kinds
    assert ours[("uploads_permits_used", ())] == 3
    assert ours[("uploads_timeout_total", ())] == 2
    assert ours[("uploads_wait_seconds_bucket", (("le", "+Inf"),))] == 3
    assert kinds["uploads_permits_used"] == "gauge"
    assert kinds["uploads_acquired_total"] == "counter"
    sem.release(held)


def test_a_dual_limiter_exports_pip442_names_per_pool(mod):
    dual = mod.AsyncDualMemoryLimiter(1000, 0)
    heap = dual.get_limiter(mod.LimitType.HEAP_MEMORY)
    run(traffic(heap, 1000))
    p = dual.get_limiter(mod.LimitType.DIRECT_MEMORY).try_acquire(77)
    ours, kinds = otel_samples(dual, "topics")
    theirs, their_kinds = prometheus_samples(dual, "topics")
    assert ours == theirs and kinds == their_kinds
    assert ours[("topics_direct_memory_used_bytes", ())] == 77
    assert ours[("topics_direct_memory_limit_bytes", ())] == 0     # disabled
    assert ours[("topics_heap_memory_limit_bytes", ())] == 1000
    assert ("topics_heap_wait_time_ms_bucket", (("le", "1000.0"),)) in ours
    assert kinds["topics_heap_timeout_total"] == "counter"
    dual.get_limiter(mod.LimitType.DIRECT_MEMORY).release(p)


def test_values_are_read_at_each_collection(mod):
    sem = mod.AsyncSemaphore(10)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instrument(sem, provider.get_meter("t"), "s")

    def used():
        for rm in reader.get_metrics_data().resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == "s_permits_used":
                        return m.data.data_points[0].value

    assert used() == 0
    p = sem.try_acquire(4)
    assert used() == 4
    sem.release(p)
    assert used() == 0
    provider.shutdown()


def test_bad_arguments(mod):
    provider = MeterProvider()
    meter = provider.get_meter("t")
    with pytest.raises(ValueError, match="^pylimiter: invalid metric name"):
        instrument(mod.AsyncSemaphore(1), meter, "no-dashes")
    with pytest.raises(TypeError, match="^pylimiter: limiter must be"):
        instrument(object(), meter, "x")
    provider.shutdown()
