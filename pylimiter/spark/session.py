"""Starting (or adopting) a SparkSession.

One session per process: ``spark_session()`` starts one for ``master``
(``local[*]`` unless told otherwise) and stops it on exit, or hands back a
session the caller already owns, untouched.  Tests pass their one shared
session this way, so three simulators and the benchmark grid pay for one JVM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator, Mapping, Optional

from .errors import SparkError, jvm_start_cause, root_cause, spark_errors
from .interrupts import cancel_on_interrupt
from .master import DEFAULT_MASTER, check_master, is_local

__all__ = ["quiet_log4j", "session_settings", "spark_session", "sql_conf", "start_spark"]

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


@contextlib.contextmanager
def _env(**values: Optional[str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _quiet_py4j() -> None:
    # py4j logs a traceback of its own for a call that a stop or a cancel
    # cut short; the failure reaches the caller anyway, said once.
    import logging

    log = logging.getLogger("py4j")
    if not any(isinstance(h, logging.NullHandler) for h in log.handlers):
        log.addHandler(logging.NullHandler())
    log.propagate = False


def _quiet_pandas_notice() -> None:
    # PySpark 4.x warns (FutureWarning, on stderr) at every start and every
    # toPandas when pandas >= 3 is installed, which is what CPython 3.15 gets:
    # the suite runs the pipelines and checks their tables on pandas 3 (make
    # test-pythons), so the notice tells a pipeline's user nothing.  Only that
    # message is silenced.
    import warnings

    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas",
                            category=FutureWarning)


def session_settings(master: str, app_name: str, log4j: Path,
                     conf: Optional[Mapping[str, str]] = None) -> dict:
    """The Spark settings start_spark uses: the pipelines' own (UI off, no
    console progress, quiet log4j, 4 shuffle partitions, Python workers
    reused; a driver on 127.0.0.1 for local masters), then ``conf``, which
    wins (``spark.ui.enabled=true`` turns the UI back on)."""
    settings = {
        "spark.master": master,
        "spark.app.name": app_name,
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
    return settings


def _drop_gateway(gateway) -> None:
    from pyspark import SparkContext

    with contextlib.suppress(Exception):
        gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.kill()
            proc.wait(10)
    SparkContext._gateway = SparkContext._jvm = None
    SparkContext._active_spark_context = None


def start_spark(master: str = DEFAULT_MASTER, *, app_name: str = "pylimiter",
                workdir: Optional[Path] = None, conf: Optional[Mapping[str, str]] = None):
    """start_spark builds a SparkSession for ``master`` with the UI off (unless
    ``conf`` turns it on), quiet logs and, for local masters, a driver bound
    to 127.0.0.1.  ``workdir`` holds the log4j file and the JVM's own
    output (``jvm.log``: Java traces never reach the terminal; set
    PYLIMITER_TRACEBACK=1 to see them there).  ``conf`` adds or overrides
    Spark settings; ``spark.pyspark.python`` in it is the executors' Python,
    which is the driver's own interpreter only for local masters (else
    PYSPARK_PYTHON, else Spark's default, python3).  A JVM that cannot
    start is a SparkError naming the cause."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway
    from pyspark.sql import SparkSession

    workdir = Path(workdir or tempfile.mkdtemp(prefix="plim-spark-"))
    settings = session_settings(master, app_name, quiet_log4j(workdir / "log4j2.properties"),
                                conf)
    python = settings.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON") \
        or (sys.executable if is_local(master) else None)
    _quiet_pandas_notice()
    spark_conf = SparkConf(loadDefaults=False)
    for k, v in settings.items():
        spark_conf.set(k, v)
    _quiet_py4j()
    show = bool(os.environ.get("PYLIMITER_TRACEBACK"))
    log_path = workdir / "jvm.log"
    if SparkContext._active_spark_context is not None:
        # One SparkContext per process: an active one is adopted, as
        # SparkSession.builder would.
        bld = SparkSession.builder
        for k, v in settings.items():
            bld = bld.config(k, v)
        return bld.getOrCreate()
    # Ctrl-C while the JVM starts is held until the context is up, then
    # acted on: py4j's connection code swallows a KeyboardInterrupt raised
    # inside it (the run would go on), and pyspark's own handler, set at the
    # end of SparkContext(), calls into a JVM that may not be ready.
    main = threading.current_thread() is threading.main_thread()
    held: list = []
    previous = signal.signal(signal.SIGINT, lambda *_: held.append(1)) if main else None
    gateway = sc = None
    try:
        with _env(PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=sys.executable):
            if SparkContext._gateway is None:
                with open(log_path, "ab") as log:
                    kw = {} if show else {"stdout": log, "stderr": log}
                    try:
                        gateway = launch_gateway(spark_conf, popen_kwargs=kw)
                    except spark_errors() as exc:
                        text = log_path.read_text(errors="replace") if log_path.exists() else ""
                        raise SparkError(f"Spark did not start: {jvm_start_cause(text)}") \
                            from exc
            else:
                gateway = SparkContext._gateway     # a stopped session's JVM, reused
            try:
                sc = SparkContext(conf=spark_conf, gateway=gateway)
            except spark_errors() as exc:
                raise SparkError(f"Spark did not start: {root_cause(exc)}") from exc
    except BaseException:
        # py4j's threads would keep the interpreter from exiting, and the
        # JVM would outlive it.
        if gateway is not None:
            _drop_gateway(gateway)
        raise
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    if held:
        with contextlib.suppress(Exception):
            sc.stop()
        _drop_gateway(gateway)
        raise KeyboardInterrupt
    spark = SparkSession.builder.getOrCreate()
    sc.setLogLevel("ERROR")
    return spark


