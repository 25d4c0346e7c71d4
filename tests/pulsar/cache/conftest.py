"""The cache tests' fixture: the implementation under test."""

from __future__ import annotations

import pytest


@pytest.fixture
def cm(impl):
    """The cache module (_cache_c or _cache_py) matching `impl` (the
    limiter's fixture, so --no-c-extensions deselects the C runs the same
    way)."""
    return impl.module_of("cache")
