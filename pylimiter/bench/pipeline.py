"""`python -m pylimiter.bench`: spread pylimiter's benchmark trials over
Spark executors and aggregate them with Spark SQL.

The grid (scenario x implementation x concurrency x permits x repeat) becomes
a DataFrame with one partition per trial, so each trial is one Spark task run
in an executor's Python worker.  Trials are ordered repeat-major and shuffled
within a repeat, so the repeats of one configuration land on different
executors and at different times: machine noise shows as spread (IQR), not
as a bias of one configuration.  Each trial measures the implementation and
its stdlib anchor in the same process, alternating, and reports the ratio.

Per-core scaling runs separately: for k = 1..cores, k tasks at once, each
hammering a limiter of its own; per-executor throughput should stay flat.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

from .._cli import (
    UsageError,
    fmt_seconds,
    make_parser,
    name_list,
    non_negative_int,
    number_list,
    positive_float,
    positive_int,
    run,  # re-exported: __main__.py is `run(main, PROG)` and nothing else
    writable_dir,
)
from ..spark.progress import JobProgress
from ..spark.session import preflight, spark_session, write_table
from .scenarios import IMPLEMENTATIONS, SCENARIOS

PROG = "python -m pylimiter.bench"

# Concurrency values per scenario in the default grid (scenarios whose
# concurrency axis means nothing run at 1).
DEFAULT_CONCURRENCY = {
    "tasks": [10, 100, 1000],
    "threads": [2, 8],
    "weighted": [100],
    "timeouts": [1000],
    "cancel": [1000],
    "dual": [100],
}
DEFAULT_PERMITS = [10]
RESULT_FIELDS = [
    ("trial", "long"), ("repeat", "int"), ("scenario", "string"), ("impl", "string"),
    ("concurrency", "int"), ("permits", "int"), ("ops", "long"), ("rounds", "int"),
    ("ns_per_op", "double"), ("ops_per_s", "double"), ("anchor", "string"),
    ("anchor_ns_per_op", "double"), ("speedup", "double"), ("speedup_lo", "double"),
    ("speedup_hi", "double"), ("baseline_ns_per_op", "double"), ("cost_ratio", "double"),
    ("wait_p50_us", "double"), ("wait_p99_us", "double"), ("wait_max_us", "double"),
    ("errors", "long"), ("leaked_permits", "long"), ("host", "string"),
    ("pid", "int"), ("worker", "string"), ("seconds", "double"), ("failure", "string"),
]


# ---- arguments -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = make_parser(PROG, "Run pylimiter's benchmark grid on Spark: every scenario's trials "
                           "(pylimiter and its\nstdlib anchor side by side in one executor "
                           "process) spread over executors,\naggregated with Spark SQL, "
                           "summarised in the terminal and in an HTML report.")
    ap.add_argument("--master", default="local[*]",
                    help="Spark master URL: local[N], spark://host:port, yarn, k8s://...")
    ap.add_argument("--scenarios", type=name_list(list(SCENARIOS)),
                    default=[s for s in SCENARIOS if s != "scaling"],
                    help="comma-separated; scaling runs per --scaling")
    ap.add_argument("--impls", type=name_list(list(IMPLEMENTATIONS)), default=["c", "python"],
                    help="implementations: c (the C core), python (the pure-Python twin)")
    ap.add_argument("--concurrency", type=number_list(int, 1, "positive integers"), default=None,
                    help="override every concurrency axis (N), e.g. 10,100")
    ap.add_argument("--permits", type=number_list(int, 1, "positive integers"), default=DEFAULT_PERMITS, help="permits (K)")
    ap.add_argument("--repeats", type=positive_int, default=5, help="trials per configuration")
    ap.add_argument("--budget", type=positive_float, default=0.3,
                    help="seconds per side (pylimiter, anchor, baseline) per trial")
    ap.add_argument("--scaling", type=non_negative_int, default=None, metavar="K",
                    help="per-core scaling up to K concurrent executors "
                         "(default: the cluster's parallelism; 0: skip)")
    ap.add_argument("--out", type=writable_dir, default=Path("reports/bench"),
                    help="folder for the tables and the report")
    ap.add_argument("--seed", type=int, default=1, help="seed of the trial order")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--no-report", action="store_true", help="skip plots and HTML")
    return ap


def expand_grid(args) -> list[dict]:
    """The trials, repeat-major, shuffled within each repeat (seeded)."""
    rng = random.Random(args.seed)
    configs = []
    for scen in args.scenarios:
        if scen == "scaling":
            continue  # run by run_scaling, not as a grid trial
        spec = SCENARIOS[scen]
        conc = (args.concurrency or DEFAULT_CONCURRENCY.get(scen, [1])) \
            if spec.uses_concurrency else [1]
        perms = args.permits if spec.uses_permits else [1]
        for impl in args.impls:
            for n in conc:
                for k in perms:
                    configs.append((scen, impl, n, k))
    trials = []
    for r in range(args.repeats):
        batch = list(configs)
        rng.shuffle(batch)
        for scen, impl, n, k in batch:
            trials.append(dict(trial=len(trials), repeat=r, scenario=scen, impl=impl,
                               concurrency=n, permits=k, budget=args.budget))
    return trials


# ---- Spark -----------------------------------------------------------------------


def _run_trials_partition(rows):
    """Executor side: run the trials of this partition, one row each."""
    import os as _os
    import socket as _socket
    import time as _time
    import traceback

    from pylimiter.bench.scenarios import run_trial

    for row in rows:
        t0 = _time.perf_counter()
        base = {"trial": row.trial, "repeat": row.repeat, "scenario": row.scenario,
                "impl": row.impl, "concurrency": row.concurrency, "permits": row.permits}
        try:
            res = run_trial(row.scenario, row.impl, row.concurrency, row.permits,
                            budget_s=row.budget)
            res.update(base)
            res["failure"] = None
        except Exception as exc:  # a failed trial is a row, not a failed job
            res = dict(base, errors=1, leaked_permits=0, failure="".join(
                traceback.format_exception_only(type(exc), exc)).strip(),
                host=_socket.gethostname(), pid=_os.getpid())
        res["worker"] = f"{res['host']}:{res['pid']}"
        res["seconds"] = _time.perf_counter() - t0
        yield tuple(res.get(name) for name, _ in RESULT_FIELDS)


def _scaling_partition(args):
    impl, k, repeat, budget = args

    def run(_it):
        import os as _os
        import time as _time

        from pylimiter.bench.scenarios import run_trial

        t0 = _time.perf_counter()
        res = run_trial("scaling", impl, k, 1, budget_s=budget)
        res.update(trial=-1, repeat=repeat, failure=None,
                   worker=f"{res['host']}:{_os.getpid()}",
                   seconds=_time.perf_counter() - t0)
        yield tuple(res.get(name) for name, _ in RESULT_FIELDS)
    return run


def result_schema():
    from pyspark.sql import types as T

    kinds = {"long": T.LongType(), "int": T.IntegerType(), "string": T.StringType(),
             "double": T.DoubleType()}
    return T.StructType([T.StructField(n, kinds[k], True) for n, k in RESULT_FIELDS])


def run_grid(spark, trials: list[dict], progress: bool):
    from pyspark.sql import types as T

    sc = spark.sparkContext
    trial_schema = T.StructType([
        T.StructField("trial", T.LongType()), T.StructField("repeat", T.IntegerType()),
        T.StructField("scenario", T.StringType()), T.StructField("impl", T.StringType()),
        T.StructField("concurrency", T.IntegerType()), T.StructField("permits", T.IntegerType()),
        T.StructField("budget", T.DoubleType()),
    ])
    rows = [tuple(t[f.name] for f in trial_schema.fields) for t in trials]
    # One partition per trial: parallelize slices a list evenly, so slice i
    # holds exactly trial i, and the DataFrame keeps that partitioning.
    trials_df = spark.createDataFrame(sc.parallelize(rows, len(rows)), trial_schema)
    results = spark.createDataFrame(trials_df.rdd.mapPartitions(_run_trials_partition),
                                    result_schema()).cache()
    with JobProgress(sc, "trials", len(rows), progress):
        results.count()
    return trials_df, results


def run_scaling(spark, impls, kmax: int, repeats: int, budget: float, progress: bool):
    """k = 1..kmax tasks at once (one stage each, k slots), each on its own
    limiter."""
    sc = spark.sparkContext
    parts = []
    total = sum(k for k in range(1, kmax + 1)) * len(impls) * repeats
    with JobProgress(sc, "scaling", total, progress):
        for r in range(repeats):
            for impl in impls:
                for k in range(1, kmax + 1):
                    rdd = sc.parallelize(range(k), k).mapPartitions(
                        _scaling_partition((impl, k, r, budget)))
                    parts.extend(rdd.collect())
    return spark.createDataFrame(parts, result_schema()) if parts else None


SUMMARY_SQL = """
SELECT scenario, impl, concurrency, permits,
       count(*)                                  AS trials,
       count(DISTINCT worker)                    AS workers,
       percentile(ns_per_op, 0.5)                AS median_ns,
       percentile(ns_per_op, 0.75) - percentile(ns_per_op, 0.25) AS iqr_ns,
       percentile(ops_per_s, 0.5)                AS median_ops_per_s,
       first(anchor, true)                       AS anchor,
       percentile(anchor_ns_per_op, 0.5)         AS anchor_median_ns,
       percentile(speedup, 0.5)                  AS median_speedup,
       percentile(speedup, 0.75) - percentile(speedup, 0.25) AS iqr_speedup,
       percentile(speedup, 0.25)                 AS q1_speedup,
       percentile(speedup, 0.75)                 AS q3_speedup,
       percentile(baseline_ns_per_op, 0.5)       AS baseline_median_ns,
       percentile(cost_ratio, 0.5)               AS median_cost_ratio,
       percentile(cost_ratio, 0.25)              AS q1_cost_ratio,
       percentile(cost_ratio, 0.75)              AS q3_cost_ratio,
       percentile(wait_p50_us, 0.5)              AS wait_p50_us,
       percentile(wait_p99_us, 0.5)              AS wait_p99_us,
       max(wait_max_us)                          AS wait_max_us,
       sum(errors)                               AS errors,
       sum(leaked_permits)                       AS leaked_permits,
       sum(CASE WHEN failure IS NULL THEN 0 ELSE 1 END) AS failed_trials
