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
The host-wide scenarios (host-handoff, host-load) run separately too, one
barrier stage per core count, every Python worker on one SharedSemaphore
(:mod:`pylimiter.bench.hostwide_pipeline`).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from ..spark.cli import (
    UsageError,
    fmt_seconds,
    make_parser,
    name_list,
    non_negative_int,
    number_list,
    positive_float,
    positive_int,
    run,  # re-exported: __main__.py is `run(main, PROG)` and nothing else
)
from ..spark.executors import check_executors
from ..spark.flags import add_run_flags, run_conf
from ..spark.master import preflight
from ..spark.progress import JobProgress, job_description
from ..spark.report import RunResult, command_line, plural
from ..spark.rows import failure_row, schema, typed_row
from ..spark.session import spark_session
from ..spark.tables import write_table
from .hostwide import HOST_SCENARIOS
from .hostwide_pipeline import run_hostwide
from .hostwide_report import host_problems, print_host_summary
from .report import print_summary, write_report
from .scenarios import IMPLEMENTATIONS, SCENARIOS

__all__ = ["PROG", "RESULT_FIELDS", "build_parser", "expand_grid", "main", "run"]

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
#: One trial to run (one row per Spark partition).
TRIAL_FIELDS = [("trial", "long"), ("repeat", "int"), ("scenario", "string"), ("impl", "string"),
                ("concurrency", "int"), ("permits", "int"), ("budget", "double")]
#: One trial's result.
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
                           "summarised in the terminal and in an HTML report.",
                     usage="%(prog)s [options]")
    ap.add_argument("--scenarios", type=name_list(list(SCENARIOS) + list(HOST_SCENARIOS)),
                    default=[s for s in SCENARIOS if s != "scaling"] + list(HOST_SCENARIOS),
                    help="comma-separated; scaling runs per --scaling, the host-wide "
                         "ones (host-*) per --host-cores")
    ap.add_argument("--impls", type=name_list(list(IMPLEMENTATIONS)), default=["c", "python"],
                    help="implementations: c (the C core), python (the pure-Python twin)")
    ap.add_argument("--concurrency", type=number_list(int, 1, "positive integers"), default=None,
                    help="override every concurrency axis (N), e.g. 10,100")
    ap.add_argument("--permits", type=number_list(int, 1, "positive integers"),
                    default=DEFAULT_PERMITS, help="permits (K)")
    ap.add_argument("--repeats", type=positive_int, default=5, help="trials per configuration")
    ap.add_argument("--budget", type=positive_float, default=0.3,
                    help="seconds per side (pylimiter, anchor, baseline) per trial")
    ap.add_argument("--scaling", type=non_negative_int, default=None, metavar="K",
                    help="per-core scaling up to K concurrent executors "
                         "(default: the cluster's parallelism; 0: skip)")
    ap.add_argument("--host-cores", type=non_negative_int, default=None, metavar="K",
                    help="host-wide scenarios (host-handoff, host-load: every Python "
                         "worker on one SharedSemaphore) for 1..K workers at once "
                         "(default: the cluster's parallelism; 0: skip); rounds: "
                         "--repeats, seconds per side per round: --budget")
    ap.add_argument("--shm-dir", default=None, metavar="DIR",
                    help="the host-wide segments' directory on the executors (default: "
                         "their $PYLIMITER_SHM_DIR, else /dev/shm)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the trial order")
    add_run_flags(ap, Path("reports/bench"), no_report=True)
    return ap


def expand_grid(args) -> list[dict]:
    """The trials, repeat-major, shuffled within each repeat (seeded)."""
    rng = random.Random(args.seed)
    configs = []
    for scen in args.scenarios:
        if scen == "scaling" or scen in HOST_SCENARIOS:
            continue  # run by run_scaling / run_hostwide, not as grid trials
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
        except Exception as exc:
            res = failure_row(dict(base, errors=1, leaked_permits=0,
                                   host=_socket.gethostname(), pid=_os.getpid()), exc)
        res["worker"] = f"{res['host']}:{res['pid']}"
        res["seconds"] = _time.perf_counter() - t0
        yield typed_row(res, RESULT_FIELDS)


def _scaling_partition(args):
    impl, k, repeat, budget = args

    def work(_it):
        import os as _os
        import time as _time

        from pylimiter.bench.scenarios import run_trial

        t0 = _time.perf_counter()
        res = run_trial("scaling", impl, k, 1, budget_s=budget)
        res.update(trial=-1, repeat=repeat, failure=None,
                   worker=f"{res['host']}:{_os.getpid()}",
                   seconds=_time.perf_counter() - t0)
        yield typed_row(res, RESULT_FIELDS)
    return work


def run_grid(spark, trials: list[dict], progress: bool):
    sc = spark.sparkContext
    rows = [typed_row(t, TRIAL_FIELDS) for t in trials]
    # One partition per trial: parallelize slices a list evenly, so slice i
    # holds exactly trial i, and the DataFrame keeps that partitioning.
    trials_df = spark.createDataFrame(sc.parallelize(rows, len(rows)), schema(TRIAL_FIELDS))
    results = spark.createDataFrame(trials_df.rdd.mapPartitions(_run_trials_partition),
                                    schema(RESULT_FIELDS)).cache()
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
    return spark.createDataFrame(parts, schema(RESULT_FIELDS)) if parts else None


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


