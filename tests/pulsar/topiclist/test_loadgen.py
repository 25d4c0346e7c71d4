"""The load generator.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations


import pytest


from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist.broker import Broker, generated_topics  # noqa: E402

from .kit import (  # noqa: E402
    run_bounded,
    HEAP,
    NS,
    assert_all_back,
    pool,
    running,
    store_with,
    tiny,
    until,
)


def test_load_generator_counts_responses_rejections_and_reads_server_peaks():
    from pylimiter.pulsar.topiclist.loadgen import run_load

    async def main():
        async with running(Broker(tiny(heap_mb=1, heap_timeout_ms=50, heap_queue=100),
                                  store=store_with(generated_topics(NS, 300)))) as b:
            res = await run_load(b.service_url, NS, 3, 30.0, admin_url=b.admin_url,
                                 max_requests=12, read_delay=0.01)
            assert res.requests == 12 and res.responses == 12
            assert res.too_many_requests == 0 and res.other_errors == 0
            assert res.bytes > 12 * 300 * 30
            s = res.summary()
            assert 0 < s["p50_ms"] <= s["p99_ms"] <= s["max_ms"]
            assert res.server["heap_memory_peak_bytes"] > 0
            assert res.server["process_peak_rss_bytes"] > 0
            hold = await b.limiter.dual.acquire(pool(b, HEAP).max_permits, HEAP)
            res = await run_load(b.service_url, NS, 2, 30.0, max_requests=4)
            assert res.too_many_requests == 4 and res.responses == 0
            b.limiter.dual.release(hold)
            await until(lambda: not b.connections, what="load clients gone")
            assert_all_back(b)
    run_bounded(main())
