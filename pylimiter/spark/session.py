"""Starting (or adopting) a SparkSession, and writing small result tables.

One session per process: ``spark_session()`` starts one for ``master``
(``local[*]`` unless told otherwise) and stops it on exit, or hands back a
session the caller already owns, untouched.  Tests pass their one shared
session this way, so three simulators and the benchmark grid pay for one JVM.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import platform
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence
from urllib.parse import urlparse

from .._cli import Failure, UsageError, announce_interrupt, require, writable_dir

__all__ = ["DEFAULT_MASTER", "ENV_NAME", "SparkError", "UsageError", "add_run_flags",
           "cancel_on_interrupt", "check_executors", "check_master", "executor_env",
           "is_local", "job_description", "master_url", "preflight", "quiet_log4j",
           "root_cause", "run_conf", "spark_session", "spark_setting", "sql_conf",
           "start_spark", "validate_master", "write_table"]

DEFAULT_MASTER = "local[*]"


def add_run_flags(parser, out: Path, *, no_report: bool = False):
    """add_run_flags adds, in a group "run", what every pipeline takes:
    ``--master`` (default local[*]; preflight checks its form before any
    JVM starts), ``--executor-env`` (a packed environment shipped to the
    executors), ``--conf KEY=VALUE`` (repeatable, any Spark setting),
    ``--out`` (default ``out``; created, and refused before any work if it
    cannot be written), ``--no-progress`` and, with ``no_report``,
    ``--no-report``.  ``run_conf(args)`` turns the parsed flags into the
    Spark settings ``spark_session`` takes.  Returns the group."""
    group = parser.add_argument_group("run")
    # The master's form is checked by preflight (one line, before the JVM),
    # not by argparse, whose errors come with the whole usage block.
    group.add_argument("--master", default=DEFAULT_MASTER,
                       help="Spark master: local, local[N], local[*], local[N,F], "
                            "local-cluster[N,C,M], spark://host:port, yarn, k8s://...")
    group.add_argument("--executor-env", type=executor_env, default=None, metavar="ARCHIVE",
                       help="a packed Python environment with pylimiter (make cluster-env) "
                            "for the executors of a cluster master: sets spark.archives="
                            f"ARCHIVE#{ENV_NAME} and the executors' Python to "
                            f"./{ENV_NAME}/bin/python")
    group.add_argument("--conf", type=spark_setting, action="append", default=[],
                       metavar="KEY=VALUE",
                       help="a Spark setting, e.g. spark.ui.enabled=true (repeatable; "
                            "wins over the pipeline's own)")
    group.add_argument("--out", type=writable_dir, default=Path(out),
                       help="output folder on the driver: index.html, its plots, the tables "
                            "(Parquet, CSV), all written by the driver")
    group.add_argument("--no-progress", action="store_true", help="no progress bars")
    if no_report:
        group.add_argument("--no-report", action="store_true",
                           help="tables only: no plots, no index.html")
    return group


# ---- master URLs, settings, the executors' environment ------------------------------

#: Where --executor-env's archive is unpacked in each executor's working folder.
ENV_NAME = "pylimiter_env"
_FORMS = ("local, local[N], local[*], local[N,F], local-cluster[N,C,M], "
          "spark://host:port[,host:port], yarn or k8s://https://host:port")
_N = r"[1-9][0-9]*"
_LOCAL = re.compile(rf"local(\[(\*|{_N})(,\s*{_N})?\])?")
_LOCAL_CLUSTER = re.compile(rf"local-cluster\[\s*{_N}\s*,\s*{_N}\s*,\s*{_N}\s*\]")
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?|\[[0-9A-Fa-f:.]+\]")


def is_local(master: str) -> bool:
    """True for local and local[...]: executors are threads of the driver's
    JVM and run the driver's Python.  local-cluster[...] starts executor
    processes like a cluster's and counts as a cluster here."""
    return bool(_LOCAL.fullmatch(master))


def _pyspark_major() -> Optional[int]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("pyspark").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return None


def _hostports(master: str, scheme: str) -> list[tuple[str, int]]:
    body = master[len(scheme):]
    found = []
    for hp in body.split(","):
        host, sep, port = hp.rpartition(":")
        if not sep or not _HOST.fullmatch(host) or not port.isdigit() \
                or not 0 < int(port) < 65536:
            raise UsageError(f"invalid master URL {master!r}: expected {scheme}host:port"
                             + (",host:port..." if scheme == "spark://" else "")
                             + f", got {hp!r}")
        found.append((host.strip("[]"), int(port)))
    return found


