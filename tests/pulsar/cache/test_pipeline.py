"""python -m pylimiter.pulsar.cache simulate: the Spark pipeline end to end on
the shared session, its flags (from CacheSettings) and the command line."""

from __future__ import annotations

import csv

import pytest

from pylimiter.pulsar.cache.policies import POLICIES
from pylimiter.pulsar.cache.replay import replay
from pylimiter.pulsar.cache.workloads import (
    Trace,
)
from tests._helpers import needs_pyspark, run_module
from tests.spark.pages import files_beside

from .kit import release_only


def _rows(path):
    assert path.is_file()               # one CSV file, not a Spark folder
    with path.open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_simulator_end_to_end(spark, tmp_path, capsys):
    from pylimiter.pulsar.cache.pipeline import main

    out = tmp_path / "cache"
    rc = main(["simulate", "--workloads", "catchup,keyshared",
               "--cache-size-mb", "1,4", "--scale", "0.05", "--duration", "2",
               "--scan-topics", "10,100", "--no-progress", "--out", str(out)], spark=spark)
    cap = capsys.readouterr()
    assert rc == 0, cap.out + cap.err
    assert "pylimiter entry cache simulator: 20 replays" in cap.out
    assert f"report: {(out / 'index.html').resolve()}" in cap.out
    assert not spark.sparkContext._jsc.sc().isStopped()
    runs = _rows(out / "runs.csv")
    assert len(runs) == 2 * 5 * 2
    for r in runs:
        assert r["failure"] == ""
        assert int(r["hits"]) + int(r["misses"]) == int(r["reads"]) > 0
    summary = _rows(out / "summary.csv")
    assert {(s["workload"], s["policy"]) for s in summary} == {
        (w, p) for w in ("catchup", "keyshared") for p in POLICIES}
    scan = _rows(out / "scan.csv")
    assert {(int(s["topics"]), s["policy"]) for s in scan} == {
        (t, p) for t in (10, 100) for p in ("pip430", "lru", "legacy")}
    html = (out / "index.html").read_text()
    assert "class='verdict'" in html and "1. Evicting from the removal queue" in html
    assert "2. Keeping entries with expected reads left" in html
    # the headline in the terminal: the verdict table's rows
    assert "verdict 1. Evicting from the removal queue" in cap.out
    assert "verdict 3. PIP-430 does at least as well as every other policy run: catchup" \
        in cap.out
    assert "20 replays (2 workloads x 5 policies x 2 cache sizes x 1 seed)" in cap.out
    for png in ("hit_rate.png", "storage.png", "scan.png"):
        assert (out / png).stat().st_size > 1000 and png in html
    assert (out / "runs.parquet").is_file()
    assert {"runs.csv", "summary.csv", "scan.csv"} <= set(files_beside(out / "index.html"))


# ---- the command line ------------------------------------------------------------------------


def _cli(*args, timeout=120):
    return run_module("pylimiter.pulsar.cache", *args, timeout=timeout)


@pytest.mark.slow
def test_cli_version_and_help():
    v = _cli("--version")
    assert v.returncode == 0 and "pylimiter-pulsar" in v.stdout
    h = _cli("simulate", "--help")
    assert h.returncode == 0 and "(default: 8.0,32.0,128.0)" in h.stdout
    assert "--eviction-watermark N" in h.stdout and "--managedLedger" not in h.stdout


def test_flags_keys_and_defaults_come_from_the_declaration():
    from pylimiter.pulsar.cache import SETTINGS
    from pylimiter.pulsar.cache._common import CacheSettings
    from pylimiter.pulsar.cache.pipeline import build_parser, settings_from
    from pylimiter.spark.settings import flag_of

    sub = build_parser()._subparsers._group_actions[0].choices["simulate"]
    helps = {opt: a.help for a in sub._actions for opt in a.option_strings}
    for f in CacheSettings.settings():
        if f.metadata["group"] == "policy":       # fixed by each policy, no flag
            assert flag_of(f) not in helps
            continue
        assert f.metadata["key"] in helps[flag_of(f)], f.name
    assert helps["--time-threshold-ms"].endswith("(default 1000 ms)")
    assert SETTINGS["managedLedgerCacheEvictionIntervalMs"] == 10.0
    assert settings_from(sub.parse_args([])) == CacheSettings()
    s = settings_from(sub.parse_args(["--max-requeue", "0", "--eviction-watermark", "0.5"]))
    assert (s.max_requeue, s.eviction_watermark, s.time_threshold_ms) == (0, 0.5, 1000.0)


@pytest.mark.slow
@pytest.mark.parametrize("args, needle", [
    (["simulate", "--policies", "pip430,arc"], "unknown 'arc'"),
    (["simulate", "--cache-size-mb", "8,-1"], "cache_size_mb must be a number from 0 to"),
    (["simulate", "--cache-size-mb", ","], "expected comma-separated values"),
    (["simulate", "--eviction-watermark", "0.99"],
     "eviction_watermark must be a number from 0 to 0.98, not 0.99"),
    (["simulate", "--eviction-interval-ms", "0"], "eviction_interval_ms must be a number from"),
    (["simulate", "--max-requeue", "1.5"], "must be an integer, not '1.5'"),
    (["simulate", "--scale", "0"], "must be a finite number > 0"),
    (["simulate", "--out", "/proc/nope"], "cannot write to /proc/nope"),
    (["simulate", "--master", "mesos://127.0.0.1:1"], "unsupported master URL"),
    ([], "required"),
])
@needs_pyspark
def test_cli_usage_errors_are_one_line(args, needle):
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr.strip().splitlines()[-1]
    assert "Traceback" not in p.stderr


@release_only
def test_result_rows_fit_the_schema_types():
    """Every value has the Python type of its declared Spark type (an int
    duration where a double is declared is rejected by createDataFrame)."""
    from pylimiter.pulsar.cache.replay import RESULT_FIELDS
    from pylimiter.spark.rows import typed_row

    res = replay(Trace("keyshared", 1, scale=0.03), "pip430", 1 << 20)   # default duration
    assert isinstance(res["sim_seconds"], (int, float))
    row = typed_row(res, RESULT_FIELDS)
    py = {"double": float, "long": int, "int": int, "string": str}
    for (name, kind), value in zip(RESULT_FIELDS, row):
        assert value is None or type(value) is py[kind], (name, value)


def test_the_run_outcome_reads_result_rows_by_name():
    # The fields in another order: a reader by position would add up the
    # wrong columns.
    from pylimiter.pulsar.cache.pipeline import outcome
    from pylimiter.pulsar.cache.replay import RESULT_FIELDS
    from pylimiter.spark.rows import failure_row, typed_row

    fields = list(reversed(RESULT_FIELDS))
    ok = {name: 0 for name, _ in fields} | {"workload": "tailing", "policy": "fifo",
                                             "reads": 7, "storage_bytes": 3000, "hits": 99,
                                             "failure": None}
    bad = failure_row({"workload": "tailing", "policy": "lru"}, ValueError("boom"))
    rows = [typed_row(ok, fields), typed_row(ok, fields), typed_row(bad, fields)]
    assert outcome(rows, fields) == (["ValueError: boom"], 14, 6000)
