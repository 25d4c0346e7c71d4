"""The run flags every pipeline takes (``--master``, ``--executor-env``,
``--conf``, ``--out``, ``--no-progress``), their argparse types, and the
Spark settings they stand for (``run_conf``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Mapping, Optional

from .cli import UsageError, writable_dir
from .master import DEFAULT_MASTER, is_local

__all__ = ["ENV_NAME", "add_run_flags", "executor_env", "run_conf", "spark_setting"]

#: Where --executor-env's archive is unpacked in each executor's working folder.
ENV_NAME = "pylimiter_env"


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