def _measure(session, args, trials, cores, progress) -> RunResult:
    """The grid, then the scaling runs: tables written to --out, and the
    summaries as pandas frames (absent where nothing ran)."""
    out = args.out
    res = RunResult(params={"master": session.sparkContext.master, "trials": len(trials)})
    if trials:
        trials_df, results = run_grid(session, trials, progress)
        write_table(trials_df, out, "trials")
        write_table(results, out, "results")
        results.createOrReplaceTempView("trials")
        summary = session.sql(SUMMARY_SQL)
        write_table(summary, out, "summary")
        with job_description(session.sparkContext, "bench: results and summary to the driver"):
            res.tables["summary"] = summary.toPandas()
            res.tables["results"] = results.toPandas()
        results.unpersist()
    kmax = cores if args.scaling is None else args.scaling
    if kmax > 0:
        scaling_df = run_scaling(session, args.impls, kmax, args.repeats, args.budget, progress)
        scaling_df.createOrReplaceTempView("scaling")
        scaling_sum = session.sql(SCALING_SQL)
        write_table(scaling_df, out, "scaling_trials")
        write_table(scaling_sum, out, "scaling")
        with job_description(session.sparkContext, "bench: scaling to the driver"):
            res.tables["scaling"] = scaling_sum.toPandas()
            res.tables["scaling_trials"] = scaling_df.toPandas()
    host = [s for s in args.scenarios if s in HOST_SCENARIOS]
    kmax = cores if args.host_cores is None else args.host_cores
    if host and kmax > 0:
        hw = run_hostwide(session, host, args.impls, kmax, args.repeats, args.budget,
                          args.shm_dir, progress)
        write_table(hw.rows, out, "host_rows")
        write_table(hw.rounds, out, "host_rounds")
        write_table(hw.summary, out, "host_summary")
        with job_description(session.sparkContext, "bench: host-wide results to the driver"):
            res.tables["host_summary"] = hw.summary.toPandas()
            res.tables["host_rounds"] = hw.rounds.toPandas()
        res.params["host_layout"] = (hw.executors, hw.cores_per_executor)
        hw.rounds.unpersist()
    return res


def main(argv=None, *, spark=None) -> int:
    """The CLI: returns 0; UsageError for bad input, RuntimeError when trials
    fail or leak permits (``run`` maps them to exit status 2 and 1).
    ``spark``: an existing session to run on (left running); by default one
    is started for --master and stopped at the end."""
    args = build_parser().parse_args(argv)
    preflight(args.master, spark, ["pyspark", "pandas", "pyarrow", "matplotlib", "rich"])
    trials = expand_grid(args)
    host = [s for s in args.scenarios if s in HOST_SCENARIOS] if args.host_cores != 0 else []
    if not trials and args.scaling == 0 and not host:
        raise UsageError("the grid is empty: nothing to run")
    out = args.out
    progress = not args.no_progress
    scen = sorted({t["scenario"] for t in trials})
    print(f"{PROG}: {plural(len(trials), 'trial')} ({plural(len(scen), 'scenario')} x "
          f"{plural(len(args.impls), 'implementation')} x {plural(args.repeats, 'repeat')}), "
          f"~{fmt_seconds(args.budget)} per side; "
          + (f"host-wide: {', '.join(host)} per core count; " if host else "")
          + (f"starting Spark ({args.master})..." if spark is None else "on the given session"),
          flush=True)
    conf = run_conf(args)
    with spark_session(args.master, app_name="pylimiter-bench", spark=spark, conf=conf,
                       prog=PROG) as session:
        t0 = time.time()
        sc = session.sparkContext
        execs = check_executors(session, ["pylimiter", "pylimiter.bench.scenarios"])
        cores = sc.defaultParallelism
        spark_version = session.version
        print(f"Spark {spark_version}, master {sc.master}, parallelism {cores}; "
              f"executors run {execs['python']} (Python {execs['version']}, "
              f"pylimiter {execs['implementation']})", flush=True)
        res = _measure(session, args, trials, cores, progress)
        res.timings["elapsed_s"] = time.time() - t0
    summary = res.tables.get("summary")
    print_summary(summary, res.tables.get("scaling"))
    host_summary = res.tables.get("host_summary")
    print_host_summary(host_summary, res.params.get("host_layout"))
    bad = host_problems(host_summary)
    if summary is not None:
        if int(summary["leaked_permits"].sum()):
            bad.append(f"{plural(int(summary['leaked_permits'].sum()), 'permit')} leaked")
        if int(summary["failed_trials"].sum()):
            bad.append(f"{plural(int(summary['failed_trials'].sum()), 'trial')} failed")
    if not args.no_report:
        index = write_report(out, res, spark_version=spark_version,
                             command=command_line(PROG, argv))
        print(f"report: {index.resolve()}")
    print(f"data: {out.resolve()} (trials, results, summary, scaling, host_* as Parquet and CSV); "
          f"{fmt_seconds(res.timings['elapsed_s'])}")
    if bad:
        raise RuntimeError("; ".join(bad))
    return 0

