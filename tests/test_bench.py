"""The benchmark harness: every scenario's trial on both implementations
(no Spark), the Spark runner end to end on a tiny grid, and the CLI's
handling of bad input."""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys

import pytest

from pylimiter.bench.scenarios import SCENARIOS, run_trial


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_trial_row_is_complete_and_clean(impl, scenario):
    name = impl.tag
    row = run_trial(scenario, name, 8, 4, budget_s=0.01)
    assert row["scenario"] == scenario and row["impl"] == name
    assert row["ops"] > 0 and row["ns_per_op"] > 0
    assert row["ops_per_s"] == pytest.approx(1e9 / row["ns_per_op"])
    assert row["errors"] == 0
    assert row["leaked_permits"] == 0
    if SCENARIOS[scenario].anchor:
        assert row["anchor_ns_per_op"] > 0
        assert row["speedup"] == pytest.approx(row["anchor_ns_per_op"] / row["ns_per_op"])
    else:
        assert row["anchor_ns_per_op"] is None and row["speedup"] is None
    if scenario in ("tasks", "threads", "weighted", "dual", "uncontended-async",
                    "uncontended-threads", "scaling"):
        assert 0 <= row["wait_p50_us"] <= row["wait_p99_us"] <= row["wait_max_us"]


def test_trial_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown scenario"):
        run_trial("nope", "c", 1, 1)
    with pytest.raises(ValueError, match="unknown implementation"):
        run_trial("tasks", "rust", 1, 1)


def _cli(*args, timeout=300):
    env = {k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"}
    return subprocess.run([sys.executable, "-m", "pylimiter.bench", *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _one_line_error(proc, needle):
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) >= 1 and needle in lines[-1], proc.stderr
    assert "at org.apache" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_cli_unknown_scenario():
    proc = _cli("--scenarios", "tasks,warp-drive")
    _one_line_error(proc, "unknown 'warp-drive'")
    assert proc.returncode == 2


@pytest.mark.slow
def test_cli_zero_repeats():
    proc = _cli("--repeats", "0")
    _one_line_error(proc, "must be at least 1")
    assert proc.returncode == 2


@pytest.mark.slow
def test_cli_master_that_does_not_answer():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _cli("--master", f"spark://127.0.0.1:{port}", timeout=60)
    _one_line_error(proc, "does not answer")
    assert proc.returncode == 2


@pytest.mark.slow
def test_cli_unsupported_master():
    proc = _cli("--master", "mesos://127.0.0.1:5050")
    _one_line_error(proc, "unsupported master URL")


def _rows(out, name):
    (part,) = (out / f"{name}.csv").glob("part-*.csv")
    with part.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.c_extension
def test_spark_runner_end_to_end(spark, tmp_path, capsys):
    """The whole runner on the shared session: grid, scaling, SQL summaries,
    tables and report."""
    from pylimiter.bench.runner import main

    out = tmp_path / "bench"
    rc = main(["--scenarios", "tasks,uncontended-threads,scaling",
               "--concurrency", "4", "--repeats", "2", "--budget", "0.02",
               "--scaling", "2", "--no-progress", "--out", str(out)], spark=spark)
    cap = capsys.readouterr()
    assert rc == 0, cap.out[-3000:] + cap.err[-3000:]
    assert "pylimiter benchmark grid" in cap.out
    assert f"report: {(out / 'index.html').resolve()}" in cap.out
    assert not spark.sparkContext._jsc.sc().isStopped()   # a passed session is left running

    trials = _rows(out, "results")
    # 2 scenarios x 2 implementations x 1 concurrency x 2 repeats.
    assert len(trials) == 8
    assert {(r["scenario"], r["impl"]) for r in trials} == {
        (s, i) for s in ("tasks", "uncontended-threads") for i in ("c", "python")}
    for r in trials:
        assert r["failure"] == ""
        assert float(r["ns_per_op"]) > 0 and float(r["anchor_ns_per_op"]) > 0
        assert int(r["leaked_permits"]) == 0 and int(r["errors"]) == 0
    summary = _rows(out, "summary")
    assert len(summary) == 4
    for s in summary:
        assert int(s["trials"]) == 2
        mine = [float(r["speedup"]) for r in trials
                if (r["scenario"], r["impl"]) == (s["scenario"], s["impl"])]
        assert float(s["median_speedup"]) == pytest.approx(sorted(mine)[0] / 2 + sorted(mine)[1] / 2)
    scaling = _rows(out, "scaling")
    assert {(r["impl"], r["executors"]) for r in scaling} == {
        (i, k) for i in ("c", "python") for k in ("1", "2")}
    assert len(_rows(out, "scaling_trials")) == 2 * (1 + 2) * 2  # impls x tasks x repeats
    for name in ("index.html", "throughput.png", "speedup.png", "latency.png", "scaling.png"):
        assert (out / name).stat().st_size > 0, name
    assert list((out / "results.parquet").glob("part-*.parquet"))
    html = (out / "index.html").read_text()
    assert "speedup.png" in html and "<table>" in html
