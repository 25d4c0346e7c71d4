"""pylimiter.bench.report: the terminal summary."""

from __future__ import annotations

import os

import pytest


def test_summary_fits_100_columns_and_explains_n_and_k():
    pd = pytest.importorskip("pandas")
    pytest.importorskip("rich")
    from rich.console import Console

    from pylimiter.bench.report import print_summary

    row = dict(scenario="uncontended-threads", impl="python", concurrency=1000, permits=10,
               median_ns=123456.0, anchor="asyncio.timeout+Semaphore", median_speedup=17.5,
               q1_speedup=17.49, q3_speedup=17.52, median_cost_ratio=0.42, wait_p99_us=12345.6,
               errors=0, leaked_permits=0, failed_trials=0)
    scaling = pd.DataFrame([dict(impl="python", executors=2, trials=10,
                                 median_ops_per_s_per_executor=6.8e6, aggregate_ops_per_s=1.3e7)])
    with open(os.devnull, "w") as sink:
        console = Console(width=100, record=True, file=sink)
        print_summary(pd.DataFrame([row]), scaling, console=console)
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 100
    assert "17.50x" in text and "17.49-17.52" in text and "0.42" in text
    assert "uncontended-threads" in text and "…" not in text   # nothing cut off
    assert "N: tasks, threads or waiters at once; K: permits" in text
