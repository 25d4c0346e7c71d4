"""Fixtures of the host-wide limiter's suite (issue 33): the twin's module
through the project's `impl` fixture, a private segment directory per test,
and child processes that are always bounded in time and reaped."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import warnings

import pytest

_names = itertools.count()


@pytest.fixture(scope="session")
def shm(impl):
    """The twin's module: SharedSemaphore, SharedDualMemoryLimiter ..."""
    return impl.module_of("shared")


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """A fresh segment directory, also the default ($PYLIMITER_SHM_DIR)."""
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv("PYLIMITER_SHM_DIR", str(d))
    return str(d)


@pytest.fixture
def name(shm_dir):
    return f"t{os.getpid()}-{next(_names)}"


class Children:
    """Child processes of one test: started through a multiprocessing
    context (spawn or fork), joined with a hard timeout, killed and reaped
    whatever happens."""

    def __init__(self):
        self.procs = []

    def start(self, method, target, *args):
        ctx = multiprocessing.get_context(method)
        p = ctx.Process(target=target, args=args, daemon=True)
        with warnings.catch_warnings():
            # 3.12+: forking a process that has threads (pytest's
            # faulthandler watchdog) warns; the children here exec nothing
            # that could deadlock on an inherited lock.
            warnings.filterwarnings("ignore", category=DeprecationWarning,
                                    message=".*fork.*")
            p.start()
        self.procs.append(p)
        return p

    def join(self, p, timeout=60):
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join(10)
            raise AssertionError(f"child {p.pid} did not finish within {timeout} s")
        return p.exitcode

    def join_all(self, timeout=60, ok=(0,)):
        codes = [self.join(p, timeout) for p in list(self.procs)]
        bad = [c for c in codes if c not in ok]
        assert not bad, f"children exited with {codes}"
        return codes

    def kill(self, p, sig=signal.SIGKILL):
        try:
            os.kill(p.pid, sig)
        except ProcessLookupError:
            pass
        p.join(30)

    def reap(self):
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join(10)
        self.procs.clear()


@pytest.fixture
def children():
    c = Children()
    try:
        yield c
    finally:
        c.reap()


@pytest.fixture(params=["fork", "spawn"])
def method(request):
    return request.param
