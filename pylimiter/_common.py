"""The contract both implementations share: limits, stats, limit types,
argument checks, the waiter states, and every error message.

A message lives here once, so the C binding and the pure-Python twin cannot
drift apart; tests/test_differential.py compares exception types and texts.
Only the per-call hot check (``_check_n`` in the binding, ``check_permits``
here) stays inline in the C twin, and it defers to ``check_permits`` for
anything but the common case.
"""

from __future__ import annotations

import contextvars
import enum
import math
import warnings
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Protocol, TypeVar

from ._errors import (
    PermitAcquireAlreadyClosedError,
    PermitAcquireCancelledError,
    PermitAcquireQueueFullError,
    PermitAcquireTimeoutError,
    PermitOverflowError,
)

#: The largest max_permits and the largest single request (the C core's
#: PLIM_MAX_PERMITS); bigger values would overflow its 62-bit counter field.
MAX_PERMITS = (1 << 60) - 1
#: The most that can be held at once, bounded or not (PLIM_MAX_ACQUIRED):
#: MAX_PERMITS, so that an unbounded semaphore holding the most can still be
#: switched to a limit of 1 inside the core's counter.
MAX_ACQUIRED = MAX_PERMITS
#: available_permits of an unbounded semaphore.
UNBOUNDED_AVAILABLE = 2**63 - 1
#: An asyncio wait longer than this (about 31 years) waits this long: the
#: deadline stays a finite number of nanoseconds (the C twin's int64_t).
MAX_TIMEOUT_S = 1e9

#: Upper bounds (seconds) of the wait-time histogram: prometheus_client's
#: defaults with finer steps at the low end, where immediate grants land.
WAIT_BUCKETS: tuple[float, ...] = (
    0.0001,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    60.0,
    math.inf,
)


def bucket_index(seconds: float) -> int:
    """Return the index of the first bucket whose bound is >= seconds."""
    for i, bound in enumerate(WAIT_BUCKETS):
        if seconds <= bound:
            return i
    return len(WAIT_BUCKETS) - 1


@dataclass(frozen=True)
class SemaphoreStats:
    """A consistent snapshot of one semaphore's gauges and counters.

    ``wait_seconds_buckets`` is cumulative, Prometheus style:
    ``((upper_bound_seconds, count_of_waits_<=_bound), ...)`` ending at ``inf``.
    Every grant enters the histogram, immediate ones as 0 seconds.
    """

    max_permits: int
    acquired_permits: int
    available_permits: int
    queue_size: int
    max_queue_size: int
    acquired_total: int
    timeout_total: int
    queue_full_total: int
    cancelled_total: int
    wait_seconds_sum: float
    wait_seconds_count: int
    wait_seconds_buckets: tuple[tuple[float, int], ...]


def cumulative_buckets(counts: Iterable[int]) -> tuple[tuple[float, int], ...]:
    """Per-bucket counts -> Prometheus-style cumulative (bound, count) pairs."""
    out = []
    running = 0
    for bound, n in zip(WAIT_BUCKETS, counts):
        running += n
        out.append((bound, running))
    return tuple(out)


class LimitType(enum.Enum):
    """Which pool of an AsyncDualMemoryLimiter a permit draws from."""

    HEAP_MEMORY = "heap"
    DIRECT_MEMORY = "direct"


# ---- waiter states --------------------------------------------------------
# Where a queued request stands; the values are plim_wstate_t's in csrc/plim.h
# (the binding asserts that at import).
W_IDLE, W_QUEUED, W_GRANTED, W_CLOSED, W_TOO_LARGE, W_CANCELLED, W_REMOVED = range(7)

# ---- messages -----------------------------------------------------------------
MSG_PERMIT_NOT_CONSTRUCTIBLE = "pylimiter: permits are created by a semaphore"
MSG_REQUEST_NOT_CONSTRUCTIBLE = (
    "pylimiter: requests are created by a semaphore's acquire() or update()")
