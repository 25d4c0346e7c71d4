"""The public surface and the implementation switch."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

import pylimiter


def test_all_exports_exist():
    for name in pylimiter.__all__:
        assert hasattr(pylimiter, name), name


def test_error_hierarchy():
    assert issubclass(pylimiter.PermitAcquireTimeoutError, pylimiter.PermitAcquireError)
    assert issubclass(pylimiter.PermitAcquireTimeoutError, TimeoutError)
    # Not the same class before 3.11: `except asyncio.TimeoutError` must catch it there too.
    assert issubclass(pylimiter.PermitAcquireTimeoutError, asyncio.TimeoutError)
    for cls in (pylimiter.PermitAcquireQueueFullError,
                pylimiter.PermitAcquireAlreadyClosedError,
                pylimiter.PermitAcquireCancelledError):
        assert issubclass(cls, pylimiter.PermitAcquireError)


def test_limit_type_members():
    assert {m.name for m in pylimiter.LimitType} == {"HEAP_MEMORY", "DIRECT_MEMORY"}


def test_both_modules_expose_the_same_api(impl):
    from pylimiter import _limiter_c, _limiter_py

    for name in ("AsyncSemaphore", "AsyncDualMemoryLimiter", "SemaphorePermit",
                 "DualMemoryPermit", "LimitType"):
        assert hasattr(_limiter_c, name) and hasattr(_limiter_py, name)
    public = {n for n in dir(_limiter_py.AsyncSemaphore) if not n.startswith("_")}
    assert public <= set(dir(_limiter_c.AsyncSemaphore))


@pytest.mark.c_extension
def test_default_implementation_is_c():
    if os.environ.get("PYLIMITER_NO_EXTENSIONS"):
        pytest.skip("pure mode requested by the environment")
    assert pylimiter.IMPLEMENTATION == "c"
    assert pylimiter.AsyncSemaphore.__module__ == "pylimiter._limiter_c"


@pytest.mark.parametrize("env, expected", [("1", "python"), ("", "c")])
def test_no_extensions_env_selects_implementation(env, expected, request):
    if expected == "c" and not request.config.getoption("--c-extensions"):
        pytest.skip("C extension deselected")
    out = subprocess.run(
        [sys.executable, "-c", "import pylimiter; print(pylimiter.IMPLEMENTATION)"],
        env={**os.environ, "PYLIMITER_NO_EXTENSIONS": env},
        capture_output=True, text=True, check=True,
    )
    assert out.stdout.strip() == expected
