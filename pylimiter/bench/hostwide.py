"""Host-wide scenarios of the benchmark grid (issue 33): every Python worker
process of an executor opens the same :class:`~pylimiter.SharedSemaphore`,
so the processes on one host share one budget.

- ``host-handoff``: a semaphore of one permit; each process runs one thread
  that loops ``acquire_blocking(1)`` -> a short critical section (a
  ``HANDOFF_HOLD_S`` busy wait, so that the others are parked by the time
  it ends) -> ``release``.  Strict FIFO makes the permit go round the
  processes, so nearly every grant is a hand-off from one process to
  another while they all run.  The *hand-off latency* is the wall time from the
  releaser reading CLOCK_MONOTONIC just before ``release`` (it writes the
  reading and its pid on a small shared board while it still holds the
  permit) to the grantee reading it when its call returns; a grant counts
  as a hand-off only when the previous holder was another process and the
  grantee had called before that release (so it was parked, not arriving
  late).  Beside it, in the same processes and the same rounds, the
  host-wide mutex users write by hand: ``fcntl.flock`` on a shared file
  (the kernel wakes every waiter and lets them race, and a releaser that
  asks again at once may get it back: not FIFO).
- ``host-load``: a semaphore of ``HOST_PERMITS`` permits; each process runs
  ``HOST_TASKS`` asyncio tasks, each looping ``acquire(1)`` -> a simulated
  hold (``asyncio.sleep(HOLD_S)``) -> ``release``.  Host throughput (grants
  per second, summed over the processes) and the wait from the acquire call
  to the grant.

Per core count k (1 .. the cluster's parallelism) one Spark *barrier*
stage runs k tasks at once, one per Python worker process.  The processes
of a host run every round's sides in the same time slots, the order
flipped every round (as :func:`pylimiter.spark.interleave.interleaved` does
in one process): a barrier cannot start them together, because Spark's
``BarrierTaskContext.barrier()`` lets some tasks go up to a second after
the others (measured here: one of two tasks returned at once, the other
1.1 s later, round after round).  So the barrier only orders the phases
(all attached; all idle), and the windows follow a schedule on
CLOCK_MONOTONIC, which every process of a host shares: once attached,
each process proposes "now + LEAD_S" on the stage's board (the largest
proposal wins); after the first barrier all read the winner as the first
slot's start, and slot i starts ``i * (budget + gap)`` later.
After every window each process reads the segment's high-water mark
(``peak_acquired_permits``); after the last one, once all processes are
idle (a barrier), the host's books (``acquired_permits``, ``queue_size``,
``holders()``) must be back to zero.

Everything here but the Spark stage itself is plain Python: the trial takes
its barrier as a callable, so tests run it in plain processes.
"""

from __future__ import annotations

import asyncio
import fcntl
import mmap
import os
import socket
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

from .._impls import IMPLEMENTATIONS

__all__ = ["HOLD_S", "HOST_FIELDS", "HOST_PERMITS", "HOST_SCENARIOS", "HOST_TASKS", "Board",
           "LoadTally", "handoff_loop", "load_loop", "run_host_trial"]

#: name -> what it measures (the scenarios of this module, for --scenarios)
HOST_SCENARIOS = {
    "host-handoff": "one permit shared by k Python workers (one thread each): "
                    "acquire_blocking(1), release; hand-off latency between processes",
    "host-load": "16 permits shared by k Python workers (100 asyncio tasks each): "
                 "acquire(1), 1 ms hold, release; host throughput",
}
#: host-handoff: the holder's critical section (a busy wait, seconds)
HANDOFF_HOLD_S = 20e-6
#: host-load: asyncio tasks per process, permits of the host, simulated hold
HOST_TASKS = 100
HOST_PERMITS = 16
HOLD_S = 0.001
#: The sides of each scenario: pylimiter's, and the hand-built anchor.
SIDES = {"host-handoff": ("shared", "flock"), "host-load": ("shared",)}
#: What a side's acquire may wait at most: a trial never hangs a Spark task.
ACQUIRE_TIMEOUT_S = 60.0
#: The first window opens this long after the last process proposed a
#: start: longer than a Spark barrier's spread (up to ~1.1 s measured).
LEAD_S = 1.5
#: Time between windows (for host-load: at least the budget): the drain
#: of requests still out at a window's end happens there.
GAP_S = {"host-handoff": 0.1, "host-load": 0.25}

