"""Starting (or adopting) a SparkSession, and writing small result tables.

One session per process: ``spark_session()`` starts one for ``master``
(``local[*]`` unless told otherwise) and stops it on exit, or hands back a
session the caller already owns, untouched.  Tests pass their one shared
session this way, so three simulators and the benchmark grid pay for one JVM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence
from urllib.parse import urlparse

from .._cli import UsageError, require, writable_dir

__all__ = ["DEFAULT_MASTER", "UsageError", "add_run_flags", "cancel_on_interrupt",
           "check_master", "preflight", "quiet_log4j", "spark_session", "sql_conf",
           "start_spark", "write_table"]

DEFAULT_MASTER = "local[*]"


def add_run_flags(parser, out: Path, *, no_report: bool = False):
    """add_run_flags adds, in a group "run", what every pipeline takes:
    ``--master`` (default local[*]), ``--out`` (default ``out``; created,
    and refused before any work if it cannot be written), ``--no-progress``
    and, with ``no_report``, ``--no-report``.  Returns the group."""
    group = parser.add_argument_group("run")
    group.add_argument("--master", default=DEFAULT_MASTER,
                       help="Spark master: local[N], spark://host:port, yarn, k8s://...")
    group.add_argument("--out", type=writable_dir, default=Path(out),
                       help="output folder: index.html, its plots, the tables (Parquet, CSV)")
    group.add_argument("--no-progress", action="store_true", help="no progress bars")
    if no_report:
        group.add_argument("--no-report", action="store_true",
                           help="tables only: no plots, no index.html")
    return group


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


def preflight(master: str, spark=None, needs: Sequence[str] = ("pyspark",)) -> None:
    """preflight is what a pipeline checks before any work, as usage errors:
    the master URL (unless it adopts a running ``spark``), then the modules
    it ``needs``, naming the extra that brings them.  The master comes first,
    so a bad URL reads the same whether or not pyspark is installed."""
    if spark is None:
        check_master(master)
    require(needs, "spark")


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
                  conf: Optional[Mapping[str, str]] = None,
                  prog: Optional[str] = None) -> Iterator:
    """spark_session yields ``spark`` unchanged when the caller passes one
    (and leaves it running), else checks ``master``, starts a session and
    stops it on exit.  Raises UsageError for a master nobody answers.
    With ``prog`` (a command's name), Ctrl-C inside the block cancels the
    running jobs and ends in KeyboardInterrupt (cancel_on_interrupt)."""
    if spark is not None:
        with _interruptible(spark, prog):
            yield spark
        return
    check_master(master)
    with tempfile.TemporaryDirectory(prefix="plim-spark-") as tmp:
        own = start_spark(master, app_name=app_name, workdir=Path(tmp), conf=conf)
        try:
            with _interruptible(own, prog):
                yield own
        finally:
            own.stop()


def _interruptible(spark, prog: Optional[str]):
    return cancel_on_interrupt(spark.sparkContext, prog) if prog else contextlib.nullcontext()


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


@contextlib.contextmanager
def cancel_on_interrupt(sc, prog: str):
    """cancel_on_interrupt turns Ctrl-C while Spark jobs run into a clean
    stop: the jobs are cancelled and KeyboardInterrupt is raised once the
    driver's blocking call has returned (``pylimiter._cli.run`` then prints
    one line and exits 130).

    pyspark's own SIGINT handler calls into the JVM from inside the signal
    handler, on the very py4j connection the interrupted call is reading,
    and py4j then logs both calls with tracebacks.  Here the handler only
    sets a flag and cancels from another thread (its own py4j connection);
    the session is then stopped normally by ``spark_session``.  A second
    Ctrl-C interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = threading.Event()

    finished = threading.Event()

    def cancel():
        # Again and again until the block is left: a job the driver submits
        # after the first cancel (the next stage, the next table) is not
        # covered by it.
        while not finished.is_set():
            with contextlib.suppress(Exception):
                sc.cancelAllJobs()
            finished.wait(0.5)

    def handler(signum, frame):
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()
        print(f"{prog}: interrupted, cancelling the Spark jobs...", file=sys.stderr, flush=True)
        threading.Thread(target=cancel, name="cancel-jobs", daemon=True).start()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    except Exception:
        if interrupted.is_set():  # the cancelled job's error: not a failure
            raise KeyboardInterrupt from None
        raise
    finally:
        finished.set()
        signal.signal(signal.SIGINT, previous)
    if interrupted.is_set():
        raise KeyboardInterrupt


@contextlib.contextmanager
def sql_conf(spark, values: Mapping[str, str]) -> Iterator[None]:
    """sql_conf sets Spark SQL settings for the block and puts the old values
    back, so a session handed in by a caller (the tests' shared one) stays
    as it was."""
    old = {k: spark.conf.get(k, None) for k in values}
    for k, v in values.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)
