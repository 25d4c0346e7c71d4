"""Helpers shared by the test modules."""

import asyncio
import gc
import importlib.util
import os
import subprocess
import sys
import time

import pytest


def run(coro, timeout=30, loop="asyncio"):
    """Run a coroutine on a fresh loop ("asyncio" or "uvloop"), bounded in
    time."""
    if loop == "asyncio":
        return asyncio.run(asyncio.wait_for(coro, timeout))
    import uvloop

    lp = uvloop.new_event_loop()
    try:
        return lp.run_until_complete(asyncio.wait_for(coro, timeout))
    finally:   # as asyncio.run: cancel what is left, then close
        lp.run_until_complete(_drain())
        lp.close()


async def _drain():
    left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in left:
        t.cancel()
    await asyncio.gather(*left, return_exceptions=True)
    await asyncio.get_running_loop().shutdown_asyncgens()


async def settle(n=5):
    """Let the loop run a few rounds (queued requests join, wakes land)."""
    for _ in range(n):
        await asyncio.sleep(0)


def release_all(sem, live_permits):
    """Check the books with these permits held, then give them all back."""
    check_invariant(sem, live_permits)
    for p in live_permits:
        sem.release(p)


def check_invariant(sem, live_permits):
    """acquired_permits == sum of live permits; available == max - acquired."""
    gc.collect()
    assert sem.acquired_permits == sum(p.permits for p in live_permits)
    if sem.max_permits > 0:
        assert sem.available_permits == sem.max_permits - sem.acquired_permits
    else:
        assert sem.available_permits == 2**63 - 1


def run_module(module, *args, timeout=120):
    """``python -m module args`` in a subprocess, output captured as text.
    PYLIMITER_NO_EXTENSIONS is not passed on: the command runs as a user
    would run it, on the compiled extension."""
    env = {k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"}
    return subprocess.run([sys.executable, "-m", module, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


#: For a test of a Spark CLI's argument checks that come after its check for
#: PySpark (an installed wheel without the [spark] extra stops there first,
#: and without PySpark no Spark version can refuse mesos://).
needs_pyspark = pytest.mark.skipif(importlib.util.find_spec("pyspark") is None,
                                   reason="PySpark (the [spark] extra) is not installed")


def wait_until(cond, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
        time.sleep(0.002)


def cs_held(sem):
    """Whether any thread holds a pure-Python semaphore's critical section
    (an RLock: no locked() before 3.14)."""
    return not repr(sem._cs).startswith("<unlocked")


class InterruptAt:
    """A profile function that raises KeyboardInterrupt at the k-th place,
    in the modules named by ``files``, where CPython would run a signal
    handler: the entry of a Python function (RESUME) and the return of a C
    call (the eval-breaker check after CALL).  Not at every line: between
    two other bytecodes no handler runs, so an interrupt cannot land there.
    ``skip``: functions left out (a finaliser: Python reports an exception
    there as unraisable and drops it).  ``seen`` counts the places passed;
    ``where`` is the one it raised at."""

    def __init__(self, k, files, skip=()):
        self.k = k
        self.files = files
        self.skip = skip
        self.seen = 0
        self.where = None

    def __call__(self, frame, event, arg):
        if event in ("call", "c_return") and frame.f_code.co_name not in self.skip and \
                any(f in frame.f_code.co_filename for f in self.files):
            self.seen += 1
            if self.seen == self.k:
                self.where = (frame.f_code.co_name, frame.f_lineno, event)
                raise KeyboardInterrupt("injected")


def call_interrupted(tracer, fn, *args, also=()):
    """``fn(*args)`` in this thread with ``tracer`` as its profile function;
    the KeyboardInterrupt it injects (and the exceptions in ``also``) are
    swallowed: the test looks at the books afterwards."""
    sys.setprofile(tracer)
    try:
        fn(*args)
    except (KeyboardInterrupt, *also):
        pass
    finally:
        sys.setprofile(None)


def run_interrupted(tracer, coro):
    """``coro`` on a new event loop with ``tracer`` as this thread's profile
    function; the injected KeyboardInterrupt, in the task or in one of the
    loop's callbacks, is swallowed, and the loop closed."""
    loop = asyncio.new_event_loop()
    try:
        call_interrupted(tracer, loop.run_until_complete, coro)
    finally:
        loop.close()