MSG_INTERNAL_NOT_CONSTRUCTIBLE = "pylimiter: {} objects are created by a semaphore"
MSG_ALREADY_AWAITED = "pylimiter: this request was already awaited"
MSG_REUSED = "pylimiter: cannot reuse an already awaited request"
MSG_UNINITIALISED = (
    "pylimiter: this {} is not initialised (made by __new__ without __init__)")
MSG_REINIT = "pylimiter: {} is already initialised"
MSG_NO_COPY = (
    "pylimiter: {} objects cannot be copied or pickled: each one is live "
    "state of its semaphore (make a new one instead)")
MSG_CLOSED = "pylimiter: semaphore is closed"
MSG_CLOSED_WHILE_QUEUED = "pylimiter: semaphore was closed"
MSG_CANCELLED = "pylimiter: request cancelled"
MSG_TIMED_OUT = ("pylimiter: timed out after {} s waiting for permits; pass timeout=None "
                 "to wait for ever, or a larger timeout= to this call or to the "
                 "semaphore's (limiter's) constructor, whose default is 25 s")
MSG_TIMEOUT_ZERO = "pylimiter: permits not available and timeout=0"
MSG_QUEUE_FULL = "pylimiter: queue is full ({} waiting)"
MSG_OVERFLOW = "pylimiter: too many permits outstanding"
MSG_UPDATE_IN_PROGRESS = "pylimiter: permit already has an update in progress"
MSG_FOREIGN_PERMIT = "pylimiter: the permit belongs to another semaphore"
MSG_NOT_A_PERMIT = "pylimiter: expected a SemaphorePermit, not {}"
MSG_TOO_LARGE = "Requested permits={} is larger than max_permits={}"
MSG_WAKE_CALLBACK_FAILED = "pylimiter: exception in a wake-up callback"
MSG_NO_LOOP = (
    "pylimiter: a request that has to wait needs a running asyncio event loop "
    "(asyncio or uvloop); from a thread use acquire_blocking(); other event "
    "loops (trio, curio) are not supported"
)
MSG_LEAKED = (
    "pylimiter: a permit of {!r} holding {} permit(s) was garbage-collected "
    "without release(); they stay taken"
)
MSG_ANON_EXIT = "pylimiter: 'async with semaphore' exited more often than it entered"


MSG_NEVER_AWAITED = (
    "pylimiter: an {} request of {!r} for {} permit(s) was never awaited; "
    "await it (or use it with `async with`), or close() it"
)


def warn_never_awaited(sem: object, permits: int, is_update: bool) -> None:
    """The RuntimeWarning for a request collected before it was awaited,
    started or closed: as for a never-awaited coroutine, since a forgotten
    ``await`` otherwise passes silently (no permit is taken)."""
    kind = "update" if is_update else "acquire"
    warnings.warn(MSG_NEVER_AWAITED.format(kind, sem, permits), RuntimeWarning, stacklevel=2)


def warn_leaked_permit(sem: object, permits: int) -> None:
    """The ResourceWarning for a permit collected while it still holds
    permits (the pure twin's SemaphorePermit.__del__; the C twin raises the
    same text from its deallocator)."""
    warnings.warn(MSG_LEAKED.format(sem, permits), ResourceWarning, stacklevel=2)


class _Done:
    """An awaitable that is already complete (with None): what ``__aexit__``
    returns when the exit only releases, so no coroutine is created."""

    __slots__ = ()

    if TYPE_CHECKING:
        def __await__(self) -> Generator[Any, Any, None]: ...
    else:
        def __await__(self):
            # An exhausted iterator: `await` returns None without raising
            # or allocating a StopIteration.
            return iter(())

    def __repr__(self) -> str:
        return "<pylimiter completed awaitable>"


#: The one completed awaitable (stateless, shared).
DONE = _Done()

_P = TypeVar("_P")


