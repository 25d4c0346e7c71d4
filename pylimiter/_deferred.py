"""Work that a finaliser or a signal handler hands over, done by a thread of
its own (the pure-Python twins; the C ones run no Python code inside their
critical sections and never need it).

A ``__del__`` run by the collector, or a signal handler, may give a permit
back while its own thread is inside a critical section of the same limiter
(or, for the host-wide one, of any segment: another process may wait for
ours): the state is half changed and the section's locks are this thread's,
so it cannot be done there, and waiting for the section would wait for
ever.  ``later(fn, *args)`` queues it; one worker thread, started when work
arrives and gone when the queue is empty, calls it, waiting for the section
as any other thread would.

- ``later`` takes no lock another thread may hold for long: a SimpleQueue
  (whose ``put`` is safe in finalisers and signal handlers) and an RLock
  held for a few bytecodes.
- The worker is not a daemon: at exit the interpreter waits for it, so a
  permit handed over just before is given back (a daemon frozen at exit
  holding a section's lock made a later finaliser wait for ever).
- If no thread can be started, the work stays queued for the next ``later``.
- In a forked child the queue starts empty: its work is the parent's.
"""

from __future__ import annotations

import _thread
import os
import sys
import threading
from collections.abc import Callable
from queue import Empty, SimpleQueue

_queue: SimpleQueue[tuple[Callable[..., object], tuple[object, ...]]] = SimpleQueue()
_state = _thread.RLock()
_running = False


def later(fn: Callable[..., object], *args: object) -> None:
    """``fn(*args)`` soon, in the worker thread."""
    _queue.put((fn, args))
    _start()


def _start() -> None:
    global _running
    with _state:
        if _running:
            return
        _running = True
    try:
        threading.Thread(target=_drain, name="pylimiter-deferred").start()
    except RuntimeError:   # no thread now (a limit, or the interpreter exiting)
        with _state:
            _running = False


def _drain() -> None:
    global _running
    while True:
        try:
            fn, args = _queue.get_nowait()
        except Empty:
            with _state:
                # Off first, then look again: work queued in between
                # (by a finaliser run right here, too) starts a worker or
                # is seen below.
                _running = False
                if _queue.empty():
                    return
                _running = True
            continue
        try:
            fn(*args)
        except Exception:
            if not _closed(getattr(fn, "__self__", None)):
                sys.excepthook(*sys.exc_info())


def _closed(owner: object) -> bool:
    """Whether the limiter the work was for was closed meanwhile (its close
    gave the permits back; what failed then does not matter)."""
    try:
        return bool(getattr(owner, "closed", False))
    except Exception:
        return False


def _after_fork_in_child() -> None:
    global _queue, _state, _running
    _queue = SimpleQueue()
    _state = _thread.RLock()
    _running = False


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
