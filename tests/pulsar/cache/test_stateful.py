"""Property tests on both implementations.

* The removal queue against a plain model (hypothesis stateful): sizes
  always add up, every entry is in exactly one of queued/removed, and the
  queue's order is insertion order modulo requeues (a requeued entry moves to
  the tail); bad arguments are TypeError/ValueError and change nothing.
* EntryCacheManager + EntryCache: random operation sequences replayed on the
  C implementation and on the pure twin must give the same results, stats and
  contents (the twin is the specification).
* TwinMachine (hypothesis stateful): a C manager and a pure one driven side
  by side through caches, an EntryReader, bad arguments, and a clock that
  raises (KeyboardInterrupt, RuntimeError), returns readings out of range or
  re-enters the cache: every step gives the same result or the same
  exception type in both, and both stay consistent and equal."""

from __future__ import annotations

import asyncio
import importlib

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from pylimiter.pulsar.cache import EntryReader

from .kit import (
    MODULES,
    FakeClock,
    ScriptedClock,
    check_manager,
    examples,
    snapshot,
)


class _Model:
    """What the queue should hold: keys in walk order, and per key its
    fields."""

    def __init__(self, max_requeue, extend):
        self.order: list[int] = []
        self.fields: dict[int, dict] = {}
        self.removed: set[int] = set()
        self.max_requeue, self.extend = max_requeue, extend

    def should_requeue(self, f):
        return (self.extend and f["accessed"]) or (
            f["tracked"] and f["reads"] > 0 and f["requeues"] < self.max_requeue)

    def walk(self, now, before=None, size_to_free=None):
        n = b = 0
        while self.order:
            if size_to_free is not None and b >= size_to_free:
                break
            k = self.order[0]
            f = self.fields[k]
            if before is not None and not f["ts"] < before:
                break
            if self.should_requeue(f):
                self.order.append(self.order.pop(0))
                f.update(ts=now, accessed=False, requeues=f["requeues"] + 1)
            else:
                self.order.pop(0)
                self.removed.add(k)
                n += 1
                b += f["size"]
        return n, b


