"""Print the micro suite's results from its pytest-benchmark JSON file: the
uncontended ns/op rows, then the figures (ratios measured side by side in
one test, see benchmarks/figures.py) against issue 14's targets.

    python -m benchmarks.micro.report reports/micro.json
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict

from rich.console import Console
from rich.table import Table

WIDTH = 100


def load(path):
    """(pytest-benchmark data, {(group, loop, impl): ns row}, [figure rows])."""
    with open(path) as f:
        data = json.load(f)
    rows, figures = {}, []
    for b in data["benchmarks"]:
        if b["group"] == "figures":
            if "median" in b["extra_info"]:
                figures.append(b["extra_info"])
            continue
        params = b.get("params") or {}
        ops = b["extra_info"].get("ops", 1)
        rows[(b["group"], params.get("loop", "-"), params.get("impl", "?"))] = {
            "ns": b["stats"]["median"] * 1e9 / ops,
            "iqr": b["stats"]["iqr"] * 1e9 / ops,
            "extra": {k: v for k, v in b["extra_info"].items() if k != "ops"},
        }
    return data, rows, figures


def _fmt(kind, v):
    return f"{v:.2f}x" if kind in ("faster", "slower") else f"{v:.2f}"


def main(path="reports/micro.json") -> int:
    data, rows, figures = load(path)
    console = Console(width=WIDTH)
    mi = data["machine_info"]
    groups = defaultdict(list)
    for (g, loop, impl), r in rows.items():
        groups[(g, loop)].append((impl, r))
    t = Table(title=f"uncontended, median ns per op ({mi['python_implementation']} "
                    f"{mi['python_version']})")
    for col in ("scenario", "loop", "implementation", "ns/op", "IQR", "notes"):
        t.add_column(col, justify="right" if col in ("ns/op", "IQR") else "left",
                     no_wrap=col != "notes")
    for (g, loop), items in sorted(groups.items()):
        for impl, r in sorted(items, key=lambda x: x[1]["ns"]):
            t.add_row(g, loop, impl, f"{r['ns']:.0f}", f"{r['iqr']:.0f}",
                      ", ".join(f"{k}={v}" for k, v in r["extra"].items()))
    console.print(t)

    f = Table(title="figures: median over interleaved rounds [IQR], same process")
    for col in ("figure", "loop", "measured", "goal", "verdict"):
        f.add_column(col)
    for r in figures:
        goal = "" if r["target"] is None else (
            (">= " if r["kind"] == "faster" else "<= ") + _fmt(r["kind"], r["target"]))
        verdict = {True: "PASS", False: "MISS", None: ""}[r["meets"]]
        f.add_row(r["figure"], r["loop"],
                  f"{_fmt(r['kind'], r['median'])} [{r['q1']:.2f}-{r['q3']:.2f}]", goal, verdict)
    console.print(f)
    console.print("x faster = anchor time / pylimiter's; cost = (pylimiter - baseline) / "
                  "(anchor - baseline); x slower = pylimiter's time / anchor's.  Titles: "
                  "benchmarks/figures.py; every Python at once: make bench-table.")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
