"""The one Spark, rows, progress and report kit shared by pylimiter's pipelines.

The limiter's benchmark grid (``pylimiter.bench``) and every broker-subsystem
simulator under ``pylimiter.pulsar`` build on these modules instead of
carrying their own plumbing:

``session``   the run flags every pipeline takes (``--master``, ``--out``,
              ``--no-progress``); start or adopt a SparkSession
              (``local[*]`` by default, any master URL checked before the
              JVM starts), quiet log4j, write small result tables as
              Parquet and CSV;
``rows``      a table's fields declared once as (name, type) pairs: its
              schema, rows typed for it, the row of a failed task;
``progress``  a rich progress bar over the tasks of one Spark job group,
              polled from the status tracker, and one over driver-side steps;
``report``    matplotlib without a display, figure saving, and the static
              HTML page (environment block, verdict, figures, tables), and
              ``reports/index.html``, which links every report of a run.

Every pipeline's ``report.write_report(out, result, *, spark_version,
command)`` draws its page with ``report``.  Importing this package needs
nothing beyond the standard library; pyspark, rich and matplotlib (the
``spark`` extra) are imported by the functions that use them.
"""

from .session import (
    UsageError,
    add_run_flags,
    check_master,
    spark_session,
    start_spark,
    write_table,
)

__all__ = ["UsageError", "add_run_flags", "check_master", "spark_session", "start_spark",
           "write_table"]
