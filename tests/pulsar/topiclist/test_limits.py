"""PIP-442's limits: TooManyRequests on timeouts and full queues, caps, live
limit changes, every request answered, the bound under load, the admin
limits and stats.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter import AsyncSemaphore  # noqa: E402
from pylimiter.pulsar.topiclist import limits, protocol  # noqa: E402
from pylimiter.pulsar.topiclist.broker import Broker, generated_topics  # noqa: E402
from pylimiter.pulsar.topiclist.limits import (  # noqa: E402
    IN_PLACE_LIMITS,
    MB,
    TopicListConfig,
    TopicListLimiter,
)
from pylimiter.pulsar.topiclist.protocol import Mode, ServerError  # noqa: E402
from pylimiter.pulsar.topiclist.proxy import Proxy  # noqa: E402

from .kit import (  # noqa: E402
    DIRECT,
    HEAP,
    NS,
    ahttp,
    assert_all_back,
    outcomes_add_up,
    pool,
    run_bounded,
    running,
    store_with,
    tiny,
    until,
)


def test_queue_full_answers_too_many_requests():
    async def main():
        async with running(Broker(tiny(), store=store_with())) as b:
            heap = pool(b, HEAP)
            hold = await b.limiter.dual.acquire(heap.max_permits, HEAP)  # the pool is taken
            c = await protocol.ClientConnection.open(b.service_url)
            first = asyncio.ensure_future(c.get_topics(NS))
            await until(lambda: heap.queue_size == 1, what="first request queued")
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics(NS)
            assert e.value.code == protocol.ServerError.TooManyRequests
            assert "queue being full" in e.value.server_message
            b.limiter.dual.release(hold)
            r, _ = await first                     # the queued one is served
            assert len(r.topics) == 3
            await c.close()
            assert_all_back(b)
            assert b.counters["too_many_requests"] == 1
    run_bounded(main())


def test_permit_timeout_answers_too_many_requests_and_counts():
    async def main():
        async with running(Broker(tiny(heap_timeout_ms=50, heap_queue=10),
                                  store=store_with())) as b:
            hold = await b.limiter.dual.acquire(pool(b, HEAP).max_permits, HEAP)
            c = await protocol.ClientConnection.open(b.service_url)
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics(NS)
            assert e.value.code == protocol.ServerError.TooManyRequests
            assert "timeout acquiring heap memory" in e.value.server_message
            _, text = await ahttp("GET", f"{b.admin_url}/metrics")
            assert 'pulsar_broker_topic_list_heap_timeout_total{cluster="standalone"} 1.0' in text
            b.limiter.dual.release(hold)
            await c.close()
            assert_all_back(b)
    run_bounded(main())


def test_client_disconnect_while_waiting_leaks_nothing():
    async def main():
        async with running(Broker(tiny(heap_queue=10), store=store_with())) as b:
            heap = pool(b, HEAP)
            hold = await b.limiter.dual.acquire(heap.max_permits, HEAP)
            c = await protocol.ClientConnection.open(b.service_url)
            for _ in range(3):
                asyncio.ensure_future(c.get_topics(NS, timeout=None))
            await until(lambda: heap.queue_size == 3, what="3 queued")
            await c.close()
            await until(lambda: heap.queue_size == 0, what="waits cancelled on disconnect")
            b.limiter.dual.release(hold)
            await until(lambda: not b.connections, what="connection gone")
            assert_all_back(b)
            assert b.counters["responses"] == 0
    run_bounded(main())


def test_response_larger_than_the_direct_pool_is_capped_and_served():
    async def main():
        topics = generated_topics(NS, 200)            # ~7 KB response
        cfg = tiny(heap_mb=1, direct_mb=1 / 1024)
        async with running(Broker(cfg, store=store_with(topics))) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            r, size = await c.get_topics(NS)
            assert len(r.topics) == 200 and size > 1024
            assert b.limiter.peak["direct"] == 1024          # held the whole pool, no more
            await c.close()
            assert_all_back(b)
    run_bounded(main())


@pytest.mark.parametrize("via_proxy", [False, True], ids=["broker", "proxy"])
def test_memory_bound_holds_under_concurrent_load(via_proxy):
    async def main():
        topics = generated_topics(NS, 2000)           # ~66 KB actual heap estimate
        cfg = TopicListConfig(heap_mb=48 / 1024, direct_mb=40 / 1024, heap_timeout_ms=2000,
                              direct_timeout_ms=2000, heap_queue=20, direct_queue=20)
        async with running(Broker(cfg if not via_proxy else TopicListConfig(),
                                  store=store_with(topics))) as b, \
                running(Proxy(cfg, broker_url=b.service_url)) as px:
            svc = px if via_proxy else b
            limits = {t: pool(svc, t).max_permits for t in (HEAP, DIRECT)}
            seen = {HEAP: 0, DIRECT: 0}
            stop = asyncio.Event()

            async def sample():
                while not stop.is_set():
                    for t in (HEAP, DIRECT):
                        seen[t] = max(seen[t], pool(svc, t).acquired_permits)
                    await asyncio.sleep(0)

            outcomes = {"ok": 0, "tmr": 0}

            async def client():
                c = await protocol.ClientConnection.open(svc.service_url)
                for _ in range(3):
                    try:
                        r, _ = await c.get_topics(NS)
                        assert len(r.topics) == 2000
                        outcomes["ok"] += 1
                    except protocol.RequestError as e:
                        assert e.code == protocol.ServerError.TooManyRequests, e
                        outcomes["tmr"] += 1
                await c.close()

            sampler = asyncio.ensure_future(sample())
            await asyncio.gather(*(client() for _ in range(40)))
            stop.set()
            await sampler
            assert outcomes["ok"] + outcomes["tmr"] == 120   # every request answered
            assert outcomes["ok"] > 0
            # seen: sampled between steps; peak: recorded at every grant.
            for t, name in ((HEAP, "heap"), (DIRECT, "direct")):
                assert seen[t] <= limits[t], (t, seen[t], limits[t])
                peak = svc.limiter.peak[name]
                assert 0 < peak <= limits[t], (t, peak, limits[t])
            await until(lambda: not svc.connections, what="clients gone")
            assert_all_back(svc)
            assert_all_back(b)
    run_bounded(main())


def test_lowering_the_heap_limit_answers_every_queued_request():
    """20 requests queue for 140 KB each; the limit drops to 64 KiB, so the
    limiter fails them (ValueError: larger than max_permits).  Each queues
    again capped by the new limit and is served."""
    async def main():
        cfg = TopicListConfig(heap_mb=1, direct_mb=8, heap_queue=100)
        async with running(Broker(cfg, store=store_with(generated_topics(NS, 2000)))) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            await c.get_topics(NS)          # the estimate becomes the actual ~140 KB
            assert b.estimates[(NS, Mode.PERSISTENT)] > 64 * 1024
            heap = pool(b, HEAP)
            hold = await b.limiter.dual.acquire(heap.max_permits, HEAP)
            reqs = [asyncio.ensure_future(c.get_topics(NS)) for _ in range(20)]
            await until(lambda: heap.queue_size == 20, what="20 queued")
            st_, _ = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"heap_mb": 1 / 16})
            assert st_ == 200 and pool(b, HEAP).max_permits == 64 * 1024
            b.limiter.dual.release(hold)
            done = await asyncio.wait_for(asyncio.gather(*reqs, return_exceptions=True), 30)
            assert [len(r[0].topics) for r in done] == [2000] * 20, done
            await c.close()
            await until(lambda: not b.connections)
            assert_all_back(b)
            assert b.limiter.peak["heap"] <= 1 * MB
            assert outcomes_add_up(b) and b.counters["responses"] == 21
    run_bounded(main())


def test_whatever_fails_inside_a_request_is_answered_with_its_request_id(monkeypatch):
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            async def broken(*args, **kwargs):
                raise RuntimeError("the limiter exploded")

            monkeypatch.setattr(b.limiter, "acquire", broken)
            c = await protocol.ClientConnection.open(b.service_url)
            with pytest.raises(protocol.RequestError) as e:
                await c.get_topics(NS, timeout=10)
            assert e.value.code == ServerError.UnknownError
            assert "the limiter exploded" in e.value.server_message
            with pytest.raises(protocol.RequestError):
                await c.watch(NS, ".*", watcher_id=1, timeout=10)
            await c.close()
            assert b.counters["errors"] == 2 and outcomes_add_up(b)
    run_bounded(main())


def _toggle_limits_under_load(rounds: int = 6):
    """40 clients list a 2000-topic namespace while the heap and direct
    limits switch between off and 48 KiB.  Returns what the test checks:
    every answer, the limiters used, and any grant that raised the bytes
    held across all of them while above the limit."""
    async def main():
        cfg = TopicListConfig(heap_mb=0, direct_mb=0, heap_timeout_ms=5000,
                              direct_timeout_ms=5000)
        async with running(Broker(cfg, store=store_with(generated_topics(NS, 2000)))) as b:
            duals = [b.limiter.dual]
            limit_on = 48 * 1024
            grew_over = []
            stop = asyncio.Event()

            async def sampler():
                # A grant counts only if the limit was on at both ends of
                # the interval: one made just before the limit was turned
                # on, in the same loop iteration, is not above any limit.
                last = {HEAP: 0, DIRECT: 0}
                last_limit = {HEAP: 0, DIRECT: 0}
                while not stop.is_set():
                    for t in (HEAP, DIRECT):
                        held = sum(d.get_limiter(t).acquired_permits for d in duals)
                        limit = b.limiter.dual.get_limiter(t).max_permits
                        if limit > 0 and last_limit[t] > 0 and held > limit \
                                and held > last[t]:
                            grew_over.append((t, held, limit))
                        last[t], last_limit[t] = held, limit
                    await asyncio.sleep(0)

            answers = {"ok": 0, "tmr": 0}

            async def client():
                c = await protocol.ClientConnection.open(b.service_url)
                for _ in range(4):
                    try:
                        r, _ = await c.get_topics(NS, timeout=30)
                        assert len(r.topics) == 2000
                        answers["ok"] += 1
                    except protocol.RequestError as exc:
                        assert exc.code == ServerError.TooManyRequests, exc
                        answers["tmr"] += 1
                await c.close()

            async def toggler():
                for i in range(rounds):
                    await asyncio.sleep(0.03)
                    mb = (limit_on / MB) if i % 2 == 0 else 0
                    status, body = await ahttp("PUT", f"{b.admin_url}/admin/limits",
                                               {"heap_mb": mb, "direct_mb": mb})
                    assert status == 200, body
                    if b.limiter.dual is not duals[-1]:
                        duals.append(b.limiter.dual)

            watch = asyncio.ensure_future(sampler())
            await asyncio.wait_for(asyncio.gather(toggler(), *(client() for _ in range(40))),
                                   120)
            stop.set()
            await watch
            await until(lambda: not b.connections, what="clients gone")
            leftovers = [(t, d.get_limiter(t).acquired_permits, d.get_limiter(t).queue_size)
                         for d in duals for t in (HEAP, DIRECT)]
            return answers, duals, grew_over, leftovers, outcomes_add_up(b)
    return run_bounded(main())


def test_switching_limits_on_and_off_under_load_answers_every_request():
    answers, duals, _, leftovers, add_up = _toggle_limits_under_load()
    assert answers["ok"] + answers["tmr"] == 160 and answers["ok"] > 0
    assert all(held == 0 and queued == 0 for _, held, queued in leftovers), leftovers
    assert add_up
    if limits.IN_PLACE_LIMITS:
        assert len(duals) == 1, "limits changed in place: no second limiter"


@pytest.mark.skipif(not limits.IN_PLACE_LIMITS,
                    reason="this core's set_max_permits cannot switch a pool between "
                           "unbounded and bounded in place (core v2 can), so turning a "
                           "limit on builds a second limiter beside the one still in use")
def test_switching_limits_in_place_never_grants_above_the_limit():
    _, duals, grew_over, _, _ = _toggle_limits_under_load()
    assert len(duals) == 1
    assert grew_over == []


class _FakePool:
    def __init__(self, calls, t, n):
        self.calls, self.t, self.max_permits = calls, t, n

    def set_max_permits(self, n):
        self.calls.append((self.t, n))
        self.max_permits = n


def test_set_limits_adjusts_pools_in_place_when_the_core_allows_it(monkeypatch):
    """The in-place branch on a core that switches unbounded <-> bounded
    (core v2), with pools that record their calls; and today's rebuild."""
    monkeypatch.setattr(limits, "IN_PLACE_LIMITS", True)
    lim = TopicListLimiter(TopicListConfig(heap_mb=0, direct_mb=1))
    calls = []
    pools = {HEAP: _FakePool(calls, HEAP, 0), DIRECT: _FakePool(calls, DIRECT, MB)}

    class FakeDual:
        def get_limiter(self, t):
            return pools[t]

    lim.dual = fake = FakeDual()
    lim.set_limits(heap_mb=2, direct_mb=0)
    assert lim.dual is fake and calls == [(HEAP, 2 * MB), (DIRECT, 0)]
    lim.set_limits(heap_mb=2)
    assert len(calls) == 2                      # unchanged sizes are left alone
    monkeypatch.setattr(limits, "IN_PLACE_LIMITS", False)
    lim.set_limits(heap_mb=0)
    assert lim.dual is not fake                 # today: a new limiter
    assert lim.dual.get_limiter(HEAP).max_permits <= 0
    assert lim.dual.get_limiter(DIRECT).max_permits <= 0


