"""`python -m pylimiter.pulsar.cache simulate`: replay generated broker
traces against the eviction policies on Spark and report hit rates, storage
reads and eviction cost.

The grid (workload x policy x cache size x seed) becomes one Spark task per
point: the executor generates the trace from its seed (deterministic, so
every policy sees the same reads) and replays it.  A second, smaller job
measures one idle eviction pass per policy at growing topic counts, all
policies of one count in one task, interleaved.  Spark SQL aggregates both
into tables (Parquet + CSV) and ``index.html`` with plots.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Optional, Sequence

from ...spark.cli import (
    UsageError,
    fmt_bytes,
    fmt_seconds,
    make_parser,
    name_list,
    number_list,
    positive_float,
    positive_int,
    run,  # re-exported: __main__.py is `run(main, PROG)` and nothing else
    subparsers,
)
from ...spark.executors import check_executors
from ...spark.flags import add_run_flags, run_conf
from ...spark.master import preflight
from ...spark.progress import JobProgress, job_description
from ...spark.report import RunResult, command_line, plural
from ...spark.rows import failure_row, field_names, schema, typed_row
from ...spark.session import spark_session
from ...spark.settings import add_setting_flags, add_sweep_flag, setting_overrides
from ...spark.tables import write_table
from ._common import CacheSettings
from .policies import POLICIES
from .replay import RESULT_FIELDS
from .report import verdicts, write_report
from .workloads import WORKLOADS

__all__ = ["PROG", "UsageError", "build_parser", "expand_grid", "main", "outcome", "run",
           "settings_from"]

PROG = "python -m pylimiter.pulsar.cache"
SCAN_POLICIES = ("pip430", "lru", "legacy")
SCAN_FIELDS = [("topics", "int"), ("policy", "string"), ("ns_per_pass", "double")]


# ---- arguments ---------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The command line: one sub-command, ``simulate``."""
    ap = make_parser(PROG, "The Pulsar broker entry cache (PIP-430) and its policy simulator.")
    sub = subparsers(ap, dest="command", required=True, metavar="COMMAND",
                     help="run `COMMAND --help` for its options")
    sp = sub.add_parser(
        "simulate", usage="%(prog)s [options]",
        help="compare eviction policies on generated traces (PySpark)",
        description="Replay generated traces (workload x policy x cache size x seed) on "
                    "Spark and write hit rates, storage reads and eviction cost to "
                    "OUT/index.html and Parquet/CSV tables.  The policies fix "
                    "cacheEvictionByExpectedReadCount and "
                    "managedLedgerCacheEvictionExtendTTLOfRecentlyAccessed: pip430 (true, "
                    "true), pip430-no-expected-reads (false, true), fifo (false, false).")
    sp.add_argument("--workloads", type=name_list(list(WORKLOADS)), default=list(WORKLOADS),
                    help="comma-separated")
    sp.add_argument("--policies", type=name_list(list(POLICIES)), default=list(POLICIES),
                    help="comma-separated")
    add_sweep_flag(sp, CacheSettings, "cache_size_mb", [8.0, 32.0, 128.0])
    pulsar = sp.add_argument_group("eviction settings (the policies fix the switches)")
    add_setting_flags(pulsar, CacheSettings, group="eviction")
    sp.add_argument("--seeds", type=positive_int, default=1, help="traces per workload")
    sp.add_argument("--scale", type=positive_float, default=1.0,
                    help="multiplies every workload's topic count")
    sp.add_argument("--duration", type=positive_float, default=None,
                    help="simulated seconds per trace (default: each workload's own)")
    sp.add_argument("--scan-topics", type=number_list(int, 0), default=[100, 1000, 10000, 100000],
                    help="topic counts for the idle eviction pass cost (0: skip)")
    add_run_flags(sp, Path("reports/cache"))
    return ap


# ---- executors -------------------------------------------------------------------------


def _replay_partition(rows):
    """Executor side: one grid point per row -> one result tuple."""
    from pylimiter.pulsar.cache.replay import RESULT_FIELDS, replay
    from pylimiter.pulsar.cache.workloads import Trace

    for row in rows:
        try:
            trace = Trace(row["workload"], row["seed"], scale=row["scale"],
                          duration=row["duration"])
            res = replay(trace, row["policy"], int(row["cache_mb"] * (1 << 20)), row["settings"])
        except Exception as exc:
            res = failure_row({k: row.get(k) for k in ("workload", "policy", "cache_mb", "seed")},
                              exc)
        yield typed_row(res, RESULT_FIELDS)


def _scan_partition(rows):
    from pylimiter.pulsar.cache.scan import idle_pass_ns

    for row in rows:
        for policy, ns in idle_pass_ns(row["topics"], row["policies"]).items():
            yield typed_row(dict(topics=row["topics"], policy=policy, ns_per_pass=ns),
                            SCAN_FIELDS)


def settings_from(args) -> CacheSettings:
    """The eviction settings the command line gives (Pulsar's defaults for
    the others)."""
    return CacheSettings(**setting_overrides(args, CacheSettings, group="eviction"))


