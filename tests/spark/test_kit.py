"""The shared Spark/progress/report kit (pylimiter.spark): master checks,
session adoption, table writing, progress counting and the report page."""

from __future__ import annotations

import csv
import decimal
import math
import socket

import pytest

from pylimiter.spark import UsageError, report
from pylimiter.spark.master import check_master, preflight
from pylimiter.spark.progress import JobProgress, StepProgress
from pylimiter.spark.session import spark_session
from pylimiter.spark.tables import write_table
from tests._helpers import needs_pyspark


@needs_pyspark
def test_check_master_accepts_local_and_rejects_unknown_schemes():
    check_master("local[*]")
    check_master("local[2]")
    with pytest.raises(UsageError, match="unsupported master URL 'mesos://h:5050'"):
        check_master("mesos://h:5050")
    with pytest.raises(UsageError, match="cannot parse Kubernetes master URL"):
        check_master("k8s://")


def test_check_master_names_a_master_nobody_answers():
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(UsageError, match=f"spark://127.0.0.1:{port} does not answer"):
        check_master(f"spark://127.0.0.1:{port}", timeout=1)


@needs_pyspark
def test_preflight_checks_the_master_first_then_the_modules():
    # the bad master wins over the missing module: one message with or without pyspark
    with pytest.raises(UsageError, match="unsupported master URL"):
        preflight("mesos://h:1", None, ["no_such_module_plim"])
    with pytest.raises(UsageError, match=r"no_such_module_plim is missing .* "
                                         r"pip install '\.\[spark\]' in a pylimiter checkout"):
        preflight("local[2]", None, ["no_such_module_plim"])
    # an adopted session is not asked about its master
    with pytest.raises(UsageError, match="no_such_module_plim is missing"):
        preflight("mesos://h:1", object(), ["no_such_module_plim"])
    preflight("local[2]", None, ["math"])


@pytest.mark.slow
def test_spark_session_adopts_a_session_without_stopping_it(spark):
    with spark_session("spark://does-not-matter:1", spark=spark) as s:
        assert s is spark               # no master check, no new JVM
    assert spark.range(3).count() == 3  # still running


@pytest.mark.slow
def test_write_table_writes_one_parquet_and_one_csv_file(spark, tmp_path):
    df = spark.createDataFrame([(1, "a", 0.5), (2, "b", 1.5)], "n long, s string, x double")
    write_table(df.repartition(3), tmp_path, "t")
    with (tmp_path / "t.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows == [{"n": "1", "s": "a", "x": "0.5"}, {"n": "2", "s": "b", "x": "1.5"}]
    assert (tmp_path / "t.parquet").is_file()
    back = spark.read.parquet(str(tmp_path / "t.parquet")).orderBy("n").collect()
    assert [tuple(r) for r in back] == [(1, "a", 0.5), (2, "b", 1.5)]
    with pytest.raises(ValueError, match="unknown table format 'orc'"):
        write_table(df, tmp_path, "t", formats=("orc",))


@pytest.mark.slow
def test_job_progress_counts_the_tasks_of_its_own_group_only(spark):
    sc = spark.sparkContext
    with JobProgress(sc, "outside", 100, enabled=False):
        sc.parallelize(range(10), 5).count()          # 5 tasks in another group
    with JobProgress(sc, "mine", 100, enabled=False) as p:
        sc.parallelize(range(10), 3).count()
        sc.parallelize(range(10), 4).count()
    assert p.done() == 7
    with JobProgress(sc, "capped", 2, enabled=False) as q:
        sc.parallelize(range(10), 6).count()
    assert q.done() == 2                              # never above total


def test_step_progress_counts_and_draws_nothing_when_disabled(capsys):
    # rich is imported only to draw; a disabled bar needs nothing installed.
    with StepProgress("steps", 3, enabled=False) as p:
        for _ in range(5):
            p.advance()
    assert p.completed == 5
    assert capsys.readouterr().out == ""


def test_html_table_rounds_escapes_and_blanks_nan():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"name": ["<b>", "x"], "v": [1.23456, math.nan], "n": [1234567, 2],
                       "big": [12345.6, math.inf]})
    t = report.html_table(df)
    assert "&lt;b&gt;" in t and "<b>" not in t
    assert "<td>1.23</td>" in t and "<td>1,234,567</td>" in t and "<td>12,346</td>" in t
    assert "<td></td>" in t and "∞" in t
    assert report.html_table([], ["a"]) == "<p class='none'>(none)</p>"
    assert "<th>a</th>" in report.html_table([(1,)], ["a"])
    # a long snake_case header may wrap after its underscores
    assert "<th>p99_<wbr>wait</th>" in report.html_table([(1,)], ["p99_wait"])
    # Spark's decimals (an avg over a decimal column) and numpy scalars are
    # rounded like floats; a text column's header lines up with its cells
    np = pytest.importorskip("numpy")
    t = report.html_table([("a", decimal.Decimal("68.392000"), decimal.Decimal("246.057000"),
                            np.float32(0.5), np.int64(1234))], ["name", "d", "big", "f", "i"])
    assert "<td>68.39</td>" in t and "<td>246</td>" in t and "<td>0.50</td>" in t
    assert "<td>1,234</td>" in t and "<th class='l'>name</th>" in t and "<th>d</th>" in t


