"""Child-process bodies of the host-wide limiter's suite.  Importable by
name, so that spawned children find them; every wait in them is bounded."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import threading
import time
import traceback

from pylimiter._impls import IMPLEMENTATIONS


def module(tag):
    return IMPLEMENTATIONS[tag].module_of("shared")


def open_sem(tag, name, directory, kwargs):
    return module(tag).SharedSemaphore(name, directory=directory, **kwargs)


def log_line(path, line):
    """Append a line to a log file, synchronously: a multiprocessing.Queue
    would not do (each process's feeder thread writes when it gets to it, so
    the order of puts from several processes is lost)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _guard(fn):
    """A child body: any exception prints its traceback and exits 1.
    (multiprocessing's bootstrap then flushes the queues and leaves by
    os._exit, so nothing of a forking parent's runs at exit.)"""
    def wrapper(*args):
        try:
            fn(*args)
        except BaseException:
            traceback.print_exc()
            sys.exit(1)
    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = fn.__qualname__
    return wrapper


@_guard
def hold(tag, name, directory, kwargs, n, events, stop):
    """Take n permits, say so, hold them until told (or 60 s)."""
    sem = open_sem(tag, name, directory, kwargs)
    p = sem.acquire_blocking(n, timeout=30)
    events.put(("held", os.getpid(), p.permits))
    stop.wait(60)
    sem.release(p)
    events.put(("released", os.getpid(), n))


@_guard
def wait_one(tag, name, directory, kwargs, n, how, timeout, events):
    """One request for n permits, by a thread or an asyncio task; report
    its outcome (and the time from the parent's release, if it sends one)."""
    sem = open_sem(tag, name, directory, kwargs)
    if how == "thread":
        try:
            p = sem.acquire_blocking(n, timeout=timeout)
            events.put(("granted", os.getpid(), p.permits, time.monotonic()))
            sem.release(p)
        except Exception as exc:
            events.put(("failed", os.getpid(), type(exc).__name__, time.monotonic()))
    else:
        async def main():
            try:
                p = await sem.acquire(n, timeout=timeout)
                events.put(("granted", os.getpid(), p.permits, time.monotonic()))
                sem.release(p)
            except Exception as exc:
                events.put(("failed", os.getpid(), type(exc).__name__, time.monotonic()))
        asyncio.run(main())
    sem.close()


@_guard
def fifo_member(tag, name, directory, kwargs, ident, how, log):
    """Join the queue for 1 permit; when granted, log ident (a line of the
    file `log`), then release."""
    sem = open_sem(tag, name, directory, kwargs)
    if how == "thread":
        p = sem.acquire_blocking(1, timeout=60)
        log_line(log, ident)
        sem.release(p)
    else:
        async def main():
            async with sem.acquire(1, timeout=60):
                log_line(log, ident)
        asyncio.run(main())
    sem.close()


@_guard
def fifo_group(tag, name, directory, kwargs, idents, log, ready):
    """Several requests from one process, each joining the queue in turn
    (threads and asyncio tasks alternating): each waits until the host's
    queue has grown by one before the next one starts, so arrival order is
    known; each logs its ident when granted."""
    sem = open_sem(tag, name, directory, kwargs)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    done = []

    def thread_req(ident):
        p = sem.acquire_blocking(1, timeout=60)
        log_line(log, ident)
        sem.release(p)

    async def task_req(ident):
        p = await sem.acquire(1, timeout=60)
        log_line(log, ident)
        sem.release(p)

    for i, ident in enumerate(idents):
        before = sem.queue_size
        if i % 2 == 0:
            t = threading.Thread(target=thread_req, args=(ident,))
            t.start()
            done.append(t)
        else:
            done.append(asyncio.run_coroutine_threadsafe(task_req(ident), loop))
        deadline = time.monotonic() + 30
        while sem.queue_size <= before:
            assert time.monotonic() < deadline, "request never queued"
            time.sleep(0.001)
    ready.put(os.getpid())
    for d in done:
        if isinstance(d, threading.Thread):
            d.join(60)
        else:
            d.result(60)
    loop.call_soon_threadsafe(loop.stop)
    sem.close()


