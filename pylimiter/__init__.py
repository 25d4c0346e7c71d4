"""pylimiter: memory-aware admission control for asyncio and threads.

A weighted, strictly FIFO semaphore (``AsyncSemaphore``) and a heap/direct
memory limiter built on it (``AsyncDualMemoryLimiter``), after Apache Pulsar's
PIP-442.  The C implementation is used unless PYLIMITER_NO_EXTENSIONS is set;
``IMPLEMENTATION`` says which one is active.
"""

import sys
from typing import TYPE_CHECKING

from . import _impls
from ._common import MAX_PERMITS, LimitType, SemaphoreStats
from ._compat import USE_EXTENSIONS
from ._errors import (
    PermitAcquireAlreadyClosedError,
    PermitAcquireCancelledError,
    PermitAcquireError,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
    PermitOverflowError,
)
from ._shared_common import SharedLimiterError

__version__ = "0.1.0"

if TYPE_CHECKING:
    from ._limiter_py import (
        AsyncDualMemoryLimiter,
        AsyncSemaphore,
        DualMemoryPermit,
        SemaphorePermit,
    )
    from ._shared_py import SharedDualMemoryLimiter, SharedSemaphore
else:
    # The C twin unless PYLIMITER_NO_EXTENSIONS=1 (or off CPython).  No
    # fallback: a missing or broken extension is an error, not a slowdown.
    _active = _impls.active_module("limiter")
    AsyncDualMemoryLimiter = _active.AsyncDualMemoryLimiter
    AsyncSemaphore = _active.AsyncSemaphore
    DualMemoryPermit = _active.DualMemoryPermit
    SemaphorePermit = _active.SemaphorePermit
    # The host-wide limiter's C twin is built on Linux only; elsewhere the
    # pure twin's constructors raise NotImplementedError naming the platform.
    _active = (_impls.active_module("shared") if sys.platform.startswith("linux")
               else _impls.PY.module_of("shared"))
    SharedDualMemoryLimiter = _active.SharedDualMemoryLimiter
    SharedSemaphore = _active.SharedSemaphore
    del _active

IMPLEMENTATION = _impls.ACTIVE.tag

__all__ = (
    "IMPLEMENTATION",
    "MAX_PERMITS",
    "USE_EXTENSIONS",
    "AsyncDualMemoryLimiter",
    "AsyncSemaphore",
    "DualMemoryPermit",
    "LimitType",
    "PermitAcquireAlreadyClosedError",
    "PermitAcquireCancelledError",
    "PermitAcquireError",
    "PermitAcquireQueueFullError",
    "PermitAcquireTimeoutError",
    "PermitOverflowError",
    "SemaphorePermit",
    "SemaphoreStats",
    "SharedDualMemoryLimiter",
    "SharedLimiterError",
    "SharedSemaphore",
    "__version__",
)
