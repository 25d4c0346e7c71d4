"""The replay itself: every step of a topic-load source through the leader's
decision loop (``cluster.Simulation``), Spark summing the topics into the
bundles of the current layout.  Nothing is written here; ``pipeline`` runs
it and ``report`` draws it.

Quiet steps are aggregated in batches (up to MAX_BATCH steps per Spark
job); a split changes the layout, so the steps aggregated ahead on the old
one go through again.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Sequence

from ...spark.progress import StepProgress, job_group
from ...spark.report import RunResult
from .cluster import STRATEGIES, ZERO, BundleSample, Settings, Simulation
from .split import TopicStats

__all__ = ["MAX_BATCH", "TABLES", "simulate"]

#: At most this many quiet steps are aggregated in one Spark job.
MAX_BATCH = 8
#: The tables a run writes (Parquet and CSV each).
TABLES = ("steps", "brokers", "decisions", "bundle_loads", "bundles", "ownership", "summary")


def _samples(rows, names) -> dict:
    out = {}
    for r in rows:
        out[names[r.bidx]] = BundleSample(r.topics, r.sessions, r.msg_rate_in, r.msg_rate_out,
                                          r.msg_throughput_in, r.msg_throughput_out)
    return out


def simulate(spark, source, broker_names: Sequence[str], settings: Settings, seed: int = 1,
             progress: bool = False) -> RunResult:
    """Run every step of ``source`` through the decision loop; nothing is
    written.  Returns the tables (TABLES, as lists of row dicts; "summary"
    is left for the pipeline, report.summary_rows), the settings, params
    ``namespaces`` and ``brokers`` (names), and the timings.  Raises
    RuntimeError if an invariant breaks (a bundle without exactly one live
    owner, a namespace over max_bundles)."""
    sim = Simulation(source.namespaces, list(broker_names), settings, STRATEGIES, seed)
    ns_index = {ns: i for i, ns in enumerate(source.namespaces)}
    res = RunResult(tables={name: [] for name in TABLES}, settings=settings,
                    params={"namespaces": list(source.namespaces),
                            "brokers": list(broker_names)})
    tables = res.tables
    timing = defaultdict(float)
    decide_per_step: list[float] = []
    steps = list(source.steps)
    pending: dict[int, dict] = {}
    names: list[str] = []
    bounds: dict[str, tuple[int, int]] = {}
    batch = 1
    now = {"step": 0}

    def topics_of(picks):
        t0 = time.perf_counter()
        rows = [(ns_index[name.rsplit("/", 1)[0]], b.lower, b.upper + 1 if b.last else b.upper, i)
                for i, (name, b) in enumerate(picks)]
        out: dict[str, dict] = {name: {} for name, _ in picks}
        sc.setJobDescription(f"balance: step {now['step']}, topics of the bundles to split")
        for r in source.topics_in(now["step"], source.layout_view(rows)):
            out[picks[r["bidx"]][0]][r["topic"]] = TopicStats(
                r["msg_rate_in"], r["msg_rate_out"], r["msg_throughput_in"],
                r["msg_throughput_out"], r["producers"], r["consumers"])
        timing["spark_s"] += time.perf_counter() - t0
        return out

    wall0 = time.perf_counter()
    sc = spark.sparkContext
    with StepProgress("steps", len(steps), progress) as bar, \
            job_group(sc, "balance-steps", "balance: step loop"):
        for i, current_step in enumerate(steps):
            now["step"] = current_step
            if current_step not in pending:
                layout = sim.layout()
                names = [full for _, full, _, _ in layout]
                bounds = {full: (lo, hi) for _, full, lo, hi in layout}
                chunk = steps[i:i + batch]
                t0 = time.perf_counter()
                sc.setJobDescription(f"balance: steps {chunk[0]}-{chunk[-1]}"
                                     if len(chunk) > 1 else f"balance: step {chunk[0]}")
                rows = source.aggregate(chunk, source.layout_view(
                    [(ns_index[ns], lo, hi, k) for k, (ns, _, lo, hi) in enumerate(layout)]))
                timing["spark_s"] += time.perf_counter() - t0
                timing["spark_jobs"] += 1
                by_step = defaultdict(list)
                for r in rows:
                    by_step[r.step].append(r)
                pending = {s: _samples(by_step[s], names) for s in chunk}
            samples = pending.pop(current_step)
            timing["topic_rows"] += sum(s.topics for s in samples.values())
            for full in names:
                s = samples.get(full, ZERO)
                lo, hi = bounds[full]
                tables["bundle_loads"].append(dict(
                    step=current_step, namespace=full.rsplit("/", 1)[0], bundle=full,
                    lower=lo, upper=hi - 1, topics=s.topics, sessions=s.sessions,
                    msg_rate_in=s.msg_rate_in, msg_rate_out=s.msg_rate_out,
                    msg_throughput_in=s.msg_throughput_in,
                    msg_throughput_out=s.msg_throughput_out))
            rec = sim.step(current_step, samples, topics_of)
            try:
                sim.check()
            except AssertionError as exc:
                raise RuntimeError(f"invariant broken at step {current_step}: {exc}") from None
            decide_per_step.append(rec.decide_cpu_s)
            tables["steps"].extend(rec.steps)
            tables["brokers"].extend(rec.brokers)
            tables["decisions"].extend(rec.decisions)
            if rec.splits:
                # Steps already aggregated on the old layout go through again.
                timing["steps_aggregated_twice"] += len(pending)
                pending.clear()
                batch = 1
            else:
                batch = min(batch * 2, MAX_BATCH)
            bar.advance()
    timing["loop_wall_s"] = time.perf_counter() - wall0
    timing["decide_s"] = sum(decide_per_step)
    timing["decide_ms_per_step"] = 1e3 * timing["decide_s"] / max(len(steps), 1)
    timing["decide_ms_per_step_max"] = 1e3 * max(decide_per_step, default=0.0)
    timing["steps"] = len(steps)
    timing["splits"] = sim.total_splits
    res.timings = dict(timing)
    tables["ownership"] = sim.ownership()
    for ns, nb in sim.layouts.items():
        for b in nb.bundles:
            full = f"{ns}/{b.name}"
            tables["bundles"].append(dict(namespace=ns, bundle=full, lower=b.lower,
                                          upper=b.upper, last=b.last,
                                          created_step=sim.created.get(full, 0)))
    return res
