"""The kit's cluster side without a cluster: master URL forms checked before
any JVM, the run flags (--executor-env, --conf), failures said as their root
cause in one line, Spark settings the user can override, tables written by
the driver; and every Spark CLI refusing a bad master, a JVM that cannot
start and a bad --input in one line."""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import time

import pytest

from pylimiter.spark import UsageError
from pylimiter.spark.errors import jvm_start_cause, root_cause
from pylimiter.spark.flags import ENV_NAME, add_run_flags, run_conf
from pylimiter.spark.master import is_local, validate_master
from pylimiter.spark.session import session_settings
from pylimiter.spark.tables import write_table
from tests._helpers import needs_pyspark

CLIS = {
    "pylimiter.bench": [],
    "pylimiter.pulsar.cache": ["simulate"],
    "pylimiter.pulsar.cursor": ["simulate"],
    "pylimiter.pulsar.balance": ["simulate"],
}


@pytest.mark.parametrize("master", [
    "local", "local[1]", "local[16]", "local[*]", "local[4,2]", "local[*,3]",
    "local-cluster[2,1,1024]", "spark://127.0.0.1:7077", "spark://h1:7077,h2:7078",
    "spark://[::1]:7077", "k8s://https://kube.example:6443", "k8s://kube.example:443",
])
def test_master_forms_spark_accepts(master):
    validate_master(master)


@pytest.mark.parametrize("master, needle", [
    ("local[abc]", "invalid master URL 'local[abc]': expected local[N]"),
    ("local[0]", "invalid master URL 'local[0]'"),
    ("local[2,0]", "invalid master URL 'local[2,0]'"),
    ("localx", "unsupported master URL 'localx'"),
    ("local-cluster[2,1]", "expected local-cluster[N,C,M]"),
    ("spark://host", "expected spark://host:port"),
    ("spark://h:7077,h2:99999", "got 'h2:99999'"),
    ("spark://", "expected spark://host:port"),
    ("k8s://", "cannot parse Kubernetes master URL"),
    ("k8s://https://h:port", "cannot parse Kubernetes master URL"),
    ("yarn-client", "unsupported master URL"),
    ("", "unsupported master URL ''"),
])
def test_master_forms_spark_refuses_are_one_line(master, needle):
    with pytest.raises(UsageError) as exc:
        validate_master(master)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_yarn_needs_hadoop_or_yarn_conf_dir(monkeypatch):
    monkeypatch.delenv("HADOOP_CONF_DIR", raising=False)
    monkeypatch.delenv("YARN_CONF_DIR", raising=False)
    with pytest.raises(UsageError, match="--master yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR"):
        validate_master("yarn")
    monkeypatch.setenv("YARN_CONF_DIR", "/etc/hadoop/conf")
    assert validate_master("yarn") == []


@needs_pyspark
def test_mesos_only_where_spark_still_has_it():
    from importlib.metadata import version

    if int(version("pyspark").split(".")[0]) >= 4:
        with pytest.raises(UsageError, match="no Mesos support"):
            validate_master("mesos://h:5050")
    else:
        assert validate_master("mesos://h:5050") == [("h", 5050)]


def test_local_means_the_drivers_python_and_local_cluster_does_not():
    assert is_local("local") and is_local("local[*]") and is_local("local[2,3]")
    assert not is_local("local-cluster[1,1,512]") and not is_local("spark://h:1")


# ---- run flags ------------------------------------------------------------------------


def _parse(tmp_path, *argv):
    ap = argparse.ArgumentParser()
    add_run_flags(ap, tmp_path / "out")
    return ap.parse_args(list(argv))


def test_executor_env_and_conf_become_spark_settings(tmp_path):
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")
    args = _parse(tmp_path, "--master", "spark://h:7077", "--executor-env", str(archive),
                  "--conf", "spark.ui.enabled=true", "--conf", "spark.executor.memory=2g",
                  "--conf", "spark.archives=hdfs:///x.zip#x")
    conf = run_conf(args, {"spark.driver.memory": "2g", "spark.executor.memory": "1g"})
    assert conf == {
        "spark.driver.memory": "2g", "spark.executor.memory": "2g",     # the user wins
        "spark.ui.enabled": "true",
        "spark.archives": f"{archive.resolve()}#{ENV_NAME},hdfs:///x.zip#x",
        "spark.pyspark.python": f"./{ENV_NAME}/bin/python",
    }
    # a URI every node can fetch is passed on as is
    args = _parse(tmp_path, "--master", "yarn", "--executor-env", "hdfs:///envs/p.tar.gz")
    assert run_conf(args)["spark.archives"] == f"hdfs:///envs/p.tar.gz#{ENV_NAME}"
    assert run_conf(_parse(tmp_path)) == {}


