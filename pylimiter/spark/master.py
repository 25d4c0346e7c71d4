"""Spark master URLs: which forms Spark takes, checked before any JVM starts
(Spark would retry for a minute, then print a Java stack trace), and
whether anybody answers at the address.

``preflight`` is what every pipeline runs first: the master, then the
modules it needs, each a one-line usage error.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
from typing import Optional, Sequence
from urllib.parse import urlparse

from .cli import UsageError, require

__all__ = ["DEFAULT_MASTER", "check_master", "is_local", "master_url", "preflight",
           "validate_master"]

DEFAULT_MASTER = "local[*]"

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


def preflight(master: str, spark=None, needs: Sequence[str] = ("pyspark",)) -> None:
    """preflight is what a pipeline checks before any work, as usage errors:
    the master URL (unless it adopts a running ``spark``), then the modules
    it ``needs``, naming the extra that brings them.  The master comes first,
    so a bad URL reads the same whether or not pyspark is installed."""
    if spark is None:
        check_master(master)
    require(needs, "spark")
