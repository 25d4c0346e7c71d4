"""What the framework integrations share (pylimiter.asgi, .aiohttp, .grpc,
.httpx): PIP-442's admission rule for bytes in flight, written once.

The rule: charge the bytes when the work arrives, hold them until the answer
has been written, queue FIFO with a timeout, refuse at once when the queue is
full.  Every integration speaks to its limiters only through the semaphore
protocol (``acquire``/``update``/``release``/``try_acquire``,
``max_permits``), duck-typed, so ``AsyncSemaphore`` of either implementation
and the host-wide ``SharedSemaphore`` work alike; a dual memory limiter
(anything with ``get_limiter(LimitType)``) is resolved to one of its pools:
heap for bytes received, direct for bytes sent.

Nothing here imports a framework; no permit is ever leaked: every path that
takes permits hands them to exactly one owner that releases them, whatever
the order of grant, timeout, cancellation and disconnect.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Callable, Optional

from ._common import LimitType
from ._errors import PermitAcquireError

#: A semaphore-like object: acquire/update/release/max_permits.
Pool = Any
#: (pool, permit) pairs in the order they were taken.
Held = list

#: Errors that mean "no room now": a timeout, a full queue, a closed limiter,
#: and ValueError, which a queued request raises when the limit is lowered
#: below its size while it waits (set_max_permits).  Answered 503 (HTTP) or
#: RESOURCE_EXHAUSTED (gRPC); anything else is a bug and propagates.
BUSY_ERRORS = (PermitAcquireError, ValueError)

#: oversize= choices: refuse a declared body above max_body_size (413), or
#: run it alone, charged the whole limit.
OVERSIZE_CHOICES = ("reject", "alone")

_SEMAPHORE_METHODS = ("acquire", "update", "release")


def missing_extra(module: str, extra: str, exc: ImportError) -> ImportError:
    """The ImportError of an integration whose framework is not installed:
    what is missing, and two installs that work today (the extra's packages
    from pyproject.toml's one copy, pylimiter._extras)."""
    from ._extras import requirements

    packages = " ".join(f"'{r}'" for r in requirements(extra))
    return ImportError(
        f"pylimiter.{module} needs {packages} ({exc}); install them with "
        f"`pip install {packages}`, or from a pylimiter checkout with "
        f"`pip install '.[{extra}]'`")


def is_dual(limiter: object) -> bool:
    """True for a dual memory limiter (it has ``get_limiter``); looked up on
    the type, so an instance's __getattr__ never runs."""
    return callable(getattr(type(limiter), "get_limiter", None))


def semaphore_of(limiter: object, limit_type: LimitType, what: str) -> Pool:
    """The semaphore behind ``limiter`` for one role: itself, or the
    ``limit_type`` pool of a dual memory limiter.  TypeError for anything
    that is neither."""
    if is_dual(limiter):
        limiter = limiter.get_limiter(limit_type)   # type: ignore[attr-defined]
    tp = type(limiter)
    if not all(callable(getattr(tp, m, None)) for m in _SEMAPHORE_METHODS) or \
            not hasattr(tp, "max_permits"):
        raise TypeError(
            f"pylimiter: {what} must be a semaphore (AsyncSemaphore, SharedSemaphore) "
            f"or a dual memory limiter (AsyncDualMemoryLimiter, SharedDualMemoryLimiter), "
            f"not {type(limiter).__name__}")
    return limiter


def check_timeout(timeout: object) -> Optional[float]:
    """None (the limiter's own default), or seconds >= 0."""
    if timeout is None:
        return None
    if type(timeout) is bool or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"pylimiter: timeout must be a number or None, not {type(timeout).__name__}")
    t = float(timeout)
    if not t >= 0:
        raise ValueError(f"pylimiter: timeout must be >= 0 or None, got {timeout!r}")
    return t


def check_retry_after(retry_after: object) -> float:
    """A finite number of seconds >= 0."""
    if type(retry_after) is bool or not isinstance(retry_after, (int, float)):
        raise TypeError(
            f"pylimiter: retry_after must be a number, not {type(retry_after).__name__}")
    r = float(retry_after)
    if not (r >= 0 and math.isfinite(r)):
        raise ValueError(f"pylimiter: retry_after must be a finite number >= 0, got "
                         f"{retry_after!r}")
    return r


