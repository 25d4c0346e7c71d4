"""The benchmark harness: every scenario's trial on both implementations
(no Spark), the Spark runner end to end on a tiny grid, and the CLI's
handling of bad input."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from pylimiter.bench.interleave import Spread, interleaved, per_round
from pylimiter.bench.scenarios import SCENARIOS, run_trial
from tests._helpers import run_module


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_trial_row_is_complete_and_clean(impl, scenario):
    name = impl.tag
    row = run_trial(scenario, name, 8, 4, budget_s=0.01)
    assert row["scenario"] == scenario and row["impl"] == name
    assert row["ops"] > 0 and row["ns_per_op"] > 0
    assert row["ops_per_s"] == pytest.approx(1e9 / row["ns_per_op"])
    assert row["errors"] == 0
    assert row["leaked_permits"] == 0
    assert row["rounds"] >= 3
    if SCENARIOS[scenario].anchor:
        assert row["anchor_ns_per_op"] > 0
        # The median of per-round ratios, not a ratio of medians.
        assert 0 < row["speedup_lo"] <= row["speedup"] <= row["speedup_hi"]
    else:
        assert row["anchor_ns_per_op"] is None and row["speedup"] is None
    if SCENARIOS[scenario].baseline and SCENARIOS[scenario].anchor:
        assert row["baseline_ns_per_op"] > 0 and row["cost_ratio"] is not None
    else:
        assert row["cost_ratio"] is None
    if scenario in ("tasks", "threads", "weighted", "dual", "uncontended-async",
                    "uncontended-threads", "scaling"):
        assert 0 <= row["wait_p50_us"] <= row["wait_p99_us"] <= row["wait_max_us"]


def test_trial_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown scenario"):
        run_trial("nope", "c", 1, 1)
    with pytest.raises(ValueError, match="unknown implementation"):
        run_trial("tasks", "rust", 1, 1)


def test_interleaved_flips_the_order_and_drops_warmup():
    calls = []
    sides = {name: (lambda name=name: calls.append(name) or len(calls)) for name in "abc"}
    out = interleaved(sides, 3, warmup=1)
    assert "".join(calls) == "abc" "cba" "abc" "cba"
    # Round 0 (warm-up) dropped: what each side returned in rounds 1-3.
    assert out == {"a": [6, 7, 12], "b": [5, 8, 11], "c": [4, 9, 10]}


def test_interleaved_budget_adds_rounds_and_before_runs_ahead_of_each_side():
    seen = []
    out = interleaved({"a": lambda: seen.append("a") or 1}, 2, warmup=0, budget_s=0.05,
                      before=lambda: seen.append("gc"))
    assert len(out["a"]) > 2      # rounds kept coming until the budget was spent
    assert seen[:4] == ["gc", "a", "gc", "a"]
    with pytest.raises(ValueError, match="at least 1"):
        interleaved({"a": lambda: 1}, 0)


def test_spread_and_per_round():
    s = Spread.of([5.0, 1.0, 3.0, 2.0, 4.0, float("nan")])
    assert (s.median, s.q1, s.q3, s.lo, s.hi, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert s.iqr == 2.0 and s.as_dict("x_")["x_median"] == 3.0
    assert Spread.of([7]).q1 == Spread.of([7]).q3 == 7
    with pytest.raises(ValueError):
        Spread.of([float("nan")])
    ratios = per_round({"mine": [1, 2, 4], "anchor": [4, 4, 4]},
                       lambda mine, anchor: anchor / mine)
    assert ratios == [4.0, 2.0, 1.0]


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
    assert list((out / "results.parquet").glob("part-*.parquet"))
    html = (out / "index.html").read_text()
    assert "speedup.png" in html and "<table>" in html
    # Environment block first, then the verdict, computed from this run.
    assert html.index("class='env'") < html.index("Verdict.") < html.index("speedup.png")
    c_threads = next(s for s in summary
                     if (s["scenario"], s["impl"]) == ("uncontended-threads", "c"))
    assert f"than threading.Semaphore (IQR {float(c_threads['q1_speedup']):.2f}" in html
    assert "No trial leaked a permit" in html


def _descendants(pid):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.slow
@pytest.mark.c_extension
def test_cli_ctrl_c_stops_cleanly(tmp_path):
    """Ctrl-C in a terminal (SIGINT to the whole process group) while the
    trials run: one line, exit 130, no py4j traceback, no JVM or Python
    worker left behind."""
    psutil = pytest.importorskip("psutil")
    pytest.importorskip("pyspark")
    env = {k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylimiter.bench", "--repeats", "3", "--scaling", "0",
         "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        first = proc.stdout.readline()
        assert first.startswith("python -m pylimiter.bench: ")  # before the JVM starts
        while time.monotonic() < deadline:
            if proc.stdout.readline().startswith("Spark "):
                break
        time.sleep(3)   # trials are running
        family = _descendants(proc.pid)
        assert any("java" in p.name() for p in family), [p.name() for p in family]
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "python -m pylimiter.bench: interrupted"
    for needle in ("Traceback", "py4j", "Exception", "at org.apache"):
        assert needle not in err, err
    gone_by = time.monotonic() + 15
    while time.monotonic() < gone_by:
        alive = [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        time.sleep(0.5)
    assert not alive, [(p.pid, p.name()) for p in alive]


# ---- benchmarks/: the figures, the table runner, the micro report ------------------
# benchmarks/ is not part of the distribution: these skip in an installed
# wheel's test run.


def test_figure_value_and_target_by_kind():
    figures = pytest.importorskip("benchmarks.figures")
    faster, cost, slower = (figures.BY_KEY[k] for k in ("await", "tasks", "pure"))
    assert faster.value({"mine": 100, "anchor": 350}) == 3.5
    assert slower.value({"mine": 600, "anchor": 100}) == 6.0
    # (mine - base) / (anchor - base): pylimiter's share of the work only.
    assert cost.value({"base": 5000, "mine": 6000, "anchor": 9000}) == 0.25
    assert faster.target((3, 12)) == 2.5 and faster.meets(2.6, (3, 12))
    assert not faster.meets(2.4, (3, 12)) and faster.meets(2.4, (3, 9)) is None
    assert cost.meets(0.5, (3, 11)) and not cost.meets(0.51, (3, 11))


@pytest.mark.c_extension
def test_figure_measured_side_by_side():
    figures = pytest.importorskip("benchmarks.figures")
    from pylimiter._impls import C, PY

    res = figures.measure(figures.BY_KEY["tasks"], C.module, PY.module, "asyncio", rounds=3)
    assert res["n"] == 3 and res["rounds"] == 3
    assert res["lo"] <= res["q1"] <= res["median"] <= res["q3"] <= res["hi"]
    assert min(res[f"{s}_ns_per_op"] for s in ("base", "mine", "anchor")) > 0
    assert res["target"] == 0.5 and res["meets"] == (res["median"] <= 0.5)
    assert res["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    with pytest.raises(ValueError, match="unknown loop"):
        figures.new_loop("trio")


@pytest.mark.c_extension
def test_table_worker_and_markdown(tmp_path, capsys):
    table = pytest.importorskip("benchmarks.table")
    out = tmp_path / "rows.json"
    assert table.main(["--worker", str(out), "--figures", "await,blocking", "--loops",
                       "asyncio", "--scale", "0.1"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["figure"], r["loop"]) for r in rows] == [("await", "asyncio"), ("blocking", "-")]
    other = dict(rows[0], python="3.99", python_full="3.99.0", target=None, meets=None)
    md = table.write_outputs(rows + [other], {"CPU": "cpu", "OS": "os", "pylimiter": "x",
                                              "date": "today"}, tmp_path).read_text()
    head = [line for line in md.splitlines() if line.startswith("| figure")][0]
    assert head.index(f"({rows[0]['python_full']})") < head.index("(3.99.0)")
    await_row = [line for line in md.splitlines() if line.startswith("| `await acquire(1)`")][0]
    assert f"{rows[0]['median']:.2f}x [" in await_row and await_row.count("x [") == 2
    assert "Command: `make bench-table`" in md
    with open(tmp_path / "figures.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    with pytest.raises(SystemExit) as exit_:                # not a version it measures
        table.main(["--pythons", "2.7"])
    assert exit_.value.code == 2 and "unknown '2.7'" in capsys.readouterr().err


def test_micro_report_prints_figures_against_targets(tmp_path, capsys):
    report = pytest.importorskip("benchmarks.micro.report")
    data = {"machine_info": {"python_implementation": "CPython", "python_version": "3.11.7"},
            "benchmarks": [
                {"group": "uncontended-async", "params": {"loop": "asyncio", "impl": "c"},
                 "extra_info": {"ops": 1000}, "stats": {"median": 1.3e-4, "iqr": 1e-6}},
                {"group": "figures", "params": {}, "stats": {"median": 1.0, "iqr": 0.0},
                 "extra_info": {"figure": "tasks", "loop": "uvloop", "kind": "cost",
                                "median": 0.85, "q1": 0.8, "q3": 0.9, "target": 0.5,
                                "meets": False}}]}
    path = tmp_path / "micro.json"
    path.write_text(json.dumps(data))
    assert report.main(str(path)) == 0
    out = capsys.readouterr().out
    assert "130" in out                     # 1.3e-4 s / 1000 ops
    assert "0.85 [0.80-0.90]" in out and "<= 0.50" in out and "MISS" in out
