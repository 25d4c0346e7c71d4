"""pylimiter.prometheus: the collector's exposition, parsed back with
prometheus_client's own text parser, for both implementations."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from pylimiter import (  # noqa: E402
    LimitType,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
)
from pylimiter.prometheus import LimiterCollector  # noqa: E402

HEAP, DIRECT = LimitType.HEAP_MEMORY, LimitType.DIRECT_MEMORY


def scrape(*collectors) -> dict:
    """{family name: family} from one exposition of `collectors`."""
    registry = CollectorRegistry()
    for c in collectors:
        registry.register(c)
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families, name, suffix="", **labels):
    fam = families[name]
    hits = [s.value for s in fam.samples
            if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, suffix, labels, fam.samples)
    return hits[0]


def test_semaphore_gauges_counters_and_histogram(mod):
    sem = mod.AsyncSemaphore(3, 1, timeout=0.01)
    metrics = LimiterCollector("app", labels={"cluster": "east"})
    metrics.track("db", sem)

    async def scenario():
        held = await sem.acquire(3)
        waiter = asyncio.ensure_future(sem.acquire(1, timeout=None))
        await asyncio.sleep(0)
        with pytest.raises(PermitAcquireQueueFullError):
            await sem.acquire(1)
        fams = scrape(metrics)
        assert value(fams, "app_db_permits_used", cluster="east") == 3
        assert value(fams, "app_db_queue_size", cluster="east") == 1
        sem.release(held)
        p = await waiter
        with pytest.raises(PermitAcquireTimeoutError):
            await sem.acquire(3)       # 1 still held, so 3 must wait and times out
        sem.release(p)

    asyncio.run(scenario())
    fams = scrape(metrics)
    assert value(fams, "app_db_permits_used", cluster="east") == 0
    assert value(fams, "app_db_permits_limit", cluster="east") == 3
    assert value(fams, "app_db_queue_size") == 0
    assert value(fams, "app_db_queue_max_size") == 1
    assert fams["app_db_acquired"].type == "counter"
    assert value(fams, "app_db_acquired", "_total") == 2
    assert value(fams, "app_db_timeout", "_total") == 1
    assert value(fams, "app_db_queue_full", "_total") == 1
    assert value(fams, "app_db_cancelled", "_total") == 0
    hist = fams["app_db_wait_seconds"]
    assert hist.type == "histogram"
    assert value(fams, "app_db_wait_seconds", "_count") == 2      # both grants
    buckets = [(s.labels["le"], s.value) for s in hist.samples if s.name.endswith("_bucket")]
    assert buckets[-1] == ("+Inf", 2)
    assert [c for _, c in buckets] == sorted(c for _, c in buckets)   # cumulative
    assert value(fams, "app_db_wait_seconds", "_sum") == pytest.approx(
        sem.stats().wait_seconds_sum)


def test_dual_limiter_uses_pip442_names_in_ms_and_reads_a_source_each_scrape(mod):
    current = [mod.AsyncDualMemoryLimiter(1000, 0)]
    metrics = LimiterCollector("pulsar_broker", labels={"cluster": "standalone"})
    metrics.track("topic_list", lambda: current[0])

    async def hold():
        return await current[0].acquire(600, HEAP)

    held = asyncio.run(hold())
    fams = scrape(metrics)
    names = set(fams)
    for pool in ("heap", "direct"):
        for m in ("memory_used_bytes", "memory_limit_bytes", "queue_size", "queue_max_size",
                  "wait_time_ms", "timeout"):
            assert f"pulsar_broker_topic_list_{pool}_{m}" in names, m
    assert value(fams, "pulsar_broker_topic_list_heap_memory_used_bytes") == 600
    assert value(fams, "pulsar_broker_topic_list_heap_memory_limit_bytes") == 1000
    assert value(fams, "pulsar_broker_topic_list_direct_memory_limit_bytes") == 0   # disabled
    les = [s.labels["le"] for s in fams["pulsar_broker_topic_list_heap_wait_time_ms"].samples
           if s.name.endswith("_bucket")]
    assert les[0] == "0.1" and "1000.0" in les and les[-1] == "+Inf"     # bounds in ms
    current[0].release(held)
    current[0] = mod.AsyncDualMemoryLimiter(2000, 5)                       # replaced
    fams = scrape(metrics)
    assert value(fams, "pulsar_broker_topic_list_heap_memory_limit_bytes") == 2000
    assert value(fams, "pulsar_broker_topic_list_heap_memory_used_bytes") == 0
    current[0] = None                                                      # nothing to show
    assert not any(f.samples for f in scrape(metrics).values())


def test_many_limiters_under_one_name_share_families_by_label(mod):
    metrics = LimiterCollector()
    a, b = mod.AsyncSemaphore(1), mod.AsyncSemaphore(2)
    metrics.track("pool", a, labels={"db": "a"})
    metrics.track("pool", b, labels={"db": "b"})
    held = b.try_acquire(2)
    fams = scrape(metrics)
    assert value(fams, "pool_permits_used", db="a") == 0
    assert value(fams, "pool_permits_used", db="b") == 2
    assert value(fams, "pool_permits_limit", db="b") == 2
    metrics.untrack("pool", labels={"db": "a"})
    fams = scrape(metrics)
    assert [s.labels["db"] for s in fams["pool_permits_used"].samples] == ["b"]
    metrics.untrack("pool", labels={"db": "b"})
    assert scrape(metrics) == {}
    b.release(held)


def test_bad_arguments_are_refused_at_the_call(mod):
    metrics = LimiterCollector("ns")
    with pytest.raises(ValueError, match="invalid metric name part"):
        metrics.track("has space", mod.AsyncSemaphore(1))
    with pytest.raises(TypeError, match="expected an AsyncSemaphore"):
        metrics.track("x", 42)
    with pytest.raises(ValueError, match="invalid label name"):
        metrics.track("x", mod.AsyncSemaphore(1), labels={"bad-label": "v"})
    with pytest.raises(TypeError, match="must be a str"):
        LimiterCollector(labels={"cluster": 1})
    with pytest.raises(ValueError, match="invalid metric namespace"):
        LimiterCollector("1abc")
    metrics.track("x", mod.AsyncSemaphore(1), labels={"k": "v"})
    with pytest.raises(ValueError, match="tracked with labels"):
        metrics.track("x", mod.AsyncSemaphore(1))
    with pytest.raises(KeyError):
        metrics.untrack("nope")
    own = LimiterCollector(labels={"cluster": "c"})
    with pytest.raises(ValueError, match="collector's own"):
        own.track("x", mod.AsyncSemaphore(1), labels={"cluster": "d"})


def test_unbounded_semaphore_reports_zero_limits(mod):
    metrics = LimiterCollector("u")
    sem = mod.AsyncSemaphore(0, 0)
    metrics.track("s", sem)
    held = sem.try_acquire(10**6)
    fams = scrape(metrics)
    assert value(fams, "u_s_permits_limit") == 0
    assert value(fams, "u_s_queue_max_size") == 0
    assert value(fams, "u_s_permits_used") == 10**6
    sem.release(held)