def test_in_place_probe_matches_what_the_core_accepts():
    sem = AsyncSemaphore(0)
    try:
        sem.set_max_permits(1)
        accepts = True
    except ValueError:
        accepts = False
    assert limits.IN_PLACE_LIMITS == accepts


def test_limits_change_at_run_time_and_metrics_names():
    async def main():
        cfg = TopicListConfig(heap_mb=1, direct_mb=0)
        async with running(Broker(cfg, store=store_with())) as b:
            st, body = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"heap_mb": 2})
            assert st == 200 and json.loads(body)["heap_mb"] == 2
            assert pool(b, HEAP).max_permits == 2 * 1024 * 1024
            old = b.limiter.dual
            st, _ = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"direct_mb": 0.5})
            # enabling: the same limiter where the core switches in place, else a new one
            assert st == 200 and (b.limiter.dual is old) == IN_PLACE_LIMITS
            assert pool(b, DIRECT).max_permits == 512 * 1024
            st, body = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"heap_mb": -1})
            assert st == 400 and "heap_mb" in body
            st, _ = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"heap_timeout_ms": 5})
            assert st == 400
            c = await protocol.ClientConnection.open(b.service_url)
            await c.get_topics(NS)
            await c.close()
            _, text = await ahttp("GET", f"{b.admin_url}/metrics")
            names = set(re.findall(r"^(pulsar_broker_topic_list_\w+?)(?:_bucket|_count|_sum)?\{",
                                   text, re.M))
            for pool_ in ("heap", "direct"):
                for m in ("memory_used_bytes", "memory_limit_bytes", "queue_size",
                          "queue_max_size", "wait_time_ms", "timeout_total"):
                    assert f"pulsar_broker_topic_list_{pool_}_{m}" in names, m
            assert 'direct_memory_limit_bytes{cluster="standalone"} 524288.0' in text
    run_bounded(main())


