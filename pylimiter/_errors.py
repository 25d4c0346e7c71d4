"""Exceptions shared by both implementations."""

from __future__ import annotations

import asyncio
import sys

__all__ = [
    "PermitAcquireError",
    "PermitAcquireTimeoutError",
    "PermitAcquireQueueFullError",
    "PermitAcquireAlreadyClosedError",
    "PermitAcquireCancelledError",
    "PermitOverflowError",
]


class PermitAcquireError(Exception):
    """Base class: a request for permits did not complete."""


if sys.version_info >= (3, 11):
    class PermitAcquireTimeoutError(PermitAcquireError, TimeoutError):
        """The request waited in the queue longer than its timeout.  Both a
        TimeoutError and an asyncio.TimeoutError (distinct classes before 3.11)."""
else:
    # Before 3.11 asyncio.TimeoutError is a class of its own, not the builtin
    # TimeoutError, and asyncio code catches that one: be both there too.
    class PermitAcquireTimeoutError(PermitAcquireError, asyncio.TimeoutError, TimeoutError):
        """The request waited in the queue longer than its timeout.  Both a
        TimeoutError and an asyncio.TimeoutError (distinct classes before 3.11)."""


class PermitAcquireQueueFullError(PermitAcquireError):
    """The request would have to queue, but the queue is at max_queue_size."""


class PermitAcquireAlreadyClosedError(PermitAcquireError):
    """The semaphore was closed before the request was granted."""


class PermitAcquireCancelledError(PermitAcquireError):
    """The request's is_cancelled callable returned true (or raised)."""


class PermitOverflowError(OverflowError, ValueError):
    """More permits than the core can count: a request above MAX_PERMITS on
    an unbounded semaphore, or one that would hold more than MAX_ACQUIRED at
    once.  An OverflowError (as before) and a ValueError (a bad argument)."""
