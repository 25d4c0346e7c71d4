"""asv suites: pylimiter's speed across commits.

Parameterised over the implementation ("c", "python", and the stdlib
primitive that anchors the scenario) and a size.  Event loops, limiters and
parked waiters are built in ``setup`` (untimed).  Only the public API of the
first release is used, and a missing module or feature raises
NotImplementedError in ``setup``, which asv records as "skipped": the suites
can run against any commit, old ones included.
"""

import asyncio
import importlib
import importlib.util
import sys
import threading
from pathlib import Path

IMPLS = ["c", "python"]
OPS = 2000


def _module(impl):
    try:
        return importlib.import_module("pylimiter._impls").IMPLEMENTATIONS[impl].module
    except ImportError as exc:  # this commit lacks it (or the build failed)
        raise NotImplementedError(str(exc))


def _semaphore(impl, permits, queue=0):
    # No default timeout: the stdlib anchors have none, and it would arm a
    # timer per queued waiter.
    return _module(impl).AsyncSemaphore(permits, queue, None)


class _Loop:
    def setup_loop(self):
        self.loop = asyncio.new_event_loop()

    def teardown(self, *params):
        self.loop.close()


class UncontendedAsync(_Loop):
    """await acquire(1) + release, nobody waiting; per OPS operations."""

    params = [IMPLS + ["asyncio.Semaphore"]]
    param_names = ["impl"]

    def setup(self, impl):
        self.setup_loop()
        if impl == "asyncio.Semaphore":
            sem = asyncio.Semaphore(10)

            async def batch():
                for _ in range(OPS):
                    await sem.acquire()
                    sem.release()
        else:
            sem = _semaphore(impl, 10)
            acq, rel = sem.acquire, sem.release

            async def batch():
                for _ in range(OPS):
                    rel(await acq(1))
        self.batch = batch

    def time_acquire_release(self, impl):
        self.loop.run_until_complete(self.batch())


class UncontendedThreads:
    """acquire_blocking(1) + release in one thread; per OPS operations."""

    params = [IMPLS + ["threading.Semaphore"]]
    param_names = ["impl"]

    def setup(self, impl):
        if impl == "threading.Semaphore":
            sem = threading.Semaphore(10)

            def batch():
                for _ in range(OPS):
                    sem.acquire()
                    sem.release()
        else:
            sem = _semaphore(impl, 10)
            acq, rel = sem.acquire_blocking, sem.release

            def batch():
                for _ in range(OPS):
                    rel(acq(1))
        self.batch = batch

    def time_acquire_release(self, impl):
        self.batch()


class TasksOnPermits(_Loop):
    """N tasks on 10 permits, each: acquire(1), sleep(0), release."""

    params = [IMPLS + ["asyncio.Semaphore"], [10, 100, 1000]]
    param_names = ["impl", "tasks"]

    def setup(self, impl, n):
        self.setup_loop()
        anchor = impl == "asyncio.Semaphore"
        sem = asyncio.Semaphore(10) if anchor else _semaphore(impl, 10)

        async def worker():
            if anchor:
                async with sem:
                    await asyncio.sleep(0)
            else:
                p = await sem.acquire(1)
                await asyncio.sleep(0)
                sem.release(p)

        async def main():
            await asyncio.gather(*(worker() for _ in range(n)))
        self.main = main

    def time_gather(self, impl, n):
        self.loop.run_until_complete(self.main())

    def peakmem_gather(self, impl, n):
        self.loop.run_until_complete(self.main())