def test_report_page_has_environment_verdict_figures_and_tables(tmp_path):
    pytest.importorskip("matplotlib")
    plt = report.pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    png = report.save_figure(fig, tmp_path / "line.png")
    assert png.stat().st_size > 0 and plt.get_fignums() == []   # figure freed
    env = report.environment("3.5.1", workload="tiny")
    assert {"CPU", "OS", "Python", "pylimiter", "Spark", "date", "workload"} <= set(env)
    page = report.ReportPage("Title & more", subtitle="sub", command="python -m x --a 1", env=env)
    page.verdicts([report.Verdict("A < B", "A = 1, B = 2", True)])
    page.paragraph("p1").figure("line.png", "cap", title="Fig")
    page.table([(1, 2.5)], ["a", "b"], title="Tab").files(["x.parquet"])
    index = page.write(tmp_path / "r")
    text = index.read_text()
    assert index == tmp_path / "r" / "index.html"
    assert "<title>Title &amp; more</title>" in text
    # the verdict first, then the environment, then the parts
    assert text.index("class='verdict'") < text.index("class='env'") < text.index("line.png")
    assert "A &lt; B" in text and "python -m x --a 1" in text
    assert "<img src='line.png'" in text and "<figcaption>cap</figcaption>" in text
    assert "max-width:1352px" in text                     # fits a 1400 px window
    assert "(not written: x.parquet)" in text       # listed, but not there
    (tmp_path / "r" / "x.parquet").write_bytes(b"PAR1")
    html = page.write(tmp_path / "r").read_text()
    assert "<a href='x.parquet'><code>x.parquet</code></a>" in html


def test_command_line_quotes_arguments():
    assert report.command_line("python -m p", ["--a", "x y"]) == "python -m p --a 'x y'"


@pytest.mark.slow
def test_job_progress_leaves_no_job_group_behind(spark):
    sc = spark.sparkContext
    with JobProgress(sc, "scoped", 10, enabled=False) as p:
        sc.parallelize(range(4), 2).count()
    sc.parallelize(range(4), 3).count()             # after the block: not p's
    assert p.done() == 2
    assert sc.getLocalProperty("spark.jobGroup.id") is None


@pytest.mark.slow
def test_sql_conf_restores_the_session(spark):
    from pylimiter.spark.session import sql_conf

    key = "spark.sql.shuffle.partitions"
    before = spark.conf.get(key)
    with sql_conf(spark, {key: "3", "spark.sql.adaptive.enabled": "false"}):
        assert spark.conf.get(key) == "3"
    assert spark.conf.get(key) == before


@pytest.mark.slow
def test_cancel_on_interrupt_turns_ctrl_c_into_keyboard_interrupt(spark, capsys):
    """SIGINT during a job: the job is cancelled, one line is printed, and the
    block ends in KeyboardInterrupt (which spark.cli.run maps to exit 130)."""
    import os
    import signal
    import threading

    from pylimiter.spark.interrupts import cancel_on_interrupt

    sc = spark.sparkContext

    def slow(it):
        import time as _t
        _t.sleep(30)
        return it

    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        with cancel_on_interrupt(sc, "prog"):
            sc.parallelize(range(2), 2).mapPartitions(slow).count()
    timer.join()
    assert capsys.readouterr().err == "prog: interrupted\n"   # one line, at once
    assert spark.range(3).count() == 3              # the session still works


# ---- result rows and run flags -------------------------------------------------------


FIELDS = [("n", "long"), ("k", "int"), ("x", "double"), ("s", "string"), ("b", "boolean"),
          ("failure", "string")]


def test_typed_row_orders_converts_and_fills_none():
    from pylimiter.spark.rows import field_names, typed_row

    row = typed_row({"x": 3, "n": 2.0, "s": 7, "k": True, "b": 1, "extra": "ignored"}, FIELDS)
    assert row == (2, 1, 3.0, "7", True, None)
    assert [type(v) for v in row[:5]] == [int, int, float, str, bool]
    assert typed_row({"x": None}, FIELDS) == (None,) * 6
    assert field_names(FIELDS) == ["n", "k", "x", "s", "b", "failure"]