@pytest.mark.parametrize("body", ["5", "null", "[]", "{}", '"x"', "{bad json",
                                  '{"heap_mb": "lots"}', '{"heap_mb": true}',
                                  '{"heap_mb": 1e13}', '{"heap_mb": -1}',
                                  '{"heap_timeout_ms": 5}'])
def test_bad_admin_limits_bodies_answer_400_with_a_message(body):
    async def main():
        async with running(Broker(TopicListConfig(heap_mb=1), store=store_with())) as b:
            status, text = await ahttp("PUT", f"{b.admin_url}/admin/limits", raw=body.encode())
            assert status == 400, text
            assert json.loads(text)["error"]
            assert b.limiter.config.heap_mb == 1                   # unchanged
            status, text = await ahttp("PUT", f"{b.admin_url}/admin/limits", {"heap_mb": 2})
            assert status == 200 and json.loads(text)["heap_mb"] == 2
    run_bounded(main())


def test_admin_stats_add_up_when_clients_vanish_while_queued():
    async def main():
        async with running(Broker(tiny(heap_mb=1, heap_queue=100), store=store_with())) as b:
            heap = pool(b, HEAP)
            hold = await b.limiter.dual.acquire(heap.max_permits, HEAP)
            clients = [await protocol.ClientConnection.open(b.service_url) for _ in range(3)]
            pending = [asyncio.ensure_future(c.get_topics(NS, timeout=None))
                       for c in clients for _ in range(5)]
            await until(lambda: heap.queue_size == 15, what="15 queued")
            st_, body = await ahttp("GET", f"{b.admin_url}/admin/stats")
            assert json.loads(body)["in_flight"] == 15
            await clients[0].close()
            await clients[1].close()
            await until(lambda: heap.queue_size == 5, what="vanished clients' waits cancelled")
            b.limiter.dual.release(hold)
            done = await asyncio.gather(*pending[10:])
            assert all(len(r.topics) == 3 for r, _ in done)
            await clients[2].close()
            await until(lambda: not b.connections)
            st_, body = await ahttp("GET", f"{b.admin_url}/admin/stats")
            s = json.loads(body)
            assert (s["requests"], s["responses"], s["cancelled"], s["in_flight"]) == \
                (15, 5, 10, 0)
            assert s["requests"] == s["responses"] + s["cancelled"] + s["errors"] + \
                s["too_many_requests"]
            await asyncio.gather(*pending[:10], return_exceptions=True)
    run_bounded(main())


