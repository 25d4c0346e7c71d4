"""python -m pylimiter.bench: the Spark pipeline end to end on a tiny grid,
the command line's handling of bad input and Ctrl-C."""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests._helpers import needs_pyspark, run_module
from tests.spark.pages import files_beside


def test_cli_version_help_and_unwritable_out(tmp_path, capsys):
    from pylimiter.bench.pipeline import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and "pylimiter-pulsar" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: local[*])", "(default: 5)", "(default: 0.3)",
                    "(default: reports/bench)", "(default: c,python)"):
        assert default in text, default
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_:      # before any work: no Spark started
        main(["--out", str(blocker / "out")])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("python -m pylimiter.bench: error: argument --out: cannot write")


def _cli(*args, timeout=300):
    return run_module("pylimiter.bench", *args, timeout=timeout)


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


@needs_pyspark
@pytest.mark.slow
def test_cli_unsupported_master():
    proc = _cli("--master", "mesos://127.0.0.1:5050")
    _one_line_error(proc, "unsupported master URL")


def _rows(out, name):
    with (out / f"{name}.csv").open(encoding="utf-8") as f:   # one file, not a folder
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.c_extension
def test_spark_runner_end_to_end(spark, tmp_path, capsys):
    """The whole runner on the shared session: grid, scaling, SQL summaries,
    tables and report."""
    from pylimiter.bench.pipeline import main

    out = tmp_path / "bench"
    rc = main(["--scenarios", "tasks,uncontended-threads,scaling",
               "--concurrency", "4", "--repeats", "2", "--budget", "0.02",
               "--scaling", "2", "--no-progress", "--out", str(out)], spark=spark)
    cap = capsys.readouterr()
    assert rc == 0, cap.out[-3000:] + cap.err[-3000:]
    assert "pylimiter benchmark grid" in cap.out
    assert cap.out.startswith("python -m pylimiter.bench: 8 trials")  # said before any work
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
        assert float(r["speedup_lo"]) <= float(r["speedup"]) <= float(r["speedup_hi"])
        # tasks has a no-limiter baseline, so a cost ratio; the rest do not.
        assert (r["cost_ratio"] != "") == (r["scenario"] == "tasks")
    summary = _rows(out, "summary")
    assert len(summary) == 4
    for s in summary:
        assert int(s["trials"]) == 2
        mine = [float(r["speedup"]) for r in trials
                if (r["scenario"], r["impl"]) == (s["scenario"], s["impl"])]
        assert float(s["median_speedup"]) == pytest.approx(sum(mine) / 2)
    scaling = _rows(out, "scaling")
    assert {(r["impl"], r["executors"]) for r in scaling} == {
        (i, k) for i in ("c", "python") for k in ("1", "2")}
    assert len(_rows(out, "scaling_trials")) == 2 * (1 + 2) * 2  # impls x tasks x repeats
    for name in ("index.html", "throughput.png", "speedup.png", "latency.png", "scaling.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "results.parquet").is_file()
    assert {"summary.csv", "results.csv", "scaling.csv"} <= set(files_beside(out / "index.html"))
    html = (out / "index.html").read_text()
    assert "speedup.png" in html and "<table>" in html
    # The verdict table first, computed from this run, then the environment.
    assert html.index("class='verdict'") < html.index("class='env'") < html.index("speedup.png")
    c_threads = next(s for s in summary
                     if (s["scenario"], s["impl"]) == ("uncontended-threads", "c"))
    assert f"than threading.Semaphore (IQR {float(c_threads['q1_speedup']):.2f}" in html
    assert "No trial leaks a permit, fails or sees an error" in html
    assert "0 permits leaked, 0 trials failed, 0 errors in 8 trials" in html


def _descendants(pid):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _python_workers(family):
    """pyspark's Python workers among ``family``: trials are running."""
    import psutil

    found = []
    for p in family:
        try:
            if "pyspark" in " ".join(p.cmdline()) and "java" not in p.name():
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
@pytest.mark.c_extension
@pytest.mark.parametrize("when", ["jvm-starting", "trials-running"])
def test_cli_ctrl_c_stops_cleanly(tmp_path, when):
    """Ctrl-C in a terminal (SIGINT to the whole process group: driver, JVM,
    Python workers) while the JVM starts or while the trials run: exactly one
    line on stderr, exit 130, no Java or py4j trace, no JVM or Python worker
    left behind.  No sleeps: the signal goes when the state is reached (the
    JVM's own output goes to a log file, so no timing can put a trace on the
    terminal)."""
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("pyspark")
    env = {k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylimiter.bench", "--repeats", "3", "--scaling", "0",
         "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    family = []
    try:
        deadline = time.monotonic() + 120
        first = proc.stdout.readline()
        assert first.startswith("python -m pylimiter.bench: ")  # before the JVM starts
        if when == "jvm-starting":
            while time.monotonic() < deadline:
                family = _descendants(proc.pid)
                if any("java" in p.name() for p in family):
                    break
                time.sleep(0.05)     # polling for the state
            assert any("java" in p.name() for p in family)
        if when == "trials-running":
            while time.monotonic() < deadline:
                if proc.stdout.readline().startswith("Spark "):
                    break
            while time.monotonic() < deadline:
                family = _descendants(proc.pid)
                if _python_workers(family):
                    break
                time.sleep(0.2)      # polling for the state, not waiting for it to happen
            assert any("java" in p.name() for p in family), [p.name() for p in family]
            assert _python_workers(family)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["python -m pylimiter.bench: interrupted"], err
    gone_by = time.monotonic() + 15
    alive = []
    while time.monotonic() < gone_by:
        alive = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive, [(p.pid, p.name()) for p in alive]
