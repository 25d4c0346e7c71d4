"""Where the topic rows come from, and the data-parallel half of the
pipeline: Spark reads or generates one row per topic per step, hashes each
topic with Spark's own ``crc32`` and sums the rows into bundles.

How bundles are re-bucketed after a split without re-reading every topic:
the bundle layout is a small table (namespace, lower, upper, bundle index)
that the driver rebuilds whenever a bundle splits, and each step's topic
rows are joined to it on the fly (a broadcast hash join on the namespace
with a range condition on the hash).  So each step's rows are read exactly
once, in the step they belong to, on the boundaries current at that step;
nothing is pre-bucketed that a later split could invalidate, and a split
costs one re-broadcast of a table of a few thousand rows.  The join key is
(namespace, top 8 bits of the hash) plus the range check, so each topic row
meets only the one or two bundles that overlap its 1/256th of the range,
however many bundles its namespace has.  Several quiet
steps are aggregated in one job; when a split happens inside such a batch,
the steps after it are simply aggregated again on the new layout.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ...spark.cli import UsageError
from .generate import FACT_COLUMNS, GeneratorSpec, generate_topics, namespace_name, step_rows_sql

__all__ = ["FileSource", "GeneratedSource", "LAYOUT_SCHEMA", "MAX_RATE", "TopicSource",
           "check_input", "load_input"]

LAYOUT_SCHEMA = "ns_id int, lower long, upper long, bidx int"
#: Topic rows meet the layout on (namespace, hash >> 24): 256 slices per namespace.
BUCKET_SHIFT = 24
_TOPIC_RE = r"^(persistent|non-persistent)://[^/]+/[^/]+/.+$"
_NS_RE = r"^[a-z-]+://([^/]+/[^/]+)/"
#: The largest rate or throughput an input row may give (msg/s, bytes/s): a
#: petabyte or 10**15 messages a second, far beyond any broker, and small
#: enough that the sums over a broker's topics and the usage percentages the
#: load manager derives from them stay finite floats (1e308 did not).
MAX_RATE = 1e15
#: A UTF-8 byte order mark, as Excel and PowerShell begin a CSV with.
_BOM = "\ufeff"


@dataclass
class AggRow:
    """One bundle's sums in one step."""

    step: int
    bidx: int
    topics: int
    sessions: int
    msg_rate_in: float
    msg_rate_out: float
    msg_throughput_in: float
    msg_throughput_out: float


class TopicSource:
    """The topic rows of a run, one step or several at a time.  Subclasses
    register their data as a temporary view and provide ``rows_sql(steps)``
    (a query with columns ``FACT_COLUMNS`` + ns_id and hash).  Every Spark
    request is one SQL string: building a DataFrame expression by expression
    would cost a JVM round trip per expression, per step."""

    spark = None
    namespaces: list[str] = []
    steps: list[int] = []

    def __init__(self):
        self._tag = f"{id(self):x}"

    def rows_sql(self, steps: Sequence[int]) -> str:
        raise NotImplementedError

    def rows(self, steps: Sequence[int]):
        """The topic rows of ``steps`` as a DataFrame."""
        return self.spark.sql(self.rows_sql(steps))

    def layout_view(self, layout: Sequence[tuple[int, int, int, int]]) -> str:
        """Register a layout table, (ns_id, lower, upper exclusive, bundle
        index) rows, and return its view name."""
        view = f"plim_balance_layout_{self._tag}"
        self.spark.createDataFrame(list(layout), LAYOUT_SCHEMA).createOrReplaceTempView(view)
        return view

    def _join_sql(self, steps: Sequence[int], layout_view: str, select: str,
                  tail: str = "") -> str:
        # A range join on the namespace alone would test every topic against
        # every bundle of its namespace (up to loadBalancerNamespaceMaximumBundles).
        # Keying it on (namespace, top 8 bits of the hash) as well leaves one
        # or two candidate bundles per topic: each bundle is listed under
        # every 1/256th of the range it overlaps.
        return f"""
            SELECT /*+ BROADCAST(l) */ {select}
            FROM ({self.rows_sql(steps)}) r
            JOIN (SELECT ns_id, lower, upper, bidx,
                         explode(sequence(shiftright(lower, {BUCKET_SHIFT}),
                                          shiftright(upper - 1, {BUCKET_SHIFT}))) AS bucket
                  FROM {layout_view}) l
              ON r.ns_id = l.ns_id AND shiftright(r.hash, {BUCKET_SHIFT}) = l.bucket
             AND r.hash >= l.lower AND r.hash < l.upper
            {tail}"""

    def aggregate(self, steps: Sequence[int], layout_view: str) -> list[AggRow]:
        """Per (step, bundle index): topic count, sessions and the four load
        sums.  Bundles without topics in a step have no row."""
        sql = self._join_sql(steps, layout_view, """
            r.step AS step, l.bidx AS bidx, count(1) AS topics,
            sum(r.producers + r.consumers) AS sessions,
            sum(r.msg_rate_in) AS msg_rate_in, sum(r.msg_rate_out) AS msg_rate_out,
            sum(r.msg_throughput_in) AS msg_throughput_in,
            sum(r.msg_throughput_out) AS msg_throughput_out""", "GROUP BY r.step, l.bidx")
        return [AggRow(int(r[0]), int(r[1]), int(r[2]), int(r[3] or 0), float(r[4]),
                       float(r[5]), float(r[6]), float(r[7]))
                for r in self.spark.sql(sql).collect()]

    def topics_in(self, step: int, layout_view: str) -> list:
        """The topic rows of ``step`` inside the layout's ranges (the bundles
        to split), with their bundle index."""
        return self.spark.sql(self._join_sql([step], layout_view, """
            l.bidx AS bidx, r.topic AS topic, r.msg_rate_in AS msg_rate_in,
            r.msg_rate_out AS msg_rate_out, r.msg_throughput_in AS msg_throughput_in,
            r.msg_throughput_out AS msg_throughput_out, r.producers AS producers,
            r.consumers AS consumers""")).collect()

    def close(self) -> None:
        """Release what the source cached and the views it registered."""
        self.spark.catalog.dropTempView(f"plim_balance_layout_{self._tag}")


