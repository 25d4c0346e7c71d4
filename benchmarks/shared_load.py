"""Host-wide load: 8 processes x 100 asyncio tasks through 16
permits for 10 s, on a SharedSemaphore (C, and the pure-Python twin) and,
where ``redis-server`` is installed, on the sorted-set semaphore on Redis
that users build by hand with redis-py; the same load, the sides
interleaved in rounds in one run.

What is measured, per round and side: every task loops ``acquire(1)`` ->
a simulated hold (``asyncio.sleep(--hold-ms)``) -> ``release`` from a common
start (CLOCK_MONOTONIC, shared by the processes) for ``--seconds``
(:func:`pylimiter.bench.hostwide.load_loop`).  Host throughput is the
grants made inside the window, summed over the processes, per second of
window; the wait is the wall time from the acquire call to the grant,
pooled over the processes.  Requests still out at the end are waited for
and released (the drain), but not counted.  After each round the benchmark
process checks the books: the segment's high-water mark
(``peak_acquired_permits``, kept in the segment by every grant) must not
exceed the limit (asserted), no permit may be held or queued, ``holders()``
must list only the benchmark process with 0, and the host's grant count
(``stats().acquired_total``) must equal what the processes counted.  The
same for Redis: its high-water mark and grant count are kept by the acquire
script in a hash, and both sorted sets must be empty after the round.

Excluded: starting the processes and the server, opening the segment or
the connections (each process opens them before the common start).

The sides run in rounds, one side at a time over all processes, the order
flipped every round (A B C, C B A, ...), after one short warm-up round;
each figure is the median over rounds, and the ratios are medians of
per-round ratios (``pylimiter.spark.interleave``).

**The Redis side** is the counting semaphore of "Redis in Action" (6.3,
the fair variant) as users write it with redis-py, here as one Lua script
so that it is atomic: a sorted set of holder ids scored by an increasing
ticket (INCR) decides who is in (ZADD, then ZRANK < limit, else ZREM),
and a second one scored by the server's clock (TIME) gives each holder a
lease of ``--redis-ttl`` seconds.  What that means:

- *Not FIFO, no queue.*  A refused request goes away and tries again after
  ``--redis-poll-ms`` (with jitter); whoever's retry lands first after a
  release wins, however long the others have waited.  "Fair" in the
  book's sense only means no client wins by its clock being behind.  Waits
  are long-tailed and a task can starve; the per-task grant spread in the
  table shows it.
- *The TTL is the crash handling.*  A holder that dies keeps its slot
  until its lease expires (``--redis-ttl`` s of one permit lost to the
  host); a live holder that holds longer than the TTL loses its slot
  silently, and the budget is exceeded while it still works.
  SharedSemaphore returns a dead process's permits within 1 s and never
  takes a permit from a live holder.

Run::

    python -m benchmarks.shared_load               # ~3 min: 3 rounds x 3 sides x 10 s
    python -m benchmarks.shared_load --seconds 2 --rounds 1 --sides c,redis

Output: a table on stdout, ``benchmarks/results/shared_load.md`` and
``shared_load.csv`` (one row per round and side).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import multiprocessing
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Optional

from pylimiter._impls import IMPLEMENTATIONS
from pylimiter.bench.hostwide import load_loop
from pylimiter.spark.interleave import Spread

RESULTS = Path(__file__).resolve().parent / "results"
SIDES = ("c", "python", "redis")
#: From "all processes ready" to the common start.
START_DELAY_S = 0.1


# ---- the hand-built Redis semaphore ------------------------------------------------

# KEYS: holders by ticket, leases by server time (ms), the ticket counter,
# the books (hash: hwm, grants).  ARGV: holder id, limit, lease (ms).
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[3]))
for _, id in ipairs(dead) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
local ticket = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[1], ticket, ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
if redis.call('ZRANK', KEYS[1], ARGV[1]) < tonumber(ARGV[2]) then
  local held = redis.call('ZCARD', KEYS[1])
  if held > tonumber(redis.call('HGET', KEYS[4], 'hwm') or '0') then
    redis.call('HSET', KEYS[4], 'hwm', held)
  end
  redis.call('HINCRBY', KEYS[4], 'grants', 1)
  return 1
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 0
"""
# KEYS: holders, leases.  ARGV: holder id.  Returns 0 when the lease had
# already expired (someone else may have been let in meanwhile).
_RELEASE = """
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
"""


