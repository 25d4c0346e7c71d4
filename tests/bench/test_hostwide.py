"""pylimiter.bench.hostwide without Spark: the host-wide trial run by plain
processes that meet at a multiprocessing.Barrier, as Spark's barrier stage
makes its Python workers do."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time

import pytest

from pylimiter.bench.hostwide import (
    HOST_FIELDS,
    HOST_SCENARIOS,
    Board,
    load_loop,
    new_run_id,
    run_host_trial,
)


def _trial(scenario, impl, k, part, run, directory, barrier, results):
    rows = run_host_trial(scenario, impl, k, part, run=run, rounds=2, budget_s=0.25,
                          barrier=barrier.wait, directory=directory, warmup=0, tasks=10,
                          permits=4, lead_s=0.3)
    results.put(rows)


def _stage(scenario, impl, k, directory):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(k, timeout=60), ctx.Queue()
    run = new_run_id()
    procs = [ctx.Process(target=_trial, args=(scenario, impl, k, i, run, directory, barrier,
                                              results), daemon=True) for i in range(k)]
    try:
        for p in procs:
            p.start()
        rows = [r for _ in procs for r in results.get(timeout=120)]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(HOST_SCENARIOS))
def test_host_stage_keeps_the_budget_and_cleans_up(impl, scenario, tmp_path):
    rows = _stage(scenario, impl.tag, 2, str(tmp_path))
    names = {name for name, _ in HOST_FIELDS}
    limit = 1 if scenario == "host-handoff" else 4
    sides = ("shared", "flock") if scenario == "host-handoff" else ("shared",)
    # 2 processes x 2 rounds x the scenario's sides, each row complete
    assert len(rows) == 2 * 2 * len(sides)
    assert {(r["round"], r["side"]) for r in rows} == {(i, s) for i in (0, 1) for s in sides}
    assert len({r["pid"] for r in rows}) == 2
    for r in rows:
        assert set(r) <= names
        assert r["failure"] is None and r["errors"] == 0, r
        assert r["limit"] == limit and r["grants"] > 0
        assert 0 < r["seconds"] <= 0.25
        assert r["grants_per_s"] == pytest.approx(r["grants"] / r["seconds"])
        # Both processes idle at the end: nothing held or queued, host-wide.
        assert r["leaked"] == 0 and r["unbalanced"] == 0
        if r["side"] == "shared":
            # The segment's high-water mark: the limit reached, never passed.
            assert r["peak"] == limit
    shared = [r for r in rows if r["side"] == "shared"]
    if scenario == "host-handoff":
        assert sum(r["handoffs"] for r in shared) > 0
        timed = [r for r in rows if r["handoffs"]]
        assert all(0 < r["handoff_p50_us"] <= r["handoff_p99_us"] for r in timed)
    else:
        assert all(0 < r["wait_p50_us"] <= r["wait_p99_us"] <= r["wait_max_us"]
                   for r in shared)
    # The segment, the board and the flock file are gone.
    assert os.listdir(tmp_path) == []


def test_unknown_host_scenario():
    with pytest.raises(ValueError, match="unknown host-wide scenario"):
        run_host_trial("host-warp", "c", 1, 0, run="x", rounds=1, budget_s=0.01,
                       barrier=lambda: None)


def test_load_loop_counts_only_the_window_and_drains():
    """Grants after the window are released but not counted; every grant is
    released; each task's count is kept."""
    held = []

    async def main():
        sem = asyncio.Semaphore(2)

        async def acquire():
            await sem.acquire()
            held.append(1)
            return len(held)

        def release(_token):
            held.pop()
            sem.release()

        now = time.monotonic_ns()
        return await load_loop(acquire, release, tasks=5, hold_s=0.002, start_ns=now,
                               end_ns=now + 50_000_000)

    t = asyncio.run(main())
    assert held == []
    assert t.releases == t.total >= t.grants > 0
    assert sum(t.per_task) == t.grants == len(t.waits)
    assert all(n > 0 for n in t.per_task)


def test_board_round_trips_between_mappings(tmp_path):
    a, b = Board(str(tmp_path / "b")), Board(str(tmp_path / "b"))
    try:
        assert a.read() == (0, 0)
        a.write(1234, 5678)
        assert b.read() == (1234, 5678)
    finally:
        a.close()
        b.close()


def test_remove_run_files_takes_only_this_runs(tmp_path):
    from pylimiter.bench.hostwide_pipeline import remove_run_files

    uid = os.getuid()
    mine = [f"pylimiter-{uid}-bench-abc-host-load-c-k2", f"pylimiter-{uid}-bench-abc-x.board"]
    others = [f"pylimiter-{uid}-bench-abd-host-load-c-k2", f"pylimiter-{uid}-uploads",
              "bench-abc-host-load"]
    for n in mine + others:
        (tmp_path / n).write_text("")
    assert sorted(remove_run_files(str(tmp_path), "abc")) == sorted(mine)
    assert sorted(os.listdir(tmp_path)) == sorted(others)