class ReleasingRequest(Generic[_P]):
    """The async-context-manager half of a request: ``async with request as
    permit`` awaits the request, and the exit releases the permit.  Neither
    step creates a coroutine (the exit returns DONE).  Subclasses set
    ``_result`` when granted and define ``_release_result``."""

    __slots__ = ()

    _result: _P | None

    def _release_result(self, permit: _P) -> None:
        raise NotImplementedError

    if TYPE_CHECKING:
        # What `async with` sees.
        async def __aenter__(self) -> _P: ...

        async def __aexit__(self, exc_type: type[BaseException] | None,
                            exc: BaseException | None,
                            tb: TracebackType | None) -> None: ...
    else:
        def __aenter__(self):
            return self

        def __aexit__(self, exc_type, exc, tb):
            if self._result is not None:
                self._release_result(self._result)
            return DONE


class PermitLike(Protocol):
    """What the dual limiter reads of a pool's permit."""

    @property
    def permits(self) -> int: ...


class RequestLike(Protocol):
    """What the dual limiter does with a pool's acquire/update request."""

    def __await__(self) -> Generator[Any, None, Any]: ...

    def close(self) -> None: ...


class SemaphoreLike(Protocol):
    """The pool the dual limiter is written against: either twin's
    AsyncSemaphore.  A protocol, so that ``_dual.py`` imports neither twin
    (each twin imports ``_dual.py``).  Permits are ``Any``: each pool takes
    back only its own (the twin's SemaphorePermit)."""

    def __init__(self, max_permits: int, max_queue_size: int = ...,
                 timeout: float | None = ...) -> None: ...

    @property
    def acquired_permits(self) -> int: ...

    @property
    def max_permits(self) -> int: ...

    def acquire(self, permits: int = ..., *, timeout: float | None = ...,
                is_cancelled: Callable[[], object] | None = ...) -> RequestLike: ...

    def acquire_blocking(self, permits: int = ..., *, timeout: float | None = ...,
                         is_cancelled: Callable[[], object] | None = ...) -> Any: ...

    def update(self, permit: Any, new_permits: int, *, timeout: float | None = ...,
               is_cancelled: Callable[[], object] | None = ...) -> RequestLike: ...

    def update_blocking(self, permit: Any, new_permits: int, *,
                        timeout: float | None = ...,
                        is_cancelled: Callable[[], object] | None = ...) -> Any: ...

    def release(self, permit: Any) -> None: ...

    def close(self) -> None: ...

    def stats(self) -> SemaphoreStats: ...


def closed_error() -> PermitAcquireAlreadyClosedError:
    """The error of an acquire on a closed semaphore."""
    return PermitAcquireAlreadyClosedError(MSG_CLOSED)


def overflow_error() -> PermitOverflowError:
    """The error of a request that would hold more than MAX_ACQUIRED."""
    return PermitOverflowError(MSG_OVERFLOW)


def no_copy_error(obj: object) -> TypeError:
    """What copy.copy, copy.deepcopy and pickle get for a stateful object."""
    return TypeError(MSG_NO_COPY.format(type(obj).__name__))


class NoCopy:
    """Refuses copy.copy, copy.deepcopy and pickle (a copy of a permit would
    be a second live permit; of a semaphore, a second view of its queue)."""

    __slots__ = ()

    def __copy__(self) -> NoReturn:
        raise no_copy_error(self)

    def __deepcopy__(self, memo: object) -> NoReturn:
        raise no_copy_error(self)

    def __reduce__(self) -> NoReturn:
        raise no_copy_error(self)

    def __reduce_ex__(self, protocol: object) -> NoReturn:
        raise no_copy_error(self)


def uninitialised_error(obj: object) -> RuntimeError:
    """The error of every call on an object whose __init__ never ran."""
    return RuntimeError(MSG_UNINITIALISED.format(type(obj).__name__))


def uninitialised_repr(obj: object) -> str:
    """repr() of such an object (repr never raises: debuggers call it)."""
    return f"<{type(obj).__name__} (not initialised)>"


def reinit_error(obj: object) -> RuntimeError:
    """The error of a second __init__ (it would forget what is held)."""
    return RuntimeError(MSG_REINIT.format(type(obj).__name__))