class ThreadsOnPermits:
    """N threads on 2 permits, 200 acquire_blocking/release each."""

    params = [IMPLS + ["threading.Semaphore"], [2, 8]]
    param_names = ["impl", "threads"]
    timeout = 120

    def setup(self, impl, n):
        anchor = impl == "threading.Semaphore"
        sem = threading.Semaphore(2) if anchor else _semaphore(impl, 2)

        def worker():
            for _ in range(200):
                if anchor:
                    with sem:
                        pass
                else:
                    sem.release(sem.acquire_blocking(1))

        def run():
            ts = [threading.Thread(target=worker) for _ in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
        self.run = run

    def time_threads(self, impl, n):
        self.run()


class Weighted(_Loop):
    """N requests of 1..8 of 10 permits, strictly FIFO."""

    params = [IMPLS, [100, 1000]]
    param_names = ["impl", "requests"]

    def setup(self, impl, n):
        self.setup_loop()
        sem = _semaphore(impl, 10)
        sizes = [1 + (i * 7) % 8 for i in range(n)]

        async def worker(k):
            p = await sem.acquire(k)
            await asyncio.sleep(0)
            sem.release(p)

        async def main():
            await asyncio.gather(*(worker(k) for k in sizes))
        self.main = main

    def time_weighted(self, impl, n):
        self.loop.run_until_complete(self.main())


class Update(_Loop):
    """acquire(1), update to 10 (grow), update to 1 (shrink), release."""

    params = [IMPLS]
    param_names = ["impl"]

    def setup(self, impl):
        self.setup_loop()
        sem = _semaphore(impl, 10)
        if not hasattr(sem, "update"):
            raise NotImplementedError("no update() in this version")

        async def batch():
            for _ in range(OPS // 4):
                p = await sem.acquire(1)
                p = await sem.update(p, 10)
                p = await sem.update(p, 1)
                sem.release(p)
        self.batch = batch

    def time_grow_shrink(self, impl):
        self.loop.run_until_complete(self.batch())


class Timeouts(_Loop):
    """N waiters parked behind a held permit, all timing out after 1 ms."""

    params = [IMPLS + ["asyncio.timeout"], [1000]]
    param_names = ["impl", "waiters"]

    def setup(self, impl, n):
        anchor = impl == "asyncio.timeout"
        if anchor and not hasattr(asyncio, "timeout"):
            raise NotImplementedError("asyncio.timeout needs Python 3.11")
        self.setup_loop()
        sem = asyncio.Semaphore(1) if anchor else _semaphore(impl, 1)

        async def waiter():
            try:
                if anchor:
                    async with asyncio.timeout(0.001):
                        await sem.acquire()
                else:
                    await sem.acquire(1, timeout=0.001)
            except (TimeoutError, asyncio.TimeoutError):
                pass

        async def main():
            held = await sem.acquire() if anchor else await sem.acquire(1)
            await asyncio.gather(*(waiter() for _ in range(n)))
            sem.release() if anchor else sem.release(held)
        self.main = main

    def time_timeouts(self, impl, n):
        self.loop.run_until_complete(self.main())


class CancelParked(_Loop):
    """N waiters parked (untimed), then cancelled newest-first (timed)."""

    params = [IMPLS + ["asyncio.Semaphore"], [1000, 10000]]
    param_names = ["impl", "waiters"]
    number = 1          # the timed part consumes what setup parked
    repeat = (3, 10, 10.0)
    warmup_time = 0

    def setup(self, impl, n):
        self.setup_loop()
        anchor = impl == "asyncio.Semaphore"
        sem = asyncio.Semaphore(1) if anchor else _semaphore(impl, 1)

        async def park():
            held = await sem.acquire() if anchor else await sem.acquire(1)
            tasks = [asyncio.ensure_future(sem.acquire() if anchor else sem.acquire(1))
                     for _ in range(n)]
            await asyncio.sleep(0)
            return held, tasks
        self.held, self.tasks = self.loop.run_until_complete(park())

    def time_cancel_newest_first(self, impl, n):
        async def cancel():
            for t in reversed(self.tasks):
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
        self.loop.run_until_complete(cancel())


class DualLimiter(_Loop):
    """Heap permit at an estimate, update to the actual size, direct permit
    for the write, release both: the topic-list pattern of PIP-442."""

    params = [IMPLS, [1, 100]]
    param_names = ["impl", "tasks"]

    def setup(self, impl, n):
        self.setup_loop()
        mod = _module(impl)
        common = importlib.import_module("pylimiter")
        if not hasattr(mod, "AsyncDualMemoryLimiter") or not hasattr(common, "LimitType"):
            raise NotImplementedError("no dual limiter in this version")
        lt = common.LimitType
        lim = mod.AsyncDualMemoryLimiter(1 << 20, 1 << 20, heap_timeout=None,
                                         direct_timeout=None)

        async def worker(i):
            for _ in range(10):
                heap = await lim.acquire(10 * 1024, lt.HEAP_MEMORY)
                heap = await lim.update(heap, 2048 + 32 * (i % 64))
                direct = await lim.acquire(4096, lt.DIRECT_MEMORY)
                await asyncio.sleep(0)
                lim.release(direct)
                lim.release(heap)

        async def main():
            await asyncio.gather(*(worker(i) for i in range(n)))
        self.main = main

    def time_list_pattern(self, impl, n):
        self.loop.run_until_complete(self.main())

    def peakmem_list_pattern(self, impl, n):
        self.loop.run_until_complete(self.main())


class Figures:
    """Issue 14's figures as asv tracks: each a ratio of pylimiter against its
    asyncio anchor (and a no-limiter baseline for the contended ones),
    measured in this one process with interleaved rounds, order flipped every
    round, in thread CPU time; the value is the median over rounds (see
    benchmarks/figures.py for each figure's definition and units).  The
    separately timed ``time_*`` benchmarks above track history; these are
    the ones to read as ratios.  ``impl`` is the implementation put in
    pylimiter's place.  Needs the side-by-side engine
    (pylimiter.spark.interleave): older commits skip."""

    params = [IMPLS, ["await", "async-with", "tasks", "tasks-timeout", "timeouts", "cancel"]]
    param_names = ["impl", "figure"]
    unit = "ratio"
    timeout = 300

    def setup(self, impl, figure):
        # benchmarks/figures.py, beside this folder: asv puts neither the
        # repository nor benchmarks/ on sys.path, so load it by location.
        name = "pylimiter_bench_figures"
        figures = sys.modules.get(name)
        if figures is None:
            path = Path(__file__).resolve().parent.parent / "figures.py"
            spec = importlib.util.spec_from_file_location(name, path)
            figures = sys.modules[name] = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(figures)
            except (ImportError, OSError) as exc:  # e.g. no pylimiter.spark.interleave yet
                del sys.modules[name]
                raise NotImplementedError(str(exc))
        self.figures = figures
        self.mod = _module(impl)

    def track_ratio(self, impl, figure):
        f = self.figures
        res = f.measure(f.BY_KEY[figure], self.mod, self.mod, "asyncio")
        if res is None:
            raise NotImplementedError(f"{figure} cannot run on this Python")
        return res["median"]
