"""Speed of ``python -m pylimiter.pulsar.balance simulate``.

Measured, in one process on one Spark session (local[*] by default):

1. the full generated run (600,000 topics, 200 namespaces, 20 brokers, 60
   steps unless told otherwise), timed by the pipeline itself: wall time,
   topic rows per second through the per-step aggregation, and the decision
   loop's driver CPU time per step (``time.thread_time``: the four strategies'
   placement, shedding and splitting, not Spark);
2. the per-step aggregation against its anchor, a plain scan of the same
   topic rows: rounds alternate A/B with the order flipped every round
   (ABBA...), on the same cached topic table and layout, and the figure is the
   median of the per-round ratios.  Spark work runs on JVM threads, so these
   are wall times; interleaving keeps a busy neighbour from biasing one side.

Excluded: JVM start-up (the session is up before any timer starts) and, in
(2), building the topic table (cached once).

Writes a small summary to ``benchmarks/results/balance_speed.csv`` and prints
it.  ``python -m benchmarks.balance_speed --topics 100000 --steps 10`` for a
quicker look.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "balance_speed.csv"


def _anchor_rounds(spark, topics: int, steps_per_job: int, rounds: int) -> dict:
    from pylimiter.pulsar.balance.cluster import Settings, Simulation
    from pylimiter.pulsar.balance.generate import GeneratorSpec
    from pylimiter.pulsar.balance.pipeline import _run_conf, sql_conf
    from pylimiter.pulsar.balance.source import GeneratedSource

    spec = GeneratorSpec(topics=topics, steps=60)
    with sql_conf(spark, _run_conf(spark)):
        src = GeneratedSource(spark, spec)
        try:
            src.prepare()
            sim = Simulation(src.namespaces, ["b"], Settings(default_bundles=16))
            ns = {n: i for i, n in enumerate(src.namespaces)}
            view = src.layout_view([(ns[n], lo, hi, k)
                                    for k, (n, _, lo, hi) in enumerate(sim.layout())])
            steps = list(range(steps_per_job))

            def agg():
                t0 = time.perf_counter()
                src.aggregate(steps, view)
                return time.perf_counter() - t0

            def scan():
                t0 = time.perf_counter()
                sql = f"SELECT count(1), sum(msg_rate_in) FROM ({src.rows_sql(steps)})"
                spark.sql(sql).collect()
                return time.perf_counter() - t0

            agg(), scan()                      # warm-up: code generation, caches
            a_times, b_times, ratios = [], [], []
            for r in range(rounds):
                if r % 2 == 0:
                    a, b = agg(), scan()
                else:
                    b, a = scan(), agg()
                a_times.append(a)
                b_times.append(b)
                ratios.append(a / b)
            rows = src.rows(steps).count()
        finally:
            src.close()
    return dict(rows_per_job=rows, aggregate_s=statistics.median(a_times),
                scan_s=statistics.median(b_times), ratio=statistics.median(ratios),
                rounds=rounds)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.balance_speed",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, default=600_000)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--brokers", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=6, help="A/B rounds of the anchor comparison")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--skip-full", action="store_true", help="only the anchor comparison")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args(argv)

    from pylimiter.pulsar.balance.pipeline import main as simulate
    from pylimiter.spark.session import spark_session

    command = "python -m benchmarks.balance_speed " + " ".join(argv or sys.argv[1:])
    load = os.getloadavg()
    out: list[tuple[str, float, str]] = []
    with spark_session(args.master, app_name="balance-speed",
                       conf={"spark.driver.memory": "2g"}) as spark:
        if not args.skip_full:
            with tempfile.TemporaryDirectory(prefix="balance-speed-") as tmp:
                t0 = time.perf_counter()
                simulate(["simulate", "--topics", str(args.topics), "--steps", str(args.steps),
                          "--brokers", str(args.brokers), "--out", tmp, "--no-progress"],
                         spark=spark)
                wall = time.perf_counter() - t0
                tm = json.loads((Path(tmp) / "timings.json").read_text())
            out += [("full run wall time (session already up)", wall, "s"),
                    ("topic rows", tm["topic_rows"], "rows"),
                    ("topic rows per second (per-step aggregation)",
                     tm["topic_rows"] / tm["spark_s"], "rows/s"),
                    ("Spark aggregation and split-topic jobs", tm["spark_s"], "s"),
                    ("prepare (generate + hash + cache topics)", tm["prepare_s"], "s"),
                    ("decision loop per step, 4 strategies (driver CPU)",
                     tm["decide_ms_per_step"], "ms"),
                    ("decision loop, slowest step", tm["decide_ms_per_step_max"], "ms"),
                    ("splits", tm["splits"], "")]
        anchor = _anchor_rounds(spark, args.topics, 4, args.rounds)
        out += [("anchor: topic rows per job (4 steps)", anchor["rows_per_job"], "rows"),
                ("anchor: aggregate on the layout, median", anchor["aggregate_s"], "s"),
                ("anchor: plain scan of the same rows, median", anchor["scan_s"], "s"),
                ("aggregate / scan, median of per-round ratios", anchor["ratio"], "x")]
    out.append(("load average (1 min) at start", load[0], ""))
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["metric", "value", "unit", "command"])
        for name, value, unit in out:
            w.writerow([name, f"{value:.4g}", unit, command])
    for name, value, unit in out:
        print(f"{name:<52} {value:>14,.3f} {unit}")
    print(f"written: {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
