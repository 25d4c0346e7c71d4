"""``python -m pylimiter.pulsar.balance simulate``: replay a cluster's topic
load through Pulsar's load manager, for four strategies side by side.

Spark does the data-parallel part (``source``): it generates or reads one
row per topic per step and sums the rows into the bundles of the current
layout.  The driver runs the decision loop (``cluster``) on those bundle
loads, one step at a time, as Pulsar's leader broker does, and hands the
next layout back to Spark.  Results go to ``--out``: Parquet + CSV tables and
``index.html`` (``report``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from ...spark.cli import (
    UsageError,
    fmt_rate,
    fmt_seconds,
    make_parser,
    non_negative_float,
    positive_float,
    positive_int,
    run,  # re-exported: __main__.py is `run(main, PROG)` and nothing else
    subparsers,
)
from ...spark.executors import check_executors
from ...spark.flags import add_run_flags, run_conf
from ...spark.master import preflight
from ...spark.progress import JobProgress
from ...spark.report import RunResult, command_line, plural
from ...spark.rows import schema
from ...spark.session import spark_session, sql_conf
from ...spark.settings import add_setting_flags, setting_overrides
from ...spark.tables import write_table
from .cluster import STRATEGIES, BrokerCapacity, Settings
from .generate import GeneratorSpec
from .load import LoadWeights
from .replay import TABLES, simulate
from .report import summary_rows, write_report
from .source import GeneratedSource, check_input, open_source
from .split import MIB

__all__ = ["PROG", "build_parser", "main", "run", "settings_from", "write_tables"]

PROG = "python -m pylimiter.pulsar.balance"
DEFAULT_OUT = Path("reports/balance")


# ---- arguments -----------------------------------------------------------------------


def _positions(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x, 0) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated hashes (e.g. 0x40000000,0x80000000), got {text!r}") from None
    if not vals or any(not 0 <= v <= 0xFFFFFFFF for v in vals):
        raise argparse.ArgumentTypeError(f"positions must be within 0..0xffffffff, got {text!r}")
    return vals


def _weights(text: str) -> LoadWeights:
    names = ("cpu", "memory", "direct_memory", "bandwidth_in", "bandwidth_out")
    base = LoadWeights()
    vals = {n: getattr(base, n) for n in names}
    for part in text.split(","):
        key, _, val = part.partition("=")
        key = key.strip().replace("-", "_")
        if key not in names or not val:
            raise argparse.ArgumentTypeError(
                f"expected name=weight pairs with names {', '.join(names)}, got {part!r}")
        vals[key] = non_negative_float(val)
    return LoadWeights(**vals)


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser(PROG, "Pulsar bundle load balancing: replay a cluster's topic load "
                           "through the load manager and compare strategies.")
    sub = subparsers(ap, dest="command", required=True, metavar="COMMAND",
                     help="run `COMMAND --help` for its options")
    p = sub.add_parser(
        "simulate", usage="%(prog)s [options]",
        help="run the load manager over generated or recorded topic load",
        description="Replay topic load (generated, or --input) step by step through Pulsar's "
                    "bundle splitting, LeastLongTermMessageRate vs uniform random placement and "
                    "ThresholdShedder on/off, side by side; write tables and an HTML report.")
    src = p.add_argument_group("input (a generated cluster unless --input is given)")
    src.add_argument("--input", type=Path, default=None, metavar="PATH",
                     help="Parquet, CSV (with header) or JSON lines: one row per topic per step "
                          "with step, topic, msg_rate_in, msg_rate_out, msg_throughput_in, "
                          "msg_throughput_out (bytes/s), producers, consumers")
    src.add_argument("--topics", type=positive_int, default=GeneratorSpec.topics,
                     help="generated topics")
    src.add_argument("--namespaces", type=positive_int, default=GeneratorSpec.namespaces,
                     help="generated namespaces")
    src.add_argument("--steps", type=positive_int, default=GeneratorSpec.steps,
                     help="generated steps (load-manager ticks of a minute)")
    src.add_argument("--seed", type=int, default=GeneratorSpec.seed,
                     help="seed of the generated cluster and of every random choice")
    cl = p.add_argument_group("brokers (the usage model: CPU from msg/s, bandwidth from bytes/s)")
    cl.add_argument("--brokers", type=positive_int, default=20, help="brokers in the cluster")
    # String defaults, run through the type like a given value: --help shows
    # 200000, not 200000.0.
    cl.add_argument("--broker-msg-rate", type=positive_float,
                    default=f"{BrokerCapacity.msg_rate:g}",
                    help="messages/s (in+out) a broker handles at 100%% CPU (Pulsar measures "
                         "the CPU)")
    cl.add_argument("--broker-bandwidth-mbytes", type=positive_float,
                    default=f"{BrokerCapacity.bandwidth_in / MIB:g}",
                    help="NIC capacity per direction, MiB/s (Pulsar reads the NIC's speed, "
                         "or loadBalancerOverrideBrokerNicSpeedGbps)")
    sp = p.add_argument_group("bundle splitting")
    add_setting_flags(sp, Settings, group="split")
    sp.add_argument("--split-positions", type=_positions, default=None, metavar="H1,H2,...",
                    help="hash positions for specified_positions_divide")
    sh = p.add_argument_group("placement and shedding")
    add_setting_flags(sh, Settings, group="shedding")
    # A string default: argparse runs it through _weights, and --help shows it.
    sh.add_argument("--weights", type=_weights, metavar="NAME=W,...",
                    default=",".join(f"{k}={v:g}" for k, v in asdict(LoadWeights()).items()),
                    help="loadBalancer*ResourceWeight by name (others keep Pulsar's default)")
    add_run_flags(p, DEFAULT_OUT, no_report=True)
    return ap


def settings_from(args) -> Settings:
    """The Settings the command line describes (a UsageError if they do not
    fit together)."""
    given = setting_overrides(args, Settings)
    chosen = {**Settings().as_dict(), **given}
    if chosen["split_algorithm"] == "specified_positions_divide" and not args.split_positions:
        raise UsageError("--split-algorithm specified_positions_divide needs --split-positions")
    if chosen["default_bundles"] > chosen["max_bundles"]:
        raise UsageError(f"--default-bundles {chosen['default_bundles']} is above "
                         f"--max-bundles {chosen['max_bundles']}")
    # Floors that keep every usage percentage a finite float for input rates
    # up to source.MAX_RATE (a broker of 1e-300 msg/s made 1e5 msg/s overflow).
    if args.broker_msg_rate < 1:
        raise UsageError(f"--broker-msg-rate must be at least 1 (msg/s), got "
                         f"{args.broker_msg_rate:g}")
    if args.broker_bandwidth_mbytes < 0.001:
        raise UsageError(f"--broker-bandwidth-mbytes must be at least 0.001 (MiB/s), got "
                         f"{args.broker_bandwidth_mbytes:g}")
    cap = BrokerCapacity(msg_rate=args.broker_msg_rate,
                         bandwidth_in=args.broker_bandwidth_mbytes * MIB,
                         bandwidth_out=args.broker_bandwidth_mbytes * MIB)
    return Settings(**given, split_positions=args.split_positions, weights=args.weights,
                    capacity=cap)


# ---- output --------------------------------------------------------------------------


#: The decisions table's columns (it may have no rows to take them from).
DECISION_COLUMNS = ["strategy", "step", "action", "bundle", "namespace", "from_broker",
                    "to_broker", "throughput", "msg_rate", "detail"]


def write_tables(spark, res: RunResult, out: Path) -> None:
    """Write every table (TABLES; "summary" filled in) as Parquet + CSV
    under ``out``."""
    import pandas as pd

    for name in TABLES:
        df = pd.DataFrame(res.tables[name],
                          columns=DECISION_COLUMNS if name == "decisions" else None)
        if name == "decisions" and df.empty:
            df = df.astype({"step": "int64", "throughput": "float64", "msg_rate": "float64"})
        write_table(spark.createDataFrame(df) if not df.empty else _empty(spark, df), out, name)
    (out / "timings.json").write_text(json.dumps(res.timings, indent=2, sort_keys=True))


def _empty(spark, df):
    kinds = {"int64": "long", "float64": "double", "bool": "boolean"}
    return spark.createDataFrame([], schema([(c, kinds.get(str(df[c].dtype), "string"))
                                             for c in df.columns]))


# ---- the command -------------------------------------------------------------------------


def _run_conf(spark) -> dict:
    # Each step is a small job (one scan, a few thousand groups): adaptive
    # re-planning costs more than it saves, and a handful of shuffle
    # partitions is plenty for the final aggregation.
    # Arrow turns the result tables (pandas) into DataFrames without
    # pickling them row by row.
    cores = spark.sparkContext.defaultParallelism
    return {"spark.sql.adaptive.enabled": "false",
            "spark.sql.shuffle.partitions": str(min(8, max(1, cores))),
            "spark.sql.execution.arrow.pyspark.enabled": "true"}


def _describe(args) -> str:
    if args.input:
        return f"replaying {args.input}"
    return (f"generating {plural(args.topics, 'topic')} in "
            f"{plural(args.namespaces, 'namespace')} x {plural(args.steps, 'step')} "
            f"(seed {args.seed})")


def main(argv: Optional[Sequence[str]] = None, *, spark=None) -> int:
    """``simulate``: returns 0; UsageError for bad input (exit 2 via
    ``pylimiter.spark.cli.run``)."""
    args = build_parser().parse_args(argv)
    settings = settings_from(args)
    preflight(args.master, spark, ["pyspark", "pandas", "matplotlib", "rich"])
    if args.input is not None:
        check_input(args.input)     # before Spark starts: seconds sooner
    print(f"{PROG} simulate: {_describe(args)}; {plural(args.brokers, 'broker')}; "
          f"{settings.split_algorithm}; Spark {args.master if spark is None else 'session given'}",
          flush=True)
    spec = GeneratorSpec(topics=args.topics, namespaces=args.namespaces, steps=args.steps,
                         seed=args.seed)
    brokers = [f"broker-{i:02d}" for i in range(1, args.brokers + 1)]
    t_all = time.perf_counter()
    with spark_session(args.master, app_name="pylimiter-balance", spark=spark,
                       conf=run_conf(args, {"spark.driver.memory": "2g"}),
                       prog=PROG) as session:
        # Executors run Spark's Python only (no pylimiter): the same minor
        # version as the driver's is all they need.
        check_executors(session, (), extension=False)
        with sql_conf(session, _run_conf(session)):
            t0 = time.perf_counter()
            source = open_source(session, args.input, spec)
            try:
                parts = (source.topics_df if isinstance(source, GeneratedSource)
                         else source.facts).rdd.getNumPartitions()
                with JobProgress(session.sparkContext, "prepare", parts + 1,
                                 not args.no_progress):
                    n_prepared = source.prepare()
                prepare_s = time.perf_counter() - t0
                res = simulate(session, source, brokers, settings, seed=args.seed,
                               progress=not args.no_progress)
            finally:
                source.close()
            res.timings.update(prepare_s=prepare_s, prepared_rows=n_prepared,
                               master=session.sparkContext.master)
            res.params["source"] = _describe(args)
            res.tables["summary"] = summary_rows(res)
            t1 = time.perf_counter()
            write_tables(session, res, args.out)
            res.timings["write_s"] = time.perf_counter() - t1
        spark_version = session.version
    if not args.no_report:
        t1 = time.perf_counter()
        index = write_report(args.out, res, spark_version=spark_version,
                             command=command_line(PROG, argv))
        res.timings["report_s"] = time.perf_counter() - t1
    res.timings["total_s"] = time.perf_counter() - t_all
    (args.out / "timings.json").write_text(json.dumps(res.timings, indent=2, sort_keys=True))
    _print_summary(res)
    if not args.no_report:
        print(f"report: {index}")
    return 0


def _print_summary(res: RunResult) -> None:
    tm = res.timings
    rows = tm.get("topic_rows", 0)
    print(f"{plural(int(rows), 'topic row')}, "
          f"{plural(len(res.tables['bundles']), 'bundle')} at the end "
          f"after {plural(int(tm.get('splits', 0)), 'split')}; "
          f"Spark {fmt_seconds(tm.get('spark_s', 0))} "
          f"({fmt_rate(rows / tm['spark_s'], 'topic rows') if tm.get('spark_s') else 'n/a'}), "
          f"decisions {tm.get('decide_ms_per_step', 0):.1f} ms/step for "
          f"{len(STRATEGIES)} strategies, total {fmt_seconds(tm.get('total_s', 0))}")
    for r in res.tables["summary"]:
        print(f"  {r['label']:<46} spread {r['mean_spread_pct']:5.1f} points (2nd half "
              f"{r['late_spread_pct']:5.1f}), peak {r['peak_usage_pct']:5.1f}%, "
              f"{plural(r['unloads'], 'unload')} moving {r['moved_mib_per_s']:,.0f} MiB/s")
