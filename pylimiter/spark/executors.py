"""What a cluster's executors can run, checked before any work: their
Python (the driver's minor version) and pylimiter (with its C extension
where the driver has it), each missing piece a one-line SparkError naming
the fix.
"""

from __future__ import annotations

import platform
import shutil
from typing import Sequence

from .errors import SparkError, root_cause, spark_errors
from .master import is_local

__all__ = ["FIX", "check_executors"]

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
    except spark_errors() as exc:
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
