"""benchmarks.shared_bench at a tiny scale: every figure of the host-wide
limiter's table comes out, each with its anchor, the verdicts follow the
goals, the files are written, and no process or segment is left behind.
(benchmarks/ is not part of the distribution: these skip in an installed
wheel's test run.)"""

from __future__ import annotations

import csv
import multiprocessing
import os

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.c_extension]

FIGURES = ["blocking", "blocking-inproc", "blocking-locked", "weight8", "async-with",
           "handoff-thread-p50", "handoff-task-p50", "handoff-task-waker-p50",
           "handoff-thread-p99", "handoff-task-p99", "handoff-task-waker-p99"]


def _bench():
    return pytest.importorskip("benchmarks.shared_bench")


def test_percentile_is_a_sample_of_the_data():
    sb = _bench()
    assert sb._pct([5, 1, 3], 0.5) == 3
    assert sb._pct(list(range(100)), 0.99) == 98
    assert sb._pct([7], 0.99) == 7


def test_every_figure_with_its_anchor_and_verdict(tmp_path, capsys):
    sb = _bench()
    before = set(os.listdir("/dev/shm"))
    assert sb.main(["--rounds", "2", "--handoffs", "5", "--handoff-rounds", "2",
                    "--out", str(tmp_path)]) == 0
    assert multiprocessing.active_children() == []
    # The segments lived in a temporary directory under /dev/shm: gone.
    assert not [n for n in set(os.listdir("/dev/shm")) - before
                if n.startswith("pylimiter-bench-")]
    with open(tmp_path / "shared_bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["figure"] for r in rows] == FIGURES
    md = (tmp_path / "shared_bench.md").read_text()
    assert md in capsys.readouterr().out
    assert "hand-off 2 rounds x 5" in md
    for r in rows:
        assert f"`{r['figure']}`" in md
        q1, med, q3 = float(r["q1"]), float(r["median"]), float(r["q3"])
        assert 0 < q1 <= med <= q3, r
        goal = float(r["goal"]) if r["goal"] else None
        if r["figure"].startswith("handoff-"):
            mine, anchor, floor = (float(r[k]) for k in ("mine_us", "anchor_us", "floor_us"))
            assert mine > 0 and anchor > 0 and floor > 0, r
        else:
            assert float(r["mine_ns_per_op"]) > 0 and float(r["anchor_ns_per_op"]) > 0
        if r["figure"] == "handoff-task-p50":
            assert r["meets"] == str(float(r["mine_us"]) <= 40.0)
        elif goal is None:
            assert r["meets"] == ""
        elif r["kind"] == "faster":
            assert r["meets"] == str(med >= goal)
        else:
            assert r["meets"] == str(med <= goal)
    # The p99 of a side is never below its p50 (the same rounds).
    by = {r["figure"]: r for r in rows}
    for side in ("thread", "task", "task-waker"):
        assert float(by[f"handoff-{side}-p99"]["mine_us"]) >= \
            float(by[f"handoff-{side}-p50"]["mine_us"])