def validate_master(master: str) -> list[tuple[str, int]]:
    """validate_master raises UsageError, in one line, for a master URL Spark
    would refuse, before any JVM starts (Spark would print a Java stack
    trace): the forms in ``_FORMS``, ``yarn`` only where HADOOP_CONF_DIR or
    YARN_CONF_DIR says where the cluster is, and mesos:// only on a Spark
    that still has it (not 4.x).  Returns the (host, port) pairs a driver
    would connect to (none for local, local-cluster and yarn)."""
    if master.startswith("local-cluster"):
        if not _LOCAL_CLUSTER.fullmatch(master):
            raise UsageError(f"invalid master URL {master!r}: expected local-cluster[N,C,M] "
                             "(workers, cores per worker, MiB per worker; each >= 1)")
        return []
    if master.startswith("local"):
        if not _LOCAL.fullmatch(master):
            if master.startswith("local["):
                raise UsageError(f"invalid master URL {master!r}: expected local[N], local[*] "
                                 "or local[N,F] (N threads >= 1 or *, F task retries >= 1)")
            raise UsageError(f"unsupported master URL {master!r} (use {_FORMS})")
        return []
    if master == "yarn":
        if not (os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR")):
            raise UsageError("--master yarn needs HADOOP_CONF_DIR or YARN_CONF_DIR set to the "
                             "folder of the cluster's Hadoop configuration")
        return []
    if master.startswith("spark://"):
        return _hostports(master, "spark://")
    if master.startswith("k8s://"):
        u = urlparse(master[len("k8s://"):] if "://" in master[len("k8s://"):]
                     else "https://" + master[len("k8s://"):])
        try:
            port = u.port
        except ValueError:
            port = -1
        if not u.hostname or u.scheme not in ("http", "https") or port == -1:
            raise UsageError(f"cannot parse Kubernetes master URL {master!r} "
                             "(expected k8s://https://host:port)")
        return [(u.hostname, port or (443 if u.scheme == "https" else 80))]
    if master.startswith("mesos://"):
        major = _pyspark_major()
        if major is not None and major >= 4:
            raise UsageError(f"unsupported master URL {master!r}: Spark {major} has no Mesos "
                             "support (removed in Spark 4.0)")
        if master.startswith("mesos://zk://"):
            return []
        return _hostports(master, "mesos://")
    raise UsageError(f"unsupported master URL {master!r} (use {_FORMS})")


def master_url(text: str) -> str:
    """argparse type for ``--master``: validate_master's checks."""
    try:
        validate_master(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def spark_setting(text: str) -> tuple[str, str]:
    """argparse type for ``--conf``: ``spark.KEY=VALUE`` -> (key, value)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if not key.startswith("spark."):
        raise argparse.ArgumentTypeError(
            f"{key!r} is not a Spark setting (Spark ignores keys outside spark.*)")
    return key, value


_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


def executor_env(text: str) -> str:
    """argparse type for ``--executor-env``: a local archive (checked now,
    made absolute) or a URI every node can fetch (hdfs://, s3a://, https://,
    passed on as is)."""
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", text) and not text.startswith("file://"):
        return text
    path = Path(text[len("file://"):] if text.startswith("file://") else text)
    if not path.name.endswith(_ARCHIVE_SUFFIXES):
        raise argparse.ArgumentTypeError(
            f"{text}: expected a .tar.gz, .tgz, .tar or .zip archive (make cluster-env)")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file (make cluster-env builds it)")
    return str(path.resolve())


def run_conf(args, base: Optional[Mapping[str, str]] = None) -> dict:
    """run_conf returns the Spark settings of the run flags: ``base`` (the
    pipeline's own), then --executor-env's, then every --conf (the user
    wins).  --executor-env on a local master is a UsageError: local
    executors run the driver's Python."""
    conf = dict(base or {})
    env = getattr(args, "executor_env", None)
    if env:
        if is_local(args.master):
            raise UsageError(f"--executor-env is for cluster masters; {args.master} runs the "
                             "driver's own Python (drop the flag, or use spark://, yarn, k8s://)")
        conf["spark.archives"] = f"{env}#{ENV_NAME}"
        conf["spark.pyspark.python"] = f"./{ENV_NAME}/bin/python"
    for key, value in getattr(args, "conf", None) or []:
        if key == "spark.archives" and "spark.archives" in conf and env:
            value = f"{conf[key]},{value}"
        conf[key] = value
    return conf


def check_master(master: str, timeout: float = 3.0) -> None:
    """check_master fails fast, in one line (UsageError), on a master URL that
    is malformed (validate_master) or that nobody answers; Spark itself would
    retry for a minute and then print a Java stack trace."""
    hostports = validate_master(master)
    if not hostports:
        return
    errors = []
    for host, port in hostports:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            errors.append(f"{host}:{port}: {exc.strerror or exc}")
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


class SparkError(Failure):
    """A Spark or Py4J failure, said in one line: its root cause (the
    Python worker's exception, the deepest Java cause), not the first line
    of a trace.  The original is its ``__cause__`` (PYLIMITER_TRACEBACK=1
    shows it)."""


_JAVA_EXC = re.compile(r"(?:Exception in thread \"[^\"]*\" |Caused by: )?"
                       r"(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error|Throwable))"
                       r"(?::\s*(.*))?")


def _python_cause(text: str) -> Optional[str]:
    """The last exception line of the last Python traceback in ``text``."""
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    found = None
    for line in text[at:].splitlines()[1:]:
        if line.startswith("\tat ") or line.startswith("\t..."):
            break                       # the Java stack after the Python one
        if line.strip() and not line[0].isspace() and not line.startswith(
                ("During handling", "The above exception", "Traceback")):
            found = line.strip()
    return found


_JAVA_NAME = re.compile(r"(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error|Throwable))"
                        r"(?::\s*|$)")


def _java_cause(text: str) -> Optional[str]:
    """The innermost 'pkg.SomeException: message' in the first line of a
    Java exception's text, without the package."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    found = list(_JAVA_NAME.finditer(first))
    if not found:
        return None
    last = found[-1]
    rest = first[last.end():].strip()
    return f"{last.group(1)}: {rest}" if rest else last.group(1)


def root_cause(exc: BaseException) -> str:
    """root_cause says in one line what made a Spark or Py4J call fail: the
    exception a Python worker raised (the last line of its traceback), else
    the deepest cause of the Java exception, else the exception's first
    line."""
    texts = []
    java = getattr(exc, "java_exception", None)     # py4j's Py4JJavaError
    if java is not None:
        with contextlib.suppress(Exception):
            t, seen = java, 0
            while t is not None and seen < 20:
                texts.append(str(t.toString()))
                t, seen = t.getCause(), seen + 1
    texts.append(str(exc))
    for text in texts:
        cause = _python_cause(text)
        if cause:
            return cause
    for text in reversed(texts[:-1] or texts):
        cause = _java_cause(text)
        if cause:
            return cause
    text = str(exc).strip()
    first = re.sub(r"^An error occurred while calling \S+\.\s*", "", text.splitlines()[0]) \
        if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _spark_errors() -> tuple:
    """The exception types that mean "Spark or Py4J failed"."""
    kinds = []
    with contextlib.suppress(ImportError):
        from py4j.protocol import Py4JError
        kinds.append(Py4JError)
    with contextlib.suppress(ImportError):
        from pyspark.errors import PySparkException
        kinds.append(PySparkException)
    return tuple(kinds)


def jvm_start_cause(log: str) -> str:
    """What the JVM printed before it exited at start-up, in one line: its
    last exception (without the package) or, if none, its last line (the
    launcher script's own error, e.g. no Java)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("at "):
            continue
        m = _JAVA_EXC.fullmatch(line)
        if m:
            return f"{m.group(1)}: {m.group(2)}" if m.group(2) else m.group(1)
    # The launcher script's own complaint: its first words name the cause
    # (spark-class's "CMD: bad array subscript" only follows from it).
    lines = [re.sub(r"^\S*spark-(?:class|submit)\S*: line \d+: ", "", ln) for ln in lines
             if "bad array subscript" not in ln]
    if not lines:
        return "the JVM exited without a word (is Java 17+ installed?)"
    cause = lines[-1]
    if "java" in cause and ("No such file" in cause or "not found" in cause):
        cause += " (set JAVA_HOME to a Java 17+ installation, or install one)"
    return cause


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
                    except _spark_errors() as exc:
                        text = log_path.read_text(errors="replace") if log_path.exists() else ""
                        raise SparkError(f"Spark did not start: {jvm_start_cause(text)}") \
                            from exc
            else:
                gateway = SparkContext._gateway     # a stopped session's JVM, reused
            try:
                sc = SparkContext(conf=spark_conf, gateway=gateway)
            except _spark_errors() as exc:
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
                with contextlib.suppress(*_spark_errors()):
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
    except _spark_errors() as exc:
        raise SparkError(root_cause(exc)) from exc


def _interruptible(spark, prog: Optional[str]):
    return cancel_on_interrupt(spark.sparkContext, prog) if prog else contextlib.nullcontext()


# ---- the executors ----------------------------------------------------------------

FIX = ("ship pylimiter with --executor-env ARCHIVE (make cluster-env builds "
       "build/cluster-env/pylimiter-env.tar.gz) or install pylimiter-pulsar on every node")


def check_executors(spark, imports: Sequence[str] = ("pylimiter",), *,
                    extension: bool = True) -> dict:
    """check_executors makes sure, before any work, that a cluster's
    executors can run what the pipeline sends them: one tiny task reports
    the executors' Python and tries ``imports``; with ``extension``, the
    executors must load pylimiter's C extension where the driver does.
    Anything missing is a SparkError in one line naming the fix.  Returns
    ``python`` (the executors' interpreter), ``version`` and
    ``implementation`` (pylimiter's, or None).  On a local master no task
    runs: the executors are the driver's own Python."""
    sc = spark.sparkContext
    driver_version = platform.python_version()
    if is_local(sc.master):
        impl = None
        if imports:
            import pylimiter
            impl = pylimiter.IMPLEMENTATION
        python = sc.pythonExec
        return {"python": shutil.which(python) or python, "version": driver_version,
                "implementation": impl}
    names = list(imports)

    def probe(_):
        # Pickled by value (a closure), so it needs nothing but Python.
        import importlib
        import sys as _sys

        info = {"python": _sys.executable, "version": "%d.%d.%d" % _sys.version_info[:3],
                "implementation": None, "error": None}
        for name in names:
            try:
                importlib.import_module(name)
            except BaseException as exc:      # noqa: BLE001 - reported, not raised
                info["error"] = f"{type(exc).__name__}: {exc}"
                break
        if names and info["error"] is None:
            info["implementation"] = _sys.modules["pylimiter"].IMPLEMENTATION
        return info

    sc.setJobDescription("check executors: Python and pylimiter")
    try:
        (got,) = sc.parallelize([0], 1).map(probe).collect()
    except _spark_errors() as exc:
        raise SparkError(f"executors cannot run Python {sc.pythonExec!r} ({root_cause(exc)}); "
                         f"{FIX}, or point --conf spark.pyspark.python at a Python "
                         "on every node") from exc
    finally:
        sc.setJobDescription(None)
    where = f"{got['python']} ({got['version']})"
    if got["version"].split(".")[:2] != driver_version.split(".")[:2]:
        raise SparkError(f"executors run Python {where}, the driver {driver_version}: "
                         f"they need the same minor version; {FIX}")
    if got["error"]:
        raise SparkError(f"executors cannot import {', '.join(names)} ({got['error']}) "
                         f"with {where}; {FIX}")
    if extension and names:
        import pylimiter
        if pylimiter.IMPLEMENTATION == "c" and got["implementation"] != "c":
            raise SparkError(f"executors run pylimiter without its C extension "
                             f"({got['implementation']} implementation, {where}); {FIX}")
    del got["error"]
    return got


@contextlib.contextmanager
def job_description(sc, text: str) -> Iterator[None]:
    """job_description names the Spark jobs started in the block (the UI's
    Description column, e.g. ``write summary.parquet``) and puts the
    previous description back."""
    old = sc.getLocalProperty("spark.job.description")
    sc.setJobDescription(text)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.job.description", old)


# ---- tables -----------------------------------------------------------------------


def _csv_value(v) -> str:
    # Spark's CSV spellings, so the tables read the same as before.
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)
    return str(v)


def write_table(df, out: Path, name: str, formats: tuple[str, ...] = ("parquet", "csv")) -> None:
    """write_table writes a (small) DataFrame as the single files
    ``out/name.parquet`` and ``out/name.csv`` (a header row, UTF-8), which a
    spreadsheet, pandas or Spark opens as they are, replacing what was there
    (the part-file folders of older runs included).  The rows are collected
    and written by the driver: executors of a cluster do not see the
    driver's disk (Spark's own writer would leave the part files in
    ``_temporary`` on the nodes and report success).  Each file appears
    whole or not at all (written beside it, then renamed)."""
    for fmt in formats:
        if fmt not in ("parquet", "csv"):
            raise ValueError(f"unknown table format {fmt!r} (parquet or csv)")
    sc = df.sparkSession.sparkContext
    with job_description(sc, f"write {name}.{'/'.join(formats)}"):
        rows = df.collect()
    fields = df.schema.fieldNames()
    for fmt in formats:
        path = Path(out) / f"{name}.{fmt}"
        tmp = path.with_name(f".{path.name}.tmp")
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq
            from pyspark.sql.pandas.types import to_arrow_schema

            schema = to_arrow_schema(df.schema)
            cols = [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(schema)]
            pq.write_table(pa.Table.from_arrays(cols, schema=schema), tmp)
        else:
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(fields)
                w.writerows([_csv_value(v) for v in r] for r in rows)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)


@contextlib.contextmanager
def cancel_on_interrupt(sc, prog: str):
    """cancel_on_interrupt turns Ctrl-C while Spark jobs run into a clean
    stop: one line on stderr at once (``prog: interrupted``, never again),
    the jobs cancelled, and KeyboardInterrupt raised once the driver's
    blocking call has returned (``pylimiter._cli.run`` then exits 130).

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
        announce_interrupt(prog)
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()
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
