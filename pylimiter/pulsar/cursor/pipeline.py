"""``python -m pylimiter.pulsar.cursor simulate``: the message-lifecycle sweep
on Spark, one task per parameter point, and ``reports/cursor/index.html``.

Each point (TTL x retention x delayed share x ack-failure rate x rollover
size) runs four subscriptions: Pulsar's TTL rule and ours, each with and
without the hole compensator, on the same traffic.  The driver collects the
small results, writes them as Parquet and CSV (``summary``, ``series``,
``lifetimes``) and draws the report.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from ...spark.cli import (
    fmt_bytes,
    fmt_seconds,
    make_parser,
    non_negative_int,
    number_list,
    positive_int,
    run,  # re-exported: __main__.py is `run(main, PROG)` and nothing else
    subparsers,
)
from ...spark.executors import check_executors
from ...spark.flags import add_run_flags, run_conf
from ...spark.master import preflight
from ...spark.progress import JobProgress
from ...spark.report import RunResult, command_line, plural
from ...spark.rows import field_names, schema, typed_row
from ...spark.session import spark_session
from ...spark.settings import add_setting_flags, setting_overrides
from ...spark.tables import write_table
from .replay import LIFETIME_FIELDS, SUMMARY_FIELDS, TABLES, Point, run_point
from .report import write_report

__all__ = ["PROG", "build_parser", "main", "points_of", "run"]

PROG = "python -m pylimiter.pulsar.cursor"


def build_parser() -> argparse.ArgumentParser:
    """The command line: ``simulate`` and its sweep and fixed options.  The
    fixed options' defaults are Point's; the broker settings' flags come
    from Point's declarations (their help names the broker.conf key)."""
    ap = make_parser(PROG, "Message lifecycle of Pulsar subscriptions: acknowledgment holes, "
                           "TTL with delayed messages, backlog quotas, retention.")
    sub = subparsers(ap, dest="command", required=True, metavar="COMMAND",
                     help="run `COMMAND --help` for its options")
    s = sub.add_parser("simulate", help="sweep subscriptions on Spark, write an HTML report",
                       description=__doc__.split("\n\n")[1],
                       usage="%(prog)s [options]")
    g = s.add_argument_group("sweep (comma-separated lists; one Spark task per combination)")
    g.add_argument("--ttl-min", type=number_list(float, 1, "minutes"), default=[60, 240],
                   help="message TTL, minutes (ttlDurationDefaultInSeconds, here in minutes)")
    g.add_argument("--retention-min", type=number_list(float, 0, "minutes"), default=[0, 180],
                   help="retention time, minutes, counted from a ledger's close "
                        "(defaultRetentionTimeInMinutes)")
    g.add_argument("--delayed-share", type=number_list(float, 0, "shares", maximum=1),
                   default=[0.1], help="share of delayed messages (delay uniform up to 2 x TTL)")
    g.add_argument("--ack-fail", type=number_list(float, 0, "shares", maximum=1),
                   default=[0.002, 0.02], help="probability that an ack is lost (a hole)")
    g.add_argument("--rollover-entries", type=number_list(int, 1, "entry counts"),
                   default=[1000, 5000],
                   help="entries per ledger before rollover (managedLedgerMaxEntriesPerLedger)")
    f = s.add_argument_group("traffic and compensator, fixed for every point")
    f.add_argument("--rate", type=positive_int, default=Point.rate, help="messages per minute")
    f.add_argument("--publish-min", type=positive_int, default=Point.publish_min,
                   help="minutes of publishing (the run goes on until everything is deleted)")
    f.add_argument("--compensate-every-min", type=positive_int,
                   default=Point.compensate_every_min, help="minutes between compensation runs")
    f.add_argument("--compensate-age-min", type=non_negative_int,
                   default=Point.compensate_age_min,
                   help="a hole is redelivered when sent longer ago than this (minutes)")
    f.add_argument("--msg-bytes", type=positive_int, default=Point.msg_bytes,
                   help="message size")
    f.add_argument("--seed", type=int, default=Point.seed,
                   help="random seed of each point's traffic and lost acks (the four "
                        "subscriptions of a point see the same messages)")
    add_setting_flags(s.add_argument_group("broker settings, fixed for every point"), Point)
    add_run_flags(s, Path("reports/cursor"))
    return ap