def exact_int(value: int) -> int:
    """An int subclass as a plain int, without calling any of its methods
    (a hostile __index__, __int__ or comparison never runs)."""
    return int.__index__(value)


def timeout_zero_error() -> PermitAcquireTimeoutError:
    """The error of a ``timeout=0`` request that would have to queue."""
    return PermitAcquireTimeoutError(MSG_TIMEOUT_ZERO)


def queue_full_error(max_queue: int) -> PermitAcquireQueueFullError:
    """The error of a request that finds the queue at its bound."""
    return PermitAcquireQueueFullError(MSG_QUEUE_FULL.format(max_queue))


def too_large_error(total: int, limit: int) -> ValueError:
    """The error of a request larger than the limit (at the call, or when the
    limit was lowered below it while it was queued or not yet awaited)."""
    return ValueError(MSG_TOO_LARGE.format(total, limit))


def no_loop_error() -> RuntimeError:
    """The error of a request that has to wait outside a running asyncio
    loop (trio, curio, or a coroutine driven by hand)."""
    return RuntimeError(MSG_NO_LOOP)


def cancelled_error(cause: BaseException | None) -> PermitAcquireCancelledError:
    """As ``raise PermitAcquireCancelledError(...) from cause``: the check's
    own exception (or None) is the cause, the context is suppressed."""
    exc = PermitAcquireCancelledError(MSG_CANCELLED)
    exc.__cause__ = cause
    exc.__suppress_context__ = True
    return exc


def timed_out_error(timeout: float | None) -> PermitAcquireTimeoutError:
    """The error of a request whose ``timeout`` (seconds) ran out: it names
    the timeout and how to change it (the 25 s default surprises callers
    who know asyncio.Semaphore, which waits for ever)."""
    seconds = "?" if timeout is None else format(timeout, "g")
    return PermitAcquireTimeoutError(MSG_TIMED_OUT.format(seconds))


def left_queue_error(state: int, total: int, limit: int,
                     cause: BaseException | None, timeout: float | None) -> Exception:
    """left_queue_error is the exception a request raises when it left the
    queue in a final state other than W_GRANTED: closed, too large for a
    lowered limit, cancelled by its check, or timed out (W_REMOVED)."""
    if state == W_CLOSED:
        return PermitAcquireAlreadyClosedError(MSG_CLOSED_WHILE_QUEUED)
    if state == W_TOO_LARGE:
        return too_large_error(total, limit)
    if state == W_CANCELLED:
        return cancelled_error(cause)
    return timed_out_error(timeout)


def permit_error(permit: object, permit_type: type) -> TypeError:
    """permit_error is the TypeError for a ``permit`` that the caller found
    not to be one of its own: of another type, or of another semaphore."""
    if type(permit) is not permit_type:
        return TypeError(MSG_NOT_A_PERMIT.format(type(permit).__name__))
    return TypeError(MSG_FOREIGN_PERMIT)


def check_limits(max_permits: object, max_queue_size: object) -> tuple[int, int]:
    """The constructor's checks: both ints (not bool), max_permits at most
    MAX_PERMITS; returns them as ints."""
    if type(max_permits) is bool or not isinstance(max_permits, int):
        raise TypeError("pylimiter: max_permits must be an int")
    if type(max_queue_size) is bool or not isinstance(max_queue_size, int):
        raise TypeError("pylimiter: max_queue_size must be an int")
    max_permits = exact_int(max_permits)
    if max_permits > MAX_PERMITS:
        raise ValueError(f"pylimiter: max_permits={max_permits} exceeds {MAX_PERMITS}")
    return max_permits, exact_int(max_queue_size)


def check_new_max(max_permits: object) -> int:
    """set_max_permits' checks: any int (not bool) up to MAX_PERMITS; <= 0
    means unbounded."""
    if type(max_permits) is bool or not isinstance(max_permits, int):
        raise TypeError("pylimiter: max_permits must be an int")
    max_permits = exact_int(max_permits)
    if max_permits > MAX_PERMITS:
        raise ValueError(f"pylimiter: max_permits={max_permits} exceeds {MAX_PERMITS}")
    return max_permits


