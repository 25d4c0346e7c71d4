"""The one command kit shared by pylimiter's commands: Spark, rows, progress,
reports, settings and side-by-side timing.

The limiter's benchmark grid (``pylimiter.bench``) and every broker subsystem
under ``pylimiter.pulsar`` (its library, its simulator or service) build on
these modules instead of carrying their own plumbing:

``cli``       what every command keeps to: parsers that show defaults and
              answer --version, argparse types, exit statuses and one-line
              errors (``run``), numbers with their units;
``flags``     the run flags every pipeline takes (``--master``,
              ``--executor-env``, ``--conf``, ``--out``, ``--no-progress``)
              and the Spark settings they stand for;
``master``    master URLs checked before any JVM starts (``local[*]`` by
              default), and ``preflight``, a pipeline's first step;
``session``   start or adopt a SparkSession, quiet log4j, JVM output kept
              off the terminal, the session stopped on exit;
``errors``    a Spark or Py4J failure said in one line (its root cause);
``executors`` a cluster's executors checked before any work;
``interrupts``  Ctrl-C while jobs run: one line, the jobs cancelled;
``tables``    small result tables written by the driver as Parquet and CSV;
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

from .cli import UsageError
from .flags import add_run_flags
from .master import check_master
from .session import spark_session, start_spark
from .tables import write_table

__all__ = ["UsageError", "add_run_flags", "check_master", "spark_session", "start_spark",
           "write_table"]