@_guard
def hammer(tag, name, directory, kwargs, seconds, seed, nthreads, ntasks, inuse, peak, lock,
           max_weight):
    """Threads and asyncio tasks acquire random weights, hold briefly,
    release, for `seconds`; the permits held host-wide are counted in
    `inuse` (under `lock`) and the most ever seen kept in `peak`."""
    sem = open_sem(tag, name, directory, kwargs)
    deadline = time.monotonic() + seconds
    limit = sem.max_permits

    def account(n):
        with lock:
            inuse.value += n
            if inuse.value > peak.value:
                peak.value = inuse.value
            assert inuse.value <= limit, (inuse.value, limit)

    def worker(i):
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < deadline:
            n = rng.randint(1, max_weight)
            try:
                p = sem.acquire_blocking(n, timeout=rng.choice([0.05, 1.0, None]))
            except Exception as exc:
                if type(exc).__name__ != "PermitAcquireTimeoutError":
                    raise
                continue
            account(n)
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.002)
            account(-n)
            sem.release(p)

    async def task(i):
        rng = random.Random(seed * 1000 + 500 + i)
        while time.monotonic() < deadline:
            n = rng.randint(1, max_weight)
            try:
                p = await sem.acquire(n, timeout=rng.choice([0.05, 1.0, None]))
            except Exception as exc:
                if type(exc).__name__ != "PermitAcquireTimeoutError":
                    raise
                continue
            account(n)
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.002)
            else:
                await asyncio.sleep(0)
            account(-n)
            sem.release(p)

    async def tasks():
        await asyncio.gather(*(task(i) for i in range(ntasks)))

    errors = []

    def run_thread(i):
        try:
            worker(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run_thread, args=(i,)) for i in range(nthreads)]
    for t in threads:
        t.start()
    if ntasks:
        asyncio.run(tasks())
    for t in threads:
        t.join(seconds + 60)
    if errors:
        raise errors[0]
    sem.close()


@_guard
def churn(tag, name, directory, kwargs, seed):
    """Random operations for ever (until killed): acquire, update, release,
    try_acquire, timeouts, from a thread and an asyncio task."""
    sem = open_sem(tag, name, directory, kwargs)
    rng = random.Random(seed)
    limit = max(1, sem.max_permits)

    def ops(rng):
        held = []
        while True:
            r = rng.random()
            try:
                if r < 0.35:
                    held.append(sem.acquire_blocking(rng.randint(1, limit),
                                                     timeout=rng.choice([0, 0.01, 0.2])))
                elif r < 0.5 and held:
                    p = held[rng.randrange(len(held))]
                    sem.update_blocking(p, rng.randint(0, limit), timeout=0.05)
                elif r < 0.6:
                    p = sem.try_acquire(rng.randint(0, limit))
                    if p is not None:
                        held.append(p)
                elif held:
                    sem.release(held.pop(rng.randrange(len(held))))
            except Exception as exc:
                if type(exc).__name__ not in ("PermitAcquireTimeoutError",
                                              "PermitAcquireQueueFullError"):
                    raise

    t = threading.Thread(target=ops, args=(random.Random(seed + 1),), daemon=True)
    t.start()

    async def task():
        held = []
        while True:
            try:
                if rng.random() < 0.5 or not held:
                    held.append(await sem.acquire(rng.randint(1, limit),
                                                  timeout=rng.choice([0.01, 0.2])))
                else:
                    sem.release(held.pop())
            except Exception as exc:
                if type(exc).__name__ not in ("PermitAcquireTimeoutError",
                                              "PermitAcquireQueueFullError"):
                    raise
    asyncio.run(task())


