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
    HEAP,
    NS,
    assert_all_back,
    pool,
    run_bounded,
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


@pytest.mark.slow
def test_the_limits_preset_drives_both_pools_to_their_limits():
    """`load --preset limits` at a small scale (2,000 topics, 24 connections,
    2 s): its broker's pools fill to their limits and no further, requests
    wait for memory and some are refused (the pools hold 4 listings and the
    queue 12 requests, the clients make 24), and the refusals the clients
    saw are exactly the waits the broker failed (timeouts and full
    queues)."""
    import asyncio

    from pylimiter.pulsar.topiclist.loadgen import PRESETS, run_preset

    preset = PRESETS["limits"]
    r = asyncio.run(asyncio.wait_for(run_preset(preset, NS, topics=2000, connections=24,
                                                duration=2.0), 120))
    heap, direct = r["pools"]["heap"], r["pools"]["direct"]
    assert heap["limit"] == pytest.approx(4.04 * r["listing_heap_bytes"], rel=1e-3)
    assert direct["limit"] == pytest.approx(2.02 * r["answer_frame_bytes"], rel=1e-3)
    for p in (heap, direct):
        assert 0 < p["peak"] <= p["limit"] and p["used"] == 0 and p["queue"] == 0
        assert p["waited"] <= p["granted"]
    assert heap["peak"] >= 0.9 * heap["limit"]          # four listings at once
    assert heap["waited"] > 0
    c = r["clients"]
    assert c["responses"] > 0 and c["other_errors"] == 0
    assert c["requests"] == c["responses"] + c["too_many_requests"]
    refused = sum(p["timeouts"] + p["queue_full"] for p in (heap, direct))
    assert c["too_many_requests"] == refused > 0
    assert r["slow_readers"] == 6 and r["connections"] == 24 and r["queue"] == 12
    assert r["rss_peak_bytes"] >= r["rss_before_bytes"] > 0


def test_a_preset_run_is_described_with_units_and_shares():
    from pylimiter.pulsar.topiclist.cli import describe_preset

    pool_ = dict(used=0, queue=0, queue_max=24, granted=100, waited=60, wait_s=30.0,
                 wait_p99_le_s=1.0, timeouts=5, queue_full=7)
    r = {"preset": "limits", "namespace": NS, "topics": 10_000, "connections": 40,
         "slow_readers": 10, "read_delay_s": 0.5, "retry_delay_s": 0.1, "duration_s": 10.0,
         "timeout_ms": 750, "queue": 24, "heap_listings": 4, "direct_answers": 2,
         "listing_heap_bytes": 710_000, "answer_frame_bytes": 410_000,
         "clients": {"duration_s": 11.0, "requests": 112, "responses": 100, "rps": 9.1,
                     "too_many_requests": 12, "other_errors": 0, "p50_ms": 800.0,
                     "p99_ms": 1800.0, "max_ms": 2100.0},
         "pools": {"heap": dict(pool_, limit=2_868_400, peak=2_840_000),
                   "direct": dict(pool_, limit=828_200, peak=820_000, waited=0, timeouts=0,
                                  queue_full=0, wait_s=0.0)},
         "rss_before_bytes": 40 * 1024 * 1024, "rss_peak_bytes": 44 * 1024 * 1024}
    lines = describe_preset(r)
    text = "\n".join(lines)
    assert "10,000 topics in public/default" in lines[0]
    assert "heap 2.7 MiB (4 listings)" in lines[1] and "times out after 750.0 ms" in lines[1]
    assert "40 connections, 10 of them reading each answer 500.0 ms late, for 10.0 s" in text
    heap_row = next(ln for ln in lines if ln.startswith("heap "))
    assert heap_row.split()[1:] == ["2.7", "MiB", "2.7", "MiB", "(99%)", "100", "60",
                                    "500.0", "ms", "<=", "1.0", "s", "5", "7"]
    direct_row = next(ln for ln in lines if ln.startswith("direct "))
    assert "(99%)" in direct_row and " - " in direct_row        # no wait: no mean
    assert "12 refused with TooManyRequests" in text
    assert "RSS 40.0 MiB before the load, peak 44.0 MiB (+4.0 MiB; heap + direct limits " \
           "3.5 MiB)" in text
