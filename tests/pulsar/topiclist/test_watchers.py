"""Topic-list watchers as Pulsar's broker keeps them: memory waits retried with
backoff, hash-matched successes, estimates per namespace and mode.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import asyncio
import random

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist import protocol  # noqa: E402
from pylimiter.pulsar.topiclist.broker import Backoff, Broker, generated_topics  # noqa: E402
from pylimiter.pulsar.topiclist.limits import TopicListConfig  # noqa: E402
from pylimiter.pulsar.topiclist.protocol import Mode, ServerError  # noqa: E402

from .kit import (  # noqa: E402
    DIRECT,
    HEAP,
    NS,
    TOPICS,
    assert_all_back,
    outcomes_add_up,
    pool,
    run_bounded,
    running,
    store_with,
    tiny,
    until,
)


def test_watch_waits_for_memory_with_backoff_instead_of_failing():
    """The heap pool is taken and waits time out after 50 ms: Pulsar's
    broker retries the watcher (100 ms, 200 ms, ...) rather than answering
    TooManyRequests; once memory is back the watch succeeds."""
    async def main():
        cfg = tiny(heap_mb=1, heap_timeout_ms=50, direct_timeout_ms=50, heap_queue=10)
        async with running(Broker(cfg, store=store_with())) as b:
            hold = await b.limiter.dual.acquire(pool(b, HEAP).max_permits, HEAP)
            c = await protocol.ClientConnection.open(b.service_url)
            watch = asyncio.ensure_future(c.watch(NS, "persistent://public/default/orders-.*",
                                                  watcher_id=1, timeout=30))
            await until(lambda: pool(b, HEAP).stats().timeout_total >= 2, what="two retries")
            assert not watch.done()
            b.limiter.dual.release(hold)
            # now the direct pool: the success itself waits for memory
            direct = pool(b, DIRECT)
            ok = await asyncio.wait_for(watch, 30)
            assert sorted(ok.topic) == TOPICS[:2]
            hold = await b.limiter.dual.acquire(direct.max_permits, DIRECT)
            again = asyncio.ensure_future(c.watch(NS, "persistent://public/default/o.*",
                                                  watcher_id=2, timeout=30))
            await until(lambda: direct.stats().timeout_total >= 2, what="direct retries")
            assert not again.done()
            b.limiter.dual.release(hold)
            assert sorted((await asyncio.wait_for(again, 30)).topic) == TOPICS[:3]
            await c.close()
            await until(lambda: not b.connections)
            assert_all_back(b)
            assert b.counters["too_many_requests"] == 0 and outcomes_add_up(b)
    run_bounded(main())


def test_closing_a_watcher_that_waits_for_memory_ends_it():
    async def main():
        cfg = tiny(heap_mb=1, heap_timeout_ms=50, heap_queue=10)
        async with running(Broker(cfg, store=store_with())) as b:
            hold = await b.limiter.dual.acquire(pool(b, HEAP).max_permits, HEAP)
            c = await protocol.ClientConnection.open(b.service_url)
            watch = asyncio.ensure_future(c.watch(NS, ".*", watcher_id=4, timeout=30))
            await until(lambda: 4 in next(iter(b.connections)).watchers)
            await c.close_watch(4)
            with pytest.raises(protocol.RequestError) as e:
                await asyncio.wait_for(watch, 30)
            assert e.value.code == ServerError.MetadataError
            assert "Closed watcher before creation was complete" in e.value.server_message
            b.limiter.dual.release(hold)
            await c.close()
            await until(lambda: not b.connections)
            assert_all_back(b)
            assert not b.store.listeners
    run_bounded(main())


def test_backoff_doubles_to_25s_with_jitter_and_resets():
    bo = Backoff(rng=random.Random(1))
    delays = [bo.next() for _ in range(12)]
    nominal = [min(0.1 * 2 ** i, 25.0) for i in range(12)]
    assert all(0.9 * n <= d <= n for d, n in zip(delays, nominal))
    assert all(d >= 0.1 for d in delays) and max(delays) <= 25.0
    bo.reset()
    assert bo.next() <= 0.1


def test_watch_with_the_matching_hash_omits_the_list():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            digest = protocol.topics_hash(TOPICS[:2])
            ok = await c.watch(NS, "persistent://public/default/orders-.*", watcher_id=1,
                               topics_hash=digest)
            assert list(ok.topic) == [] and ok.topics_hash == digest
            ok = await c.watch(NS, "persistent://public/default/orders-.*", watcher_id=2,
                               topics_hash="00000000")
            assert sorted(ok.topic) == TOPICS[:2] and ok.topics_hash == digest
            await c.close()
    run_bounded(main())


def test_heap_estimates_are_kept_per_namespace_and_mode():
    async def main():
        topics = TOPICS + generated_topics(NS, 50)
        async with running(Broker(TopicListConfig(), store=store_with(topics))) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            await c.get_topics(NS, mode=Mode.NON_PERSISTENT)
            assert b.estimates == {(NS, Mode.NON_PERSISTENT):
                                   protocol.estimate_heap(b.store.list(NS, Mode.NON_PERSISTENT))}
            await c.get_topics(NS, mode=Mode.ALL)
            await c.watch(NS, ".*", watcher_id=1)
            for mode in (Mode.ALL, Mode.PERSISTENT, Mode.NON_PERSISTENT):
                assert b.estimates[(NS, mode)] == protocol.estimate_heap(b.store.list(NS, mode))
            assert len(set(b.estimates.values())) == 3
            await c.close()
    run_bounded(main())
