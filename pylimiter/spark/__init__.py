"""The one command kit shared by pylimiter's commands: Spark, rows, progress,
reports, settings and side-by-side timing.

The limiter's benchmark grid (``pylimiter.bench``) and every broker subsystem
under ``pylimiter.pulsar`` (its library, its simulator or service) build on
these modules instead of carrying their own plumbing:

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
              ``reports/index.html``, which links every report of a run;
``settings``  Pulsar settings, each declared once with its broker.conf key,
              default, unit and range: the config-file reader, the flags,
              the report's settings table;
``show``      a caller's value as an error message quotes it;
``interleave``  side-by-side timing: sides run in interleaved rounds, the
              order flipped, a figure per round, its median over rounds.

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