def points_of(args) -> list:
    """Every combination of the sweep lists, as replay.Point (the fixed options
    shared)."""
    base = {"rate": args.rate, "publish_min": args.publish_min,
            "compensate_every_min": args.compensate_every_min,
            "compensate_age_min": args.compensate_age_min, "msg_bytes": args.msg_bytes,
            "seed": args.seed, **setting_overrides(args, Point)}
    return [Point(ttl, ret, share, fail, roll, **base)
            for ttl in args.ttl_min for ret in args.retention_min
            for share in args.delayed_share for fail in args.ack_fail
            for roll in args.rollover_entries]


def _run_partition(items):
    """Executor side: every variant of each point in this partition."""
    for idx, point in items:
        t0 = time.perf_counter()
        results = run_point(point)
        yield idx, results, time.perf_counter() - t0


def main(argv: Sequence[str] | None = None, *, spark=None) -> int:
    """Run the sweep; ``spark`` adopts a running session (tests)."""
    args = build_parser().parse_args(argv)
    preflight(args.master, spark, ["pyspark", "pandas", "matplotlib"])
    points = points_of(args)
    print(f"{PROG} simulate: {plural(len(points), 'point')} x 4 subscriptions "
          f"({args.publish_min} min of {args.rate} msg/min each) on {args.master}", flush=True)
    t0 = time.perf_counter()
    with spark_session(args.master, app_name="pylimiter-cursor", spark=spark,
                       conf=run_conf(args), prog=PROG) as session:
        sc = session.sparkContext
        check_executors(session, ["pylimiter", "pylimiter.pulsar.cursor.replay"])
        rdd = sc.parallelize(list(enumerate(points)), len(points))
        with JobProgress(sc, "points", len(points), enabled=not args.no_progress):
            collected = sorted(rdd.mapPartitions(_run_partition).collect(), key=lambda r: r[0])
        tables = _tables(points, collected)
        for name, rows in tables.items():
            write_table(session.createDataFrame(rows, schema(TABLES[name])), args.out, name)
        spark_version = session.version
    wall = time.perf_counter() - t0
    res = RunResult(tables=tables, params={"points": points},
                    timings={"wall_s": wall, "task_s": sum(r[2] for r in collected)})
    index = write_report(args.out, res, spark_version=spark_version,
                         command=command_line(PROG, argv))
    names = field_names(SUMMARY_FIELDS)
    summary = {(r["point"], r["rule"], r["compensator"]): r
               for r in (dict(zip(names, row)) for row in tables["summary"])}
    lost = {rule: sum(r["lost_before_delivery"] for k, r in summary.items()
                      if k[1] == rule and not k[2]) for rule in ("publish", "deliverable")}
    delayed = sum(r["delayed"] for k, r in summary.items() if k[1] == "publish" and not k[2])
    peak = {c: max(r["peak_range_bytes"] for k, r in summary.items() if k[2] == c)
            for c in (False, True)}
    print(f"delayed messages expired before delivery: Pulsar's rule {lost['publish']:,} of "
          f"{delayed:,}, ours {lost['deliverable']:,}")
    print(f"peak hole-range memory: {fmt_bytes(peak[False])} without the compensator, "
          f"{fmt_bytes(peak[True])} with it")
    print(f"report: {index}  ({fmt_seconds(wall)})")
    return 0


def _tables(points, collected) -> dict:
    """The rows of the summary, series and lifetimes tables (TABLES)."""
    summary, series, lifetimes = [], [], []
    for idx, results, seconds in collected:
        p = asdict(points[idx])
        for rule, comp, res in results:
            row = dict(p, point=idx, rule=rule, compensator=comp, seconds=seconds / 4,
                       **res["summary"])
            summary.append(typed_row(row, SUMMARY_FIELDS))
            series.extend((idx, rule, comp, *s) for s in res["series"])
            for lt in res["lifetimes"]:
                row = dict(p, point=idx, rule=rule, compensator=comp, **lt)
                lifetimes.append(typed_row(row, LIFETIME_FIELDS))
    return {"summary": summary, "series": series, "lifetimes": lifetimes}
