"""Print the comparison table from a pytest-benchmark JSON file: median ns per
operation, and the ratios the targets in benchmarks/README.md are stated in.
All numbers come from the same run."""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict

from rich.console import Console
from rich.table import Table


def load(path):
    data = json.load(open(path))
    rows = {}
    for b in data["benchmarks"]:
        params = b.get("params") or {}
        loop = params.get("loop", "-")
        impl = params.get("impl", "?")
        ops = b["extra_info"].get("ops", 1)
        rows[(b["group"], loop, impl)] = {
            "ns": b["stats"]["median"] * 1e9 / ops,
            "iqr": b["stats"]["iqr"] * 1e9 / ops,
            "extra": b["extra_info"],
        }
    return data, rows


def main(path):
    data, rows = load(path)
    console = Console(width=140)
    groups = defaultdict(list)
    for (g, loop, impl), r in rows.items():
        groups[(g, loop)].append((impl, r))
    table = Table(title=f"pylimiter micro benchmarks ({data['machine_info']['python_implementation']} "
                        f"{data['machine_info']['python_version']}), median ns per op")
    for col in ("scenario", "loop", "implementation", "ns/op", "IQR", "notes"):
        table.add_column(col)
    for (g, loop), items in sorted(groups.items()):
        for impl, r in sorted(items, key=lambda x: x[1]["ns"]):
            extra = {k: v for k, v in r["extra"].items() if k != "ops"}
            table.add_row(g, loop, impl, f"{r['ns']:.0f}", f"{r['iqr']:.0f}",
                          ", ".join(f"{k}={v}" for k, v in extra.items()))
    console.print(table)

    def ns(g, loop, impl):
        r = rows.get((g, loop, impl))
        return None if r is None else r["ns"]

    targets = Table(title="targets (ratios within this run)")
    for col in ("target", "loop", "measured", "goal", "verdict"):
        targets.add_column(col)
    py311 = sys.version_info[:2] == (3, 11)
    for loop in ("asyncio", "uvloop"):
        c, a = ns("uncontended-async", loop, "c"), ns("uncontended-async", loop, "asyncio.Semaphore")
        if c and a:
            goal = 3.0 if py311 else 2.0
            targets.add_row("await acquire(1)+release vs asyncio.Semaphore", loop,
                            f"{a / c:.2f}x faster", f">= {goal:.0f}x",
                            "PASS" if a / c >= goal else "MISS")
        c, base, a = (ns("1000-tasks-10-permits", loop, k) for k in ("c", "baseline", "asyncio.Semaphore"))
        if c and base and a:
            ratio = (c - base) / (a - base)
            targets.add_row("1000 tasks/10 permits: cost over baseline vs asyncio", loop,
                            f"{ratio:.2f} of asyncio's", "<= 0.50", "PASS" if ratio <= 0.5 else "MISS")
        c, a = ns("10k-parked-cancel-newest-first", loop, "c"), ns("10k-parked-cancel-newest-first", loop, "asyncio.Semaphore")
        if c and a:
            targets.add_row("10k parked, cancel newest-first, per waiter", loop,
                            f"{a / c:.1f}x cheaper", ">= 5x", "PASS" if a / c >= 5 else "MISS")
        c, base, a = (ns("10k-parked-timeout", loop, k) for k in ("c", "baseline", "asyncio.Semaphore"))
        if c and base and a:
            ratio = (c - base) / (a - base)
            targets.add_row("10k parked timing out: cost over parking vs asyncio.timeout", loop,
                            f"{ratio:.2f} of asyncio's", "<= 0.33", "PASS" if ratio <= 1 / 3 else "MISS")
        w = rows.get(("weighted-1-to-8-of-10", loop, "c"))
        if w:
            ok = w["extra"].get("overtakes") == 0 and not w["extra"].get("deadlocked")
            others = "; ".join(
                f"{impl}: overtakes={r['extra'].get('overtakes')}, deadlocked={r['extra'].get('deadlocked')}"
                for (g, lp, impl), r in rows.items() if g == "weighted-1-to-8-of-10" and lp == loop and impl != "c")
            targets.add_row("weighted 1..8 of 10: FIFO, no overtaking", loop,
                            f"overtakes={w['extra'].get('overtakes')} ({others})", "0 overtakes", "PASS" if ok else "MISS")
    c, s, lk = (ns("uncontended-blocking", "-", k) for k in ("c", "threading.Semaphore", "threading.Lock"))
    if c and s and lk:
        targets.add_row("acquire_blocking(1)+release vs threading.Semaphore", "-", f"{s / c:.2f}x faster", ">= 4x", "PASS" if s / c >= 4 else "MISS")
        targets.add_row("acquire_blocking(1)+release vs threading.Lock", "-", f"{c / lk:.2f}x Lock's time", "<= 2x", "PASS" if c / lk <= 2 else "MISS")
    console.print(targets)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "reports/micro.json")
