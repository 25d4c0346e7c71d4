"""EntryReader: cache first, one storage call per run of misses, storage
reads in flight bounded by an AsyncSemaphore; on both implementations of the
cache (and the limiter of the running build)."""

from __future__ import annotations

import asyncio

import pytest

from pylimiter import PermitAcquireQueueFullError, PermitAcquireTimeoutError
from pylimiter.pulsar.cache import EntryReader


class Storage:
    """Entries of `size` bytes; records calls; optional delay or gate."""

    def __init__(self, size=100, delay=0.0, gate=None, reader=None):
        self.size, self.delay, self.gate, self.reader = size, delay, gate, reader
        self.calls: list[tuple] = []
        self.peak = 0
        self.running = 0

    async def __call__(self, name, first, last):
        self.calls.append((name, first, last))
        if self.reader is not None:
            self.peak = max(self.peak, self.reader.semaphore.acquired_permits)
        self.running += 1
        try:
            if self.gate is not None:
                await self.gate.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
        finally:
            self.running -= 1
        return [f"{name}:{first[0]}:{e}".encode().ljust(self.size, b".")
                for e in range(first[1], last[1] + 1)]


def test_fully_cached_read_takes_no_permit(cm):
    m = cm.EntryCacheManager(1 << 20)
    c = m.cache("t")
    for e in range(5):
        c.insert((1, e), b"d%d" % e)
    storage = Storage()
    r = EntryReader(m, storage, 10_000)
    got = asyncio.run(r.read("t", (1, 0), (1, 4)))
    assert got == [b"d%d" % e for e in range(5)]
    assert storage.calls == [] and r.semaphore.stats().acquired_total == 0
    assert m.stats().hits == 5 and m.stats().misses == 0


def test_each_run_of_misses_is_one_storage_call(cm):
    m = cm.EntryCacheManager(1 << 20, entry_overhead_bytes=0)   # payload bytes below
    c = m.cache("t")
    for e in (2, 3, 6):
        c.insert((7, e), b"cached")
    storage = Storage(size=50)
    r = EntryReader(m, storage, 1 << 20)
    got = asyncio.run(r.read("t", (7, 0), (7, 8), expected_reads=2))
    assert storage.calls == [("t", (7, 0), (7, 1)), ("t", (7, 4), (7, 5)),
                             ("t", (7, 7), (7, 8))]
    assert got[2] == got[3] == got[6] == b"cached"
    assert got[0].startswith(b"t:7:0") and len(got[8]) == 50
    st = m.stats()
    assert (st.hits, st.misses, st.inserts) == (3, 6, 3 + 6)
    assert m.non_evictable() == (6, 300)                 # inserted with expected_reads=2
    assert r.semaphore.acquired_permits == 0


def test_permit_estimate_and_update(cm):
    m = cm.EntryCacheManager(1 << 20)
    r = EntryReader(m, Storage(), 25_000)
    assert r.estimate(2) == 2 * 10 * 1024                 # Pulsar's default before any insert
    assert r.estimate(3) == 25_000                        # capped at the limit
    m.cache("x").insert((0, 0), b"x" * 300)
    assert r.estimate(4) == 1200
    seen = []

    async def storage(name, first, last):
        seen.append(r2.semaphore.acquired_permits)
        return [b"y" * 1000] * (last[1] - first[1] + 1)

    r2 = EntryReader(m, storage, 25_000)

    async def main():
        await r2.read("t", (1, 0), (1, 1))
        return r2.semaphore.stats()

    st = asyncio.run(main())
    assert seen == [2 * 300]                              # 2 entries x average 300
    assert st.acquired_permits == 0 and r2.semaphore.acquired_permits == 0
    assert EntryReader(m, Storage(), 0).estimate(1000) == 1000 * m.average_entry_size


def test_bad_ranges_and_storage_results(cm):
    m = cm.EntryCacheManager(1 << 20)

    async def short(name, first, last):
        return [b"x"]

    async def wrong_type(name, first, last):
        return ["str"] * (last[1] - first[1] + 1)

    r = EntryReader(m, Storage(), 1000)
    with pytest.raises(ValueError, match="one ledger"):
        asyncio.run(r.read("t", (1, 0), (2, 0)))
    with pytest.raises(ValueError, match="after"):
        asyncio.run(r.read("t", (1, 5), (1, 4)))
    with pytest.raises(TypeError):
        asyncio.run(r.read("t", (1, 0), [1, 4]))
    r = EntryReader(m, short, 1000)
    with pytest.raises(ValueError, match="returned 1 entries for 3"):
        asyncio.run(r.read("t", (1, 0), (1, 2)))
    assert r.semaphore.acquired_permits == 0
    r = EntryReader(m, wrong_type, 1000)
    with pytest.raises(TypeError):
        asyncio.run(r.read("t", (1, 0), (1, 2)))
    assert r.semaphore.acquired_permits == 0 and m.stats().inserts == 0
    with pytest.raises(TypeError):
        EntryReader(m, "not callable", 10)