class GeneratedSource(TopicSource):
    """A generated cluster (see ``generate``): the topic table is computed
    once and cached; each step's rows are computed from it on demand."""

    def __init__(self, spark, spec: GeneratorSpec):
        super().__init__()
        self.spark = spark
        self.spec = spec
        self.topics_df = generate_topics(spark, spec).cache()
        self.view = f"plim_balance_topics_{self._tag}"
        self.topics_df.createOrReplaceTempView(self.view)
        self.namespaces = [namespace_name(i) for i in range(spec.namespaces)]
        self.steps = list(range(spec.steps))

    def prepare(self) -> int:
        """Materialise the topic table; returns the number of topics."""
        return self.topics_df.count()

    def rows_sql(self, steps: Sequence[int]) -> str:
        return step_rows_sql(self.spec, self.view, steps)

    def close(self) -> None:
        super().close()
        self.spark.catalog.dropTempView(self.view)
        self.topics_df.unpersist()


def _input_files(path: Path) -> list[Path]:
    """The files an input names: the path itself, or the entries of a folder
    that Spark would read (not hidden, not ``_SUCCESS``-like).  Anything but
    a regular file or a folder (a FIFO, a device, a socket) is a UsageError
    at once: opening a FIFO waits for a writer, for ever."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file or folder") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        files = []
        for p in sorted(path.iterdir()):
            if p.name.startswith((".", "_")):
                continue
            mode = p.stat().st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise UsageError(f"{p}: not a regular file ({_kind(mode)}); give files or "
                                 "a folder of files")
            files.append(p)
        return files
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path}: not a regular file ({_kind(st.st_mode)}); give a file or "
                         "a folder of files")
    return [path]


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a file"


def _first_line(path: Path) -> str:
    """The first non-blank line of a regular file, its BOM dropped.  Opened
    without blocking and checked again once open, so a FIFO put in its place
    after _input_files looked is refused too, not waited on."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{path}: not a regular file ({_kind(mode)})")
        with os.fdopen(fd, encoding="utf-8-sig", errors="replace") as f:
            fd = -1                     # the file object closes it
            return next((ln for ln in f if ln.strip()), "")
    finally:
        if fd >= 0:
            os.close(fd)


_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json",
             ".jsonl": "json", ".ndjson": "json"}


def _detect_format(path: Path) -> str:
    suffixes = _SUFFIXES
    if path.is_dir():
        kinds = {suffixes.get(p.suffix.lower()) for p in path.iterdir()
                 if p.is_file() and not p.name.startswith((".", "_"))} - {None}
        if len(kinds) == 1:
            return kinds.pop()
        raise UsageError(f"{path}: cannot tell the format of this folder (found "
                         f"{', '.join(sorted(kinds)) or 'no .parquet, .csv or .json files'})")
    fmt = suffixes.get(path.suffix.lower())
    if fmt is None:
        raise UsageError(f"{path}: unknown file type {path.suffix or '(none)'!r}; "
                         "use .parquet, .csv or .json/.jsonl (JSON lines)")
    return fmt