def test_failure_row_keeps_the_base_and_names_the_exception_in_one_line():
    from pylimiter.spark.rows import failure_row, typed_row

    try:
        raise KeyError("no such\npoint")
    except KeyError as exc:
        row = failure_row({"n": 4, "s": "p"}, exc)
    assert row["n"] == 4 and row["s"] == "p"
    assert row["failure"].startswith("KeyError: ") and "no such" in row["failure"]
    assert typed_row(row, FIELDS)[-1] == row["failure"]


@pytest.mark.slow
def test_schema_of_the_fields_and_unknown_types_refused(spark):
    from pylimiter.spark.rows import schema, typed_row

    s = schema(FIELDS)
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in s.fields] == [
        ("n", "bigint", True), ("k", "int", True), ("x", "double", True),
        ("s", "string", True), ("b", "boolean", True), ("failure", "string", True)]
    df = spark.createDataFrame([typed_row({"n": 1, "k": 2, "x": 3, "s": "a", "b": 0}, FIELDS)],
                               s)
    assert tuple(df.collect()[0]) == (1, 2, 3.0, "a", False, None)
    with pytest.raises(ValueError, match="field 'q': unknown type 'float'"):
        schema([("q", "float")])


def test_run_flags_master_out_progress_and_report(tmp_path, capsys):
    import argparse

    from pylimiter.spark.flags import add_run_flags

    ap = argparse.ArgumentParser()
    add_run_flags(ap, tmp_path / "default-out")
    args = ap.parse_args([])
    assert (args.master, args.out, args.no_progress) == ("local[*]", tmp_path / "default-out",
                                                         False)
    assert not hasattr(args, "no_report")
    args = ap.parse_args(["--master", "local[2]", "--out", str(tmp_path / "o"),
                          "--no-progress"])
    assert (args.master, args.out, args.no_progress) == ("local[2]", tmp_path / "o", True)
    assert (tmp_path / "o").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        ap.parse_args(["--out", str(blocker / "o")])
    assert "cannot write to" in capsys.readouterr().err
    ap = argparse.ArgumentParser()
    group = add_run_flags(ap, tmp_path, no_report=True)
    assert group.title == "run" and ap.parse_args(["--no-report"]).no_report


def test_every_pipeline_report_has_the_same_signature():
    import importlib
    import inspect

    sigs = {}
    for name in ("pylimiter.bench", "pylimiter.pulsar.balance", "pylimiter.pulsar.cache",
                 "pylimiter.pulsar.cursor"):
        fn = importlib.import_module(f"{name}.report").write_report
        sigs[name] = [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]
    first = next(iter(sigs.values()))
    assert [n for n, _ in first] == ["out", "res", "spark_version", "command"]
    assert all(s == first for s in sigs.values()), sigs


def test_pysparks_pandas_notice_alone_is_silenced():
    # start_spark installs this filter: on pandas >= 3 (CPython 3.15) PySpark
    # would print the notice on every pipeline run.
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        from pylimiter.spark import session
        session._quiet_pandas_notice()
        warnings.warn("PySpark does not yet fully support pandas >= 3.0.0. Some features "
                      "may not work correctly.", FutureWarning)
        warnings.warn("another FutureWarning", FutureWarning)
    assert [str(w.message) for w in seen] == ["another FutureWarning"]


def test_the_package_names_are_the_concern_modules_own():
    # session.py was split by concern; the package's public names stayed.
    import pylimiter.spark as kit
    from pylimiter.spark import flags, master, session, tables

    assert sorted(kit.__all__) == ["UsageError", "add_run_flags", "check_master",
                                   "spark_session", "start_spark", "write_table"]
    assert kit.add_run_flags is flags.add_run_flags
    assert kit.check_master is master.check_master
    assert kit.spark_session is session.spark_session
    assert kit.start_spark is session.start_spark
    assert kit.write_table is tables.write_table
    assert issubclass(kit.UsageError, Exception)


def test_run_result_is_defined_once_in_the_kit():
    # Every pipeline's write_report takes the one RunResult: tables by name,
    # settings, params, timings.
    import re
    from pathlib import Path

    import pylimiter
    from pylimiter.spark.report import RunResult

    root = Path(pylimiter.__file__).parent
    where = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
             for _ in re.finditer(r"^\s*class RunResult\b", p.read_text(encoding="utf-8"),
                                  re.M)]
    assert where == ["spark/report.py"]
    res = RunResult()
    assert (res.tables, res.settings, res.params, res.timings) == ({}, None, {}, {})
    assert RunResult().tables is not res.tables
