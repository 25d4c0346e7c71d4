"""The two implementations, by name: shared by tests/, benchmarks/ and the
benchmark runner shipped in pylimiter.bench.

One spelling everywhere: "c" for the extension, "python" for the pure twin
(test ids, the bench CLI's --impls, asv params, the micro suite).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from types import ModuleType


@dataclass(frozen=True)
class LimiterImplementation:
    """One of the two implementations: tag "c" or "python"."""

    is_pure_python: bool

    @property
    def tag(self) -> str:
        return "python" if self.is_pure_python else "c"

    @property
    def module(self) -> ModuleType:
        name = "pylimiter._limiter_py" if self.is_pure_python else "pylimiter._limiter_c"
        return import_module(name)

    def __str__(self) -> str:
        return self.tag


C = LimiterImplementation(is_pure_python=False)
PY = LimiterImplementation(is_pure_python=True)
#: tag -> implementation
IMPLEMENTATIONS = {impl.tag: impl for impl in (C, PY)}