def check_permits(value: object, max_permits: int, bounded: bool) -> int:
    """Validate a permit count at the call site; return it as an int."""
    if type(value) is bool or not isinstance(value, int):
        raise TypeError(
            f"pylimiter: permits must be an int, not {type(value).__name__}"
        )
    if type(value) is not int:
        value = exact_int(value)
    if value < 0:
        raise ValueError(f"Invalid negative permits value: {value}")
    if bounded and value > max_permits:
        raise too_large_error(value, max_permits)
    if value > MAX_PERMITS:
        raise PermitOverflowError(
            f"pylimiter: permits={value} exceeds the maximum of {MAX_PERMITS}"
        )
    return value


#: The default of every ``timeout`` argument: "use the semaphore's timeout".
#: Typed Any so that annotated signatures may default to it.
TIMEOUT_NOT_GIVEN: Any = object()


def check_timeout(timeout: object, default: float | None) -> float | None:
    """Resolve the timeout argument: <default> sentinel, None, or seconds >= 0
    (inf and ints too large for a float wait for ever, in effect)."""
    if timeout is TIMEOUT_NOT_GIVEN:
        return default
    if timeout is None:
        return None
    if type(timeout) is bool or not isinstance(timeout, (int, float)):
        raise TypeError(
            f"pylimiter: timeout must be a number or None, not {type(timeout).__name__}"
        )
    if isinstance(timeout, int):
        whole = exact_int(timeout)
        try:
            timeout = float(whole)
        except OverflowError:
            timeout = math.inf if whole > 0 else -math.inf
    else:
        timeout = float.__float__(timeout)   # a float subclass, no method of its own
    if timeout < 0 or math.isnan(timeout):
        raise ValueError(f"pylimiter: timeout must be >= 0 or None, got {timeout}")
    return timeout


def thrown_exception(typ: Any, val: Any = None, tb: Any = None) -> BaseException:
    """The exception a coroutine's throw(typ, val, tb) raises (both twins'
    requests build it the same way)."""
    if isinstance(typ, BaseException):
        exc = typ
    elif isinstance(val, BaseException):
        exc = val
    elif val is None:
        exc = typ()
    else:
        exc = typ(val)
    if not isinstance(exc, BaseException):
        raise TypeError("exceptions must derive from BaseException")
    if tb is not None:
        exc = exc.with_traceback(tb)
    return exc


def ask_cancelled(is_cancelled: Callable[[], object]) -> tuple[bool, BaseException | None]:
    """Evaluate an is_cancelled callable: (cancelled?, exception it raised).
    A check that raises counts as cancelled; the exception becomes the
    __cause__ of the PermitAcquireCancelledError."""
    try:
        return bool(is_cancelled()), None
    except Exception as exc:
        return True, exc


def check_done_callback(fn: object, context: object) -> None:
    """add_done_callback's arguments: a callable, and a Context or None."""
    if not callable(fn):
        raise TypeError(f"pylimiter: a done callback must be callable, not {type(fn).__name__}")
    if context is not None and type(context) is not contextvars.Context:
        raise TypeError(
            f"pylimiter: context must be a contextvars.Context, not {type(context).__name__}")


def same_callback(registered: object, fn: object) -> bool:
    """remove_done_callback's test: equal callbacks, as asyncio compares
    them (a task's bound method is a new object each time), but only
    between objects of one type, so a stranger's __eq__ never runs."""
    return registered is fn or (type(registered) is type(fn) and bool(registered == fn))


def check_is_cancelled(is_cancelled: object) -> object:
    """An is_cancelled argument must be callable or None."""
    if is_cancelled is not None and not callable(is_cancelled):
        raise TypeError("pylimiter: is_cancelled must be callable or None")
    return is_cancelled