FROM trials
GROUP BY scenario, impl, concurrency, permits
ORDER BY scenario, impl, concurrency, permits
"""

SCALING_SQL = """
SELECT impl, concurrency AS executors,
       count(*)                            AS trials,
       percentile(ops_per_s, 0.5)          AS median_ops_per_s_per_executor,
       percentile(ops_per_s, 0.5) * concurrency AS aggregate_ops_per_s,
       sum(leaked_permits)                 AS leaked_permits
FROM scaling
GROUP BY impl, concurrency
ORDER BY impl, concurrency
"""


ANCHOR_SHORT = {"asyncio.Semaphore": "asyncio", "threading.Semaphore": "threading",
                "asyncio.timeout+Semaphore": "timeout"}
IMPL_SHORT = {"c": "C", "python": "py"}
SUMMARY_WIDTH = 100


def _ok(v) -> bool:
    return v is not None and v == v


def _num(v, fmt="{:.0f}") -> str:
    return fmt.format(v) if _ok(v) else ""


def print_summary(summary_pdf, scaling_pdf, console=None) -> None:
    """The terminal summary: fits 100 columns; N and K explained below it."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=SUMMARY_WIDTH)
    if summary_pdf is not None:
        t = Table(title="pylimiter benchmark grid: medians over trials", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True, title_justify="left")
        for col in ["scenario", "impl", "N", "K", "ns/op", "anchor", "speed-up", "IQR",
                    "cost", "p99 µs"]:
            t.add_column(col, justify="left" if col in ("scenario", "impl", "anchor")
                         else "right", no_wrap=True)
        for r in summary_pdf.itertuples():
            iqr = f"{r.q1_speedup:.2f}-{r.q3_speedup:.2f}" if _ok(r.q1_speedup) else ""
            t.add_row(r.scenario, IMPL_SHORT.get(r.impl, r.impl), str(r.concurrency),
                      str(r.permits), _num(r.median_ns),
                      ANCHOR_SHORT.get(r.anchor, r.anchor or ""),
                      _num(r.median_speedup, "{:.2f}x"), iqr,
                      _num(r.median_cost_ratio, "{:.2f}"),
                      _num(r.wait_p99_us, "{:.1f}" if _ok(r.wait_p99_us)
                           and r.wait_p99_us < 100 else "{:,.0f}"))
        console.print(t)
        console.print(
            "N: tasks, threads or waiters at once; K: permits of the limiter.  speed-up: "
            "anchor's time / pylimiter's in the same trial (>1: pylimiter faster; "
            "IQR over trials).  cost: (pylimiter - no limiter) / (anchor - no limiter), "
            "<1: cheaper than the anchor.  p99 µs: wait from acquire call to grant.  "
            "Anchors: asyncio = asyncio.Semaphore, threading = threading.Semaphore, "
            "timeout = asyncio.timeout around asyncio.Semaphore.acquire.",
            width=SUMMARY_WIDTH, soft_wrap=False)
        errors, leaked = int(summary_pdf["errors"].sum()), int(summary_pdf["leaked_permits"].sum())
        failed = int(summary_pdf["failed_trials"].sum())
        console.print(f"errors: {errors}, leaked permits: {leaked}, failed trials: {failed}")
    if scaling_pdf is not None and len(scaling_pdf):
        s = Table(title="per-core scaling (uncontended, one limiter per executor)",
                  box=box.SIMPLE_HEAD, pad_edge=False, title_justify="left")
        for col in ["impl", "executors", "trials", "M ops/s per executor", "M ops/s in all"]:
            s.add_column(col, justify="right")
        for r in scaling_pdf.itertuples():
            s.add_row(r.impl, str(r.executors), str(r.trials),
                      _num(r.median_ops_per_s_per_executor / 1e6, "{:.2f}"),
                      _num(r.aggregate_ops_per_s / 1e6, "{:.2f}"))
        console.print(s)