class QueueMachine(RuleBasedStateMachine):
    """The queue of one implementation (set by a subclass) against _Model."""

    mod = None

    @initialize(max_requeue=st.integers(0, 3), extend=st.booleans())
    def setup(self, max_requeue, extend):
        self.clock = FakeClock(1_000)
        self.q = self.mod.RemovalQueue(max_requeue, extend, clock=self.clock)
        self.model = _Model(max_requeue, extend)
        self.entries: dict[int, object] = {}
        self.next_key = 0

    def _queued(self):
        return [k for k in self.model.order]

    @rule(size=st.integers(0, 100), reads=st.integers(-1, 3), age=st.integers(0, 50))
    def add(self, size, reads, age):
        k = self.next_key
        self.next_key += 1
        e = self.mod.CacheEntry(k, size, expected_reads=reads, timestamp_ns=self.clock.now - age)
        self.q.add(e)
        self.entries[k] = e
        self.model.order.append(k)
        self.model.fields[k] = dict(size=size, ts=self.clock.now - age, accessed=False,
                                    tracked=reads > 0, reads=max(reads, 0), requeues=0)

    @precondition(lambda self: self.model.order)
    @rule(data=st.data(), what=st.sampled_from(["access", "read", "replay"]))
    def touch(self, data, what):
        k = data.draw(st.sampled_from(self.model.order))
        e, f = self.entries[k], self.model.fields[k]
        if what == "access":
            e.accessed = True
            f["accessed"] = True
        elif what == "read":
            e.mark_read()
            f["reads"] -= f["tracked"]
        else:
            e.add_expected_read()
            f["reads"] += f["tracked"]

    @rule(dt=st.integers(0, 40))
    def tick(self, dt):
        self.clock.advance(dt)

    @rule(lag=st.integers(-20, 60))
    def evict_before(self, lag):
        before = self.clock.now - lag
        assert self.q.evict_before(before) == self.model.walk(self.clock.now, before=before)

    @rule(size=st.integers(1, 300))
    def evict_least_accessed(self, size):
        got = self.q.evict_least_accessed(size)
        assert got == self.model.walk(self.clock.now, size_to_free=size)

    @rule(data=st.data(), what=st.sampled_from(["add", "evict_before", "evict_least_accessed",
                                                 "max_requeue", "entry"]))
    def bad_argument(self, data, what):
        bad = data.draw(st.sampled_from([None, "1", 1.5, float("nan"), -1, 2**63, 2**64, True]))
        calls = {"add": lambda: self.q.add(bad),
                 "evict_before": lambda: self.q.evict_before(bad),
                 "evict_least_accessed": lambda: self.q.evict_least_accessed(bad),
                 "max_requeue": lambda: setattr(self.q, "max_requeue_count_when_expected_reads",
                                                bad),
                 "entry": lambda: self.mod.CacheEntry("k", bad)}
        try:
            calls[what]()
        except (TypeError, ValueError):
            pass
        else:
            # A few of these are valid (evict_before(-1), evict_least_accessed(2**63)...):
            # then the model must follow.
            if what == "evict_before":
                self.model.walk(self.clock.now, before=bad)
            elif what == "evict_least_accessed":
                self.model.walk(self.clock.now, size_to_free=bad)
            elif what == "max_requeue":
                self.model.max_requeue = bad

    @rule(max_requeue=st.integers(0, 3), extend=st.booleans())
    def reconfigure(self, max_requeue, extend):
        self.q.max_requeue_count_when_expected_reads = max_requeue
        self.q.extend_ttl_of_recently_accessed = extend
        self.model.max_requeue, self.model.extend = max_requeue, extend

    @invariant()
    def sizes_add_up(self):
        assert self.q.size == sum(self.model.fields[k]["size"] for k in self.model.order)
        assert len(self.q) == len(self.model.order)
        assert self.q.is_empty() == (not self.model.order)

    @invariant()
    def each_entry_queued_or_removed(self):
        queued = set(self.model.order)
        assert queued.isdisjoint(self.model.removed)
        assert queued | self.model.removed == set(self.entries)
        for k, e in self.entries.items():
            assert e.removed == (k in self.model.removed)

    @invariant()
    def order_is_insertion_order_modulo_requeues(self):
        assert [e.key for e in self.q] == self.model.order
        for k in self.model.order:
            e, f = self.entries[k], self.model.fields[k]
            assert (e.timestamp_ns, e.accessed, e.requeue_count) == (
                f["ts"], f["accessed"], f["requeues"])
            assert e.expected_reads == (f["reads"] if f["tracked"] else None)

    @invariant()
    def non_evictable_matches(self):
        live = [self.model.fields[k] for k in self.model.order]
        want = [f for f in live if f["tracked"] and f["reads"] > 0]
        assert self.q.non_evictable() == (len(want), sum(f["size"] for f in want))


_SETTINGS = settings(max_examples=examples(150), stateful_step_count=40, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


class PyQueueMachine(QueueMachine):
    mod = importlib.import_module(MODULES["python"])


class CQueueMachine(QueueMachine):
    mod = importlib.import_module(MODULES["c"])


TestRemovalQueuePython = PyQueueMachine.TestCase
TestRemovalQueuePython.settings = _SETTINGS
TestRemovalQueueC = pytest.mark.c_extension(CQueueMachine.TestCase)
TestRemovalQueueC.settings = _SETTINGS


# ---- differential: C against the twin -------------------------------------------------

_pos = st.tuples(st.integers(0, 3), st.integers(0, 200))
_op = st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 2), _pos, st.integers(0, 120),
              st.integers(-1, 3)),
    st.tuples(st.just("get"), st.integers(0, 2), _pos),
    st.tuples(st.just("range"), st.integers(0, 2), _pos, _pos),
    st.tuples(st.just("invalidate"), st.integers(0, 2),
              st.tuples(st.integers(-1, 3), st.integers(-1, 200))),
    st.tuples(st.just("read"), st.integers(0, 2), _pos),
    st.tuples(st.just("replay"), st.integers(0, 2), _pos),
    st.tuples(st.just("clear"), st.integers(0, 2)),
    st.tuples(st.just("tick"), st.integers(0, 700_000)),
    st.tuples(st.just("evict")),
    st.tuples(st.just("resize"), st.integers(0, 3000)),
    st.tuples(st.just("requeue"), st.integers(0, 4), st.booleans()),
)


