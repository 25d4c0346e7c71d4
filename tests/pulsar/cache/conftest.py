"""The cache tests' fixture: the implementation under test."""

from __future__ import annotations

from importlib import import_module

import pytest

from .kit import MODULES


@pytest.fixture
def cm(impl):
    """The cache module (_cache_c or _cache_py) matching `impl` (the
    limiter's fixture, so --no-c-extensions deselects the C runs the same
    way)."""
    return import_module(MODULES[impl.tag])
