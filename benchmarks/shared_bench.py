"""The host-wide limiter's figures (issue 33), each measured in one process
beside its anchor, rounds interleaved with the order flipped every round
(:mod:`pylimiter.spark.interleave`), median over rounds.

Single-thread figures, timed in thread CPU time, set-up excluded:

- ``blocking``: 20,000 x ``acquire_blocking(1)`` + ``release`` on a
  SharedSemaphore against ``multiprocessing.Semaphore``'s ``acquire()`` +
  ``release()`` (its POSIX ``sem_t`` fast path), and against the in-process
  ``AsyncSemaphore``'s ``acquire_blocking(1)`` + ``release`` (the ratio the
  issue bounds at 1.5x).  A fourth side, ``blocking-locked``, is the same
  SharedSemaphore with its lock-free paths switched off
  (``_set_lock_free(False)``: every call takes the host's lock, as before
  they existed), so the table shows what the lock-free paths buy.
- ``weight8``: ``acquire_blocking(8)`` + ``release`` against the 8
  ``acquire()`` + 8 ``release()`` a user writes with
  ``multiprocessing.Semaphore`` today.
- ``async-with``: ``async with sem:`` on an asyncio loop against
  ``async with asyncio.Semaphore``.

Hand-off between processes (wall time, CLOCK_MONOTONIC, which every process
of the host shares): process A holds the only permit; process B's request
is parked (B said it is about to wait, then A waits 0.3 ms more, and for the
SharedSemaphore until the host's queue shows it); A reads the clock and
releases; B reads the clock when its request returns.  The latency is B's
reading minus A's.  Sides: a SharedSemaphore waiter in a thread of B
(``acquire_blocking``), in an asyncio task of B (``await acquire``; A's
release writes one datagram to the socket B's loop watches), the same task
with B's wake socket switched off (``_set_direct_wake(False)``: A wakes B's
waker thread, which writes the loop's eventfd, the two-hop path before the
socket existed), and ``multiprocessing.Semaphore``'s hand-off to a thread
of B measured the same way; and, as the floor of any wake-up of an event
loop from another process on this machine, one byte written by A into a
FIFO that B's loop reads (``add_reader``), the task resuming on a Future
the reader resolves (no semaphore at all: what a one-hop asyncio hand-off
cannot beat).  Per round each side hands off 300 times, 25 rounds; the
figures are the medians over rounds of each round's p50 and p99, and
their ratios to the anchor's.  (One round's p50 moves by a fifth either
way with where the scheduler put B; with the 7 rounds x 200 of earlier
runs the median ratio of the thread hand-off came out anywhere from 0.92
to 1.23 for the same code, with 25 x 300 within about 0.1.)

Excluded everywhere: creating semaphores, loops and processes.  The C
implementation only (``pylimiter._shared_c``).  Run::

    python -m benchmarks.shared_bench            # all figures, ~30 s
    python -m benchmarks.shared_bench --rounds 5 --handoffs 100

Output: a table on stdout, ``benchmarks/results/shared_bench.md`` and
``shared_bench.csv``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gc
import mmap
import multiprocessing
import os
import statistics
import struct
import sys
import tempfile
import time
import warnings
from pathlib import Path

from pylimiter.spark.interleave import CPU, Spread, interleaved, per_round

RESULTS = Path(__file__).resolve().parent / "results"
OPS = 20_000


def _shared_module():
    from pylimiter import _shared_c
    return _shared_c


# ---- single-thread sides ---------------------------------------------------------


def _blocking_locked(sem, n, weight):
    """The same calls with the lock-free paths off (each takes the lock)."""
    inner = _blocking_mine(sem, n, weight)

    def run():
        sem._set_lock_free(False)
        try:
            return inner()
        finally:
            sem._set_lock_free(True)
    return run


def _blocking_mine(sem, n, weight):
    def run():
        acq, rel = sem.acquire_blocking, sem.release
        t0 = CPU()
        for _ in range(n):
            rel(acq(weight))
        return CPU() - t0
    return run


def _blocking_mp(sem, n, weight):
    def run():
        acq, rel = sem.acquire, sem.release
        t0 = CPU()
        if weight == 1:
            for _ in range(n):
                acq()
                rel()
        else:
            for _ in range(n):
                for _ in range(weight):
                    acq()
                for _ in range(weight):
                    rel()
        return CPU() - t0
    return run


def _async_with(loop, sem, n):
    async def body():
        t0 = CPU()
        for _ in range(n):
            async with sem:
                pass
        return CPU() - t0
    return lambda: loop.run_until_complete(body())


def single_thread_figures(rounds: int, directory: str) -> list[dict]:
    from pylimiter import _limiter_c
    shm = _shared_module()
    out = []
    name = f"bench-{os.getpid()}"
    shared = shm.SharedSemaphore(name, 1 << 20, directory=directory)
    mp_sem = multiprocessing.Semaphore(1 << 10)
    inproc = _limiter_c.AsyncSemaphore(1 << 20, 0, None)
    try:
        samples = interleaved({"mine": _blocking_mine(shared, OPS, 1),
                               "anchor": _blocking_mp(mp_sem, OPS, 1),
                               "inproc": _blocking_mine(inproc, OPS, 1),
                               "locked": _blocking_locked(shared, OPS, 1)},
                              rounds, warmup=2, before=gc.collect)
        out.append(_row("blocking", "`acquire_blocking(1)`+`release`, x faster than "
                        "multiprocessing.Semaphore", samples, "faster", OPS, goal=1.0))
        out.append(_row("blocking-inproc", "the same, / in-process AsyncSemaphore's time",
                        {"mine": samples["mine"], "anchor": samples["inproc"]}, "slower", OPS,
                        goal=1.5))
        out.append(_row("blocking-locked", "the same with the lock-free paths off (every "
                        "call takes the host's lock), x faster than multiprocessing.Semaphore",
                        {"mine": samples["locked"], "anchor": samples["anchor"]}, "faster",
                        OPS))
        samples = interleaved({"mine": _blocking_mine(shared, OPS // 4, 8),
                               "anchor": _blocking_mp(mp_sem, OPS // 4, 8)},
                              rounds, warmup=2, before=gc.collect)
        out.append(_row("weight8", "`acquire_blocking(8)`+`release`, x faster than 8 "
                        "acquire() + 8 release() of multiprocessing.Semaphore", samples,
                        "faster", OPS // 4, goal=10.0))
        loop = asyncio.new_event_loop()
        try:
            samples = interleaved({"mine": _async_with(loop, shared, OPS),
                                   "anchor": _async_with(loop, asyncio.Semaphore(10), OPS)},
                                  rounds, warmup=2, before=gc.collect)
        finally:
            loop.close()
        out.append(_row("async-with", "`async with sem:`, x faster than asyncio.Semaphore",
                        samples, "faster", OPS,
                        goal=2.0 if sys.version_info[:2] == (3, 11) else None))
    finally:
        shared.close()
        shm.SharedSemaphore.unlink(name, directory)
    return out


def _row(key, title, samples, kind, ops, goal=None):
    if kind == "faster":
        values = per_round(samples, lambda mine, anchor, **_: anchor / mine)
    else:
        values = per_round(samples, lambda mine, anchor, **_: mine / anchor)
    spread = Spread.of(values)
    meets = None if goal is None else (spread.median >= goal if kind == "faster"
                                       else spread.median <= goal)
    return {"figure": key, "title": title, "kind": kind, **spread.as_dict(),
            "goal": goal, "meets": meets,
            "mine_ns_per_op": statistics.median(samples["mine"]) / ops,
            "anchor_ns_per_op": statistics.median(samples["anchor"]) / ops}


# ---- hand-off between processes --------------------------------------------------
# A shared anonymous page per side: [0] B's "about to wait" counter, [1] B's
# "done" counter, [2] A's "holds the permit again" counter, then one clock
# reading per hand-off.
_T = 24

_I64 = struct.Struct("q")


def _wait_for(page, idx, value, poll=0.00005, timeout=30.0):
    deadline = time.monotonic() + timeout
    while _I64.unpack_from(page, idx * 8)[0] < value:
        if time.monotonic() > deadline:
            raise RuntimeError("hand-off benchmark: the other process stopped answering")
        time.sleep(poll)


def _b_side(kind, name, directory, page, conn, mp_sem, cpu=None):
    """Process B: park a request, note the clock when it returns, release,
    for each hand-off of each round the parent asks for."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    fifo_fd = -1
    if kind == "mp-thread":
        sem = mp_sem   # inherited through fork
    elif kind == "fifo-task":
        sem = None
        fifo_fd = os.open(os.path.join(directory, name), os.O_RDWR | os.O_NONBLOCK)
    else:
        sem = _shared_module().SharedSemaphore(name, 1, directory=directory)
        if kind == "shared-task-waker":
            sem._set_direct_wake(False)
    loop = asyncio.new_event_loop() if "task" in kind else None
    fut_box = [None]
    if fifo_fd >= 0:
        def on_byte():
            try:
                os.read(fifo_fd, 64)
            except BlockingIOError:
                return
            f = fut_box[0]
            if f is not None and not f.done():
                f.set_result(None)
        loop.add_reader(fifo_fd, on_byte)
    count = 0
    while True:
        k = conn.recv()
        if k is None:
            break
        for _ in range(k):
            _wait_for(page, 2, count)        # A holds the permit again
            count += 1
            _I64.pack_into(page, 0, count)   # about to wait
            if fifo_fd >= 0:
                async def one():
                    fut_box[0] = loop.create_future()
                    await fut_box[0]
                    _I64.pack_into(page, _T + 8 * ((count - 1) % 4096), time.monotonic_ns())
                loop.run_until_complete(one())
            elif loop is not None:
                async def one():
                    p = await sem.acquire(1, timeout=None)
                    _I64.pack_into(page, _T + 8 * ((count - 1) % 4096), time.monotonic_ns())
                    sem.release(p)
                loop.run_until_complete(one())
            elif kind == "mp-thread":
                sem.acquire()
                _I64.pack_into(page, _T + 8 * ((count - 1) % 4096), time.monotonic_ns())
                sem.release()
            else:
                p = sem.acquire_blocking(1, timeout=None)
                _I64.pack_into(page, _T + 8 * ((count - 1) % 4096), time.monotonic_ns())
                sem.release(p)
            _I64.pack_into(page, 8, count)   # done
        conn.send(count)


