"""What pylimiter.asgi.MemoryLimitMiddleware costs a real service, and what
it saves: uvicorn (uvloop, httptools) serving a FastAPI app on 127.0.0.1.

    python -m benchmarks.http_bench [--rounds 10] [--duration 2] [--json FILE]

0. In process: the FastAPI app called through ASGI by this process, no
   server and no network, each side timing its requests in thread CPU time
   (the middleware's own cost, least disturbed by other tenants).
1. Throughput (wrk, Debian's ``apt-get install wrk``): requests/s and p50/p99
   latency of a small POST against three server processes started side by
   side: no middleware, the middleware (a budget that never queues), and a
   hand-written asyncio.Semaphore middleware.  The servers share one CPU and
   wrk runs on the other (where the machine has two); rounds are
   interleaved with the order flipped every round (pylimiter.bench's
   kit), and each ratio to "no middleware" is taken per round and
   summarised by its median and quartiles over the rounds.
2. Broker-style RSS: 200 concurrent 1 MiB uploads, each handler holding its
   body in memory for a moment, against a server without the middleware
   and one with it (a 16 MiB budget); each round starts a fresh server,
   warms it with four uploads, reads its RSS, resets its peak (VmHWM),
   sends the uploads and reads the peak: growth = peak - RSS before.
   Rounds interleaved as above.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from pylimiter import AsyncSemaphore
from pylimiter.asgi import MemoryLimitMiddleware
from pylimiter.spark.interleave import CPU, Spread, interleaved, per_round

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
SIDES = ("plain", "pylimiter", "asyncio")
LABELS = {"plain": "no middleware", "pylimiter": "MemoryLimitMiddleware",
          "asyncio": "asyncio.Semaphore middleware"}
_LUA = 'wrk.method = "POST"\nwrk.body = string.rep("x", {size})\n' \
       'wrk.headers["Content-Type"] = "application/octet-stream"\n'


def cpus() -> tuple[set[int], set[int]]:
    """(server CPUs, client CPUs): one each where there are two or more."""
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        return set(mine), set(mine)
    return {mine[-1]}, {mine[0]}


class Uvicorn:
    """One uvicorn process serving benchmarks.http_app, pinned."""

    def __init__(self, variant: str, cpu: set[int], log: Path, **env: str):
        with socket_port() as port:
            self.port = port
        self.base = f"http://127.0.0.1:{self.port}"
        full = {k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"}
        full.update({"PYLIMITER_BENCH_VARIANT": variant, **env})
        full["PYTHONPATH"] = os.pathsep.join(
            [p for p in [os.environ.get("PYTHONPATH")] if p] + [str(ROOT)])
        argv = [sys.executable, "-m", "uvicorn", "--factory", "benchmarks.http_app:create",
                "--host", "127.0.0.1", "--port", str(self.port), "--loop", "uvloop",
                "--http", "httptools", "--log-level", "warning", "--no-access-log"]
        self._log = open(log, "wb")
        self.proc = subprocess.Popen(argv, cwd=log.parent, env=full, stdout=self._log,
                                     stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: os.sched_setaffinity(0, cpu))
        deadline = time.monotonic() + 60
        while True:
            try:
                req = urllib.request.Request(self.base + "/small", data=b"x", method="POST")
                urllib.request.urlopen(req, timeout=2).read()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"uvicorn ({variant}) did not start: {log.read_text()}")
                time.sleep(0.1)

    def status(self, field: str) -> int:
        """A /proc/<pid>/status size (VmRSS, VmHWM) in bytes."""
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M)[1]) * 1024

    def cpu_ns(self) -> int:
        """CPU time the server's threads have run, in ns (schedstat): what
        a request costs the server, whoever else shares the machine."""
        total = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
        return total

    def reset_peak(self) -> None:
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


@contextlib.contextmanager
def socket_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk(srv: Uvicorn, duration: float, connections: int, script: Path, cpu: set[int]) -> dict:
    cpu0 = srv.cpu_ns()
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--latency", "-s", str(script),
         srv.base + "/small"],
        capture_output=True, text=True, check=True, timeout=duration + 60,
        preexec_fn=lambda: os.sched_setaffinity(0, cpu)).stdout
    cpu_used = srv.cpu_ns() - cpu0

    def latency(q: str) -> float:
        m = re.search(rf"^\s+{q}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        return float(m[1]) * _UNITS[m[2]]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    requests = int(re.search(r"(\d+) requests in", out)[1])
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1]),
            "cpu_us": cpu_used / 1000 / requests,
            "p50_ms": latency("50"), "p99_ms": latency("99"),
            "non_2xx": int(errors[1]) if errors else 0}


def throughput(args, tmp: Path) -> dict:
    server_cpu, client_cpu = cpus()
    script = tmp / "post.lua"
    script.write_text(_LUA.format(size=args.body))
    servers = {s: Uvicorn(s, server_cpu, tmp / f"{s}.log") for s in SIDES}
    try:
        sides = {s: (lambda srv=servers[s]: wrk(srv, args.duration, args.connections, script,
                                                 client_cpu))
                 for s in SIDES}
        rounds = interleaved(sides, rounds=args.rounds, warmup=1)
    finally:
        for srv in servers.values():
            srv.stop()
    result = {"rounds": args.rounds, "duration_s": args.duration,
              "connections": args.connections, "body_bytes": args.body,
              "server_cpus": sorted(server_cpu), "client_cpus": sorted(client_cpu)}
    for s in SIDES:
        runs = rounds[s]
        assert all(r["non_2xx"] == 0 for r in runs), f"{s}: non-2xx answers"
        result[s] = {k: Spread.of([r[k] for r in runs]).as_dict()
                     for k in ("rps", "p50_ms", "p99_ms", "cpu_us")}
    for s in ("pylimiter", "asyncio"):
        ratio = per_round({"mine": [r["rps"] for r in rounds[s]],
                           "base": [r["rps"] for r in rounds["plain"]]},
                          lambda mine, base: mine / base)
        result[f"{s}_over_plain"] = Spread.of(ratio).as_dict()
        # The capacity a middleware leaves: requests per CPU-second against
        # the bare app's, from the server's own CPU time per request.
        capacity = per_round({"mine": [r["cpu_us"] for r in rounds[s]],
                              "base": [r["cpu_us"] for r in rounds["plain"]]},
                             lambda mine, base: base / mine)
        result[f"{s}_capacity"] = Spread.of(capacity).as_dict()
    return result


_SMALL_SCOPE = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": "POST", "scheme": "http", "path": "/small", "raw_path": b"/small",
                "query_string": b"", "root_path": "",
                "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000)}


def inprocess(args) -> dict:
    """The same apps driven through ASGI in this process, no server and no
    network: each side times its own requests in thread CPU time, so what
    is left between the sides is the middleware's own cost."""
    from benchmarks import http_app

    apps = {}
    for side in SIDES:
        os.environ["PYLIMITER_BENCH_VARIANT"] = side
        apps[side] = http_app.create()
    os.environ.pop("PYLIMITER_BENCH_VARIANT")
    # The middlewares alone: around an app that reads the body and answers,
    # nothing else (the FastAPI figures carry the framework's own noise).
    apps["minimal"] = _minimal
    apps["minimal+pylimiter"] = MemoryLimitMiddleware(_minimal, AsyncSemaphore(1 << 30))
    apps["minimal+asyncio"] = http_app.SemaphoreMiddleware(_minimal, 1000)
    body = {"type": "http.request", "body": b"x" * args.body, "more_body": False}
    headers = [(b"host", b"127.0.0.1"), (b"content-length", str(args.body).encode()),
               (b"content-type", b"application/octet-stream")]

    async def receive():
        return body

    async def send(message):
        pass

    def side(app):
        async def batch() -> float:
            t0 = CPU()
            for _ in range(args.inprocess_requests):
                await app({**_SMALL_SCOPE, "headers": headers}, receive, send)
            return (CPU() - t0) / args.inprocess_requests / 1000

        return lambda: asyncio.run(batch())

    rounds = interleaved({s: side(a) for s, a in apps.items()}, rounds=args.rounds, warmup=1,
                         before=gc.collect)
    result = {"requests_per_round": args.inprocess_requests, "rounds": args.rounds}
    for s in apps:
        result[s] = Spread.of(rounds[s]).as_dict()
    for base, mine in (("plain", "pylimiter"), ("plain", "asyncio"),
                       ("minimal", "minimal+pylimiter"), ("minimal", "minimal+asyncio")):
        result[f"{mine}_extra_us"] = Spread.of(per_round(
            {"mine": rounds[mine], "base": rounds[base]},
            lambda mine, base: mine - base)).as_dict()
        result[f"{mine}_capacity"] = Spread.of(per_round(
            {"mine": rounds[mine], "base": rounds[base]},
            lambda mine, base: base / mine)).as_dict()
    return result


