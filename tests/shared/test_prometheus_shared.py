"""Issue 33, point 10: pylimiter.prometheus.LimiterCollector takes a
SharedSemaphore and a SharedDualMemoryLimiter, and what it exposes is the
host's: permits held and counters of another process included."""

from __future__ import annotations

import multiprocessing

import pytest

pytest.importorskip("prometheus_client")

from pylimiter import LimitType  # noqa: E402
from pylimiter.prometheus import LimiterCollector  # noqa: E402
from tests.shared import _workers  # noqa: E402
from tests.shared.test_processes import get  # noqa: E402
from tests.test_prometheus import scrape, value  # noqa: E402


def test_collector_reports_the_hosts_semaphore(impl, shm, name, shm_dir, children):
    ctx = multiprocessing.get_context("fork")
    events, stop = ctx.Queue(), ctx.Event()
    sem = shm.SharedSemaphore(name, 10, max_queue_size=5)
    try:
        child = children.start("fork", _workers.hold, impl.tag, name, shm_dir,
                               {"max_permits": 10, "max_queue_size": 5}, 4, events, stop)
        assert get(events)[:3] == ("held", child.pid, 4)
        p = sem.acquire_blocking(1)
        metrics = LimiterCollector("app")
        metrics.track("uploads", sem)
        fams = scrape(metrics)
        assert value(fams, "app_uploads_permits_used") == 5      # the child's 4 + our 1
        assert value(fams, "app_uploads_permits_limit") == 10
        assert value(fams, "app_uploads_queue_max_size") == 5
        assert value(fams, "app_uploads_acquired", "_total") == 2
        assert value(fams, "app_uploads_wait_seconds", "_count") == 2
        stop.set()
        children.join_all()
        sem.release(p)
        fams = scrape(metrics)
        assert value(fams, "app_uploads_permits_used") == 0
    finally:
        sem.close()


def test_collector_reports_the_hosts_dual_limiter(impl, shm, name):
    a = shm.SharedDualMemoryLimiter(name, 1000, 500)
    b = shm.SharedDualMemoryLimiter(name, 1000, 500)
    try:
        h = a.acquire_blocking(300, LimitType.HEAP_MEMORY)
        d = b.acquire_blocking(200, LimitType.DIRECT_MEMORY)
        metrics = LimiterCollector()
        metrics.track("mem", a)
        fams = scrape(metrics)
        assert value(fams, "mem_heap_memory_used_bytes") == 300
        assert value(fams, "mem_direct_memory_used_bytes") == 200   # b's, host-wide
        assert value(fams, "mem_direct_memory_limit_bytes") == 500
        a.release(h)
        b.release(d)
    finally:
        a.close()
        b.close()