class _Handoff:
    """One hand-off side: process B and the parent's half of the protocol."""

    def __init__(self, kind, directory, cpu=None):
        self.kind = kind
        self.name = f"handoff-{os.getpid()}-{kind}"
        self.directory = directory
        self.page = mmap.mmap(-1, _T + 8 * 4096)
        ctx = multiprocessing.get_context("fork")
        self.conn, child_conn = ctx.Pipe()
        self.fifo = -1
        if kind == "mp-thread":
            self.sem = ctx.Semaphore(1)
        elif kind == "fifo-task":
            self.sem = None
            os.mkfifo(os.path.join(directory, self.name), 0o600)
        else:
            self.sem = _shared_module().SharedSemaphore(self.name, 1, directory=directory)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            self.proc = ctx.Process(target=_b_side, args=(
                kind, self.name, directory, self.page, child_conn,
                self.sem if kind == "mp-thread" else None, cpu), daemon=True)
            self.proc.start()
        if kind == "fifo-task":
            self.fifo = os.open(os.path.join(directory, self.name), os.O_WRONLY)
        self.count = 0
        self.held = self._acquire()

    def _acquire(self):
        if self.kind == "mp-thread":
            self.sem.acquire()
            return None
        if self.kind == "fifo-task":
            return None
        return self.sem.acquire_blocking(1, timeout=None)

    def _release(self, held):
        if self.kind == "mp-thread":
            self.sem.release()
        elif self.kind == "fifo-task":
            os.write(self.fifo, b"x")
        else:
            self.sem.release(held)

    def round(self, k):
        """k hand-offs; returns the latencies in ns."""
        self.conn.send(k)
        t0s = []
        for _ in range(k):
            self.count += 1
            _wait_for(self.page, 0, self.count)          # B is about to wait
            time.sleep(0.0003)                           # ...and is parked
            if self.kind.startswith("shared"):
                deadline = time.monotonic() + 30
                while self.sem.queue_size < 1:
                    if time.monotonic() > deadline:
                        raise RuntimeError("hand-off benchmark: B never queued")
                    time.sleep(0.00005)
            t0 = time.monotonic_ns()
            self._release(self.held)
            t0s.append(t0)
            _wait_for(self.page, 1, self.count)          # B woke, noted, released
            self.held = self._acquire()
            _I64.pack_into(self.page, 16, self.count)    # A holds it again
        assert self.conn.recv() == self.count
        first = self.count - k
        return [_I64.unpack_from(self.page, _T + 8 * ((first + i) % 4096))[0] - t0s[i]
                for i in range(k)]

    def close(self):
        try:
            if self.kind != "fifo-task":
                self._release(self.held)
            self.conn.send(None)
        finally:
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(10)
            if self.kind.startswith("shared"):
                self.sem.close()
                _shared_module().SharedSemaphore.unlink(self.name, self.directory)
            elif self.fifo >= 0:
                os.close(self.fifo)


