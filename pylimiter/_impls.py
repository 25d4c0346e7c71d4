"""The twins, listed once: every compiled module and its pure-Python twin,
and the two implementations by name (shared by the package, tests/,
benchmarks/, the wheel checks and the benchmark runner in pylimiter.bench).

One spelling everywhere: "c" for the extensions, "python" for the pure twins
(test ids, the bench CLI's --impls, asv params, the micro suite).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from types import ModuleType

from ._compat import USE_EXTENSIONS, not_built_message

#: twin -> (compiled module, pure-Python twin).  A new extension is added
#: here and nowhere else: the package __init__s, the test fixtures, the
#: benchmarks and wheels/check_wheels.py read this table.
TWINS: dict[str, tuple[str, str]] = {
    "limiter": ("pylimiter._limiter_c", "pylimiter._limiter_py"),
    "cache": ("pylimiter.pulsar.cache._cache_c", "pylimiter.pulsar.cache._cache_py"),
    # The host-wide limiter (issue 33); built on Linux only (futexes, OFD locks).
    "shared": ("pylimiter._shared_c", "pylimiter._shared_py"),
}
#: Every compiled module a wheel must carry.
EXTENSIONS = tuple(c for c, _ in TWINS.values())


@dataclass(frozen=True)
class LimiterImplementation:
    """One of the two implementations: tag "c" or "python"."""

    is_pure_python: bool

    @property
    def tag(self) -> str:
        return "python" if self.is_pure_python else "c"

    def module_of(self, twin: str) -> ModuleType:
        """This implementation's module of ``twin`` ("limiter", "cache")."""
        c_name, py_name = TWINS[twin]
        return import_module(py_name if self.is_pure_python else c_name)

    @property
    def module(self) -> ModuleType:
        """The limiter's module (the semaphore and the dual limiter)."""
        return self.module_of("limiter")

    def __str__(self) -> str:
        return self.tag


C = LimiterImplementation(is_pure_python=False)
PY = LimiterImplementation(is_pure_python=True)
#: tag -> implementation
IMPLEMENTATIONS = {impl.tag: impl for impl in (C, PY)}
#: The implementation this process uses (PYLIMITER_NO_EXTENSIONS, CPython).
ACTIVE = C if USE_EXTENSIONS else PY


def active_module(twin: str) -> ModuleType:
    """The module of ``twin`` this process uses.  No fallback: a missing
    extension is an ImportError naming the two ways out (build it, or ask
    for the pure twin), not a silent slowdown."""
    c_name = TWINS[twin][0]
    try:
        return ACTIVE.module_of(twin)
    except ModuleNotFoundError as exc:
        if ACTIVE.is_pure_python or exc.name != c_name:
            raise
        # Which pylimiter was imported, which one it hides, what to run.
        raise ImportError(not_built_message(c_name), name=c_name) from None
