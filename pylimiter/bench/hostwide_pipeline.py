"""The host-wide scenarios on Spark (:mod:`pylimiter.bench.hostwide`): one
*barrier* stage per scenario, implementation and core count k = 1 .. K, so
that k tasks run at once, one in each of k Python worker processes, and meet
at ``BarrierTaskContext.barrier()`` before every round and side.  Every
process opens the same SharedSemaphore (a segment named per run and stage,
in ``--shm-dir`` or the executors' ``$PYLIMITER_SHM_DIR``, else
``/dev/shm``): on ``local[*]`` and on a standalone cluster of one worker all
of them are on one host and share one budget.  On a cluster of several
hosts each host's processes share their own (the rows carry the host, and
the summaries group by it).

The rows (one per process, round and side) are aggregated with Spark SQL:
per round and host, the host's throughput (grants summed over its
processes, per second of window), the hand-offs per second, the median over
its processes of their hand-off p50 and the worst of their p99; then per
configuration the medians over rounds, and the anchor's (flock's) hand-off
p50 over pylimiter's as the median of per-round ratios.
"""

from __future__ import annotations

from typing import Optional

from ..spark.progress import JobProgress
from ..spark.rows import failure_row, schema, typed_row
from .hostwide import HOST_FIELDS, HOST_SCENARIOS, new_run_id

__all__ = ["HOST_ROUNDS_SQL", "HOST_SUMMARY_SQL", "HostResult", "executor_layout",
           "remove_run_files", "run_hostwide"]


def _host_partition(args):
    scenario, impl, k, run, rounds, budget, directory = args

    def work(_it):
        import os as _os
        import socket as _socket

        from pyspark import BarrierTaskContext

        from pylimiter.bench.hostwide import run_host_trial

        ctx = BarrierTaskContext.get()
        part = ctx.partitionId()
        try:
            rows = run_host_trial(scenario, impl, k, part, run=run, rounds=rounds,
                                  budget_s=budget, barrier=ctx.barrier, directory=directory)
        except Exception as exc:
            # Raised before the first barrier (the same in every process of
            # the stage: an unknown name, a missing extension): one row.
            rows = [failure_row({"run": run, "scenario": scenario, "impl": impl, "cores": k,
                                 "partition": part, "round": -1, "side": "shared",
                                 "errors": 1, "host": _socket.gethostname(),
                                 "pid": _os.getpid()}, exc)]
        for r in rows:
            yield typed_row(r, HOST_FIELDS)
    return work


HOST_ROUNDS_SQL = """
SELECT scenario, impl, cores, side, round, host,
       count(*)                                  AS processes,
       max(limit)                                AS limit,
       sum(grants) / max(seconds)                AS grants_per_s,
       sum(handoffs) / max(seconds)              AS handoffs_per_s,
       percentile(handoff_p50_us, 0.5)           AS handoff_p50_us,
       max(handoff_p99_us)                       AS handoff_p99_us,
       percentile(wait_p50_us, 0.5)              AS wait_p50_us,
       max(wait_p99_us)                          AS wait_p99_us,
       max(peak)                                 AS peak,
       max(leaked)                               AS leaked,
       max(unbalanced)                           AS unbalanced,
       sum(errors)                               AS errors,
       sum(CASE WHEN failure IS NULL THEN 0 ELSE 1 END) AS failures
FROM host_rows
GROUP BY scenario, impl, cores, side, round, host
"""

