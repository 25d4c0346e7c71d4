"""Ctrl-C while Spark jobs run: one line at once, the jobs cancelled from
another thread, KeyboardInterrupt once the driver's blocking call returns.
"""

from __future__ import annotations

import contextlib
import signal
import threading

from .cli import announce_interrupt

__all__ = ["cancel_on_interrupt"]

@contextlib.contextmanager
def cancel_on_interrupt(sc, prog: str):
    """cancel_on_interrupt turns Ctrl-C while Spark jobs run into a clean
    stop: one line on stderr at once (``prog: interrupted``, never again),
    the jobs cancelled, and KeyboardInterrupt raised once the driver's
    blocking call has returned (``pylimiter.spark.cli.run`` then exits 130).

    pyspark's own SIGINT handler calls into the JVM from inside the signal
    handler, on the very py4j connection the interrupted call is reading,
    and py4j then logs both calls with tracebacks.  Here the handler only
    sets a flag and cancels from another thread (its own py4j connection);
    the session is then stopped normally by ``spark_session``.  A second
    Ctrl-C interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = threading.Event()

    finished = threading.Event()

    def cancel():
        # Again and again until the block is left: a job the driver submits
        # after the first cancel (the next stage, the next table) is not
        # covered by it.
        while not finished.is_set():
            with contextlib.suppress(Exception):
                sc.cancelAllJobs()
            finished.wait(0.5)

    def handler(signum, frame):
        announce_interrupt(prog)
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()
        threading.Thread(target=cancel, name="cancel-jobs", daemon=True).start()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    except Exception:
        if interrupted.is_set():  # the cancelled job's error: not a failure
            raise KeyboardInterrupt from None
        raise
    finally:
        finished.set()
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        raise KeyboardInterrupt