def _pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


HANDOFF_SIDES = ("shared-thread", "shared-task", "shared-task-waker", "mp-thread", "fifo-task")


def handoff_figures(rounds: int, k: int, directory: str, pin: bool = False) -> list[dict]:
    """``pin``: A runs on one CPU and every B on another, so that a wake-up
    always crosses CPUs (unpinned, the scheduler often runs both on one CPU,
    and the latency is then whether the woken B preempts A)."""
    mask = os.sched_getaffinity(0)
    cpus = sorted(mask)
    if pin and len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs")
    if pin:
        os.sched_setaffinity(0, {cpus[0]})
    sides = {kind: _Handoff(kind, directory, cpus[1] if pin else None)
             for kind in HANDOFF_SIDES}
    pooled: dict[str, list[int]] = {kind: [] for kind in sides}
    try:
        def side(kind):
            def run():
                lat = sides[kind].round(k)
                pooled[kind].extend(lat)
                return lat
            return run
        samples = interleaved({kind: side(kind) for kind in sides}, rounds, warmup=1)
    finally:
        for s in sides.values():
            s.close()
        os.sched_setaffinity(0, mask)
    out = []
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        per = {kind: [_pct(r, q) for r in samples[kind]] for kind in sides}
        for kind in ("shared-thread", "shared-task", "shared-task-waker"):
            values = [m / a for m, a in zip(per[kind], per["mp-thread"])]
            spread = Spread.of(values)
            mine_us = statistics.median(per[kind]) / 1000
            anchor_us = statistics.median(per["mp-thread"]) / 1000
            goal = None
            meets = None
            if kind == "shared-thread":
                goal = 1.0 if label == "p50" else 2.0
                meets = spread.median <= goal
            elif label == "p50" and kind == "shared-task":
                meets = mine_us <= 40.0
            floor_us = statistics.median([_pct(r, q) for r in samples["fifo-task"]]) / 1000
            what = "a thread" if kind.endswith("thread") else "a task"
            if kind.endswith("waker"):
                what = "a task through B's waker thread (wake socket off)"
            out.append({
                "figure": f"handoff-{kind.split('-', 1)[1]}-{label}",
                "title": f"hand-off to {what}, {label}, / multiprocessing.Semaphore's "
                         f"{label} (to a thread)",
                "kind": "slower", **spread.as_dict(), "goal": goal, "meets": meets,
                "mine_us": mine_us, "anchor_us": anchor_us,
                "floor_us": floor_us,
                "mine_pooled_us": _pct(pooled[kind], q) / 1000,
                "anchor_pooled_us": _pct(pooled["mp-thread"], q) / 1000,
            })
    return out