def _measure(session, args, trials, cores, progress):
    """The grid, then the scaling runs: tables written to --out, and the
    summaries as pandas frames (None where nothing ran)."""
    out = args.out
    summary_pdf = results_pdf = scaling_pdf = scaling_trials_pdf = None
    if trials:
        trials_df, results = run_grid(session, trials, progress)
        write_table(trials_df, out, "trials")
        write_table(results, out, "results")
        results.createOrReplaceTempView("trials")
        summary = session.sql(SUMMARY_SQL)
        write_table(summary, out, "summary")
        summary_pdf = summary.toPandas()
        results_pdf = results.toPandas()
        results.unpersist()
    kmax = cores if args.scaling is None else args.scaling
    if kmax > 0:
        scaling_df = run_scaling(session, args.impls, kmax, args.repeats, args.budget, progress)
        scaling_df.createOrReplaceTempView("scaling")
        scaling_sum = session.sql(SCALING_SQL)
        write_table(scaling_df, out, "scaling_trials")
        write_table(scaling_sum, out, "scaling")
        scaling_pdf = scaling_sum.toPandas()
        scaling_trials_pdf = scaling_df.toPandas()
    return summary_pdf, results_pdf, scaling_pdf, scaling_trials_pdf


def main(argv=None, *, spark=None) -> int:
    """The CLI: returns 0; UsageError for bad input, RuntimeError when trials
    fail or leak permits (``run`` maps them to exit status 2 and 1).
    ``spark``: an existing session to run on (left running); by default one
    is started for --master and stopped at the end."""
    args = build_parser().parse_args(argv)
    preflight(args.master, spark, ["pyspark", "pandas", "pyarrow", "matplotlib", "rich"])
    trials = expand_grid(args)
    if not trials and args.scaling == 0:
        raise UsageError("the grid is empty: nothing to run")
    out = args.out
    progress = not args.no_progress
    scen = sorted({t["scenario"] for t in trials})
    print(f"{PROG}: {len(trials)} trials ({len(scen)} scenarios x {len(args.impls)} "
          f"implementations x {args.repeats} repeats), ~{fmt_seconds(args.budget)} per side; "
          + (f"starting Spark ({args.master})..." if spark is None else "on the given session"),
          flush=True)
    with spark_session(args.master, app_name="pylimiter-bench", spark=spark,
                       prog=PROG) as session:
        t0 = time.time()
        sc = session.sparkContext
        cores = sc.defaultParallelism
        spark_version = session.version
        print(f"Spark {spark_version}, master {sc.master}, parallelism {cores}; "
              f"executors run {sys.executable}", flush=True)
        summary_pdf, results_pdf, scaling_pdf, scaling_trials_pdf = _measure(
            session, args, trials, cores, progress)
        elapsed = time.time() - t0
    print_summary(summary_pdf, scaling_pdf)
    bad = []
    if summary_pdf is not None:
        if int(summary_pdf["leaked_permits"].sum()):
            bad.append(f"{int(summary_pdf['leaked_permits'].sum())} permits leaked")
        if int(summary_pdf["failed_trials"].sum()):
            bad.append(f"{int(summary_pdf['failed_trials'].sum())} trials failed")
    if not args.no_report:
        from .report import write_report

        index = write_report(out, summary_pdf, results_pdf, scaling_pdf, scaling_trials_pdf,
                             meta={"master": args.master, "elapsed_s": elapsed,
                                   "trials": len(trials), "spark_version": spark_version,
                                   "argv": list(sys.argv[1:] if argv is None else argv)})
        print(f"report: {index.resolve()}")
    print(f"data: {out.resolve()} (trials, results, summary, scaling as Parquet and CSV); "
          f"{fmt_seconds(elapsed)}")
    if bad:
        raise RuntimeError("; ".join(bad))
    return 0

