"""Starting (or adopting) a SparkSession, and writing small result tables.

One session per process: ``spark_session()`` starts one for ``master``
(``local[*]`` unless told otherwise) and stops it on exit, or hands back a
session the caller already owns, untouched.  Tests pass their one shared
session this way, so three simulators and the benchmark grid pay for one JVM.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Mapping, Optional
from urllib.parse import urlparse

from .._cli import UsageError

__all__ = ["DEFAULT_MASTER", "UsageError", "check_master", "quiet_log4j", "spark_session",
           "start_spark", "write_table"]

DEFAULT_MASTER = "local[*]"


def check_master(master: str, timeout: float = 3.0) -> None:
    """check_master fails fast, in one line (UsageError), on a master URL that
    is malformed or that nobody answers; Spark itself would retry for a
    minute and then print a Java stack trace."""
    if master.startswith("local"):
        return
    if master == "yarn":
        return  # resolved through HADOOP_CONF_DIR; Spark's own error is clear enough
    if master.startswith("spark://"):
        hostports = master[len("spark://"):].split(",")
    elif master.startswith("k8s://"):
        u = urlparse(master[len("k8s://"):])
        if not u.hostname:
            raise UsageError(f"cannot parse Kubernetes master URL {master!r}")
        hostports = [f"{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}"]
    else:
        raise UsageError(f"unsupported master URL {master!r} "
                         "(use local[N], spark://host:port, yarn or k8s://...)")
    errors = []
    for hp in hostports:
        host, _, port = hp.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            errors.append(f"{hp}: {reason}")
    raise UsageError(f"Spark master {master} does not answer ({'; '.join(errors)})")


def quiet_log4j(path: Path) -> Path:
    """Write a log4j2 configuration that lets only errors through, one line
    each: Spark's INFO chatter would bury the progress bar."""
    path.write_text(
        "rootLogger.level = error\n"
        "rootLogger.appenderRef.stderr.ref = console\n"
        "appender.console.type = Console\n"
        "appender.console.name = console\n"
        "appender.console.target = SYSTEM_ERR\n"
        "appender.console.layout.type = PatternLayout\n"
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n\n"
        # PySpark's driver counts as a shell: unless the class that starts
        # Spark's logging has a logger config of its own, Spark prints
        # "Setting default log level to WARN" and lowers the console
        # threshold to WARN.  One config for all of org.apache.spark covers it.
        "logger.spark.name = org.apache.spark\n"
        "logger.spark.level = error\n"
    )
    return path


def start_spark(master: str = DEFAULT_MASTER, *, app_name: str = "pylimiter",
                workdir: Optional[Path] = None, conf: Optional[Mapping[str, str]] = None):
    """start_spark builds a SparkSession for ``master`` with the UI off, quiet
    logs and, for local masters, a driver bound to 127.0.0.1.  ``workdir``
    holds the log4j file (it must outlive JVM start-up only).  ``conf`` adds
    or overrides Spark settings.  Raises what Spark raises (no Java, ...)."""
    # Executors must run the interpreter that has pylimiter installed; on a
    # cluster, ship a venv archive and point PYSPARK_PYTHON at it instead
    # (benchmarks/README.md), so an explicit setting wins.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    workdir = Path(workdir or tempfile.mkdtemp(prefix="plim-spark-"))
    log4j = quiet_log4j(workdir / "log4j2.properties")
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j}",
        "spark.sql.shuffle.partitions": "4",
        "spark.python.worker.reuse": "true",
    }
    if master.startswith("local"):
        # Nothing outside this machine needs to reach the driver.
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    settings.update(conf or {})
    b = SparkSession.builder.master(master).appName(app_name)
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def spark_session(master: str = DEFAULT_MASTER, *, app_name: str = "pylimiter", spark=None,
                  conf: Optional[Mapping[str, str]] = None) -> Iterator:
    """spark_session yields ``spark`` unchanged when the caller passes one
    (and leaves it running), else checks ``master``, starts a session and
    stops it on exit.  Raises UsageError for a master nobody answers."""
    if spark is not None:
        yield spark
        return
    check_master(master)
    with tempfile.TemporaryDirectory(prefix="plim-spark-") as tmp:
        own = start_spark(master, app_name=app_name, workdir=Path(tmp), conf=conf)
        try:
            yield own
        finally:
            own.stop()


def write_table(df, out: Path, name: str, formats: tuple[str, ...] = ("parquet", "csv")) -> None:
    """write_table writes a (small) DataFrame as ``out/name.parquet`` and
    ``out/name.csv`` (with a header), one part file each, replacing what was
    there."""
    one = df.coalesce(1)  # small tables: one part file is easier to use
    for fmt in formats:
        w = one.write.mode("overwrite")
        if fmt == "csv":
            w.option("header", True).csv(str(out / f"{name}.csv"))
        elif fmt == "parquet":
            w.parquet(str(out / f"{name}.parquet"))
        else:
            raise ValueError(f"unknown table format {fmt!r} (parquet or csv)")
