"""Hostile inputs and crash isolation shared by the subsystems'
``test_hostile.py`` files (issue 18): the hostile-argument matrix and the
outcome of a call, a cap on this process's address space, a runner for code
that could crash the interpreter (a subprocess, so a crash fails one test
instead of aborting pytest), and the attribute walk run inside it."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# ---- hostile values ----------------------------------------------------------------------


class BadIndex:
    """Claims to be an integer; its __index__ (and __int__) raise."""

    def __index__(self):
        raise RuntimeError("__index__ says no")

    __int__ = __index__


class BadEq:
    """Hashable, but comparing it raises."""

    def __eq__(self, other):
        raise RuntimeError("__eq__ says no")

    __lt__ = __le__ = __gt__ = __ge__ = __ne__ = __eq__

    def __hash__(self):
        return 7


class BadHash:
    """hash() raises."""

    def __hash__(self):
        raise RuntimeError("__hash__ says no")


class BadRepr:
    def __repr__(self):
        raise RuntimeError("__repr__ says no")


def hostile_values():
    """The values of the hostile-argument matrix (issue 18), with ids."""
    return [("nan", math.nan), ("inf", math.inf), ("-inf", -math.inf), ("-1", -1), ("0", 0),
            ("2**63", 2**63), ("2**64", 2**64), ("True", True), ("None", None), ("str", "7"),
            ("1.5", 1.5), ("1.0", 1.0), ("BadIndex", BadIndex()), ("BadEq", BadEq()),
            ("BadHash", BadHash()), ("BadRepr", BadRepr()), ("-2**63-1", -2**63 - 1)]


def outcome(fn, *args, **kwargs):
    """("ok", result) or ("raised", exception type): what a call did.  Only
    TypeError and ValueError (and subclasses) are acceptable refusals; any
    other exception fails the test that asks."""
    try:
        return "ok", fn(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return "raised", type(exc)


# ---- code that may crash the interpreter ----------------------------------------------------


@contextlib.contextmanager
def memory_cap(extra: int = 1 << 30):
    """Let this process grow by at most ``extra`` bytes of address space
    while the block runs (Linux): an argument that makes the code under test
    allocate without bound (2**63 bundles, every hole of a 2**62-entry
    ledger) raises MemoryError instead of exhausting a shared machine."""
    try:
        import resource
        with open("/proc/self/status") as f:
            vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = vm + extra
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, OSError, StopIteration, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _limit_memory(nbytes: int):
    def preexec():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return preexec


def run_isolated(code: str, *, timeout: float = 120, env: dict | None = None,
                 memory_limit: int | None = None) -> str:
    """Run ``code`` in a fresh interpreter (the same one, with the same -X
    and -W flags) and return its stdout; a crash, a hang past ``timeout`` or
    a non-zero exit fails the calling test with the child's output.  With
    ``memory_limit`` (bytes of address space, POSIX), a runaway allocation
    fails the child with MemoryError instead of exhausting the machine."""
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), child_env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, *subprocess._args_from_interpreter_flags(), "-c", code]
    try:
        limit = (_limit_memory(memory_limit)
                 if memory_limit and os.name == "posix" else None)
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                             cwd=str(ROOT), env=child_env, preexec_fn=limit)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung for {timeout} s:\n{code}\n--- stdout:\n{exc.stdout}\n"
                    f"--- stderr:\n{exc.stderr}")
    if out.returncode != 0:
        pytest.fail(f"exit {out.returncode}:\n{code}\n--- stdout:\n{out.stdout}\n"
                    f"--- stderr:\n{out.stderr}")
    return out.stdout


# ---- the attribute walk (run inside run_isolated) -------------------------------------------


def walk(obj) -> int:
    """Read every attribute of ``obj`` (public and private, as dir() lists
    them), its repr, dir() and inspect.getmembers(); each read may give a
    value or raise an Exception, nothing else.  Returns the names read."""
    names = dir(obj)
    for name in names:
        try:
            getattr(obj, name)
        except Exception:
            pass
    repr(obj)
    str(obj)
    inspect.getmembers(obj)
    return len(names)