def _run(mod, ops):
    clock = FakeClock(10**9)
    m = mod.EntryCacheManager(2000, time_threshold_ms=1, clock=clock)
    out = []
    for op in ops:
        kind, args = op[0], op[1:]
        if kind == "tick":
            clock.advance(args[0])
            continue
        if kind == "evict":
            out.append(m.run_eviction())
        elif kind == "resize":
            m.max_size_bytes = args[0]
        elif kind == "requeue":
            m.max_requeue_count_when_expected_reads = args[0]
            m.extend_ttl_of_recently_accessed = args[1]
        else:
            c = m.cache(f"t{args[0]}")
            if kind == "insert":
                out.append(c.insert(args[1], bytes([len(out) % 256]) * args[2],
                                    expected_reads=args[3]))
            elif kind == "get":
                out.append(c.get(args[1]))
            elif kind == "range":
                out.append(c.get_range(args[1], args[2]))
            elif kind == "invalidate":
                out.append(c.invalidate_up_to(args[1]))
            elif kind == "read":
                c.mark_read(args[1])
            elif kind == "replay":
                c.add_expected_read(args[1])
            elif kind == "clear":
                out.append(c.clear())
        out.append((m.stats(), m.non_evictable(), m.average_entry_size))
    contents = {n: m.cache(n).get_range((0, 0), (9, 999)) for n in ("t0", "t1", "t2")}
    return out, contents, clock.reads


@pytest.mark.c_extension
@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_op, max_size=80))
def test_c_matches_the_pure_twin(ops):
    c = _run(importlib.import_module(MODULES["c"]), ops)
    py = _run(importlib.import_module(MODULES["python"]), ops)
    assert c == py


# ---- two managers side by side, exceptions included -------------------------------------------


_NAMES = ("t0", "t1", "t2")
_bad_positions = st.sampled_from([(1, -1), (-1, 1), (1, 2**63), ("1", 1), (1, 1.0), (1,), None,
                                  [1, 1], (True, 1)])
_good_position = st.tuples(st.integers(0, 2), st.integers(0, 40))
# Mostly valid (so the caches fill), sometimes not.
_any_position = st.one_of(_good_position, _good_position, _good_position, _bad_positions)


async def _storage(name, first, last):
    return [b"%s:%d" % (name.encode(), e) * (1 + e % 4) for e in range(first[1], last[1] + 1)]


def _call(fn):
    """("ok", result) or ("raised", type): the outcome both twins must share."""
    try:
        return "ok", fn()
    except (TypeError, ValueError, RuntimeError, KeyboardInterrupt, SystemExit) as exc:
        return "raised", type(exc)


