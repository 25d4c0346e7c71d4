"""Hypothesis stateful test: each implementation against a tiny FIFO model."""

from __future__ import annotations

import asyncio
import copy
import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule


def make_machine(mod):
    class SemaphoreModel(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.loop = asyncio.new_event_loop()
            self.sem = mod.AsyncSemaphore(8, max_queue_size=0, timeout=None)
            self.max = 8
            self.avail = 8
            self.queue = []      # model: [(id, need)]
            self.held = {}       # model: id -> permits
            self.tasks = {}      # id -> task
            self.permits = {}    # id -> real permit
            self.failed = set()
            self.next = 0

        def teardown(self):
            self.sem.close()
            self.step()
            for p in self.permits.values():
                self.sem.release(p)
            self.loop.close()

        def step(self):
            async def settle():
                for _ in range(4):
                    await asyncio.sleep(0)
            self.loop.run_until_complete(settle())
            for i, t in list(self.tasks.items()):
                if t.done():
                    del self.tasks[i]
                    if not t.cancelled() and t.exception() is None:
                        self.permits[i] = t.result()

        @property
        def bounded(self):
            return self.max > 0

        def process(self):
            while self.queue and (not self.bounded or self.avail >= self.queue[0][1]):
                i, n = self.queue.pop(0)
                self.avail -= n
                self.held[i] = n

        @rule(n=st.integers(0, 8))
        def acquire(self, n):
            if self.bounded and n > self.max:
                with pytest.raises(ValueError):
                    self.sem.acquire(n)
                return
            i = self.next
            self.next += 1
            self.tasks[i] = self.loop.create_task(self._acq(n))
            if n == 0 or not self.bounded or (not self.queue and self.avail >= n):
                self.avail -= n
                self.held[i] = n
            else:
                self.queue.append((i, n))
            self.step()

        async def _acq(self, n):
            return await self.sem.acquire(n)

        @precondition(lambda self: self.permits)
        @rule(data=st.data())
        def release(self, data):
            i = data.draw(st.sampled_from(sorted(self.permits)))
            self.sem.release(self.permits.pop(i))
            self.avail += self.held.pop(i)
            self.process()
            self.step()

        @precondition(lambda self: self.queue)
        @rule(data=st.data())
        def cancel(self, data):
            idx = data.draw(st.integers(0, len(self.queue) - 1))
            i, _ = self.queue.pop(idx)
            self.tasks[i].cancel()
            if idx == 0:
                self.process()
            self.step()

        @rule(m=st.integers(-2, 12))
        def set_max(self, m):
            # The live switch too: m <= 0 is unbounded (grants every queued
            # request), m > 0 bounds it again with what is held carried over.
            self.sem.set_max_permits(m)
            self.avail += max(m, 0) - (self.max if self.bounded else 0)
            self.max = m
            if self.bounded:
                self.queue = [(i, n) for i, n in self.queue if n <= m]
            self.process()
            self.step()

        @rule(v=st.sampled_from([-1, math.nan, math.inf, 2**64, True, None, "1", 1.5, []]),
              how=st.sampled_from(["acquire", "try_acquire", "acquire_blocking",
                                   "set_max_permits", "release", "copy"]))
        def misuse(self, v, how):
            # Refused at the call with TypeError/ValueError; the model (the
            # semaphore's books and queue) is unchanged.
            if how == "set_max_permits" and type(v) is int and v < 0:
                v = 2**64   # (a limit <= 0 is valid: unbounded)
            with pytest.raises((TypeError, ValueError)):
                if how == "copy":
                    copy.copy(self.sem)
                elif how == "acquire":
                    self.sem.acquire(v)
                elif how == "acquire_blocking":
                    self.sem.acquire_blocking(v, timeout=0)
                else:
                    getattr(self.sem, how)(v)

        @invariant()
        def matches_model(self):
            assert self.sem.max_permits == self.max
            if self.bounded:
                assert self.sem.available_permits == self.avail
            else:
                assert self.sem.available_permits == 2**63 - 1
            assert self.sem.queue_size == len(self.queue)
            assert self.sem.acquired_permits == sum(self.held.values())
            assert set(self.permits) == set(self.held)
            for i, n in self.held.items():
                assert self.permits[i].permits == n

    return SemaphoreModel


def test_semaphore_matches_model(mod):
    machine = make_machine(mod)
    machine.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                         deadline=None)
    machine.TestCase().runTest()