def redis_keys(name: str) -> list[str]:
    """The semaphore's keys: holders, leases, ticket counter, books."""
    return [f"{name}:holders", f"{name}:leases", f"{name}:ticket", f"{name}:books"]


class RedisSemaphore:
    """A counting semaphore of ``limit`` slots on Redis (redis.asyncio), as
    users build it: acquire retries every ``poll_s`` (+-50% jitter) until the
    script lets it in; each holder has a lease of ``ttl_s``."""

    def __init__(self, client, name: str, limit: int, ttl_s: float, poll_s: float,
                 seed: int = 0):
        self.keys = redis_keys(name)
        self.limit, self.ttl_ms, self.poll_s = limit, int(ttl_s * 1000), poll_s
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)
        self._prefix = f"{os.getpid()}-"
        self._ids = 0
        self._rng = random.Random(seed)
        self.expired = 0     # releases that found their lease gone
        self.calls = 0       # acquire scripts run before ``window_end`` (ns)
        self.window_end = 1 << 62

    async def prepare(self, client, connections: int) -> None:
        """Load the scripts and open ``connections`` connections (one per
        task that will talk at once), so the timed window opens none."""
        await client.script_load(_ACQUIRE)
        await client.script_load(_RELEASE)
        await asyncio.gather(*(client.ping() for _ in range(connections)))

    async def acquire(self) -> str:
        self._ids += 1
        ident = f"{self._prefix}{self._ids}"
        while True:
            if time.monotonic_ns() <= self.window_end:
                self.calls += 1
            if await self._acquire(keys=self.keys, args=[ident, self.limit, self.ttl_ms]):
                return ident
            await asyncio.sleep(self.poll_s * (0.5 + self._rng.random()))

    async def release(self, ident: str) -> None:
        if not await self._release(keys=self.keys[:2], args=[ident]):
            self.expired += 1