class TwinMachine(RuleBasedStateMachine):
    """A C manager and a pure one, the same steps, the same outcomes."""

    @initialize(max_size=st.integers(0, 3000), overhead=st.sampled_from([0, 16, 192]),
                extend=st.booleans(), max_requeue=st.integers(0, 3))
    def setup(self, max_size, overhead, extend, max_requeue):
        self.twins = []
        for modname in (MODULES["c"], MODULES["python"]):
            mod = importlib.import_module(modname)
            clock = ScriptedClock(10**9)
            m = mod.EntryCacheManager(max_size, time_threshold_ms=1, clock=clock,
                                      entry_overhead_bytes=overhead,
                                      extend_ttl_of_recently_accessed=extend,
                                      max_requeue_count_when_expected_reads=max_requeue)
            reader = EntryReader(m, _storage, 4000)
            self.twins.append((m, clock, reader))

    def both(self, step):
        """Run ``step(manager, clock, reader)`` on both twins; same outcome."""
        got = [_call(lambda t=t: step(*t)) for t in self.twins]
        assert got[0] == got[1], got
        event(f"{step.__qualname__.split('.')[1]}: "
              f"{got[0][1].__name__ if got[0][0] == 'raised' else 'ok'}")
        return got[0]

    @rule(name=st.sampled_from(_NAMES), pos=_any_position, size=st.integers(0, 900),
          kind=st.sampled_from(["bytes"] * 4 + ["memoryview"] * 2 + ["released", "str"]),
          reads=st.one_of(st.integers(-1, 3), st.integers(-1, 3),
                          st.sampled_from([2**31, 1.5, None])))
    def insert(self, name, pos, size, kind, reads):
        def step(m, clock, reader):
            payload = b"p" * size
            if kind == "memoryview":
                payload = memoryview(payload)
            elif kind == "released":
                payload = memoryview(payload)
                payload.release()
            elif kind == "str":
                payload = "p" * size
            return m.cache(name).insert(pos, payload, expected_reads=reads)
        self.both(step)

    @rule(name=st.sampled_from(_NAMES), pos=_any_position,
          what=st.sampled_from(["get", "contains", "mark_read", "add_expected_read"]))
    def lookup(self, name, pos, what):
        def step(m, clock, reader):
            c = m.cache(name)
            if what == "get":
                return c.get(pos)
            if what == "contains":
                return pos in c
            return getattr(c, what)(pos)
        self.both(step)

    @rule(name=st.sampled_from(_NAMES), first=_any_position, last=_any_position)
    def get_range(self, name, first, last):
        self.both(lambda m, clock, reader: m.cache(name).get_range(first, last))

    @rule(name=st.sampled_from(_NAMES),
          pos=st.one_of(st.tuples(st.integers(-1, 2), st.integers(-1, 41)), _bad_positions),
          clear=st.booleans())
    def drop(self, name, pos, clear):
        self.both(lambda m, clock, reader: m.cache(name).clear() if clear
                  else m.cache(name).invalidate_up_to(pos))

    @rule(dt=st.integers(0, 3_000_000))
    def tick(self, dt):
        for _, clock, _ in self.twins:
            clock.advance(dt)

    @rule()
    def run_eviction(self):
        self.both(lambda m, clock, reader: m.run_eviction())

    @rule(value=st.one_of(st.integers(0, 4000), st.sampled_from([-1, 2**63, 1.5, None])))
    def resize(self, value):
        self.both(lambda m, clock, reader: setattr(m, "max_size_bytes", value))

    @rule(max_requeue=st.one_of(st.integers(0, 4), st.sampled_from([-1, 2**31, "2"])),
          extend=st.booleans())
    def requeue_settings(self, max_requeue, extend):
        def step(m, clock, reader):
            m.extend_ttl_of_recently_accessed = extend
            m.max_requeue_count_when_expected_reads = max_requeue
        self.both(step)

    @rule(fault=st.sampled_from(["KeyboardInterrupt", "SystemExit", "RuntimeError", "2**63",
                                 "-2**63", "float", "None", "reenter-insert",
                                 "reenter-clear", "reenter-evict"]),
          later=st.integers(1, 3))
    def clock_fault(self, fault, later):
        """The clock's reading ``later`` readings from now misbehaves."""
        for m, clock, _ in self.twins:
            n = clock.reads + later
            if fault in ("KeyboardInterrupt", "SystemExit", "RuntimeError"):
                exc = {"KeyboardInterrupt": KeyboardInterrupt, "SystemExit": SystemExit,
                       "RuntimeError": RuntimeError}[fault]

                def boom(exc=exc):
                    raise exc("clock")
                clock.actions[n] = boom
            elif fault.startswith("reenter"):
                def reenter(m=m, fault=fault):
                    c = m.cache("t1")
                    if fault == "reenter-insert":
                        c.insert((2, 7), b"r" * 300, expected_reads=1)
                    elif fault == "reenter-clear":
                        c.clear()
                    else:
                        m.max_size_bytes = m.max_size_bytes // 2
                clock.actions[n] = reenter
            else:
                clock.values[n] = {"2**63": 2**63, "-2**63": -2**63, "float": 1.5,
                                   "None": None}[fault]

    @rule(name=st.sampled_from(_NAMES), ledger=st.integers(0, 2), first=st.integers(0, 30),
          n=st.integers(1, 6), reads=st.integers(0, 2))
    def read_through_reader(self, name, ledger, first, n, reads):
        def step(m, clock, reader):
            got = asyncio.run(reader.read(name, (ledger, first), (ledger, first + n - 1),
                                          expected_reads=reads))
            assert reader.semaphore.acquired_permits == 0
            return got
        self.both(step)

    @invariant()
    def consistent_and_equal(self):
        if not hasattr(self, "twins"):
            return
        snaps = []
        for m, clock, _ in self.twins:
            check_manager(m, _NAMES)
            snaps.append((snapshot(m, _NAMES), clock.reads, sorted(clock.actions),
                          sorted(clock.values)))
        assert snaps[0] == snaps[1]

    def teardown(self):
        if hasattr(self, "twins"):
            contents = [[m.cache(n).get_range((0, 0), (9, 99)) for n in _NAMES]
                        for m, _, _ in self.twins]
            assert contents[0] == contents[1]


TestTwins = pytest.mark.c_extension(TwinMachine.TestCase)
TestTwins.settings = settings(max_examples=examples(120), stateful_step_count=40, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