async def _minimal(scope, receive, send):
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def _uploads(base: str, n: int, size: int, hold: float) -> list[int]:
    import httpx

    body = b"x" * size
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=n + 8),
                                 timeout=httpx.Timeout(300.0)) as http:
        async def one():
            r = await http.post(f"{base}/upload?hold={hold}", content=body)
            return r.status_code

        return await asyncio.gather(*(one() for _ in range(n)))


def rss(args, tmp: Path) -> dict:
    server_cpu, client_cpu = cpus()
    os.sched_setaffinity(0, client_cpu)
    budget = args.budget_mib * MiB
    env = {"plain": {}, "pylimiter": {"PYLIMITER_BENCH_BUDGET": str(budget)}}

    def side(variant: str):
        def measure() -> dict:
            # A fresh process each time: memory a round freed stays in the
            # allocator's arenas and would hide the next round's growth.
            srv = Uvicorn(variant, server_cpu, tmp / f"rss-{variant}.log", **env[variant])
            try:
                asyncio.run(_uploads(srv.base, 4, MiB, 0))   # the code paths, warmed
                before = srv.status("VmRSS")
                srv.reset_peak()
                t0 = time.perf_counter()
                codes = asyncio.run(_uploads(srv.base, args.uploads, MiB, args.hold))
                took = time.perf_counter() - t0
                peak = srv.status("VmHWM")
            finally:
                srv.stop()
            assert codes == [200] * args.uploads, f"not every upload was served: {codes}"
            return {"growth": peak - before, "before": before, "seconds": took}
        return measure

    rounds = interleaved({s: side(s) for s in env}, rounds=args.rss_rounds, warmup=0)
    result = {"uploads": args.uploads, "upload_bytes": MiB, "hold_s": args.hold,
              "budget_bytes": budget, "rounds": args.rss_rounds}
    for s in env:
        result[s] = {k: Spread.of([r[k] for r in rounds[s]]).as_dict()
                     for k in ("growth", "before", "seconds")}
    ratio = per_round({"mine": [r["growth"] for r in rounds["pylimiter"]],
                       "base": [r["growth"] for r in rounds["plain"]]},
                      lambda mine, base: mine / base)
    result["pylimiter_over_plain"] = Spread.of(ratio).as_dict()
    return result