def test_storage_exception_propagates_after_release(cm):
    m = cm.EntryCacheManager(1 << 20)
    boom = OSError("bookie down")

    async def failing(name, first, last):
        raise boom

    r = EntryReader(m, failing, 1000)
    with pytest.raises(OSError) as info:
        asyncio.run(r.read("t", (1, 0), (1, 2)))
    assert info.value is boom
    assert r.semaphore.acquired_permits == 0 and m.stats().inserts == 0


def test_timeout_is_the_cores_error(cm):
    # A fresh manager: the estimate is 10 KiB, the whole limit.
    r = EntryReader(cm.EntryCacheManager(1 << 20), Storage(), 10 * 1024, acquire_timeout=0.05)

    async def blocked():
        gate = asyncio.Event()
        r._storage = Storage(gate=gate)
        first = asyncio.create_task(r.read("t", (1, 0), (1, 0)))
        await asyncio.sleep(0.01)
        try:
            return await r.read("t", (1, 1), (1, 1))
        finally:
            gate.set()
            await first

    with pytest.raises(PermitAcquireTimeoutError):
        asyncio.run(asyncio.wait_for(blocked(), 10))
    assert r.semaphore.acquired_permits == 0


def test_queue_full_is_the_cores_error(cm):
    r = EntryReader(cm.EntryCacheManager(1 << 20), Storage(), 10 * 1024, max_queue_size=1,
                    acquire_timeout=5)

    async def full():
        gate = asyncio.Event()
        r._storage = Storage(gate=gate)
        t1 = asyncio.create_task(r.read("t", (2, 0), (2, 0)))
        await asyncio.sleep(0.01)
        t2 = asyncio.create_task(r.read("t", (2, 1), (2, 1)))     # queued
        await asyncio.sleep(0.01)
        try:
            await r.read("t", (2, 2), (2, 2))                    # queue full
        finally:
            gate.set()
            await asyncio.gather(t1, t2)

    with pytest.raises(PermitAcquireQueueFullError):
        asyncio.run(asyncio.wait_for(full(), 10))
    assert r.semaphore.acquired_permits == 0


def test_bound_holds_under_200_concurrent_slow_reads(cm):
    """200 readers of distinct ranges, a slow storage: permits in flight
    never exceed the limit, all come back, and cancelling waiting reads
    leaks nothing and calls storage for none of them."""
    m = cm.EntryCacheManager(64 << 20)
    limit = 8 * 1024 * 10                    # room for 8 single-entry reads at 10 KiB
    storage = Storage(size=10 * 1024, delay=0.01)
    r = EntryReader(m, storage, limit, acquire_timeout=30)
    storage.reader = r
    peaks = []

    async def main():
        async def sample():
            while True:
                peaks.append(r.semaphore.acquired_permits)
                await asyncio.sleep(0.001)

        sampler = asyncio.create_task(sample())
        tasks = [asyncio.create_task(r.read(f"topic-{i % 20}", (i, 0), (i, i % 3)))
                 for i in range(200)]
        await asyncio.sleep(0.02)
        waiting = r.semaphore.queue_size
        victims = tasks[-30:]
        for t in victims:
            t.cancel()
        res = await asyncio.gather(*tasks, return_exceptions=True)
        sampler.cancel()
        return waiting, res, victims

    waiting, res, victims = asyncio.run(main())
    assert waiting > 30                                   # the victims were queued
    assert max(peaks) <= limit and storage.peak <= limit
    assert r.semaphore.acquired_permits == 0 and r.semaphore.queue_size == 0
    done = [x for x in res if not isinstance(x, BaseException)]
    cancelled = [x for x in res if isinstance(x, asyncio.CancelledError)]
    assert len(done) == 170 and len(cancelled) == 30
    called = {c[1][0] for c in storage.calls}
    assert called.isdisjoint(range(170, 200))             # no storage call for a cancelled read
    assert all(len(x) == (i % 3) + 1 for i, x in enumerate(done))


def test_cancel_while_storage_runs_makes_no_later_call(cm):
    m = cm.EntryCacheManager(1 << 20)
    m.cache("t").insert((1, 2), b"cached")
    gate = asyncio.Event()
    storage = Storage(gate=gate)
    r = EntryReader(m, storage, 1 << 20)

    async def main():
        t = asyncio.create_task(r.read("t", (1, 0), (1, 4)))   # two runs: 0-1, 3-4
        while not storage.calls:
            await asyncio.sleep(0)
        assert r.semaphore.acquired_permits > 0
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t

    asyncio.run(main())
    assert storage.calls == [("t", (1, 0), (1, 1))]
    assert r.semaphore.acquired_permits == 0 and m.stats().inserts == 1


def test_no_limit(cm):
    m = cm.EntryCacheManager(1 << 20)
    storage = Storage(size=1 << 16)
    r = EntryReader(m, storage, 0)
    assert r.max_reads_in_flight_bytes == 0
    got = asyncio.run(r.read("t", (1, 0), (1, 99)))
    assert len(got) == 100 and r.semaphore.acquired_permits == 0
