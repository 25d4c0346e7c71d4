"""Shared by the tests/pulsar/test_cache*.py files: the cache implementation
under test (following the limiter's `impl` fixture, so --no-c-extensions
deselects the C runs the same way) and a settable clock."""

from __future__ import annotations

from importlib import import_module

import pytest

MODULES = {"c": "pylimiter.pulsar.cache._cache_c", "python": "pylimiter.pulsar.cache._cache_py"}
MS = 1_000_000


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