def check_size(value: object, what: str) -> Optional[int]:
    """None, or an int >= 0."""
    if value is None:
        return None
    if type(value) is bool or not isinstance(value, int):
        raise TypeError(f"pylimiter: {what} must be an int or None, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"pylimiter: {what} must be >= 0 or None, got {value}")
    return int(value)


def check_oversize(oversize: object) -> str:
    if oversize not in OVERSIZE_CHOICES or type(oversize) is not str:
        raise ValueError(
            f"pylimiter: oversize must be 'reject' or 'alone', not {oversize!r}")
    return oversize


def check_callable(value: object, what: str) -> Optional[Callable[..., Any]]:
    if value is not None and not callable(value):
        raise TypeError(f"pylimiter: {what} must be callable or None, not "
                        f"{type(value).__name__}")
    return value


def limit_of(pool: Pool) -> Optional[int]:
    """A pool's whole limit now, or None when it is unbounded."""
    m = pool.max_permits
    return m if m > 0 else None


def clamp(pool: Pool, n: int) -> int:
    """``n`` bytes as a pool can charge them: at most its whole limit (a
    request larger than everything runs alone instead of failing)."""
    m = pool.max_permits
    return n if m <= 0 or n <= m else m


def deadline_of(timeout: Optional[float]) -> Optional[float]:
    """The monotonic deadline of an explicit timeout (None: each limiter's
    own default applies to its own wait)."""
    return None if timeout is None else time.monotonic() + timeout


def timeout_kw(deadline: Optional[float]) -> dict:
    """acquire/update keyword arguments for what is left until ``deadline``:
    one budget for the whole chain of pools, not one per pool."""
    if deadline is None:
        return {}
    return {"timeout": max(0.0, deadline - time.monotonic())}


def release_all(held: Held) -> None:
    """Give back every permit in ``held`` (the last taken first) and empty
    it.  Each release runs even if one before it raised."""
    error = None
    while held:
        pool, permit = held.pop()
        try:
            pool.release(permit)
        except BaseException as exc:   # keep releasing; raise the first after
            if error is None:
                error = exc
    if error is not None:
        raise error


def try_all(charges: list[tuple[Pool, int]], held: Held) -> int:
    """Take what fits now, in order, without waiting or overtaking anyone
    queued; stops at the first pool that has no room.  Returns how many
    pools were charged (their permits are appended to ``held``)."""
    i = 0
    for pool, n in charges:
        try_acquire = getattr(pool, "try_acquire", None)
        if try_acquire is None:
            break
        permit = try_acquire(n)
        if permit is None:
            break
        held.append((pool, permit))
        i += 1
    return i


async def acquire_all(charges: list[tuple[Pool, int]], deadline: Optional[float]) -> Held:
    """Take ``n`` from each pool in order (waiting in each queue in turn,
    within one deadline) and return the permits; on any failure or
    cancellation, what was taken goes back before the error propagates."""
    got: Held = []
    try:
        for pool, n in charges:
            got.append((pool, await pool.acquire(n, **timeout_kw(deadline))))
    except BaseException:
        release_all(got)
        raise
    return got


async def grow_all(held: Held, total: int, deadline: Optional[float]) -> None:
    """Grow every held permit to ``total`` bytes (clamped to its pool's
    limit), in order.  On failure a permit keeps what it had."""
    for pool, permit in held:
        n = clamp(pool, total)
        if n > permit.permits:
            await pool.update(permit, n, **timeout_kw(deadline))


def give_up(task: "asyncio.Future[Held]") -> None:
    """Stop waiting for ``task`` (an acquire_all): cancel it; permits it was
    granted anyway (the grant raced the cancel) go back when it ends."""
    if task.done():
        _settle(task)
    else:
        task.cancel()
        task.add_done_callback(_settle)


def _settle(task: "asyncio.Future[Held]") -> None:
    if task.cancelled():
        return
    if task.exception() is None:   # also marks the exception retrieved
        release_all(task.result())


def retry_after_value(retry_after: float) -> str:
    """The Retry-After header: whole seconds, rounded up."""
    return str(math.ceil(retry_after))


class Settings:
    """The arguments the HTTP integrations share, checked once: the pools
    each request is charged from, the timeout, the size rules and the
    Retry-After answer."""

    __slots__ = ("key", "key_limiter", "max_body_size", "oversize", "pool", "response_pool",
                 "retry_after", "retry_after_header", "timeout")

    def __init__(self, limiter: object, *, timeout: object, max_body_size: object,
                 oversize: object, retry_after: object, key: object, key_limiter: object,
                 response_limiter: object) -> None:
        self.pool = semaphore_of(limiter, LimitType.HEAP_MEMORY, "limiter")
        if response_limiter is not None:
            self.response_pool = semaphore_of(response_limiter, LimitType.DIRECT_MEMORY,
                                              "response_limiter")
        elif is_dual(limiter):
            self.response_pool = semaphore_of(limiter, LimitType.DIRECT_MEMORY, "limiter")
        else:
            self.response_pool = None
        self.timeout = check_timeout(timeout)
        self.max_body_size = check_size(max_body_size, "max_body_size")
        self.oversize = check_oversize(oversize)
        self.retry_after = check_retry_after(retry_after)
        self.retry_after_header = retry_after_value(self.retry_after)
        self.key = check_callable(key, "key")
        self.key_limiter = check_callable(key_limiter, "key_limiter")
        if (key is None) != (key_limiter is None):
            raise ValueError("pylimiter: key and key_limiter go together: give both or neither")

    def pools(self, request: object) -> list:
        """The request's pools in the order they are charged: its key's
        first, then the global one (a key or key limiter of None: the
        global one alone)."""
        if self.key is None:
            return [self.pool]
        k = self.key(request)
        if k is None:
            return [self.pool]
        limiter = self.key_limiter(k)   # type: ignore[misc]
        if limiter is None:
            return [self.pool]
        return [semaphore_of(limiter, LimitType.HEAP_MEMORY, "key_limiter(key)"), self.pool]

    def limit(self) -> Optional[int]:
        """The largest body accepted now: max_body_size, else the limiter's
        limit (None: unbounded)."""
        if self.max_body_size is not None:
            return self.max_body_size
        return limit_of(self.pool)

    def declared_charges(self, pools: list, length: int,
                         limit: Optional[int]) -> Optional[list[tuple[Pool, int]]]:
        """What a declared body of ``length`` bytes is charged in each pool;
        None when it is to be refused (413)."""
        if limit is not None and length > limit:
            if self.oversize == "reject":
                return None
            # "alone": the whole limit of every pool, so nothing runs beside it.
            return [(p, p.max_permits if p.max_permits > 0 else length) for p in pools]
        return [(p, clamp(p, length)) for p in pools]