def expand_grid(args) -> list[dict]:
    """The replay points, shuffled (seeded) so heavy ones spread over
    executors."""
    settings = settings_from(args)
    points = [dict(workload=w, policy=p, cache_mb=mb, seed=s + 1, scale=args.scale,
                   duration=args.duration, settings=settings)
              for w in args.workloads for p in args.policies for mb in args.cache_size_mb
              for s in range(args.seeds)]
    random.Random(1).shuffle(points)
    return points


# ---- driver --------------------------------------------------------------------------------


def outcome(rows, fields=RESULT_FIELDS) -> tuple[list[str], int, int]:
    """What the replays' result rows (tuples in ``fields`` order) add up to,
    each value read by its field's name: the failures' messages, the entry
    reads and the bytes read from storage."""
    named = [dict(zip(field_names(fields), r)) for r in rows]
    return ([r["failure"] for r in named if r["failure"]],
            sum(r["reads"] or 0 for r in named),
            sum(r["storage_bytes"] or 0 for r in named))


SUMMARY_SQL = """
SELECT workload, policy, cache_mb,
       count(*) AS runs,
       avg(hit_rate) AS hit_rate,
       stddev_samp(hit_rate) AS hit_rate_sd,
       sum(reads) AS reads, sum(hits) AS hits, sum(misses) AS misses,
       avg(storage_bytes) / 1048576.0 AS storage_mib,
       avg(storage_reads) AS storage_reads,
       avg(evicted_entries) AS evicted_entries,
       avg(requeues) AS requeues,
       avg(peak_bytes) / 1048576.0 AS peak_mib,
       sum(eviction_cpu_ns) / sum(eviction_passes) / 1000.0 AS eviction_us_per_pass,
       max(max_pass_ns) / 1000.0 AS max_pass_us,
       max(topics) AS topics
FROM runs WHERE failure IS NULL
GROUP BY workload, policy, cache_mb
ORDER BY workload, cache_mb, policy
"""


def main(argv: Optional[Sequence[str]] = None, *, spark=None) -> int:
    """Run the simulator; ``spark`` adopts a session (tests), else one is
    started on ``--master`` and stopped at the end."""
    args = build_parser().parse_args(argv)
    preflight(args.master, spark, ["pyspark", "pandas", "matplotlib", "rich"])
    grid = expand_grid(args)
    scan = [t for t in args.scan_topics if t > 0]
    print(f"pylimiter entry cache simulator: {plural(len(grid), 'replay')} "
          f"({plural(len(args.workloads), 'workload')} x "
          f"{plural(len(args.policies), 'policy', 'policies')} x "
          f"{plural(len(args.cache_size_mb), 'cache size')} x {plural(args.seeds, 'seed')})"
          + (f" + idle-pass cost at {','.join(map(str, scan))} topics" if scan else "")
          + f" on {args.master if spark is None else 'the given session'}", flush=True)
    t0 = time.perf_counter()
    out = args.out
    with spark_session(args.master, app_name="pylimiter-cache-sim", spark=spark,
                       conf=run_conf(args), prog=PROG) as s:
        sc = s.sparkContext
        check_executors(s, ["pylimiter", "pylimiter.pulsar.cache.replay",
                            "pylimiter.pulsar.cache.scan"])
        with JobProgress(sc, "replays", len(grid), enabled=not args.no_progress):
            rows = sc.parallelize(grid, len(grid)).mapPartitions(_replay_partition).collect()
        runs = s.createDataFrame(rows, schema(RESULT_FIELDS))
        runs.createOrReplaceTempView("runs")
        failures, total_reads, total_bytes = outcome(rows)
        if failures:
            print(f"{plural(len(failures), 'replay')} failed; first: {failures[0]}")
        scan_rows = []
        if scan:
            pts = [dict(topics=t, policies=[p for p in SCAN_POLICIES if p in args.policies]
                        or list(SCAN_POLICIES)) for t in scan]
            with JobProgress(sc, "idle passes", len(pts), enabled=not args.no_progress):
                scan_rows = sc.parallelize(pts, len(pts)).mapPartitions(_scan_partition).collect()
        scan_df = s.createDataFrame(scan_rows, schema(SCAN_FIELDS))
        summary = s.sql(SUMMARY_SQL)
        write_table(runs, out, "runs")
        write_table(summary, out, "summary")
        write_table(scan_df, out, "scan")
        with job_description(sc, "cache: summary and idle passes to the driver"):
            summary_pd, scan_pd = summary.toPandas(), scan_df.toPandas()
        res = RunResult(tables={"summary": summary_pd, "scan": scan_pd},
                        settings=grid[0]["settings"] if grid else settings_from(args),
                        params=dict(workloads=args.workloads, policies=args.policies,
                                    seeds=args.seeds, scale=args.scale))
        index = write_report(out, res, spark_version=s.version,
                             command=command_line(PROG, argv))
    if failures:
        raise RuntimeError(f"{len(failures)} of {len(grid)} replays failed: {failures[0]}")
    print(f"{plural(len(grid), 'replay')}, {plural(total_reads, 'entry read')}, "
          f"{fmt_bytes(total_bytes)} read from simulated storage, in "
          f"{fmt_seconds(time.perf_counter() - t0)}")
    for v in verdicts(res):   # the headline: the page's verdict table
        print(f"verdict {v.claim}: holds? {v.holds_text()}\n    {v.measured}")
    print(f"report: {index.resolve()}")
    return 0