class RedisServer:
    """``redis-server`` on 127.0.0.1 (a free port, no persistence), stopped
    by its PID."""

    def __init__(self, workdir: str):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", workdir, "--maxclients", "4096",
             "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError("redis-server did not start") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def version(self) -> str:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True,
                             timeout=10).stdout
        return next((w.split("=")[1] for w in out.split() if w.startswith("v=")), "?")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def redis_available() -> Optional[str]:
    """None when the Redis side can run here, else why not."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (Debian: apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "redis-py is not installed (pip install redis; the bench dependency group)"
    return None


# ---- the worker processes ----------------------------------------------------------


def _worker(conn) -> None:
    """One load process: runs the rounds the parent sends until told to stop."""
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(_run_job(job, conn))
        except Exception as exc:     # reported; the parent fails the run
            conn.send({"error": f"{type(exc).__name__}: {exc}"})


def _run_job(job: dict, conn) -> dict:
    """Open the side's limiter (or connections), say "ready", wait for the
    common start the parent sends, run the load window."""
    side = job["side"]
    out: dict = {"pid": os.getpid()}

    def ready() -> tuple[int, int]:
        conn.send("ready")
        start_ns = conn.recv()
        if start_ns is None:            # the parent gave up on the round
            raise SystemExit(0)
        return start_ns, start_ns + int(job["seconds"] * 1e9)

    if side == "redis":
        import redis.asyncio as aredis

        async def main():
            client = aredis.Redis(host="127.0.0.1", port=job["port"])
            try:
                sem = RedisSemaphore(client, job["name"], job["permits"], job["ttl_s"],
                                     job["poll_s"], seed=os.getpid())
                await sem.prepare(client, job["tasks"])
                start_ns, end_ns = ready()
                sem.window_end = end_ns
                tally = await load_loop(sem.acquire, sem.release, tasks=job["tasks"],
                                        hold_s=job["hold_s"], start_ns=start_ns,
                                        end_ns=end_ns, release_awaits=True)
                out["expired"] = sem.expired
                out["calls"] = sem.calls
                return tally
            finally:
                await client.aclose()
        tally = asyncio.run(main())
    else:
        mod = IMPLEMENTATIONS[side].module_of("shared")
        sem = mod.SharedSemaphore(job["name"], job["permits"], 0, None,
                                  directory=job["directory"])
        try:
            start_ns, end_ns = ready()
            tally = asyncio.run(load_loop(lambda: sem.acquire(1), sem.release,
                                          tasks=job["tasks"], hold_s=job["hold_s"],
                                          start_ns=start_ns, end_ns=end_ns))
            # This process is idle: the host must book nothing for it.
            out["held_after"] = sem.holders().get(os.getpid())
        finally:
            sem.close()
    out.update(grants=tally.grants, total=tally.total, releases=tally.releases,
               errors=tally.errors, error_text=tally.error_text, per_task=tally.per_task,
               waits=array("q", tally.waits).tobytes())
    return out


class Workers:
    """``n`` long-lived load processes (spawned), joined and reaped on close."""

    def __init__(self, n: int):
        ctx = multiprocessing.get_context("spawn")
        self.procs, self.conns = [], []
        try:
            for _ in range(n):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_worker, args=(child,), daemon=True)
                p.start()
                child.close()
                self.procs.append(p)
                self.conns.append(parent)
        except BaseException:
            self.close()
            raise

    def _answers(self, timeout: float, what: str) -> list:
        out = []
        for c, p in zip(self.conns, self.procs):
            if not c.poll(timeout):
                raise RuntimeError(f"load process {p.pid} did not {what} in {timeout:.0f} s")
            r = c.recv()
            if isinstance(r, dict) and "error" in r:
                raise RuntimeError(f"load process {p.pid}: {r['error']}")
            out.append(r)
        return out

    def run(self, job: dict, timeout: float) -> list[dict]:
        """Every process prepares the job; once all are ready, they start
        together START_DELAY_S later (CLOCK_MONOTONIC) and run the window."""
        for c in self.conns:
            c.send(job)
        self._answers(60, "get ready")
        start_ns = time.monotonic_ns() + int(START_DELAY_S * 1e9)
        for c in self.conns:
            c.send(start_ns)
        return self._answers(timeout, "finish a round")

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)
        for c in self.conns:
            c.close()


# ---- one round of one side -----------------------------------------------------------


def _pct(sorted_vals, q: float) -> Optional[float]:
    if not sorted_vals:
        return None
    return float(sorted_vals[min(len(sorted_vals) - 1, round(q * (len(sorted_vals) - 1)))])


def run_side(side: str, workers: Workers, *, rnd: int, tasks: int, permits: int,
             seconds: float, hold_s: float, directory: str, redis_port: Optional[int],
             ttl_s: float, poll_s: float) -> dict:
    """One round of one side over every load process, then the books
    checked; returns the round's row (see the module's docstring)."""
    name = f"load-{os.getpid()}-{rnd}-{side}"
    job = dict(side=side, name=name, directory=directory, permits=permits, tasks=tasks,
               hold_s=hold_s, seconds=seconds, port=redis_port, ttl_s=ttl_s, poll_s=poll_s)
    me = os.getpid()
    sem = client = None
    if side == "redis":
        import redis

        client = redis.Redis(host="127.0.0.1", port=redis_port)
        client.delete(*redis_keys(name))
    else:
        # The benchmark process creates the segment (so it can read the
        # books after the round) and stays attached, idle.
        mod = IMPLEMENTATIONS[side].module_of("shared")
        sem = mod.SharedSemaphore(name, permits, 0, None, directory=directory)
    try:
        results = workers.run(job, timeout=seconds + 120)
        row = {"round": rnd, "side": side, "processes": len(results), "tasks": tasks,
               "permits": permits, "seconds": seconds, "hold_ms": hold_s * 1000}
        grants = sum(r["grants"] for r in results)
        total = sum(r["total"] for r in results)
        releases = sum(r["releases"] for r in results)
        errors = sum(r["errors"] for r in results)
        waits = sorted(w for r in results for w in array("q", r["waits"]))
        per_task = sorted(n for r in results for n in r["per_task"])
        row.update(grants=grants, grants_per_s=grants / seconds, total=total,
                   wait_p50_us=_pct(waits, 0.5) / 1e3 if waits else None,
                   wait_p99_us=_pct(waits, 0.99) / 1e3 if waits else None,
                   wait_max_us=waits[-1] / 1e3 if waits else None,
                   task_grants_min=per_task[0], task_grants_median=statistics.median(per_task),
                   task_grants_max=per_task[-1], errors=errors,
                   error_text=next((r["error_text"] for r in results if r["error_text"]), ""))
        problems = []
        if releases != total:
            problems.append(f"{total} grants but {releases} releases")
        if side == "redis":
            books = {k.decode(): int(v) for k, v in client.hgetall(redis_keys(name)[3]).items()}
            row["peak"] = books.get("hwm", 0)
            row["host_grants"] = books.get("grants", 0)
            row["expired_leases"] = sum(r.get("expired", 0) for r in results)
            # What polling costs: acquire scripts run per second of window.
            row["redis_calls_per_s"] = sum(r.get("calls", 0) for r in results) / seconds
            left = client.zcard(redis_keys(name)[0]) + client.zcard(redis_keys(name)[1])
            row["left_held"] = left
            if left:
                problems.append(f"{left} ids left in the sorted sets")
        else:
            row["peak"] = sem.peak_acquired_permits
            row["host_grants"] = sem.stats().acquired_total
            left = sem.acquired_permits + sem.queue_size
            row["left_held"] = left
            holders = sem.holders()
            if left or holders != {me: 0}:
                problems.append(f"books not clean: acquired+queued {left}, holders {holders}")
            held_after = [r.get("held_after") for r in results]
            if any(h != 0 for h in held_after):
                problems.append(f"a process still held permits when idle: {held_after}")
        if row["host_grants"] != total:
            problems.append(f"the host counted {row['host_grants']} grants, the processes "
                            f"{total}")
        if errors:
            problems.append(f"{errors} errors ({row['error_text']})")
        row["books"] = "; ".join(problems) or "balanced"
        # The budget: the high-water mark in the segment (for Redis, in
        # its own books) never above the limit.
        if side != "redis":
            assert row["peak"] <= permits, \
                f"{side}: budget exceeded: high-water mark {row['peak']} > limit {permits}"
        return row
    finally:
        if sem is not None:
            sem.close()
            type(sem).unlink(name, directory)
        if client is not None:
            client.delete(*redis_keys(name))
            client.close()


def run_load(sides, *, processes: int = 8, tasks: int = 100, permits: int = 16,
             seconds: float = 10.0, rounds: int = 3, hold_s: float = 0.001,
             warmup_s: float = 1.0, ttl_s: float = 10.0, poll_s: float = 0.005,
             directory: Optional[str] = None, log=print) -> list[dict]:
    """The whole benchmark: returns one row per measured round and side
    (rows of the warm-up round have ``round`` -1)."""
    sides = list(sides)
    server = None
    tmp = tempfile.mkdtemp(prefix="pylimiter-load-", dir=directory or "/dev/shm")
    rows: list[dict] = []
    workers = None
    try:
        if "redis" in sides:
            server = RedisServer(tmp)
            log(f"redis-server {server.version()} on 127.0.0.1:{server.port} "
                f"(pid {server.proc.pid})")
        workers = Workers(processes)
        kw = dict(tasks=tasks, permits=permits, hold_s=hold_s, directory=tmp,
                  redis_port=server.port if server else None, ttl_s=ttl_s, poll_s=poll_s)
        plan = [(-1, warmup_s)] if warmup_s > 0 else []
        plan += [(r, seconds) for r in range(rounds)]
        for i, (rnd, secs) in enumerate(plan):
            order = sides if i % 2 == 0 else sides[::-1]
            for side in order:
                row = run_side(side, workers, rnd=rnd, seconds=secs, **kw)
                rows.append(row)
                log(f"round {rnd:>2} {side:<6} {row['grants_per_s']:>9,.0f} grants/s  "
                    f"wait p50 {row['wait_p50_us'] or 0:>9,.0f} us  "
                    f"p99 {row['wait_p99_us'] or 0:>10,.0f} us  "
                    f"high-water mark {row['peak']} <= {permits}: {row['peak'] <= permits}  "
                    f"books: {row['books']}")
    finally:
        if workers is not None:
            workers.close()
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


# ---- the figures ---------------------------------------------------------------------


def summarise(rows: list[dict], permits: int) -> list[dict]:
    """Per side: medians over the measured rounds; per pair of sides, the
    median of per-round throughput ratios."""
    measured = [r for r in rows if r["round"] >= 0]
    sides = list(dict.fromkeys(r["side"] for r in measured))
    by = {s: {r["round"]: r for r in measured if r["side"] == s} for s in sides}
    out = []
    for s in sides:
        rs = list(by[s].values())
        med = lambda k: statistics.median(r[k] for r in rs if r[k] is not None)  # noqa: E731
        out.append({
            "side": s, "rounds": len(rs),
            "grants_per_s": med("grants_per_s"),
            "grants_per_s_q1": Spread.of([r["grants_per_s"] for r in rs]).q1,
            "grants_per_s_q3": Spread.of([r["grants_per_s"] for r in rs]).q3,
            "wait_p50_us": med("wait_p50_us"), "wait_p99_us": med("wait_p99_us"),
            "wait_max_us": max(r["wait_max_us"] for r in rs),
            "task_grants_min": min(r["task_grants_min"] for r in rs),
            "task_grants_max": max(r["task_grants_max"] for r in rs),
            "peak": max(r["peak"] for r in rs), "limit": permits,
            "books": "balanced" if all(r["books"] == "balanced" for r in rs)
            else "; ".join(r["books"] for r in rs if r["books"] != "balanced"),
            "redis_calls_per_s": (statistics.median(r["redis_calls_per_s"] for r in rs)
                                  if s == "redis" else None),
        })
    for s in sides:
        for other in sides:
            if s == other or s != "c":
                continue
            common = sorted(set(by[s]) & set(by[other]))
            ratios = [by[s][r]["grants_per_s"] / by[other][r]["grants_per_s"]
                      for r in common if by[other][r]["grants_per_s"]]
            if ratios:
                sp = Spread.of(ratios)
                out.append({"side": f"c / {other}", "rounds": sp.n, "ratio": sp.median,
                            "ratio_q1": sp.q1, "ratio_q3": sp.q3})
    return out


LABELS = {"c": "SharedSemaphore (C)", "python": "SharedSemaphore (pure Python)",
          "redis": "Redis sorted-set semaphore"}


def table(summary: list[dict], meta: str) -> str:
    lines = [f"Host-wide load ({meta})", "",
             "| side | grants/s (IQR over rounds) | wait p50 | wait p99 | wait max | "
             "grants per task (min-max) | high-water mark / limit | books |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summary:
        if "ratio" in s:
            continue
        lines.append(
            f"| {LABELS.get(s['side'], s['side'])} | **{s['grants_per_s']:,.0f}** "
            f"({s['grants_per_s_q1']:,.0f}-{s['grants_per_s_q3']:,.0f}) | "
            f"{s['wait_p50_us'] / 1e3:,.2f} ms | {s['wait_p99_us'] / 1e3:,.2f} ms | "
            f"{s['wait_max_us'] / 1e3:,.1f} ms | {s['task_grants_min']}-{s['task_grants_max']} | "
            f"{s['peak']} / {s['limit']} | {s['books']} |")
    for s in summary:
        if s.get("redis_calls_per_s"):
            lines += ["", f"Redis: {s['redis_calls_per_s']:,.0f} acquire-script calls/s (the "
                      f"polling) for {s['grants_per_s']:,.0f} grants/s (medians over rounds)."]
    ratios = [s for s in summary if "ratio" in s]
    if ratios:
        lines += ["", "| throughput ratio | median of per-round ratios (IQR) | rounds |",
                  "|---|---|---|"]
        for s in ratios:
            lines.append(f"| {s['side']} | **{s['ratio']:.2f}x** ({s['ratio_q1']:.2f}-"
                         f"{s['ratio_q3']:.2f}) | {s['rounds']} |")
    return "\n".join(lines) + "\n"


def write(rows: list[dict], text: str, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "shared_load.md").write_text(text)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(out_dir / "shared_load.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.shared_load",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=100, help="asyncio tasks per process")
    ap.add_argument("--permits", type=int, default=16, help="the host's limit")
    ap.add_argument("--seconds", type=float, default=10.0, help="per side per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--hold-ms", type=float, default=1.0, help="simulated hold per grant")
    ap.add_argument("--sides", default=",".join(SIDES),
                    help="comma-separated: c, python, redis (skipped, with the reason, "
                         "where redis-server or redis-py is missing)")
    ap.add_argument("--redis-ttl", type=float, default=10.0, help="lease of a Redis holder, s")
    ap.add_argument("--redis-poll-ms", type=float, default=5.0,
                    help="a refused Redis request retries after this (+-50%%)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    sides = [s for s in args.sides.split(",") if s]
    bad = [s for s in sides if s not in SIDES]
    if bad:
        ap.error(f"unknown side(s) {', '.join(bad)}; choose from {', '.join(SIDES)}")
    if "redis" in sides and (why := redis_available()):
        print(f"Redis side skipped: {why}")
        sides.remove("redis")
    print(f"{args.processes} processes x {args.tasks} tasks through {args.permits} permits, "
          f"{args.seconds:g} s per side per round, {args.rounds} rounds (+ a 1 s warm-up), "
          f"hold {args.hold_ms:g} ms; sides {', '.join(sides)}", flush=True)
    rows = run_load(sides, processes=args.processes, tasks=args.tasks, permits=args.permits,
                    seconds=args.seconds, rounds=args.rounds, hold_s=args.hold_ms / 1000,
                    ttl_s=args.redis_ttl, poll_s=args.redis_poll_ms / 1000,
                    log=lambda s: print(s, flush=True))
    summary = summarise(rows, args.permits)
    meta = (f"CPython {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.processes} "
            f"processes x {args.tasks} tasks, {args.permits} permits, hold {args.hold_ms:g} ms, "
            f"{args.rounds} rounds x {args.seconds:g} s per side"
            + (f"; Redis: lease {args.redis_ttl:g} s, retry every {args.redis_poll_ms:g} ms "
               "+-50%" if "redis" in sides else ""))
    text = table(summary, meta)
    print()
    print(text)
    write(rows, text, args.out)
    bad_books = [s for s in summary if s.get("books", "balanced") != "balanced"]
    if bad_books:
        print("books did not balance: " + "; ".join(f"{s['side']}: {s['books']}"
                                                    for s in bad_books), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
