"""Generated broker read/write traces for the cache simulator: seeded,
deterministic, on a simulated clock, and independent of the cache policy
(consumers do not slow down on a miss), so every policy replays the same
trace.

A topic has a producer (Poisson arrivals at ``rate`` entries/s, log-normal
sizes around ``size`` bytes, all in ledger 1) and cursors.  A cursor polls
every ``poll`` s (jittered) and reads up to 100 entries that are at least
``lag`` s old, at most ``speed`` entries/s; it connects at ``start`` s, at
the tail or, with ``from_backlog``, at entry 0 of a backlog written before
the trace began (not cached).  A Key_Shared cursor routes every
``consumers``-th entry to one slow consumer taking ``slow_rate`` entries/s
from a buffer of 100: what does not fit goes on the replay queue and is
redelivered when the consumer has room.

Events, in time order (``t`` in ns; positions are entry ids of ledger 1):

``(t, ADD, topic, entry, active_cursors)``        the producer wrote an entry
``(t, READ, topic, first, last, cursors_at_or_before)``   a cursor read a range
``(t, REPLAY_ADD, topic, entries)``               entries put on a replay queue
``(t, REPLAY_READ, topic, entries)``              redelivered from it
``(t, MARK_DELETE, topic, entry)``   the slowest mark-delete moved up to entry
``(t, SLOWEST_READ, topic, entry)``  every cursor has read up to entry
"""

from __future__ import annotations

import heapq
import math
import zlib
from array import array
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from random import Random
from typing import Callable, Iterator, Optional

__all__ = ["WORKLOADS", "Cursor", "Topic", "Trace", "ADD", "READ", "REPLAY_ADD",
           "REPLAY_READ", "MARK_DELETE", "SLOWEST_READ"]

ADD, READ, REPLAY_ADD, REPLAY_READ, MARK_DELETE, SLOWEST_READ = range(6)
LEDGER = 1
BATCH = 100            # dispatcherMaxReadBatchSize
SLOW_BUFFER = 100      # the slow consumer's receiver queue
NS = 1_000_000_000


@dataclass(frozen=True)
class Cursor:
    """One subscription's cursor (see the module docstring)."""

    speed: float = math.inf
    lag: float = 0.0
    start: float = 0.0
    from_backlog: bool = False
    key_shared: Optional[tuple[int, float]] = None   # (consumers, slow entries/s)


@dataclass(frozen=True)
class Topic:
    """One topic: producer rate and size, backlog, cursors, poll interval."""

    rate: float
    size: int
    cursors: tuple[Cursor, ...]
    backlog: int = 0
    poll: float = 0.05


@dataclass(frozen=True)
class Workload:
    """A named generator of topic specs with its default duration."""

    name: str
    description: str
    duration: float
    topics: Callable[[Random, float], list[Topic]]


def _tailing(rng: Random, scale: float) -> list[Topic]:
    return [Topic(rate=rng.uniform(10, 30), size=2048, cursors=(Cursor(), Cursor()),
                  poll=rng.uniform(0.05, 0.15)) for _ in range(max(1, round(200 * scale)))]


def _catchup(rng: Random, scale: float) -> list[Topic]:
    return [Topic(rate=50, size=2048, backlog=6000, poll=0.05,
                  cursors=(Cursor(speed=600, from_backlog=True),
                           Cursor(speed=400, from_backlog=True),
                           Cursor(speed=300, from_backlog=True), Cursor()))
            for _ in range(max(1, round(20 * scale)))]


def _keyshared(rng: Random, scale: float) -> list[Topic]:
    return [Topic(rate=100, size=2048, poll=0.05,
                  cursors=(Cursor(key_shared=(4, rng.uniform(15, 20))),))
            for _ in range(max(1, round(30 * scale)))]


def _fanout(rng: Random, scale: float) -> list[Topic]:
    return [Topic(rate=100, size=4096, poll=0.1,
                  cursors=tuple(Cursor(lag=0.25 * i) for i in range(20)))
            for _ in range(max(1, round(20 * scale)))]


def _mix(rng: Random, scale: float) -> list[Topic]:
    out = []
    for _ in range(max(1, round(10_000 * scale))):
        rate = min(rng.lognormvariate(-0.5, 1.0), 50.0)
        kind = rng.random()
        if kind < 0.7:
            cursors = tuple(Cursor() for _ in range(rng.randint(1, 2)))
        elif kind < 0.8:
            cursors = tuple(Cursor(lag=rng.uniform(0, 3)) for _ in range(5))
        elif kind < 0.9:
            cursors = (Cursor(speed=20, from_backlog=True), Cursor(speed=10, from_backlog=True))
        else:
            cursors = (Cursor(key_shared=(4, rate / 4 * 0.7)),)
        out.append(Topic(rate=rate, size=1024, cursors=cursors, poll=0.5,
                         backlog=200 if kind >= 0.8 and kind < 0.9 else 0))
    return out


WORKLOADS: dict[str, Workload] = {w.name: w for w in (
    Workload("tailing", "200 topics, 2 consumers each at the head", 30, _tailing),
    Workload("catchup", "20 topics, 3 cursors reading a 6000-entry backlog at 600/400/300 "
             "entries/s, 1 at the head", 30, _catchup),
    Workload("keyshared", "30 topics, Key_Shared with one slow consumer of 4: its entries "
             "are replayed", 30, _keyshared),
    Workload("fanout", "20 topics, 20 subscriptions each, 0-4.75 s behind the head", 30,
             _fanout),
    Workload("mix", "10,000 topics of all four kinds at low rates", 10, _mix),
)}


