"""Types of the compiled implementation (pylimiter._limiter_c).

The same public API as pylimiter._limiter_py, which `import pylimiter` is
typed from; this stub serves code that imports the extension module itself.
An acquire/update request is both ``Awaitable[SemaphorePermit]`` and
``AsyncContextManager[SemaphorePermit]``; each semaphore and limiter takes
only its own kind of permit.
"""

from collections.abc import Callable, Generator
from contextvars import Context
from types import TracebackType
from typing import Any, final

from ._common import LimitType as LimitType
from ._common import SemaphoreStats
from ._dual import DualMemoryLimiterBase
from ._dual import DualMemoryPermit as DualMemoryPermit

__all__ = [
    "AsyncDualMemoryLimiter",
    "AsyncSemaphore",
    "DualMemoryPermit",
    "LimitType",
    "SemaphorePermit",
]

_IsCancelled = Callable[[], object] | None

@final
class SemaphorePermit:
    """Permits held from one AsyncSemaphore."""

    def __init__(self, *args: object, **kwargs: object) -> None: ...
    @property
    def permits(self) -> int: ...
    def __enter__(self) -> SemaphorePermit: ...
    def __exit__(self, *exc: object) -> None: ...

@final
class _Request:
    """What acquire/update return: awaitable once, and an async context
    manager releasing the permit on exit."""

    def __await__(self) -> Generator[Any, None, SemaphorePermit]: ...
    def __iter__(self) -> _Request: ...
    def __next__(self) -> Any: ...
    # The coroutine protocol (asyncio may drive a request as a coroutine) and
    # the part of the Future protocol a task parked on it uses.
    def send(self, value: object) -> Any: ...
    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any: ...
    def close(self) -> None: ...
    def add_done_callback(
        self, fn: Callable[[_Request], object], *, context: Context | None = None
    ) -> None: ...
    def remove_done_callback(self, fn: Callable[[_Request], object]) -> int: ...
    def done(self) -> bool: ...
    def cancelled(self) -> bool: ...
    def result(self) -> None: ...
    def cancel(self, msg: object = None) -> bool: ...
    async def __aenter__(self) -> SemaphorePermit: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

class AsyncSemaphore:
    """A weighted, strictly FIFO semaphore for asyncio tasks and threads."""

    def __init__(
        self, max_permits: int, max_queue_size: int = 10000, timeout: float | None = 25.0
    ) -> None: ...
    @property
    def max_permits(self) -> int: ...
    @property
    def available_permits(self) -> int: ...
    @property
    def acquired_permits(self) -> int: ...
    @property
    def queue_size(self) -> int: ...
    @property
    def max_queue_size(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def locked(self) -> bool: ...
    def acquire(
        self, permits: int = 1, *, timeout: float | None = ..., is_cancelled: _IsCancelled = None
    ) -> _Request: ...
    def update(
        self,
        permit: SemaphorePermit,
        new_permits: int,
        *,
        timeout: float | None = ...,
        is_cancelled: _IsCancelled = None,
    ) -> _Request: ...
    def acquire_blocking(
        self, permits: int = 1, *, timeout: float | None = ..., is_cancelled: _IsCancelled = None
    ) -> SemaphorePermit: ...
    def update_blocking(
        self,
        permit: SemaphorePermit,
        new_permits: int,
        *,
        timeout: float | None = ...,
        is_cancelled: _IsCancelled = None,
    ) -> SemaphorePermit: ...
    def try_acquire(self, permits: int = 1) -> SemaphorePermit | None: ...
    def release(self, permit: SemaphorePermit) -> None: ...
    async def __aenter__(self) -> None: ...
    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...
    def close(self) -> None: ...
    def set_max_permits(self, max_permits: int) -> None: ...
    def stats(self) -> SemaphoreStats: ...

class AsyncDualMemoryLimiter(DualMemoryLimiterBase):
    """Separate heap and direct memory limits with FIFO queueing per pool."""
