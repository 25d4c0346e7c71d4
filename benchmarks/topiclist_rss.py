"""Broker peak-RSS growth against concurrent clients listing a namespace of
100,000 topics, with PIP-442 limits on and off.

    python -m benchmarks.topiclist_rss [--clients 1,10,50,100,250,500] [--topics 100000]

For every (limits, clients) point a fresh broker process is started on
127.0.0.1 (so its peak RSS belongs to that point alone), its RSS is read
once it is up (baseline), then `clients` connections each request the list
`--requests` times (bounded also by `--duration`), and the broker's peak RSS
is read from its metrics (getrusage ru_maxrss).  growth = peak - baseline.
Results: benchmarks/results/topiclist_rss.csv and .png, and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import subprocess
import sys
import time
from pathlib import Path

import psutil

from pylimiter.spark.report import pyplot, save_figure
from pylimiter.pulsar.topiclist.loadgen import run_load

MB = 1024 * 1024
OUT = Path(__file__).resolve().parent / "results"


def start_broker(topics: int, heap_mb: float, direct_mb: float):
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylimiter.pulsar.topiclist", "broker", "--topics", str(topics),
         "--heap-mb", str(heap_mb), "--direct-mb", str(direct_mb)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = admin = None
    for _ in range(5):
        line = proc.stdout.readline()
        if line.startswith("broker:"):
            parts = line.split()
            url, admin = parts[1], parts[3]
            break
    if not url:
        proc.kill()
        raise RuntimeError("broker did not start")
    time.sleep(0.5)
    return proc, url, admin


def measure(topics: int, clients: int, heap_mb: float, direct_mb: float, requests: int,
            duration: float, read_delay: float) -> dict:
    proc, url, admin = start_broker(topics, heap_mb, direct_mb)
    try:
        # Start-up builds the topic list and frees temporaries, leaving a
        # high-water mark above the idle RSS.  Reset the kernel's mark
        # (clear_refs 5 resets VmHWM) so the peak read after the load is the
        # load's own; fall back to the server's ru_maxrss if that is refused.
        base = psutil.Process(proc.pid).memory_info().rss
        try:
            Path(f"/proc/{proc.pid}/clear_refs").write_text("5")
            hwm_reset = True
        except OSError:
            hwm_reset = False
        res = asyncio.run(run_load(url, "public/default", clients, duration, admin_url=admin,
                                   max_requests=clients * requests, request_timeout=300,
                                   read_delay=read_delay))
        peak = _vm_hwm(proc.pid) if hwm_reset else res.server.get("process_peak_rss_bytes", 0)
    finally:
        proc.terminate()
        proc.communicate(timeout=20)
    s = res.summary()
    return {
        "limits": "on" if heap_mb > 0 else "off",
        "heap_mb": heap_mb, "direct_mb": direct_mb, "clients": clients,
        "baseline_rss_mb": round(base / MB, 1), "peak_rss_mb": round(peak / MB, 1),
        "growth_mb": round((peak - base) / MB, 1),
        "peak_heap_permits_mb": round(res.server.get("heap_memory_peak_bytes", 0) / MB, 1),
        "peak_direct_permits_mb": round(res.server.get("direct_memory_peak_bytes", 0) / MB, 1),
        "responses": s["responses"], "too_many_requests": s["too_many_requests"],
        "other_errors": s["other_errors"], "rps": s["rps"],
        "p50_ms": round(s["p50_ms"] or 0, 1), "p99_ms": round(s["p99_ms"] or 0, 1),
        "seconds": round(s["duration_s"], 1), "read_delay_s": read_delay,
    }


def _vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def plot(rows, path: Path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for lim, color in (("off", "#d62728"), ("on", "#2ca02c")):
        pts = [r for r in rows if r["limits"] == lim]
        ax.plot([r["clients"] for r in pts], [r["growth_mb"] for r in pts], "o-", color=color,
                label=f"limits {lim}")
    on = [r for r in rows if r["limits"] == "on"]
    if on:
        bound = on[0]["heap_mb"] + on[0]["direct_mb"]
        ax.axhline(bound, color="#2ca02c", ls="--", lw=0.8,
                   label=f"heap + direct limit ({bound:g} MB)")
    ax.set_xscale("log")
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("broker peak RSS growth, MB")
    ax.set_title("topic list of 100k topics: RSS growth vs clients")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", default="1,10,50,100,250,500")
    ap.add_argument("--topics", type=int, default=100_000)
    ap.add_argument("--heap-mb", type=float, default=32)
    ap.add_argument("--direct-mb", type=float, default=32)
    ap.add_argument("--requests", type=int, default=2, help="per client")
    ap.add_argument("--duration", type=float, default=300.0, help="cap per point, seconds")
    ap.add_argument("--read-delay", type=float, default=2.0,
                    help="each client waits this long before reading its response")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--name", default="topiclist_rss", help="file stem of the results")
    args = ap.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    rows = []
    for lim in ("off", "on"):
        for n in clients:
            h, d = (args.heap_mb, args.direct_mb) if lim == "on" else (0, 0)
            r = measure(args.topics, n, h, d, args.requests, args.duration, args.read_delay)
            rows.append(r)
            print(r, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    plot(rows, args.out / f"{args.name}.png")
    print("\n| limits | clients | RSS growth MB | peak heap permits MB | peak direct permits MB "
          "| responses | TooManyRequests | req/s | p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['limits']} | {r['clients']} | {r['growth_mb']} | {r['peak_heap_permits_mb']} "
              f"| {r['peak_direct_permits_mb']} | {r['responses']} | {r['too_many_requests']} "
              f"| {r['rps']} | {r['p50_ms']} | {r['p99_ms']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