#: One row per process, round and side.
HOST_FIELDS = [
    ("run", "string"), ("scenario", "string"), ("impl", "string"), ("cores", "int"),
    ("partition", "int"), ("round", "int"), ("side", "string"), ("limit", "long"),
    ("tasks", "int"), ("grants", "long"), ("seconds", "double"), ("grants_per_s", "double"),
    ("handoffs", "long"), ("handoff_p50_us", "double"), ("handoff_p99_us", "double"),
    ("wait_p50_us", "double"), ("wait_p99_us", "double"), ("wait_max_us", "double"),
    ("peak", "long"), ("leaked", "long"), ("unbalanced", "long"), ("errors", "long"),
    ("host", "string"), ("pid", "int"), ("failure", "string"),
]


# ---- the host-load loop (also used by benchmarks/shared_load.py) ---------------------


@dataclass
class LoadTally:
    """What one process's tasks did in a load window."""

    grants: int = 0           # granted inside the window
    total: int = 0            # granted in all (the drain after the window included)
    releases: int = 0
    errors: int = 0
    waits: list[int] = field(default_factory=list)      # ns, grants inside the window
    per_task: list[int] = field(default_factory=list)   # grants inside the window, per task
    error_text: Optional[str] = None


async def load_loop(acquire: Callable[[], Awaitable[Any]], release: Callable[[Any], Any], *,
                    tasks: int, hold_s: float, start_ns: int, end_ns: int,
                    release_awaits: bool = False) -> LoadTally:
    """``tasks`` asyncio tasks, each looping ``acquire()`` -> ``sleep(hold_s)``
    -> ``release(token)`` from ``start_ns`` until ``end_ns``
    (CLOCK_MONOTONIC, which every process of the host shares).  A request
    made before the end is waited for and released (the drain), but only
    grants inside the window count as throughput.  ``release_awaits``: the
    release returns an awaitable (a network round trip)."""
    clock = time.monotonic_ns
    tally = LoadTally(per_task=[0] * tasks)

    async def one(i: int) -> None:
        while True:
            t0 = clock()
            if t0 >= end_ns:
                return
            try:
                token = await acquire()
            except Exception as exc:      # counted and reported; the task stops
                tally.errors += 1
                tally.error_text = f"{type(exc).__name__}: {exc}"
                return
            t1 = clock()
            tally.total += 1
            if t1 <= end_ns:
                tally.grants += 1
                tally.per_task[i] += 1
                tally.waits.append(t1 - t0)
            try:
                await asyncio.sleep(hold_s)
            finally:
                if release_awaits:
                    await release(token)
                else:
                    release(token)
                tally.releases += 1

    delay = start_ns - clock()
    if delay > 0:
        await asyncio.sleep(delay / 1e9)
    await asyncio.gather(*(one(i) for i in range(tasks)))
    return tally


# ---- the hand-off loop -------------------------------------------------------------