def check_input(path: Path) -> None:
    """check_input does, before Spark starts, the checks that need no Spark:
    the file or folder exists, its format is known, and its header (CSV),
    first line (JSON lines) or schema (Parquet) has every column of
    ``FACT_COLUMNS``.  The rows themselves are checked by ``load_input``."""
    import json

    path = Path(path)
    files = _input_files(path)
    fmt = _detect_format(path)
    first = next(p for p in files if _SUFFIXES.get(p.suffix.lower()) == fmt)
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq
            columns = pq.read_schema(first).names
        else:
            line = _first_line(first)
            if not line:
                raise UsageError(f"{path}: no rows")
            if fmt == "csv":
                columns = [c.strip().strip('"') for c in line.rstrip("\r\n").split(",")]
            else:
                try:
                    row = json.loads(line)
                except ValueError:
                    raise UsageError(f"{path}: row 1 is not valid JSON: "
                                     f"{line.strip()[:60]!r}") from None
                columns = list(row) if isinstance(row, dict) else []
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UsageError:
        raise
    except Exception as exc:        # pyarrow: not a Parquet file
        raise UsageError(f"{path}: not a readable {fmt} file ({type(exc).__name__})") from None
    missing = [c for c in FACT_COLUMNS if c not in columns]
    if missing:
        raise UsageError(f"{path}: missing column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)} (need {', '.join(FACT_COLUMNS)})")


_NUMBERS = ("msg_rate_in", "msg_rate_out", "msg_throughput_in", "msg_throughput_out")
_COUNTS = ("producers", "consumers")


def load_input(spark, path: Path):
    """Read and check an input file: every column of ``FACT_COLUMNS``
    present; step and counts integers >= 0; rates numbers from 0 to
    ``MAX_RATE``; topic a full name (``persistent://tenant/ns/name``); no
    (step, topic) twice.  A problem is a UsageError naming the column and the
    row (1-based, in file order).  Only regular files are read (a FIFO is
    refused, not waited on), and a CSV header may start with a UTF-8 BOM.
    Returns the typed DataFrame with namespace and hash columns."""
    from pyspark.sql import functions as F

    path = Path(path)
    _input_files(path)
    fmt = _detect_format(path)
    if fmt == "csv":
        raw = spark.read.option("header", True).option("mode", "PERMISSIVE").csv(str(path))
        # Spark keeps a BOM as part of the first header name ("\ufeffstep").
        first = raw.columns[0] if raw.columns else ""
        if first.startswith(_BOM):
            raw = raw.withColumnRenamed(first, first.lstrip(_BOM))
    elif fmt == "json":
        schema = ", ".join(f"{c} string" for c in FACT_COLUMNS) + ", _corrupt_record string"
        raw = (spark.read.schema(schema).option("columnNameOfCorruptRecord", "_corrupt_record")
               .json(str(path)))
    else:
        raw = spark.read.parquet(str(path))
    missing = [c for c in FACT_COLUMNS if c not in raw.columns]
    if missing:
        raise UsageError(f"{path}: missing column{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)} (need {', '.join(FACT_COLUMNS)})")
    if fmt == "parquet":
        kinds = dict(raw.dtypes)
        for c in FACT_COLUMNS:
            want_str = c == "topic"
            is_str = kinds[c] == "string"
            numeric = kinds[c] in ("tinyint", "smallint", "int", "bigint", "float", "double") \
                or kinds[c].startswith("decimal")
            if (want_str and not is_str) or (not want_str and not numeric):
                raise UsageError(f"{path}: column {c} has type {kinds[c]}, expected "
                                 f"{'string' if want_str else 'a number'}")
    s = {c: F.col(c).cast("string") for c in FACT_COLUMNS}
    # try_cast: under ANSI mode (Spark 4's default) a plain cast of "abc"
    # fails the job instead of giving the null the check looks for.
    num = {c: F.expr(f"try_cast(CAST(`{c}` AS STRING) AS DOUBLE)") for c in FACT_COLUMNS}
    as_int = {c: num[c] for c in ("step", *_COUNTS)}
    checks = []
    if "_corrupt_record" in raw.columns:
        checks.append((F.col("_corrupt_record").isNotNull(), "(line)", "is not valid JSON"))
    checks.append((~F.coalesce(s["topic"].rlike(_TOPIC_RE), F.lit(False)), "topic",
                   "is not a full topic name like persistent://tenant/ns/topic"))
    for c in ("step", *_COUNTS):
        v = as_int[c]
        checks.append((v.isNull() | (v < 0) | (v != F.floor(v)) | (v > 2**31 - 1), c,
                       "is not an integer >= 0"))
    for c in _NUMBERS:
        v = num[c]
        checks.append((v.isNull() | F.isnan(v) | (v < 0) | (v > MAX_RATE), c,
                       f"is not a number from 0 to {MAX_RATE:g}"))
    problem = F.lit(None).cast("string")
    for cond, col, _ in reversed(checks):
        problem = F.when(cond, F.lit(col)).otherwise(problem)
    flagged = raw.withColumn("_problem", problem)
    bad = flagged.where(F.col("_problem").isNotNull()).limit(1).collect()
    if bad:
        _report_bad_row(path, raw, checks)
    typed = raw.select(
        num["step"].cast("int").alias("step"),
        F.col("topic").cast("string").alias("topic"),
        *[num[c].alias(c) for c in _NUMBERS],
        *[num[c].cast("int").alias(c) for c in _COUNTS])
    dup = typed.groupBy("step", "topic").count().where(F.col("count") > 1).limit(1).collect()
    if dup:
        raise UsageError(f"{path}: step {dup[0]['step']} has topic {dup[0]['topic']} "
                         f"{dup[0]['count']} times (one row per topic per step)")
    return typed.withColumn("namespace", F.regexp_extract("topic", _NS_RE, 1))