# ---- output ----------------------------------------------------------------------


def _fmt(r):
    goal = r.get("goal")
    if r["figure"] == "handoff-task-p50":
        goal_txt = "<= 40 us"
    elif r["figure"] == "handoff-task-waker-p50":
        goal_txt = "-"
    elif goal is None:
        goal_txt = "-"
    else:
        goal_txt = f"{'>=' if r['kind'] == 'faster' else '<='} {goal:g}"
    verdict = {True: "yes", False: "NO", None: "-"}[r["meets"]]
    if "mine_us" in r:
        detail = f"{r['mine_us']:.1f} us / {r['anchor_us']:.1f} us"
        if r["figure"].startswith("handoff-task"):
            detail += f" (FIFO-to-loop floor {r['floor_us']:.1f} us)"
    else:
        detail = f"{r['mine_ns_per_op']:.0f} ns / {r['anchor_ns_per_op']:.0f} ns"
    return (f"| `{r['figure']}` | {r['title']} | **{r['median']:.2f}** "
            f"({r['q1']:.2f}-{r['q3']:.2f}) | {detail} | {goal_txt} | {verdict} |")


def write(rows, out_dir: Path, meta: str) -> str:
    lines = [f"Host-wide limiter figures ({meta})", "",
             "| figure | what | median (IQR) | mine / anchor | goal | met |",
             "|---|---|---|---|---|---|"]
    lines += [_fmt(r) for r in rows]
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "shared_bench.md").write_text(text)
    keys = sorted({k for r in rows for k in r})
    with open(out_dir / "shared_bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    return text


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15,
                    help="rounds per figure (default %(default)s)")
    ap.add_argument("--handoffs", type=int, default=300,
                    help="hand-offs per side per round (default %(default)s)")
    ap.add_argument("--handoff-rounds", type=int, default=25,
                    help="hand-off rounds (default %(default)s)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--skip-handoff", action="store_true")
    ap.add_argument("--only-handoff", action="store_true")
    ap.add_argument("--pin", action="store_true",
                    help="hand-offs: A on one CPU, B on another (every wake crosses CPUs)")
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="pylimiter-bench-", dir="/dev/shm") as d:
        rows = [] if args.only_handoff else single_thread_figures(args.rounds, d)
        if not args.skip_handoff:
            rows += handoff_figures(args.handoff_rounds, args.handoffs, d, args.pin)
    load1 = os.getloadavg()[0]
    pinned = ", A and B pinned to two CPUs" if args.pin else ""
    meta = (f"CPython {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
            f"{args.rounds} rounds; hand-off {args.handoff_rounds} rounds x "
            f"{args.handoffs}{pinned}; load average {load0:.1f} at the start, "
            f"{load1:.1f} at the end")
    print(write(rows, args.out, meta))
    return 0


if __name__ == "__main__":
    sys.exit(main())