@_guard
def crash_at(tag, name, directory, kwargs, op, k, events, go):
    """Arm the k-th crash point, then run `op`: the child dies by SIGKILL
    inside that operation's critical section (or finishes it if it has fewer
    than k points, and says so)."""
    sem = open_sem(tag, name, directory, kwargs)
    limit = sem.max_permits
    held = sem.acquire_blocking(1, timeout=10)
    events.put(("ready", os.getpid()))
    go.wait(30)
    if op.endswith("_locked"):
        # The C twin's paths under the host's lock (its lock-free ones off);
        # the pure twin has only those.
        op = op[:-len("_locked")]
        if hasattr(sem, "_set_lock_free"):
            sem._set_lock_free(False)
    sem._crash_after(k)
    try:
        if op == "acquire":
            sem.acquire_blocking(1, timeout=10)
        elif op in ("release", "grant"):
            # grant: a waiter of the parent is queued for all the permits,
            # so this release grants it.
            sem.release(held)
        elif op == "enqueue":
            sem.acquire_blocking(limit, timeout=0.2)
        elif op == "update":
            sem.update_blocking(held, 2, timeout=10)
            sem.update_blocking(held, 0)
        elif op == "set_max":
            sem.set_max_permits(limit + 1)
        elif op == "close":
            sem.close()
    except Exception as exc:
        if type(exc).__name__ != "PermitAcquireTimeoutError":
            raise
    sem._crash_after(0)
    events.put(("finished", os.getpid(), op, k))


@_guard
def fuzz(path, seconds, seed, writes_per_s, hot):
    """Write random bytes at random offsets of a live segment, mostly into
    its first `hot` bytes (header, pools, slots, the records in use)."""
    rng = random.Random(seed)
    fd = os.open(path, os.O_RDWR)
    size = os.fstat(fd).st_size
    deadline = time.monotonic() + seconds
    pause = 1.0 / writes_per_s
    while time.monotonic() < deadline:
        n = rng.choice([1, 2, 4, 8, 16])
        end = hot if rng.random() < 0.8 else size
        os.pwrite(fd, rng.randbytes(n), rng.randrange(0, end - n))
        time.sleep(pause)
    os.close(fd)


@_guard
def victim_of_fuzz(tag, name, directory, kwargs, seconds, seed, events):
    """Operations on a segment being corrupted: each works or raises one of
    the allowed errors; anything else fails the child."""
    mod = module(tag)
    import pylimiter
    allowed = (mod.SharedLimiterError, pylimiter.PermitAcquireError, ValueError)
    sem = open_sem(tag, name, directory, kwargs)
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    counts = {"ok": 0, "refused": 0}
    held = []

    def step():
        r = rng.random()
        if r < 0.4:
            held.append(sem.acquire_blocking(rng.randint(1, 4), timeout=0.05))
        elif r < 0.5:
            p = sem.try_acquire(rng.randint(1, 4))
            if p is not None:
                held.append(p)
        elif r < 0.6 and held:
            sem.update_blocking(held[-1], rng.randint(0, 4), timeout=0.05)
        elif r < 0.65:
            sem.stats()
            sem.holders()
        elif held:
            sem.release(held.pop())

    async def astep():
        p = await sem.acquire(rng.randint(1, 4), timeout=0.05)
        sem.release(p)

    while time.monotonic() < deadline:
        try:
            if rng.random() < 0.2:
                asyncio.run(astep())
            else:
                step()
            counts["ok"] += 1
        except allowed:
            counts["refused"] += 1
    try:
        sem.close()
    except allowed:
        pass
    events.put(("fuzzed", os.getpid(), counts["ok"], counts["refused"]))


@_guard
def set_max(tag, name, directory, kwargs, value, events):
    sem = open_sem(tag, name, directory, kwargs)
    sem.set_max_permits(value)
    events.put(("set", os.getpid(), value))
    sem.close()


@_guard
def forked_user(sem, parent_permit, events):
    """A child forked after its parent opened `sem` (gunicorn --preload)."""
    out = {"pid": os.getpid()}
    try:
        sem.release(parent_permit)
        out["release"] = "ok"
    except TypeError:
        out["release"] = "TypeError"
    try:
        sem.update_blocking(parent_permit, 1, timeout=0)
        out["update"] = "ok"
    except TypeError:
        out["update"] = "TypeError"
    p = sem.acquire_blocking(2, timeout=10)
    out["holders"] = sem.holders()
    out["acquired"] = sem.acquired_permits
    sem.release(p)
    out["after"] = sem.acquired_permits
    events.put(("forked", out))
    sem.close()


def kill_self():
    os.kill(os.getpid(), signal.SIGKILL)