def _report_bad_row(path: Path, raw, checks) -> None:
    """Find the first bad row in file order and raise a UsageError about it."""
    conds = list(checks)
    probe = raw.select(*raw.columns,
                       *[c.alias(f"_bad{i}") for i, (c, _, _) in enumerate(conds)])
    flags = [f"_bad{i}" for i in range(len(conds))]   # plain strings: the filter is pickled
    first = (probe.rdd.zipWithIndex()
             .filter(lambda rv: any(rv[0][f] for f in flags))
             .first())
    row, index = first
    for i, (_, col, why) in enumerate(conds):
        if row[f"_bad{i}"]:
            value = row["_corrupt_record"] if col == "(line)" else row[col]
            where = f"row {index + 1}"
            if col == "(line)":
                raise UsageError(f"{path}: {where} {why}: {str(value)[:60]!r}")
            shown = "empty" if value is None else repr(str(value)[:60])
            raise UsageError(f"{path}: {where}: column {col} {why} (got {shown})")
    raise UsageError(f"{path}: a row is malformed")


class FileSource(TopicSource):
    """Topic rows from an input file (``load_input``), namespaces numbered,
    hashed with Spark's ``crc32``, and kept in memory (spilling to disk)."""

    def __init__(self, spark, path: Path):
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        super().__init__()
        self.spark = spark
        typed = load_input(spark, path)
        self.namespaces = sorted(r[0] for r in typed.select("namespace").distinct().collect())
        if not self.namespaces:
            raise UsageError(f"{path}: no rows")
        ns_df = spark.createDataFrame(list(enumerate(self.namespaces)),
                                      "ns_id int, namespace string")
        self.facts = (typed.join(F.broadcast(ns_df), "namespace")
                      .withColumn("hash", F.crc32(F.col("topic")))
                      .select(*FACT_COLUMNS, "ns_id", "hash")
                      .persist(StorageLevel.MEMORY_AND_DISK))
        self.view = f"plim_balance_facts_{self._tag}"
        self.facts.createOrReplaceTempView(self.view)
        self.steps = sorted(r[0] for r in self.facts.select("step").distinct().collect())

    def prepare(self) -> int:
        """Materialise the rows; returns how many there are."""
        return self.facts.count()

    def rows_sql(self, steps: Sequence[int]) -> str:
        steps = ", ".join(str(int(x)) for x in steps)
        return f"SELECT * FROM {self.view} WHERE step IN ({steps})"

    def close(self) -> None:
        super().close()
        self.spark.catalog.dropTempView(self.view)
        self.facts.unpersist()


def open_source(spark, input_path: Optional[Path], spec: GeneratorSpec) -> TopicSource:
    """The run's source: the input file if given, else the generated cluster."""
    if input_path is not None:
        return FileSource(spark, input_path)
    return GeneratedSource(spark, spec)
