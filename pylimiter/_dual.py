"""AsyncDualMemoryLimiter: two AsyncSemaphores, one per memory pool.

Written once on top of whichever AsyncSemaphore an implementation provides;
each implementation module binds ``_semaphore_class`` to its own.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Generic, Optional, TypeVar

from ._common import (
    MSG_ALREADY_AWAITED,
    MSG_REQUEST_NOT_CONSTRUCTIBLE,
    MSG_REUSED,
    TIMEOUT_NOT_GIVEN,
    LimitType,
    NoCopy,
    PermitLike,
    ReleasingRequest,
    RequestLike,
    SemaphoreLike,
    SemaphoreStats,
    reinit_error,
    thrown_exception,
    uninitialised_error,
    uninitialised_repr,
)

IsCancelled = Optional[Callable[[], object]]
#: The pools' semaphore class (each twin's AsyncSemaphore).
_S = TypeVar("_S", bound=SemaphoreLike)


MSG_DUAL_PERMIT_NOT_CONSTRUCTIBLE = "pylimiter: permits are created by a limiter"


class DualMemoryPermit(NoCopy):
    """Bytes held from one pool of an AsyncDualMemoryLimiter.

    ``with`` releases it on exit, like SemaphorePermit.
    """

    __slots__ = ("_limit_type", "_limiter", "_permit")

    _limiter: DualMemoryLimiterBase[Any]
    _permit: PermitLike
    _limit_type: LimitType

    def __new__(cls, *args: object, **kwargs: object) -> DualMemoryPermit:
        # Not only __init__: no half-made permit may exist (the limiter
        # makes them with object.__new__).
        raise TypeError(MSG_DUAL_PERMIT_NOT_CONSTRUCTIBLE)

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise TypeError(MSG_DUAL_PERMIT_NOT_CONSTRUCTIBLE)

    @classmethod
    def _new(cls, limiter: DualMemoryLimiterBase[Any], permit: PermitLike,
             limit_type: LimitType) -> DualMemoryPermit:
        self = object.__new__(cls)
        self._limiter = limiter
        self._permit = permit
        self._limit_type = limit_type
        return self

    @property
    def permits(self) -> int:
        """Bytes held now."""
        return self._permit.permits

    @property
    def limit_type(self) -> LimitType:
        """The pool these bytes come from."""
        return self._limit_type

    def __enter__(self) -> DualMemoryPermit:
        return self

    def __exit__(self, *exc: object) -> None:
        self._limiter.release(self)

    def __repr__(self) -> str:
        return (f"<DualMemoryPermit {self._limit_type.name} "
                f"permits={self._permit.permits}>")


class _DualRequest(NoCopy, ReleasingRequest[DualMemoryPermit]):
    """Awaitable (once) and async context manager around a semaphore
    request; a coroutine too (``asyncio.create_task(limiter.acquire(...))``),
    as the semaphores' requests are."""

    __slots__ = ("_gen", "_inner", "_limit_type", "_limiter", "_result", "_stage",
                 "_wrapper")

    _inner: RequestLike
    _limiter: DualMemoryLimiterBase[Any]
    _limit_type: LimitType
    _wrapper: DualMemoryPermit | None
    _result: DualMemoryPermit | None
    _gen: Generator[Any, None, DualMemoryPermit] | None
    _stage: int

    def __new__(cls, *args: object, **kwargs: object) -> _DualRequest:
        raise TypeError(MSG_REQUEST_NOT_CONSTRUCTIBLE)

    @classmethod
    def _new(cls, inner: RequestLike, limiter: DualMemoryLimiterBase[Any],
             limit_type: LimitType, wrapper: DualMemoryPermit | None) -> _DualRequest:
        self = object.__new__(cls)
        self._inner = inner
        self._limiter = limiter
        self._limit_type = limit_type
        self._wrapper = wrapper
        self._result = None
        self._gen = None
        self._stage = 0
        return self

    def __await__(self) -> Generator[Any, None, DualMemoryPermit]:
        if self._stage:
            raise RuntimeError(MSG_ALREADY_AWAITED)
        self._stage = 1
        g = self._gen = self._run()
        return g

    def _run(self) -> Generator[Any, None, DualMemoryPermit]:
        try:
            permit = yield from self._inner.__await__()
        finally:
            self._stage = 2
        wrapper = self._wrapper
        if wrapper is None:
            wrapper = self._wrapper = DualMemoryPermit._new(self._limiter, permit,
                                                            self._limit_type)
        self._result = wrapper
        return wrapper

    # ---- the coroutine protocol (as the semaphores' requests) ------------

    def send(self, value: object) -> Any:
        """Coroutine protocol: advance the request."""
        if self._stage == 2:
            raise RuntimeError(MSG_REUSED)
        g = self._gen
        if g is None:
            self._stage = 1
            g = self._gen = self._run()
        return g.send(None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """Coroutine protocol: the awaiting task is cancelled or interrupted."""
        g = self._gen
        self._stage = 2
        try:
            exc = thrown_exception(typ, val, tb)
        except BaseException:
            if g is not None:
                g.close()
            raise
        if g is None:
            self._inner.close()   # never awaited: it never will be
            raise exc
        return g.throw(exc)

    def close(self) -> None:
        """Coroutine protocol: the awaiting coroutine is closed."""
        g = self._gen
        self._stage = 2
        if g is not None:
            g.close()
        else:
            self._inner.close()

    def _release_result(self, permit: DualMemoryPermit) -> None:
        self._limiter.release(permit)


class DualMemoryLimiterBase(NoCopy, Generic[_S]):
    """Separate heap and direct memory limits with FIFO queueing per pool.

    Each pool is an AsyncSemaphore counting bytes: ``max_*_bytes <= 0``
    disables that limit, ``*_max_queue_size`` bounds its queue and
    ``*_timeout`` (seconds, None: for ever) its default wait.
    """

    _semaphore_class: type[_S]

    def __new__(cls, *args: Any, **kwargs: Any) -> DualMemoryLimiterBase[Any]:
        # Not ready until __init__ has run: a limiter made by __new__ alone
        # refuses every call (an instance attribute: reads stay fast).
        self = super().__new__(cls)
        self._ready = False
        return self

    def __init__(self, max_heap_bytes: int, max_direct_bytes: int, *,
                 heap_max_queue_size: int = 10000,
                 direct_max_queue_size: int = 10000,
                 heap_timeout: float | None = 25.0,
                 direct_timeout: float | None = 25.0) -> None:
        cls = self._semaphore_class
        limiters = {
            LimitType.HEAP_MEMORY: cls(max_heap_bytes, heap_max_queue_size,
                                       heap_timeout),
            LimitType.DIRECT_MEMORY: cls(max_direct_bytes, direct_max_queue_size,
                                         direct_timeout),
        }
        if getattr(self, "_ready", False):
            # A second __init__ would forget what is held and queued.
            raise reinit_error(self)
        self._limiters = limiters
        self._ready = True

    @property
    def _pools(self) -> dict[LimitType, _S]:
        if not self._ready:
            raise uninitialised_error(self)
        return self._limiters

    def get_limiter(self, limit_type: LimitType) -> _S:
        """The AsyncSemaphore behind one pool."""
        # By type, not by lookup: a hostile __hash__/__eq__ never runs.
        if type(limit_type) is not LimitType:
            raise TypeError(
                f"pylimiter: limit_type must be a LimitType, not {type(limit_type).__name__}")
        return self._pools[limit_type]

    def _unwrap(self, permit: object) -> DualMemoryPermit:
        if type(permit) is not DualMemoryPermit:
            raise TypeError(
                f"pylimiter: expected a DualMemoryPermit, not {type(permit).__name__}"
            )
        if permit._limiter is not self:
            raise TypeError("pylimiter: the permit belongs to another limiter")
        return permit

    def acquire(self, size: int, limit_type: LimitType, *,
                timeout: float | None = TIMEOUT_NOT_GIVEN,
                is_cancelled: IsCancelled = None) -> _DualRequest:
        """Awaitable of a DualMemoryPermit holding ``size`` bytes of one pool."""
        sem = self.get_limiter(limit_type)
        inner = sem.acquire(size, timeout=timeout, is_cancelled=is_cancelled)
        return _DualRequest._new(inner, self, limit_type, None)

    def acquire_blocking(self, size: int, limit_type: LimitType, *,
                         timeout: float | None = TIMEOUT_NOT_GIVEN,
                         is_cancelled: IsCancelled = None) -> DualMemoryPermit:
        """Blocking twin of ``acquire``."""
        sem = self.get_limiter(limit_type)
        permit = sem.acquire_blocking(size, timeout=timeout, is_cancelled=is_cancelled)
        return DualMemoryPermit._new(self, permit, limit_type)

    def update(self, permit: DualMemoryPermit, new_size: int, *,
               timeout: float | None = TIMEOUT_NOT_GIVEN,
               is_cancelled: IsCancelled = None) -> _DualRequest:
        """Awaitable that resizes ``permit`` in place and returns it."""
        p = self._unwrap(permit)
        sem = self._limiters[p._limit_type]
        inner = sem.update(p._permit, new_size, timeout=timeout,
                           is_cancelled=is_cancelled)
        return _DualRequest._new(inner, self, p._limit_type, p)

    def update_blocking(self, permit: DualMemoryPermit, new_size: int, *,
                        timeout: float | None = TIMEOUT_NOT_GIVEN,
                        is_cancelled: IsCancelled = None) -> DualMemoryPermit:
        """Blocking twin of ``update``."""
        p = self._unwrap(permit)
        self._limiters[p._limit_type].update_blocking(
            p._permit, new_size, timeout=timeout, is_cancelled=is_cancelled)
        return p

    def release(self, permit: DualMemoryPermit) -> None:
        """Give back the bytes ``permit`` holds (a no-op when it holds none)."""
        p = self._unwrap(permit)
        self._limiters[p._limit_type].release(p._permit)

    def close(self) -> None:
        """Close both pools."""
        for sem in self._pools.values():
            sem.close()

    def stats(self) -> dict[LimitType, SemaphoreStats]:
        """One SemaphoreStats per pool."""
        return {t: sem.stats() for t, sem in self._pools.items()}

    def __repr__(self) -> str:
        if not getattr(self, "_ready", False):
            return uninitialised_repr(self)
        h = self._limiters[LimitType.HEAP_MEMORY]
        d = self._limiters[LimitType.DIRECT_MEMORY]
        return (f"<AsyncDualMemoryLimiter heap={h.acquired_permits}/{h.max_permits} "
                f"direct={d.acquired_permits}/{d.max_permits}>")