@dataclass
class _CursorState:
    spec: Cursor
    pos: int = 0
    connected: bool = False
    tokens: float = 0.0
    last: float = 0.0
    slow_tokens: float = float(SLOW_BUFFER)
    pending: deque = field(default_factory=deque)


class Trace:
    """Trace is one generated run of a workload: iterate it for the events;
    ``sizes[topic][entry]`` is an entry's size (filled as entries are
    written) and ``reads`` counts the entry reads emitted so far (READ and
    REPLAY_READ), which every policy's hits + misses must equal."""

    def __init__(self, workload: str, seed: int = 1, *, scale: float = 1.0,
                 duration: Optional[float] = None):
        if workload not in WORKLOADS:
            raise ValueError(f"unknown workload {workload!r}; choose from {', '.join(WORKLOADS)}")
        w = WORKLOADS[workload]
        self.workload, self.seed, self.scale = workload, seed, scale
        self.duration = w.duration if duration is None else duration
        # A stable seed per (workload, seed): str hashes are salted per process.
        self._rng_seed = zlib.crc32(f"{workload}:{seed}".encode())
        self.topics = w.topics(Random(self._rng_seed), scale)
        self.names = [f"persistent://tenant/ns/{workload}-{i}" for i in range(len(self.topics))]
        self.sizes = [array("I") for _ in self.topics]
        self.reads = 0
        self.events_count = 0

    def __iter__(self) -> Iterator[tuple]:
        rng = Random(self._rng_seed + 1)
        end = self.duration
        heap: list = []
        seq = 0
        write_times: list[list[float]] = []
        cursors: list[list[_CursorState]] = []
        md = []
        slowest = []

        def size(t: Topic) -> int:
            return max(16, int(rng.lognormvariate(math.log(t.size) - 0.125, 0.5)))

        for i, t in enumerate(self.topics):
            sz = self.sizes[i]
            for _ in range(t.backlog):
                sz.append(size(t))
            write_times.append([-math.inf] * t.backlog)
            cursors.append([_CursorState(c) for c in t.cursors])
            md.append(-1)
            slowest.append(-1)
            heapq.heappush(heap, (rng.expovariate(t.rate), seq, ADD, i, 0))
            seq += 1
            for j, c in enumerate(t.cursors):
                heapq.heappush(heap, (c.start + rng.uniform(0, t.poll), seq, READ, i, j))
                seq += 1

        while heap:
            now, _, kind, i, j = heapq.heappop(heap)
            if now > end:
                break
            t_ns = int(now * NS)
            topic = self.topics[i]
            wt = write_times[i]
            if kind == ADD:
                eid = len(wt)
                wt.append(now)
                self.sizes[i].append(size(topic))
                active = sum(1 for c in cursors[i] if c.connected)
                self.events_count += 1
                yield (t_ns, ADD, i, eid, active)
                heapq.heappush(heap, (now + rng.expovariate(topic.rate), seq, ADD, i, 0))
                seq += 1
                continue
            cs = cursors[i]
            c = cs[j]
            if not c.connected:
                c.connected = True
                c.pos = 0 if c.spec.from_backlog else len(wt)
                c.last = now
            dt = now - c.last
            c.last = now
            ks = c.spec.key_shared
            m = 0
            if ks is not None:
                c.slow_tokens = min(c.slow_tokens + ks[1] * dt, SLOW_BUFFER)
                m = min(len(c.pending), int(c.slow_tokens))
                if m:
                    ids = tuple(c.pending.popleft() for _ in range(m))
                    c.slow_tokens -= m
                    self.reads += m
                    self.events_count += 1
                    yield (t_ns, REPLAY_READ, i, ids)
            avail = bisect_right(wt, now - c.spec.lag)
            k = min(avail - c.pos, BATCH)
            if c.spec.speed != math.inf:
                c.tokens = min(c.tokens + c.spec.speed * dt, BATCH)
                k = min(k, int(c.tokens))
            if k > 0:
                first = c.pos
                before = sum(1 for o in cs if (o.connected or o.spec.from_backlog)
                             and (o.pos if o.connected else 0) <= first)
                self.reads += k
                self.events_count += 1
                yield (t_ns, READ, i, first, first + k - 1, before)
                c.pos += k
                if c.spec.speed != math.inf:
                    c.tokens -= k
                if ks is not None:
                    replay = []
                    for eid in range(first, first + k):
                        if eid % ks[0]:
                            continue
                        if not c.pending and c.slow_tokens >= 1:
                            c.slow_tokens -= 1          # delivered with the read
                        else:
                            c.pending.append(eid)
                            replay.append(eid)
                    if replay:
                        self.events_count += 1
                        yield (t_ns, REPLAY_ADD, i, tuple(replay))
            if k > 0 or m:
                # Only this cursor moved.  A subscription that has not
                # connected yet holds its place only if it exists already
                # (a backlog cursor).
                new_md = new_slowest = None
                for o in cs:
                    if o.connected:
                        p = o.pos
                    elif o.spec.from_backlog:
                        p = 0
                    else:
                        continue
                    d = o.pending[0] if o.pending else p
                    if new_md is None or d < new_md:
                        new_md = d
                    if new_slowest is None or p < new_slowest:
                        new_slowest = p
                if new_md - 1 > md[i]:
                    md[i] = new_md - 1
                    self.events_count += 1
                    yield (t_ns, MARK_DELETE, i, new_md - 1)
                if new_slowest - 1 > slowest[i]:
                    slowest[i] = new_slowest - 1
                    self.events_count += 1
                    yield (t_ns, SLOWEST_READ, i, new_slowest - 1)
            heapq.heappush(heap, (now + topic.poll * rng.uniform(0.5, 1.5), seq, READ, i, j))
            seq += 1