def report(tp: dict | None, mem: dict | None, inproc: dict | None = None) -> str:
    lines = []
    if inproc:
        lines += [f"In process (FastAPI app called through ASGI, no server): thread CPU "
                  f"time per request, {inproc['rounds']} interleaved rounds of "
                  f"{inproc['requests_per_round']} requests", "",
                  "| app | us/request median [IQR] | extra us/request [IQR] | "
                  "requests per CPU-second vs no middleware [IQR] |",
                  "|---|---:|---:|---:|"]
        labels = {**LABELS, "minimal": "minimal ASGI app",
                  "minimal+pylimiter": "minimal + MemoryLimitMiddleware",
                  "minimal+asyncio": "minimal + asyncio.Semaphore middleware"}
        for s in (*SIDES, "minimal", "minimal+pylimiter", "minimal+asyncio"):
            r = inproc[s]
            extra = capacity = "(anchor)"
            if s not in ("plain", "minimal"):
                extra = "{median:.2f} [{q1:.2f}-{q3:.2f}]".format(**inproc[f"{s}_extra_us"])
                capacity = "{median:.3f} [{q1:.3f}-{q3:.3f}]".format(**inproc[f"{s}_capacity"])
            lines.append(f"| {labels[s]} | {r['median']:.2f} [{r['q1']:.2f}-{r['q3']:.2f}] | "
                         f"{extra} | {capacity} |")
        lines.append("")
    if tp:
        lines += [f"Throughput: small POST ({tp['body_bytes']} B), wrk -t1 "
                  f"-c{tp['connections']}, {tp['rounds']} interleaved rounds of "
                  f"{tp['duration_s']:g} s; server CPU {tp['server_cpus']}, wrk CPU "
                  f"{tp['client_cpus']}", "",
                  "| server | requests/s median [IQR] | p50 ms | p99 ms | "
                  "requests/s vs no middleware [IQR] | server CPU us/request | "
                  "requests per CPU-second vs no middleware [IQR] |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for s in SIDES:
            r = tp[s]["rps"]
            ratio = capacity = "1 (anchor)"
            if s != "plain":
                ratio = "{median:.3f} [{q1:.3f}-{q3:.3f}]".format(**tp[f"{s}_over_plain"])
                capacity = "{median:.3f} [{q1:.3f}-{q3:.3f}]".format(**tp[f"{s}_capacity"])
            lines.append(f"| {LABELS[s]} | {r['median']:.0f} [{r['q1']:.0f}-{r['q3']:.0f}] | "
                         f"{tp[s]['p50_ms']['median']:.2f} | {tp[s]['p99_ms']['median']:.2f} | "
                         f"{ratio} | {tp[s]['cpu_us']['median']:.0f} | {capacity} |")
        lines.append("")
    if mem:
        lines += [f"Broker-style RSS: {mem['uploads']} concurrent 1 MiB uploads, each body "
                  f"held {mem['hold_s']:g} s; budget {mem['budget_bytes'] // MiB} MiB; "
                  f"{mem['rounds']} interleaved rounds", "",
                  "| server | peak RSS growth MiB, median [IQR] | RSS before MiB | seconds |",
                  "|---|---:|---:|---:|"]
        for s in ("plain", "pylimiter"):
            g, b, t = mem[s]["growth"], mem[s]["before"], mem[s]["seconds"]
            lines.append(f"| {LABELS[s]} | {g['median'] / MiB:.1f} [{g['q1'] / MiB:.1f}-"
                         f"{g['q3'] / MiB:.1f}] | {b['median'] / MiB:.1f} | "
                         f"{t['median']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.http_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="throughput rounds (default: 10)")
    p.add_argument("--duration", type=int, default=2,
                   help="seconds of wrk per side and round (default: 2)")
    p.add_argument("--connections", type=int, default=32, help="wrk connections (default: 32)")
    p.add_argument("--body", type=int, default=256, help="small POST body bytes (default: 256)")
    p.add_argument("--rss-rounds", type=int, default=3, help="RSS rounds (default: 3)")
    p.add_argument("--uploads", type=int, default=200, help="concurrent uploads (default: 200)")
    p.add_argument("--hold", type=float, default=0.5,
                   help="seconds each upload handler holds its body (default: 0.5)")
    p.add_argument("--budget-mib", type=int, default=16,
                   help="the middleware's budget for the RSS part (default: 16)")
    p.add_argument("--inprocess-requests", type=int, default=2000,
                   help="requests per side and round in process (default: 2000)")
    p.add_argument("--only", choices=("inprocess", "throughput", "rss"), help="run one part")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    parts = [args.only] if args.only else ["inprocess", "throughput", "rss"]
    if "throughput" in parts and shutil.which("wrk") is None:
        p.error("wrk is not installed (Debian: apt-get install wrk)")
    with tempfile.TemporaryDirectory(prefix="http_bench-") as d:
        tmp = Path(d)
        inproc = inprocess(args) if "inprocess" in parts else None
        tp = throughput(args, tmp) if "throughput" in parts else None
        mem = rss(args, tmp) if "rss" in parts else None
    print(report(tp, mem, inproc))
    if args.json:
        args.json.write_text(json.dumps({"inprocess": inproc, "throughput": tp, "rss": mem,
                                         "python": sys.version.split()[0]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