def test_executor_env_on_a_local_master_is_refused(tmp_path):
    archive = tmp_path / "env.zip"
    archive.write_bytes(b"")
    args = _parse(tmp_path, "--executor-env", str(archive))
    with pytest.raises(UsageError, match="--executor-env is for cluster masters"):
        run_conf(args)


@pytest.mark.parametrize("argv, needle", [
    (["--executor-env", "/no/such/env.tar.gz"], "no such file (make cluster-env builds it)"),
    (["--executor-env", "env.whl"], "expected a .tar.gz, .tgz, .tar or .zip archive"),
    (["--conf", "spark.ui.enabled"], "expected KEY=VALUE"),
    (["--conf", "=x"], "expected KEY=VALUE"),
    (["--conf", "ui.enabled=true"], "'ui.enabled' is not a Spark setting"),
])
def test_bad_run_flags(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit):
        _parse(tmp_path, *argv)
    assert needle in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_user_turns_the_ui_back_on(tmp_path):
    log4j = tmp_path / "l.properties"
    assert session_settings("local[2]", "a", log4j)["spark.ui.enabled"] == "false"
    mine = session_settings("spark://h:1", "a", log4j, {"spark.ui.enabled": "true"})
    assert mine["spark.ui.enabled"] == "true" and "spark.driver.host" not in mine
    assert session_settings("local[2]", "a", log4j)["spark.driver.bindAddress"] == "127.0.0.1"


# ---- failures in one line --------------------------------------------------------------


class _Java:
    def __init__(self, text, cause=None):
        self.text, self.cause = text, cause

    def toString(self):
        return self.text

    def getCause(self):
        return self.cause


class _Py4JJavaError(Exception):
    def __init__(self, java):
        super().__init__("An error occurred while calling o416.collectToPython.\n: trace")
        self.java_exception = java


WORKER_TRACE = (
    "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 "
    "failed 4 times, most recent failure: Lost task 0.3 in stage 0.0 (TID 3) (127.0.0.1 "
    "executor 0): org.apache.spark.api.python.PythonException: Traceback (most recent call "
    "last):\n  File \"/x/pyspark.zip/pyspark/worker.py\", line 1, in main\n    func = load()\n"
    "           ^^^^^^\nModuleNotFoundError: No module named 'pylimiter'\n\n"
    "\tat org.apache.spark.api.python.BasePythonRunner.handle(PythonRunner.scala:1)\n")


def test_root_cause_is_the_python_workers_exception():
    assert root_cause(_Py4JJavaError(_Java(WORKER_TRACE))) == \
        "ModuleNotFoundError: No module named 'pylimiter'"


def test_root_cause_is_the_deepest_java_cause():
    java = _Java("org.apache.spark.SparkException: Job aborted due to stage failure: Lost task "
                 "0.0 (TID 1): java.io.IOException: Cannot run program \"./e/bin/python\": "
                 "error=2, No such file or directory\n\tat a.b.C(C.java:1)")
    assert root_cause(_Py4JJavaError(java)) == \
        "IOException: Cannot run program \"./e/bin/python\": error=2, No such file or directory"
    chained = _Java("org.apache.spark.SparkException: outer",
                    _Java("java.net.ConnectException: Connection refused"))
    assert root_cause(_Py4JJavaError(chained)) == "ConnectException: Connection refused"


def test_root_cause_of_a_plain_exception_is_its_first_line():
    assert root_cause(ValueError("bad\nmore")) == "ValueError: bad"


def test_jvm_start_cause():
    assert jvm_start_cause(
        "Exception in thread \"main\" org.apache.spark.SparkException: When running with "
        "master 'yarn' either HADOOP_CONF_DIR or YARN_CONF_DIR must be set.\n"
        "\tat org.apache.spark.deploy.SparkSubmitArguments.error(X.scala:1)\n") == \
        "SparkException: When running with master 'yarn' either HADOOP_CONF_DIR or " \
        "YARN_CONF_DIR must be set."
    assert jvm_start_cause(
        "/p/pyspark/bin/spark-class: line 71: /nope/bin/java: No such file or directory\n"
        "/p/pyspark/bin/spark-class: line 97: CMD: bad array subscript\n").startswith(
        "/nope/bin/java: No such file or directory (set JAVA_HOME")
    assert "without a word" in jvm_start_cause("")


