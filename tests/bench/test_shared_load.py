"""benchmarks.shared_load at a small scale (3 processes x 10 tasks through 4
permits, 1 s rounds): the host's budget is never exceeded and every
process's books balance, on both implementations and, where redis-server
is installed, on the hand-built Redis semaphore.  (benchmarks/ is not part
of the distribution: these skip in an installed wheel's test run.)"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def _run(side):
    load = pytest.importorskip("benchmarks.shared_load")
    rows = load.run_load([side], processes=3, tasks=10, permits=4, seconds=1.0, rounds=2,
                         warmup_s=0, log=lambda _: None)
    assert [(r["round"], r["side"]) for r in rows] == [(0, side), (1, side)]
    return load, rows


def test_load_keeps_the_host_budget_and_the_books(impl):
    side = impl.tag
    load, rows = _run(side)
    for r in rows:
        # 30 tasks on 4 permits: the load reaches the limit, never more.
        assert r["peak"] == 4
        assert r["books"] == "balanced" and r["left_held"] == 0
        assert r["errors"] == 0 and r["grants"] > 0
        # Every grant the processes counted is in the segment's counter.
        assert r["host_grants"] == r["total"] >= r["grants"]
        # Strict FIFO: no task is left out.
        assert r["task_grants_min"] > 0
        assert 0 < r["wait_p50_us"] <= r["wait_p99_us"] <= r["wait_max_us"]
    summary = load.summarise(rows, 4)
    assert summary[0]["side"] == side and summary[0]["peak"] == 4
    assert "| " + load.LABELS[side] in load.table(summary, "test")


def test_load_on_redis_keeps_its_books():
    load = pytest.importorskip("benchmarks.shared_load")
    why = load.redis_available()
    if why:
        pytest.skip(why)
    _, rows = _run("redis")
    for r in rows:
        assert 0 < r["peak"] <= 4
        assert r["books"] == "balanced" and r["left_held"] == 0
        assert r["host_grants"] == r["total"] and r["errors"] == 0
        assert r["expired_leases"] == 0


def test_load_asserts_the_budget(monkeypatch):
    """A high-water mark above the limit stops the benchmark: the check is
    an assertion on the segment's own number, not a printout."""
    load = pytest.importorskip("benchmarks.shared_load")
    from pylimiter._impls import IMPLEMENTATIONS

    cls = IMPLEMENTATIONS["python"].module_of("shared").SharedSemaphore
    monkeypatch.setattr(cls, "peak_acquired_permits", property(lambda self: 5))
    with pytest.raises(AssertionError, match="budget exceeded: high-water mark 5 > limit 4"):
        load.run_load(["python"], processes=1, tasks=2, permits=4, seconds=0.2, rounds=1,
                      warmup_s=0, log=lambda _: None)