@contextlib.contextmanager
def spark_session(master: str = DEFAULT_MASTER, *, app_name: str = "pylimiter", spark=None,
                  conf: Optional[Mapping[str, str]] = None,
                  prog: Optional[str] = None) -> Iterator:
    """spark_session yields ``spark`` unchanged when the caller passes one
    (and leaves it running), else checks ``master``, starts a session and
    stops it on exit.  Raises UsageError for a master nobody answers.
    With ``prog`` (a command's name), Ctrl-C inside the block cancels the
    running jobs and ends in KeyboardInterrupt (cancel_on_interrupt).
    A Spark or Py4J failure inside the block leaves it as a SparkError
    naming its root cause; a session this function started is then stopped
    with a non-zero exit code, so the cluster manager lists the
    application as failed."""
    if spark is not None:
        with _failures_in_one_line():
            with _interruptible(spark, prog):
                yield spark
        return
    check_master(master)
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGINT) if main else None
    with tempfile.TemporaryDirectory(prefix="plim-spark-") as tmp:
        own = start_spark(master, app_name=app_name, workdir=Path(tmp), conf=conf)
        # Every job gets a description in the UI: the command's name unless
        # a step names its own.
        own.sparkContext.setJobDescription(app_name)
        ok = False
        try:
            with _failures_in_one_line():
                with _interruptible(own, prog):
                    yield own
            ok = True
        finally:
            if main:
                # pyspark's own SIGINT handler calls into the JVM; while it
                # stops, Ctrl-C is a plain KeyboardInterrupt.
                signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                with contextlib.suppress(*spark_errors()):
                    if ok:
                        own.stop()
                    else:
                        own.sparkContext._jsc.sc().stop(1)
                        own.stop()
            finally:
                if main and handler is not None:
                    signal.signal(signal.SIGINT, handler)


@contextlib.contextmanager
def _failures_in_one_line() -> Iterator[None]:
    try:
        yield
    except spark_errors() as exc:
        raise SparkError(root_cause(exc)) from exc


def _interruptible(spark, prog: Optional[str]):
    return cancel_on_interrupt(spark.sparkContext, prog) if prog else contextlib.nullcontext()


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