HOST_SUMMARY_SQL = """
WITH anchor AS (
  SELECT m.scenario, m.impl, m.cores, m.host,
         percentile(a.handoff_p50_us / m.handoff_p50_us, 0.5) AS anchor_over_mine_p50,
         percentile(a.grants_per_s / m.grants_per_s, 0.5)     AS anchor_over_mine_grants
  FROM host_rounds m JOIN host_rounds a
    ON a.scenario = m.scenario AND a.impl = m.impl AND a.cores = m.cores
   AND a.host = m.host AND a.round = m.round AND m.side = 'shared' AND a.side = 'flock'
  GROUP BY m.scenario, m.impl, m.cores, m.host
)
SELECT r.scenario, r.impl, r.cores, r.side, r.host,
       count(*)                                  AS rounds,
       max(r.processes)                          AS processes,
       max(r.limit)                              AS limit,
       percentile(r.grants_per_s, 0.5)           AS grants_per_s,
       percentile(r.grants_per_s, 0.25)          AS grants_per_s_q1,
       percentile(r.grants_per_s, 0.75)          AS grants_per_s_q3,
       percentile(r.handoffs_per_s, 0.5)         AS handoffs_per_s,
       percentile(r.handoff_p50_us, 0.5)         AS handoff_p50_us,
       percentile(r.handoff_p99_us, 0.5)         AS handoff_p99_us,
       percentile(r.wait_p50_us, 0.5)            AS wait_p50_us,
       percentile(r.wait_p99_us, 0.5)            AS wait_p99_us,
       max(r.peak)                               AS peak,
       max(r.leaked)                             AS leaked,
       max(r.unbalanced)                         AS unbalanced,
       sum(r.errors)                             AS errors,
       sum(r.failures)                           AS failures,
       first(a.anchor_over_mine_p50, true)       AS anchor_over_mine_p50,
       first(a.anchor_over_mine_grants, true)    AS anchor_over_mine_grants
FROM host_rounds r LEFT JOIN anchor a
  ON r.scenario = a.scenario AND r.impl = a.impl AND r.cores = a.cores AND r.host = a.host
 AND r.side = 'shared'
GROUP BY r.scenario, r.impl, r.cores, r.side, r.host
ORDER BY r.scenario, r.impl, r.side DESC, r.host, r.cores
"""


class HostResult:
    """What the host-wide stages produced, as Spark DataFrames: ``rows``
    (per process, round and side), ``rounds`` and ``summary`` (the SQL
    above), and the session's layout (``executors`` x ``cores``)."""

    def __init__(self, rows, rounds, summary, executors: Optional[int],
                 cores_per_executor: Optional[int]):
        self.rows, self.rounds, self.summary = rows, rounds, summary
        self.executors, self.cores_per_executor = executors, cores_per_executor


def remove_run_files(directory: Optional[str], run: str) -> list[str]:
    """Remove this host's files of run ``run`` (segments, boards, locks)
    from the segment directory; returns their names."""
    import glob
    import os

    from .._shared_common import segment_dir

    gone = []
    for path in glob.glob(os.path.join(segment_dir(directory),
                                       f"pylimiter-{os.getuid()}-bench-{run}-*")):
        try:
            os.unlink(path)
            gone.append(os.path.basename(path))
        except FileNotFoundError:
            pass
    return gone


def executor_layout(sc) -> tuple[Optional[int], Optional[int]]:
    """(executors, cores each) of the session: local mode is one executor
    (the driver's JVM) with the whole parallelism."""
    from ..spark.master import is_local

    cores = sc.defaultParallelism
    if is_local(sc.master):
        return 1, cores
    try:
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        n = max(1, len(infos) - 1)          # the driver is listed too
    except Exception:                        # noqa: BLE001 - shown as unknown
        return None, None
    return n, max(1, cores // n)


def run_hostwide(spark, scenarios, impls, kmax: int, rounds: int, budget: float,
                 directory: Optional[str], progress: bool) -> HostResult:
    """One barrier stage per scenario, implementation and k = 1..kmax."""
    unknown = [s for s in scenarios if s not in HOST_SCENARIOS]
    if unknown:
        raise ValueError(f"unknown host-wide scenario(s) {unknown}")
    sc = spark.sparkContext
    run = new_run_id()
    parts = []
    total = sum(range(1, kmax + 1)) * len(impls) * len(scenarios)
    try:
        with JobProgress(sc, "host-wide", total, progress):
            for scenario in scenarios:
                for impl in impls:
                    for k in range(1, kmax + 1):
                        rdd = sc.parallelize(range(k), k).barrier().mapPartitions(
                            _host_partition((scenario, impl, k, run, rounds, budget,
                                             directory)))
                        parts.extend(rdd.collect())
    finally:
        # A stage cut short (Ctrl-C, a killed worker) leaves its files; on
        # this host (all of local[*]'s), the run's own are removed.
        remove_run_files(directory, run)
    rows = spark.createDataFrame(parts, schema(HOST_FIELDS))
    rows.createOrReplaceTempView("host_rows")
    per_round = spark.sql(HOST_ROUNDS_SQL).cache()
    per_round.createOrReplaceTempView("host_rounds")
    summary = spark.sql(HOST_SUMMARY_SQL)
    return HostResult(rows, per_round, summary, *executor_layout(sc))
