"""A generated cluster, in Spark SQL expressions only (no Python UDF, so the
rows never leave the JVM): topics spread over namespaces, each with a rate
that changes step by step.

The shape is chosen so that the load balancer has work to do, at the scale of
the 600,000-topic clusters the Tencent Cloud article describes:

- namespace sizes are skewed (namespace k holds a share ~ k**-1/3 of the
  topics: the biggest holds ~3% of them, the smallest ~0.3%), so big
  namespaces split on ``loadBalancerNamespaceBundleMaxTopics``/``MaxSessions``;
- a quarter of the topics are idle; the others publish a Pareto-distributed
  rate (alpha 1.3, median ~0.9 msg/s, the hottest topic ~14k msg/s) of
  log-normal sized messages (median 1 KiB), read by 0-3 subscriptions;
- 80% of the topics exist from step 0, the others appear at a random step;
  30% grow or shrink by up to a few percent per step; 10% go quiet at a
  random step; every rate carries +-15% log-normal noise per step;
- a few namespaces (~3%) surge to 5x their traffic over five steps starting
  at 40% of the run, which overloads the brokers that happen to own them.

Every random number is a hash of (seed, topic id, step, purpose), so the same
seed gives the same cluster on any number of executors.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FACT_COLUMNS", "GeneratorSpec", "generate_topics", "namespace_name", "step_rows",
           "step_rows_sql"]

#: The input schema: one row per topic per step.
FACT_COLUMNS = ("step", "topic", "msg_rate_in", "msg_rate_out", "msg_throughput_in",
                "msg_throughput_out", "producers", "consumers")

NAMESPACES_PER_TENANT = 10


def namespace_name(ns_id: int) -> str:
    """The generated namespace ``ns_id``: ``tenant-003/ns-031``."""
    return f"tenant-{ns_id // NAMESPACES_PER_TENANT:03d}/ns-{ns_id:03d}"


@dataclass(frozen=True)
class GeneratorSpec:
    """How big the generated cluster is and how its traffic behaves."""

    topics: int = 600_000
    namespaces: int = 200
    steps: int = 60
    seed: int = 1
    idle_share: float = 0.25
    rate_scale: float = 0.5          # Pareto x_m, msg/s
    rate_alpha: float = 1.3
    rate_cap: float = 20_000.0       # msg/s in, per topic
    born_at_start: float = 0.8
    growing_share: float = 0.3
    quiet_share: float = 0.1
    noise: float = 0.15
    surge_share: float = 0.03
    surge_factor: float = 5.0

    def __post_init__(self):
        for name in ("topics", "namespaces", "steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def surge_start(self) -> int:
        """The step at which the surging namespaces start to ramp up."""
        return int(self.steps * 0.4)


def _u(F, seed: int, purpose: str, *cols):
    """A uniform [0, 1) from the 53 top bits of xxhash64(seed, purpose, cols)."""
    h = F.xxhash64(F.lit(seed), F.lit(purpose), *cols)
    return F.shiftrightunsigned(h, 11).cast("double") / float(1 << 53)


def _z(F, seed: int, purpose: str, *cols):
    """An approximately standard normal: the centred sum of four uniforms."""
    s = sum(_u(F, seed, f"{purpose}{k}", *cols) for k in range(4))
    return (s - 2.0) * (3.0 ** 0.5)


def generate_topics(spark, spec: GeneratorSpec, partitions: int = 0):
    """The topic table (one row per topic): id, name, namespace id, CRC-32
    hash (Spark's ``crc32``, the same as ``topic_hash``) and the topic's
    traffic parameters.  Not cached: the caller decides."""
    from pyspark.sql import functions as F

    n, s = spec.namespaces, spec.seed
    parts = partitions or max(2, spark.sparkContext.defaultParallelism)
    tid = F.col("id")
    ns_id = F.least(F.floor(F.lit(float(n)) * F.pow(_u(F, s, "ns", tid), 1.5)).cast("int"),
                    F.lit(n - 1))
    df = spark.range(0, spec.topics, numPartitions=parts).withColumn("ns_id", ns_id)
    tenant = F.lpad((F.col("ns_id") / NAMESPACES_PER_TENANT).cast("int").cast("string"), 3, "0")
    ns = F.concat(F.lit("tenant-"), tenant, F.lit("/ns-"),
                  F.lpad(F.col("ns_id").cast("string"), 3, "0"))
    topic = F.concat(F.lit("persistent://"), ns, F.lit("/topic-"), tid.cast("string"))
    idle = _u(F, s, "idle", tid) < spec.idle_share
    rate = F.least(F.lit(spec.rate_scale) * F.pow(1.0 - _u(F, s, "rate", tid),
                                                  -1.0 / spec.rate_alpha),
                   F.lit(spec.rate_cap))
    size = F.least(F.greatest(F.lit(1024.0) * F.exp(0.8 * _z(F, s, "size", tid)), F.lit(64.0)),
                   F.lit(1048576.0))
    fanout = F.floor(_u(F, s, "fanout", tid) * 4).cast("int")
    birth = F.when(_u(F, s, "born", tid) < spec.born_at_start, F.lit(0)).otherwise(
        1 + F.floor(_u(F, s, "birth", tid) * max(spec.steps - 1, 1)).cast("int"))
    quiet_at = F.when(_u(F, s, "quiet", tid) < spec.quiet_share,
                      1 + F.floor(_u(F, s, "quiet_at", tid) * spec.steps).cast("int")
                      ).otherwise(F.lit(1 << 30))
    growth = F.when(_u(F, s, "grows", tid) < spec.growing_share,
                    _u(F, s, "growth", tid) * 0.05 - 0.02).otherwise(F.lit(0.0))
    surge = _u(F, s, "surge", F.col("ns_id")) < spec.surge_share
    return df.select(
        tid.alias("tid"), F.col("ns_id"), ns.alias("namespace"), topic.alias("topic"),
        F.crc32(topic).alias("hash"),
        F.when(idle, 0.0).otherwise(rate).alias("base_rate"),
        size.alias("msg_size"), fanout.alias("fanout"),
        F.when(idle, 0).otherwise(1 + F.floor(_u(F, s, "prod", tid) * 2).cast("int"))
        .alias("producers0"),
        (fanout * (1 + F.floor(_u(F, s, "cons", tid) * 2).cast("int"))).alias("consumers"),
        birth.alias("birth"), quiet_at.alias("quiet_at"), growth.alias("growth"),
        surge.alias("surge"))


def _z_sql(seed: int, salt: int, *cols: str) -> str:
    """An approximately standard normal from ONE xxhash64: the centred sum of
    its four 16-bit quarters (Irwin-Hall), so the per-row cost is one hash."""
    h = f"xxhash64({int(seed)}, {int(salt)}, {', '.join(cols)})"
    quarters = " + ".join(f"((shiftright({h}, {k}) & 65535))" for k in (0, 16, 32)) \
        + f" + shiftrightunsigned({h}, 48)"
    return f"((({quarters}) / 65536.0 - 2.0) * {3.0 ** 0.5!r})"


def step_rows_sql(spec: GeneratorSpec, topics_view: str, steps) -> str:
    """SQL for the topic rows of the given steps (``FACT_COLUMNS`` plus ns_id
    and hash), computed from the topic table registered as ``topics_view``.
    One SQL string, so building it costs no round trips to the JVM."""
    steps = ", ".join(str(int(x)) for x in steps)
    surge = (f"CASE WHEN t.surge THEN 1.0 + {spec.surge_factor - 1.0!r} * "
             f"least(greatest((step - {spec.surge_start} + 1) / 5.0, 0.0), 1.0) ELSE 1.0 END")
    rate = (f"CASE WHEN step >= t.quiet_at THEN 0.0 ELSE t.base_rate * {surge} * "
            f"exp(t.growth * (step - t.birth) + "
            f"{spec.noise!r} * {_z_sql(spec.seed, 7, 't.tid', 'step')}) END")
    return f"""
        SELECT step, topic, ns_id, hash, rate_in AS msg_rate_in,
               rate_in * fanout AS msg_rate_out,
               rate_in * msg_size AS msg_throughput_in,
               rate_in * fanout * msg_size AS msg_throughput_out,
               producers, consumers
        FROM (SELECT step, t.topic, t.ns_id, t.hash, t.fanout, t.msg_size, t.consumers,
                     CASE WHEN step >= t.quiet_at THEN 0 ELSE t.producers0 END AS producers,
                     {rate} AS rate_in
              FROM {topics_view} t LATERAL VIEW explode(array({steps})) s AS step
              WHERE t.birth <= step)"""


def step_rows(spark, topics_df, spec: GeneratorSpec, steps):
    """The topic rows of ``steps`` as a DataFrame (registers ``topics_df`` as
    a temporary view)."""
    view = f"plim_balance_topics_{id(topics_df):x}"
    topics_df.createOrReplaceTempView(view)
    return spark.sql(step_rows_sql(spec, view, steps))