class Board:
    """Words in a small shared file: the pid of the last process to release
    the permit and its CLOCK_MONOTONIC reading just before it did (written
    only by the holder of the single permit, so the limiter's own hand-off
    orders each write before the next holder's read); then the stage's
    first window start (``propose_start``)."""

    SIZE = 24

    def __init__(self, path: str):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            if os.fstat(fd).st_size < self.SIZE:
                os.ftruncate(fd, self.SIZE)
            self._map = mmap.mmap(fd, self.SIZE)
        finally:
            os.close(fd)

    def read(self) -> tuple[int, int]:
        return struct.unpack_from("=qq", self._map, 0)

    def write(self, pid: int, ns: int) -> None:
        struct.pack_into("=qq", self._map, 0, pid, ns)

    def propose_start(self, ns: int, fd_path: str) -> None:
        """Raise the stage's start to ``ns`` if it is later (under an flock
        of ``fd_path``: processes propose at the same time)."""
        fd = os.open(fd_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            (cur,) = struct.unpack_from("=q", self._map, 16)
            if ns > cur:
                struct.pack_into("=q", self._map, 16, ns)
        finally:
            os.close(fd)         # drops the flock

    def start(self) -> int:
        return struct.unpack_from("=q", self._map, 16)[0]

    def close(self) -> None:
        self._map.close()


@dataclass
class HandoffTally:
    """What one process's thread did in a hand-off window."""

    grants: int = 0
    latencies: list[int] = field(default_factory=list)   # ns, hand-offs to this process


def handoff_loop(acquire: Callable[[], Any], release: Callable[[Any], None], board: Board,
                 start_ns: int, end_ns: int, hold_s: float = HANDOFF_HOLD_S) -> HandoffTally:
    """Loop ``acquire()`` -> busy ``hold_s`` -> ``release(token)`` from
    ``start_ns`` to ``end_ns`` (CLOCK_MONOTONIC), timing each hand-off from
    another process (see the module's docstring)."""
    clock = time.monotonic_ns
    hold_ns = int(hold_s * 1e9)
    me = os.getpid()
    tally = HandoffTally()
    delay = start_ns - clock()
    if delay > 0:
        time.sleep(delay / 1e9)
    while True:
        t0 = clock()
        if t0 >= end_ns:
            return tally
        token = acquire()
        t1 = clock()
        last_pid, released_ns = board.read()
        if t1 <= end_ns:
            tally.grants += 1
            # Another process released it after this call began: this
            # process was parked (or on its way to park) when it did.
            if last_pid not in (0, me) and t0 <= released_ns <= t1:
                tally.latencies.append(t1 - released_ns)
        until = t1 + hold_ns
        while clock() < until:
            pass
        board.write(me, clock())
        release(token)


# ---- one trial: every process of the stage runs this -----------------------------------


def _percentile(sorted_vals: list[int], q: float) -> Optional[float]:
    if not sorted_vals:
        return None
    i = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return float(sorted_vals[i])


def _us(ns: Optional[float]) -> Optional[float]:
    return None if ns is None else ns / 1000.0


def _side_path(directory: str, name: str, suffix: str) -> str:
    return os.path.join(directory, f"pylimiter-{os.getuid()}-{name}.{suffix}")


def new_run_id() -> str:
    """A run's id: segment names are unique per run (and per stage)."""
    return uuid.uuid4().hex[:12]


def segment_name(run: str, scenario: str, impl: str, cores: int) -> str:
    """The segment of one stage: ``bench-<run>-<scenario>-<impl>-k<cores>``."""
    return f"bench-{run}-{scenario}-{impl}-k{cores}"


class _Handoff:
    """The two sides of host-handoff in one process: the shared semaphore
    and the flock anchor, over one board."""

    def __init__(self, sem, board: Board, directory: str, name: str):
        self.sem = sem
        self.board = board
        self.lock_fd = os.open(_side_path(directory, name, "flock"),
                               os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)

    def run(self, side: str, start_ns: int, end_ns: int) -> HandoffTally:
        if side == "shared":
            sem = self.sem
            return handoff_loop(lambda: sem.acquire_blocking(1, timeout=ACQUIRE_TIMEOUT_S),
                                sem.release, self.board, start_ns, end_ns)
        fd = self.lock_fd
        return handoff_loop(lambda: fcntl.flock(fd, fcntl.LOCK_EX),
                            lambda _: fcntl.flock(fd, fcntl.LOCK_UN), self.board,
                            start_ns, end_ns)

    def close(self) -> None:
        os.close(self.lock_fd)


def run_host_trial(scenario: str, impl: str, cores: int, partition: int, *, run: str,
                   rounds: int, budget_s: float, barrier: Callable[[], None],
                   directory: Optional[str] = None, warmup: int = 1,
                   tasks: int = HOST_TASKS, permits: int = HOST_PERMITS,
                   hold_s: float = HOLD_S, lead_s: float = LEAD_S) -> list[dict]:
    """One process's part of a host-wide stage: open the stage's segment,
    run ``warmup`` + ``rounds`` rounds of the scenario's sides
    (``budget_s`` seconds each), check the books, detach, and return one row
    per measured round and side (``HOST_FIELDS``).

    ``barrier()`` must return only when every process of the stage has
    called it (Spark's ``BarrierTaskContext.barrier``, or a
    ``multiprocessing.Barrier``'s ``wait``); every process calls it the same
    number of times whatever fails, so a failure is a row, never a hang.
    ``lead_s``: from the last process's proposal to the first window (more
    than the barrier's spread)."""
    if scenario not in HOST_SCENARIOS:
        raise ValueError(f"unknown host-wide scenario {scenario!r}")
    mod = IMPLEMENTATIONS[impl].module_of("shared")
    from .._shared_common import segment_dir

    directory = segment_dir(directory)
    name = segment_name(run, scenario, impl, cores)
    limit = 1 if scenario == "host-handoff" else permits
    sides = SIDES[scenario]
    base = {"run": run, "scenario": scenario, "impl": impl, "cores": cores,
            "partition": partition, "limit": limit,
            "tasks": 1 if scenario == "host-handoff" else tasks,
            "host": socket.gethostname(), "pid": os.getpid()}
    rows: list[dict] = []
    failure: Optional[str] = None
    sem = handoff = board = None
    clock_lock = _side_path(directory, name, "lock")
    try:
        sem = mod.SharedSemaphore(name, limit, 0, None, directory=directory)
        board = Board(_side_path(directory, name, "board"))
        if scenario == "host-handoff":
            handoff = _Handoff(sem, board, directory, name)
        board.propose_start(time.monotonic_ns() + int(lead_s * 1e9), clock_lock)
    except Exception as exc:
        failure = f"open: {type(exc).__name__}: {exc}"
    barrier()                 # everyone attached and proposed: the latest start wins
    first = board.start() if board is not None else 0
    slot_ns = int((budget_s + GAP_S[scenario]) * 1e9)
    slot = 0
    for r in range(warmup + rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for side in order:
            start = first + slot * slot_ns
            end = start + int(budget_s * 1e9)
            slot += 1
            # A process still draining the last window starts late: its
            # window is what is left of the slot.
            seconds = max(0, end - max(start, time.monotonic_ns())) / 1e9
            row = dict(base, round=r - warmup, side=side, seconds=seconds, grants=0,
                       handoffs=0, errors=0, failure=failure)
            if failure is None and seconds > 0:
                try:
                    if handoff is not None:
                        t = handoff.run(side, start, end)
                        lat = sorted(t.latencies)
                        row.update(grants=t.grants, handoffs=len(lat),
                                   handoff_p50_us=_us(_percentile(lat, 0.5)),
                                   handoff_p99_us=_us(_percentile(lat, 0.99)))
                    else:
                        t = asyncio.run(load_loop(
                            lambda: sem.acquire(1, timeout=ACQUIRE_TIMEOUT_S), sem.release,
                            tasks=tasks, hold_s=hold_s, start_ns=start, end_ns=end))
                        waits = sorted(t.waits)
                        row.update(grants=t.grants, errors=t.errors,
                                   wait_p50_us=_us(_percentile(waits, 0.5)),
                                   wait_p99_us=_us(_percentile(waits, 0.99)),
                                   wait_max_us=_us(float(waits[-1]) if waits else None))
                        if t.error_text:
                            row["failure"] = t.error_text
                    if side == "shared":
                        row["peak"] = sem.peak_acquired_permits
                except Exception as exc:
                    row.update(errors=row["errors"] + 1,
                               failure=f"{side}: {type(exc).__name__}: {exc}")
            row["grants_per_s"] = row["grants"] / seconds if seconds > 0 else None
            if r >= warmup:
                rows.append(row)
    barrier()                             # every process idle: the books must be clean
    leaked = unbalanced = None
    if sem is not None:
        try:
            leaked = sem.acquired_permits + sem.queue_size
            unbalanced = sum(sem.holders().values())
        except Exception as exc:
            failure = failure or f"books: {type(exc).__name__}: {exc}"
        sem.close()
    if handoff is not None:
        handoff.close()
    if board is not None:
        board.close()
    # Every process is past its last window: the files can go (a process
    # still reading its books keeps its mapping).
    mod.SharedSemaphore.unlink(name, directory)
    for suffix in ("board", "flock", "lock"):
        try:
            os.unlink(_side_path(directory, name, suffix))
        except FileNotFoundError:
            pass
    for row in rows:
        row.update(leaked=leaked, unbalanced=unbalanced)
        if failure and not row["failure"]:
            row["failure"] = failure
    return rows
