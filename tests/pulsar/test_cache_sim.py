"""The cache simulator: traces, the reference policies, the replayer, the
idle-pass measurement, the Spark pipeline end to end on the shared session,
and the command line."""

from __future__ import annotations

import csv

import pytest

from pylimiter.pulsar.cache.policies import POLICIES, LegacyCacheManager, LRUCacheManager
from pylimiter.pulsar.cache.replay import replay
from pylimiter.pulsar.cache.scan import idle_pass_ns
from pylimiter.pulsar.cache.workloads import (
    ADD,
    MARK_DELETE,
    READ,
    REPLAY_ADD,
    REPLAY_READ,
    WORKLOADS,
    Trace,
)
from tests._helpers import run_module

from ._cache_support import FakeClock, release_only

SMALL = dict(scale=0.05, duration=4.0)


# ---- traces ------------------------------------------------------------------------------


@release_only
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_traces_are_deterministic_and_seeded(workload):
    a = list(Trace(workload, 3, **SMALL))
    b = list(Trace(workload, 3, **SMALL))
    c = list(Trace(workload, 4, **SMALL))
    assert a == b and a != c and a
    assert all(x[0] <= y[0] for x, y in zip(a, a[1:]))          # time order
    kinds = {e[1] for e in a}
    assert {ADD, READ, MARK_DELETE} <= kinds


@release_only
def test_trace_reads_and_replays():
    t = Trace("keyshared", 1, scale=0.1, duration=20)
    events = list(t)
    reads = sum(e[4] - e[3] + 1 for e in events if e[1] == READ)
    reads += sum(len(e[3]) for e in events if e[1] == REPLAY_READ)
    assert t.reads == reads and reads > 0
    added = [x for e in events if e[1] == REPLAY_ADD for x in e[3]]
    redelivered = [x for e in events if e[1] == REPLAY_READ for x in e[3]]
    assert added and redelivered and set(redelivered) <= set(added)
    # the mark-delete never passes an entry still waiting for redelivery
    pending: dict[int, set] = {}
    md: dict[int, int] = {}
    for e in events:
        p = pending.setdefault(e[2], set())
        if e[1] == REPLAY_ADD:
            p |= set(e[3])
        elif e[1] == REPLAY_READ:
            p -= set(e[3])
        elif e[1] == MARK_DELETE:
            md[e[2]] = e[3]
        assert all(x > md.get(e[2], -1) for x in p)
    t2 = Trace("catchup", 1, scale=0.05, duration=5)
    list(t2)
    assert all(len(s) >= 6000 for s in t2.sizes)                   # the backlog's sizes too
    with pytest.raises(ValueError, match="unknown workload"):
        Trace("nope")


# ---- policies ----------------------------------------------------------------------------


def test_legacy_refuses_inserts_when_full_and_scans_by_position():
    clock = FakeClock(0)
    m = LegacyCacheManager(1000, time_threshold_ms=1, clock=clock)
    c = m.cache("t")
    # Out of position order in time: position 5 is the oldest entry.
    clock.now = 0
    assert c.insert((1, 5), b"x" * 100)
    clock.now = 10_000_000
    assert c.insert((1, 1), b"x" * 100)
    clock.now = 10_500_000
    # Only entries from the lowest position on, stopping at the first young
    # one: (1, 1) is young, so the expired (1, 5) survives (PIP-430's point).
    assert m.run_eviction() == (0, 0) and (1, 5) in c
    legacy_full = LegacyCacheManager(300, time_threshold_ms=1000, clock=clock)
    f = legacy_full.cache("t")
    f.insert((1, 0), b"x" * 290)
    assert f.insert((1, 1), b"x" * 5)                              # 295 < 300
    assert f.insert((1, 2), b"x" * 5) is False or legacy_full.size < 300


def test_legacy_size_eviction_takes_from_the_largest_caches():
    m = LegacyCacheManager(10_000, time_threshold_ms=1000, clock=FakeClock())
    big, small = m.cache("big"), m.cache("small")
    for i in range(30):
        small.insert((1, i), b"x" * 100)                           # 3000, older
    for i in range(68):
        big.insert((1, i), b"x" * 100)                             # 9800: not above 9800
    assert m.stats().evicted_entries == 0
    assert big.insert((1, 68), b"x" * 100)                        # 9900: free 900
    # the largest cache holds half the bytes alone: it pays everything,
    # from its lowest positions
    assert small.size == 3000 and big.size == 6900 - 900
    assert (1, 8) not in big and (1, 9) in big


def test_lru_evicts_least_recently_used_globally():
    m = LRUCacheManager(300, time_threshold_ms=1000, clock=FakeClock())
    a, b = m.cache("a"), m.cache("b")
    a.insert((1, 0), b"x" * 100)
    b.insert((1, 0), b"x" * 100)
    a.insert((1, 1), b"x" * 100)
    assert a.get((1, 0)) is not None                               # a:0 is now recent
    b.insert((1, 1), b"x" * 100)                                   # evicts b:0
    assert b.get((1, 0)) is None and a.get((1, 0)) is not None
    assert m.run_eviction() == (0, 0)
    a.invalidate_up_to((1, 0))
    assert m.stats().entries == 2 and m.size == 200


@release_only
@pytest.mark.parametrize("policy", sorted(POLICIES))
@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_replay_accounts_every_read(policy, workload):
    r = replay(Trace(workload, 1, **SMALL), policy, 2 << 20)
    assert r["hits"] + r["misses"] == r["reads"] > 0
    assert r["hit_rate"] == pytest.approx(r["hits"] / r["reads"])
    assert r["storage_reads"] <= r["misses"] and (r["storage_bytes"] > 0) == (r["misses"] > 0)
    assert r["eviction_passes"] == int(4.0 / 0.01) or r["eviction_passes"] > 0
    assert r["peak_bytes"] <= 2 << 20


@release_only
def test_expected_reads_keep_catchup_entries():
    t = dict(scale=0.1, duration=15)
    pip = replay(Trace("catchup", 1, **t), "pip430", 64 << 20)
    fifo = replay(Trace("catchup", 1, **t), "fifo", 64 << 20)
    assert pip["requeues"] > 0 and fifo["requeues"] == 0
    assert pip["storage_bytes"] < fifo["storage_bytes"]


@release_only
def test_idle_pass_measures_without_evicting():
    ns = idle_pass_ns(50, ("pip430", "legacy", "lru"), rounds=3, budget_passes=5000)
    assert set(ns) == {"pip430", "legacy", "lru"} and all(v > 0 for v in ns.values())


# ---- the pipeline ------------------------------------------------------------------------


def _rows(path):
    (part,) = path.glob("part-*.csv")
    with part.open() as f:
        return list(csv.DictReader(f))


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
    assert "Verdict." in html and "Claim 1" in html and "Claim 2" in html
    for png in ("hit_rate.png", "storage.png", "scan.png"):
        assert (out / png).stat().st_size > 1000 and png in html
    assert (out / "runs.parquet").is_dir()


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
    from pylimiter.pulsar._settings import flag_of
    from pylimiter.pulsar.cache import SETTINGS
    from pylimiter.pulsar.cache._common import CacheSettings
    from pylimiter.pulsar.cache.pipeline import build_parser, settings_from

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