def test_the_snapshot_counts_the_grants_that_waited_and_how_long():
    """/admin/stats' waits per pool (what `load --preset` prints): an
    immediate grant is not a wait; one that queued is, with its time."""
    async def main():
        lim = limits.TopicListLimiter(TopicListConfig(heap_mb=1))
        dual = lim.dual
        assert lim.snapshot()["heap"]["wait_p99_le_s"] is None     # no grant yet
        hold = await lim.acquire(HEAP, 1024 * 1024, dual, lambda: False)
        s = lim.snapshot()["heap"]
        assert (s["granted"], s["waited"], s["wait_s"]) == (1, 0, 0.0)
        waiter = asyncio.ensure_future(lim.acquire(HEAP, 10, dual, lambda: False))
        await until(lambda: pool_of(lim).queue_size == 1)
        await asyncio.sleep(0.05)
        dual.release(hold)
        dual.release(await waiter)
        s = lim.snapshot()["heap"]
        assert (s["granted"], s["waited"]) == (2, 1)
        assert 0.04 <= s["wait_s"] < 30
        assert s["wait_p99_le_s"] is not None and s["wait_p99_le_s"] >= 0.05
        assert json.loads(json.dumps(lim.snapshot())) == lim.snapshot()

    def pool_of(lim):
        return lim.dual.get_limiter(HEAP)
    run_bounded(main())


def test_quantile_bound_reads_cumulative_buckets():
    b = ((0.001, 90), (0.1, 99), (1.0, 100), (float("inf"), 100))
    assert limits._quantile_bound(b, 100, 0.5) == 0.001
    assert limits._quantile_bound(b, 100, 0.99) == 0.1
    assert limits._quantile_bound(b, 100, 1.0) == 1.0
    assert limits._quantile_bound(((1.0, 1), (float("inf"), 2)), 2, 0.99) is None
    assert limits._quantile_bound(b, 0, 0.99) is None