# ---- tables written by the driver ----------------------------------------------------------


@pytest.mark.slow
def test_write_table_is_written_by_the_driver(spark, tmp_path):
    df = spark.createDataFrame(
        [(1, None, float("nan"), True), (2, "x,y", float("inf"), None)],
        "n long, s string, x double, b boolean").repartition(2)
    # A part-file folder of an older run is replaced by one file.
    (tmp_path / "t.csv").mkdir()
    (tmp_path / "t.csv" / "part-old.csv").write_text("stale")
    write_table(df, tmp_path, "t")
    for fmt in ("csv", "parquet"):
        assert (tmp_path / f"t.{fmt}").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.parquet"]
    with (tmp_path / "t.csv").open(encoding="utf-8") as f:
        assert f.readline() == "n,s,x,b\n"       # a header, no BOM: what a spreadsheet reads
        f.seek(0)
        rows = sorted(csv.DictReader(f), key=lambda r: r["n"])
    assert rows == [{"n": "1", "s": "", "x": "NaN", "b": "true"},
                    {"n": "2", "s": "x,y", "x": "Infinity", "b": ""}]
    back = spark.read.parquet(str(tmp_path / "t.parquet"))
    assert back.schema == df.schema
    assert sorted(back.collect(), key=lambda r: r.n)[1].s == "x,y"
    import pandas as pd

    frame = pd.read_csv(tmp_path / "t.csv").sort_values("n")
    assert frame["n"].tolist() == [1, 2] and frame["s"].iloc[1] == "x,y"
    assert sorted(pd.read_parquet(tmp_path / "t.parquet")["n"]) == [1, 2]
    write_table(df, tmp_path, "t")              # again: replaced, nothing left beside
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.parquet"]


# ---- every Spark CLI ------------------------------------------------------------------------


def _cli(module, *args, env=None, timeout=120):
    env = {**{k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"},
           **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def _one_line(proc, needle, code):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and needle in lines[0], proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("module", list(CLIS))
def test_bad_masters_are_refused_in_one_line_before_the_jvm(module, tmp_path):
    env = {k: "" for k in ("HADOOP_CONF_DIR", "YARN_CONF_DIR")}
    for master, needle in (("local[abc]", "invalid master URL 'local[abc]'"),
                           ("local[0]", "invalid master URL 'local[0]'"),
                           ("localx", "unsupported master URL 'localx'"),
                           ("yarn", "--master yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR")):
        t0 = time.monotonic()
        proc = _cli(module, *CLIS[module], "--master", master, "--out", str(tmp_path), env=env)
        _one_line(proc, needle, 2)
        assert "starting Spark" not in proc.stdout
        assert time.monotonic() - t0 < 60


@needs_pyspark
@pytest.mark.slow
@pytest.mark.parametrize("module", list(CLIS))
def test_a_jvm_that_cannot_start_is_one_line(module, tmp_path):
    proc = _cli(module, *CLIS[module], "--out", str(tmp_path), "--no-progress",
                env={"JAVA_HOME": str(tmp_path / "no-java")})
    _one_line(proc, "Spark did not start: ", 1)
    assert "no-java/bin/java: No such file or directory" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name, text, needle", [
    ("missing.csv", None, "no such file or folder"),
    ("rows.txt", "x", "unknown file type '.txt'"),
    ("rows.csv", "step,topic\n0,persistent://a/b/c\n", "missing columns msg_rate_in"),
    ("rows.jsonl", "{oops\n", "row 1 is not valid JSON"),
    ("rows.parquet", "not parquet", "not a readable parquet file"),
])
@needs_pyspark
def test_balance_input_is_checked_before_spark_starts(tmp_path, name, text, needle):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    # No Java at all: a check that needed the JVM would fail differently.
    proc = _cli("pylimiter.pulsar.balance", "simulate", "--input", str(path),
                "--out", str(tmp_path / "o"), env={"JAVA_HOME": str(tmp_path / "no-java")})
    _one_line(proc, needle, 2)
    assert str(path) in proc.stderr
