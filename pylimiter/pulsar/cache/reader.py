"""The broker's read path: serve a range of entries from the entry cache and
read the misses from storage, with the bytes of storage reads in flight
bounded by pylimiter's AsyncSemaphore (Pulsar's InflightReadsLimiter:
managedLedgerMaxReadsInFlightSizeInMB, ...PermitsAcquireTimeoutMillis,
...PermitsAcquireQueueSize).
"""

from __future__ import annotations

from typing import Awaitable, Callable, Optional, Sequence, Union

from ... import AsyncSemaphore, PermitAcquireTimeoutError
from ._common import (
    DEFAULT_ENTRY_SIZE_ESTIMATE,
    check_expected_reads,
    check_int,
    check_position,
    data_size,
)

__all__ = ["EntryReader", "lookup"]

Data = Union[bytes, memoryview]
Storage = Callable[[str, tuple, tuple], Awaitable[Sequence[Data]]]


def lookup(cache, ledger: int, first: int, last: int) -> tuple[list, list[tuple[int, int]]]:
    """lookup serves entry ids first..last of one ledger from ``cache``: one
    ``get`` per position (a hit or a miss each).  Returns the data list, None
    at each miss, and the runs of consecutive misses as inclusive index
    pairs into that list; each run is one storage read."""
    get = cache.get
    datas = [get((ledger, eid)) for eid in range(first, last + 1)]
    runs = []
    start = None
    for i, d in enumerate(datas):
        if d is None:
            if start is None:
                start = i
        elif start is not None:
            runs.append((start, i - 1))
            start = None
    if start is not None:
        runs.append((start, len(datas) - 1))
    return datas, runs


class EntryReader:
    """EntryReader reads ranges of one ledger through ``manager``'s caches and
    ``storage``, holding at most ``max_reads_in_flight_bytes`` of storage
    reads in flight (``<= 0``: no limit).

    ``storage`` is awaited as ``await storage(name, first, last)`` with first
    and last in one ledger and must return every entry first..last in order
    (a wrong count is a ValueError).  Each storage call holds a permit of
    entries x the average size of the entries inserted into the manager so
    far (10 KiB before any), capped at the limit, for as long as it runs;
    a read waits at most ``acquire_timeout`` seconds for it
    (PermitAcquireTimeoutError) and fails at once when ``max_queue_size``
    reads wait already (PermitAcquireQueueFullError).
    """

    def __init__(self, manager, storage: Storage, max_reads_in_flight_bytes: int, *,
                 acquire_timeout: Optional[float] = 60.0, max_queue_size: int = 10000):
        if not callable(getattr(manager, "cache", None)):
            raise TypeError(f"manager must be an EntryCacheManager, not {type(manager).__name__}")
        if not callable(storage):
            raise TypeError(f"storage must be an async callable, not {type(storage).__name__}")
        limit = check_int(max_reads_in_flight_bytes, "max_reads_in_flight_bytes")
        self._manager = manager
        self._storage = storage
        self._limit = limit if limit > 0 else 0
        # An unbounded semaphore (max_permits 0) still counts what is held.
        self._sem = AsyncSemaphore(self._limit, max_queue_size, acquire_timeout)

    @property
    def max_reads_in_flight_bytes(self) -> int:
        """The limit (0: none)."""
        return self._limit

    @property
    def semaphore(self) -> AsyncSemaphore:
        """The semaphore whose permits are the bytes of reads in flight
        (``acquired_permits``, ``stats()``)."""
        return self._sem

    def estimate(self, entries: int) -> int:
        """The permit a storage read of ``entries`` (an int >= 0) entries
        asks for."""
        entries = check_int(entries, "entries")
        if entries < 0:
            raise ValueError(f"entries must be >= 0, got {entries}")
        avg = self._manager.average_entry_size
        n = entries * (DEFAULT_ENTRY_SIZE_ESTIMATE if avg is None else avg)
        return min(n, self._limit) if self._limit else n

    async def read(self, name: str, first: tuple[int, int], last: tuple[int, int], *,
                   expected_reads: int = 0) -> list[Data]:
        """The data of every position first..last of one ledger, in order.

        Cached positions come from the cache (one hit each); each run of
        consecutive misses is one storage call (one miss per position) whose
        entries are then inserted with ``expected_reads``.  A fully cached
        read takes no permit.  A range across ledgers or with first > last is
        a ValueError.  A storage exception propagates unchanged after the
        permit is released; cancelling the read, while it waits for a permit
        or while storage runs, gives the permit up and makes no later
        storage call.
        """
        first, last = check_position(first), check_position(last)
        if first[0] != last[0]:
            raise ValueError(f"first {first} and last {last} must be in one ledger")
        if first[1] > last[1]:
            raise ValueError(f"first {first} is after last {last}")
        check_expected_reads(expected_reads)
        cache = self._manager.cache(name)
        ledger, base = first
        datas, runs = lookup(cache, ledger, base, last[1])
        for i, j in runs:
            datas[i:j + 1] = await self._from_storage(cache, name, ledger, base + i, base + j,
                                                      expected_reads)
        return datas

    async def _from_storage(self, cache, name, ledger, a, b, expected_reads) -> list[Data]:
        n = b - a + 1
        sem = self._sem
        permit = await sem.acquire(self.estimate(n))
        try:
            got = list(await self._storage(name, (ledger, a), (ledger, b)))
            if len(got) != n:
                raise ValueError(f"storage returned {len(got)} entries for {n} positions "
                                 f"{(ledger, a)}..{(ledger, b)} of {name!r}")
            actual = sum(data_size(d) for d in got)
            if self._limit:
                actual = min(actual, self._limit)
            if actual <= permit.permits:
                await sem.update(permit, actual)   # a shrink: completes at once
            else:
                # Grow only if it fits now: the data is already in memory, and
                # waiting while holding the estimate could deadlock readers that
                # all wait to grow.  Otherwise the permit keeps the estimate.
                try:
                    await sem.update(permit, actual, timeout=0)
                except PermitAcquireTimeoutError:
                    pass
            for k, d in enumerate(got):
                cache.insert((ledger, a + k), d, expected_reads=expected_reads)
            return got
        finally:
            sem.release(permit)
