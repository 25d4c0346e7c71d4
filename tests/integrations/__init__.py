"""Tests of the framework integrations (issue 34): pylimiter.asgi, .aiohttp,
.grpc, .httpx and .otel."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

#: A source checkout (make build's venv has the dev group: every framework
#: is installed) versus an installed wheel's test run (pytest only).
CHECKOUT = (Path(__file__).resolve().parents[2] / "pylimiter" / "_limiter_c.pyx").exists()


def need(module: str):
    """Import a framework the tests drive.  In a checkout it must be there
    (the dev group installs it; a missing one fails, it does not skip); an
    installed wheel's run without the extras skips, saying which."""
    if CHECKOUT:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} (an integration's extra) is "
                               "not installed")
