"""Shared by the tests/pulsar/test_cache*.py files: the cache implementation
under test (following the limiter's `impl` fixture, so --no-c-extensions
deselects the C runs the same way), a settable clock, hostile values, the
consistency checks a manager must pass after anything, and a runner for
code that could crash the interpreter (run in a subprocess, so a crash
fails one test instead of aborting pytest)."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest

MODULES = {"c": "pylimiter.pulsar.cache._cache_c", "python": "pylimiter.pulsar.cache._cache_py"}
MS = 1_000_000
ROOT = Path(__file__).resolve().parents[2]

#: A Py_DEBUG interpreter (python3.11-dbg): every allocation and refcount is
#: checked, so the same work takes 10-80x longer (more under
#: gc.set_threshold(1)).  The property tests then run fewer examples and the
#: simulator's workloads are left to the release build, so the debug tier
#: stays within its budget while still driving every code path of the
#: extension.
DEBUG_BUILD = hasattr(sys, "gettotalrefcount")


def examples(n: int) -> int:
    """Hypothesis examples for a property test: ``n``, or a twelfth (at least
    5) on a debug build."""
    return max(5, n // 12) if DEBUG_BUILD else n


release_only = pytest.mark.skipif(
    DEBUG_BUILD, reason="a simulator workload: too slow under Py_DEBUG, run by the release build")


@pytest.fixture
def cm(impl):
    """The cache module (_cache_c or _cache_py) matching `impl`."""
    return import_module(MODULES[impl.tag])


class FakeClock:
    """A clock the test moves: int nanoseconds, counts its readings."""

    def __init__(self, now: int = 0):
        self.now = now
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.now

    def advance(self, ns: int) -> int:
        self.now += ns
        return self.now


class ScriptedClock(FakeClock):
    """A FakeClock with a script: before its n-th reading (1-based) it runs
    ``actions[n]()`` (which may raise, KeyboardInterrupt included, or call
    back into the cache), and it hands out ``values[n]`` instead of ``now``
    when there is one."""

    def __init__(self, now: int = 0):
        super().__init__(now)
        self.actions: dict[int, object] = {}
        self.values: dict[int, object] = {}

    def __call__(self):
        self.reads += 1
        n = self.reads
        action = self.actions.pop(n, None)
        if action is not None:
            action()
        if n in self.values:
            return self.values.pop(n)
        return self.now


# ---- hostile values ----------------------------------------------------------------------


class BadIndex:
    """Claims to be an integer; its __index__ (and __int__) raise."""

    def __index__(self):
        raise RuntimeError("__index__ says no")

    __int__ = __index__


class BadEq:
    """Hashable, but comparing it raises."""

    def __eq__(self, other):
        raise RuntimeError("__eq__ says no")

    __lt__ = __le__ = __gt__ = __ge__ = __ne__ = __eq__

    def __hash__(self):
        return 7


class BadHash:
    """hash() raises."""

    def __hash__(self):
        raise RuntimeError("__hash__ says no")


class BadRepr:
    def __repr__(self):
        raise RuntimeError("__repr__ says no")


def hostile_values():
    """The values of the hostile-argument matrix (issue 18), with ids."""
    return [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("-1", -1), ("0", 0),
            ("2**63", 2**63), ("2**64", 2**64), ("True", True), ("None", None), ("str", "7"),
            ("1.5", 1.5), ("1.0", 1.0), ("BadIndex", BadIndex()), ("BadEq", BadEq()),
            ("BadHash", BadHash()), ("BadRepr", BadRepr()), ("-2**63-1", -2**63 - 1)]


def outcome(fn, *args, **kwargs):
    """("ok", result) or ("raised", exception type): what a call did.  Only
    TypeError and ValueError (and subclasses) are acceptable refusals; any
    other exception fails the test that asks."""
    try:
        return "ok", fn(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return "raised", type(exc)


# ---- consistency of a manager and its caches ------------------------------------------------


def check_manager(m, names=("t0", "t1", "t2")):
    """What must hold after any sequence of calls, exceptions included: the
    manager's gauges are the sums over its caches, every cached position
    answers, and sizes are consistent with the counts."""
    st = m.stats()
    caches = [m.cache(n) for n in names]
    assert st.size == m.size == sum(c.size for c in caches)
    assert st.entries == sum(len(c) for c in caches)
    assert 0 <= st.size and 0 <= st.entries
    assert st.size >= st.entries * m.entry_overhead_bytes
    ne, nb = m.non_evictable()
    assert 0 <= ne <= st.entries and 0 <= nb <= st.size
    assert st.evicted_entries >= 0 and st.evicted_bytes >= 0 and st.requeues >= 0
    return st


def snapshot(m, names=("t0", "t1", "t2")):
    """The observable state, without touching `accessed` (get_range would)."""
    return (m.stats(), m.non_evictable(), m.average_entry_size,
            tuple((len(m.cache(n)), m.cache(n).size) for n in names))


# ---- code that may crash the interpreter ----------------------------------------------------


@contextlib.contextmanager
def memory_cap(extra: int = 1 << 30):
    """Let this process grow by at most ``extra`` bytes of address space
    while the block runs (Linux): an argument that makes the code under test
    allocate without bound (2**63 bundles, every hole of a 2**62-entry
    ledger) raises MemoryError instead of exhausting a shared machine."""
    try:
        import resource
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = vm + extra
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, OSError, StopIteration, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _limit_memory(nbytes: int):
    def preexec():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return preexec


def run_isolated(code: str, *, timeout: float = 120, env: dict | None = None,
                 memory_limit: int | None = None) -> str:
    """Run ``code`` in a fresh interpreter (the same one, with the same -X
    and -W flags) and return its stdout; a crash, a hang past ``timeout`` or
    a non-zero exit fails the calling test with the child's output.  With
    ``memory_limit`` (bytes of address space, POSIX), a runaway allocation
    fails the child with MemoryError instead of exhausting the machine."""
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), child_env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", code]
    try:
        limit = (_limit_memory(memory_limit)
                 if memory_limit and os.name == "posix" else None)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             cwd=str(ROOT), env=child_env, preexec_fn=limit)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung for {timeout} s:\n{code}\n--- stdout:\n{exc.stdout}\n"
                    f"--- stderr:\n{exc.stderr}")
    if out.returncode != 0:
        pytest.fail(f"exit {out.returncode}:\n{code}\n--- stdout:\n{out.stdout}\n"
                    f"--- stderr:\n{out.stderr}")
    return out.stdout


# ---- the attribute walk (run inside run_isolated) -------------------------------------------


def walk(obj) -> int:
    """Read every attribute of ``obj`` (public and private, as dir() lists
    them), its repr, dir() and inspect.getmembers(); each read may give a
    value or raise an Exception, nothing else.  Returns the names read."""
    names = dir(obj)
    for name in names:
        try:
            getattr(obj, name)
        except Exception:
            pass
    repr(obj)
    str(obj)
    inspect.getmembers(obj)
    return len(names)


def cache_objects_in_every_state(mod):
    """(label, object) for every cache object in every state: fresh,
    populated, after eviction, cleared, uninitialised (built with __new__),
    and the entries a cache made."""
    out = []
    clock = FakeClock(10**9)
    for cls in (mod.CacheEntry, mod.RemovalQueue, mod.EntryCache, mod.EntryCacheManager):
        out.append((f"{cls.__name__} uninitialised", cls.__new__(cls)))
    out.append(("entry fresh", mod.CacheEntry("k", 3)))
    tracked = mod.CacheEntry(("k", 1), 5, expected_reads=2, timestamp_ns=7)
    out.append(("entry tracked", tracked))
    q = mod.RemovalQueue(2, True, clock=clock)
    out.append(("queue fresh", q))
    q2 = mod.RemovalQueue(0, False, clock=clock)
    queued = [mod.CacheEntry(i, 10, timestamp_ns=i) for i in range(5)]
    for e in queued:
        q2.add(e)
    queued[0].accessed = True
    out += [("queue populated", q2), ("entry queued", queued[1])]
    q2.evict_before(3)
    out += [("queue after eviction", q2), ("entry evicted", queued[0])]
    m = mod.EntryCacheManager(4000, clock=clock, time_threshold_ms=1)
    out.append(("manager fresh", m))
    c = m.cache("t")
    out.append(("cache fresh", c))
    for i in range(20):
        c.insert((1, i), b"x" * 50, expected_reads=i % 3)
    c.get((1, 3))
    out += [("manager populated", m), ("cache populated", c)]
    clock.advance(10 * MS)
    m.run_eviction()
    out += [("manager after eviction", m), ("cache after eviction", c)]
    c.invalidate_up_to((1, 10))
    c2 = m.cache("u")
    c2.insert((0, 0), memoryview(b"abc"))
    c2.clear()
    out += [("cache cleared", c2), ("cache invalidated", c)]
    if mod.__name__.endswith("_py"):
        # The pure twin exposes the entries an EntryCache made (C keeps them
        # inside the extension).
        out += [(f"cache entry {i}", e) for i, e in enumerate(list(m._queue)[:3])]
    m0 = mod.EntryCacheManager(0, clock=clock)
    out.append(("manager disabled", m0))
    return out
