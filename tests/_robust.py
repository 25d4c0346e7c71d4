"""Helpers of the robustness tests (issue 18): scripts run in a child
interpreter, so that a crash fails one test instead of killing pytest, and
the objects of both twins in every state a user can meet them in."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_script(code: str, *, timeout: float = 120, args: tuple[str, ...] = (),
               env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (this one's executable, -X dev, the
    checkout first on sys.path).  A crash is a non-zero return code, not a
    dead test session."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return subprocess.run(
        [sys.executable, "-X", "dev", "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=full_env)


def crashed(out: subprocess.CompletedProcess) -> str:
    """A readable failure message for a child that died."""
    return (f"exit {out.returncode}\n--- stdout\n{out.stdout[-3000:]}"
            f"\n--- stderr\n{out.stderr[-3000:]}")


def read_everything(obj) -> int:
    """Read every attribute of obj the way a debugger or a REPL does: dir(),
    repr(), inspect.getmembers(), and each name by getattr.  Each read either
    returns or raises an Exception (never crashes); returns how many names
    were read."""
    repr(obj)
    str(obj)
    names = dir(obj)
    inspect.getmembers(obj)
    for name in names:
        try:
            value = getattr(obj, name)
        except Exception:
            continue
        try:
            repr(value)
        except Exception:
            pass
    return len(names)


def loop_states(sem) -> list:
    """The per-loop states a semaphore keeps (private: reached the way a
    debugger's object graph would, through gc.get_referents)."""
    found = []
    todo = list(gc.get_referents(sem))
    for obj in todo:
        if type(obj).__name__ == "_LoopState" and obj not in found:
            found.append(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
    return found


async def settle(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def objects_in_every_state(mod) -> list[tuple[str, object]]:
    """Every kind of object of one implementation module in every state
    issue 18 lists: fresh, queued, granted at once, granted after waiting,
    cancelled, timed out, closed; permits, requests, waiters, semaphores,
    dual limiters and their permits and requests.  Must run on a loop."""
    from pylimiter import LimitType

    out: list[tuple[str, object]] = []
    sem = mod.AsyncSemaphore(2, max_queue_size=10, timeout=None)
    out.append(("semaphore fresh", sem))
    fresh = sem.acquire(1)
    out.append(("request fresh", fresh))
    p_now = await sem.acquire(1)
    out.append(("permit granted at once", p_now))
    out.append(("request granted at once", fresh))
    fresh.close()
    out.append(("request closed before await", fresh))
    p2 = sem.try_acquire(1)
    out.append(("semaphore full", sem))
    waiting = asyncio.ensure_future(sem.acquire(1))
    timing = asyncio.ensure_future(sem.acquire(2, timeout=0.01))
    cancelling = asyncio.ensure_future(sem.acquire(1))
    await settle()
    out.append(("task waiting", waiting))
    out.append(("waiter queued", waiting._fut_waiter))
    for ls in loop_states(sem):
        out.append(("loop state", ls))
    out.append(("semaphore with a queue", sem))
    upd_req = sem.update(p_now, 2)
    out.append(("update request fresh", upd_req))
    upd = asyncio.ensure_future(upd_req)
    await settle()
    out.append(("update waiter queued", upd._fut_waiter))
    out.append(("permit with a pending update", p_now))
    cancel_waiter = cancelling._fut_waiter
    cancelling.cancel()
    await settle()
    out.append(("waiter cancelled", cancel_waiter))
    out.append(("task cancelled", cancelling))
    time_waiter = timing._fut_waiter
    await asyncio.sleep(0.05)
    out.append(("waiter timed out", time_waiter))
    sem.release(p2)
    await settle()
    got = await waiting
    out.append(("permit granted after waiting", got))
    out.append(("waiter granted", waiting))
    sem.release(got)
    sem.release(p_now)          # the update takes 2 now
    await settle()
    out.append(("update done", upd))
    sem.release(await upd)
    out.append(("permit released", got))
    blocked = asyncio.ensure_future(sem.acquire(2))
    holder = sem.try_acquire(2)
    blocked2 = asyncio.ensure_future(sem.acquire(2))
    await settle()
    closing_waiter = blocked2._fut_waiter
    sem.close()
    await settle()
    out.append(("waiter closed", closing_waiter))
    out.append(("semaphore closed", sem))
    out.append(("permit of a closed semaphore", holder))
    sem.release(holder)
    for t in (blocked, blocked2, timing):
        try:
            r = await t
        except Exception:
            continue
        if r is not None:
            sem.release(r)

    ub = mod.AsyncSemaphore(0)
    out.append(("unbounded semaphore", ub))
    ub_p = ub.try_acquire(5)
    out.append(("permit of an unbounded semaphore", ub_p))
    ub.release(ub_p)

    dual = mod.AsyncDualMemoryLimiter(100, 0)
    out.append(("dual limiter fresh", dual))
    dreq = dual.acquire(10, LimitType.HEAP_MEMORY)
    out.append(("dual request fresh", dreq))
    dp = await dreq
    out.append(("dual request granted", dreq))
    out.append(("dual permit", dp))
    dual.release(dp)
    out.append(("dual permit released", dp))
    dual.close()
    out.append(("dual limiter closed", dual))

    # What a blocking thread leaves behind.
    bsem = mod.AsyncSemaphore(1)
    bp = bsem.acquire_blocking(1)
    out.append(("permit from a blocking acquire", bp))
    bsem.release(bp)
    return out
