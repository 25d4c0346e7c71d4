"""The lifecycle simulator: one subscription without Spark, the command line,
and an end-to-end sweep on the shared SparkSession."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from pylimiter.pulsar.cursor.replay import Point, run_variant, seed_rule_min

TINY = {"rate": 10, "publish_min": 120, "rollover_max_min": 60, "ttl_check_min": 5, "sample_min": 5}


def test_our_rule_never_expires_a_delayed_message_before_delivery():
    p = Point(ttl_min=30, retention_min=0, delayed_share=0.3, ack_fail=0.05,
              rollover_entries=200, **TINY)
    pulsar = run_variant(p, "publish", False)["summary"]
    ours = run_variant(p, "deliverable", False)["summary"]
    assert pulsar["published"] == ours["published"] == 1200     # same traffic
    assert pulsar["delayed"] == ours["delayed"] > 0
    assert pulsar["lost_before_delivery"] > 0
    assert ours["lost_before_delivery"] == 0
    for s in (pulsar, ours):
        # Every message ends acknowledged one way or another, and deleted.
        assert s["consumed"] + s["expired"] + s["evicted"] == s["published"]
        assert s["not_deleted"] == 0


def test_compensator_redelivers_holes_and_shrinks_them():
    p = Point(ttl_min=60, retention_min=0, delayed_share=0.0, ack_fail=0.2,
              rollover_entries=500, **TINY)
    off = run_variant(p, "deliverable", False)["summary"]
    on = run_variant(p, "deliverable", True)["summary"]
    assert off["redelivered"] == 0 and on["redelivered"] > 0
    assert on["expired"] < off["expired"]
    assert on["peak_holes"] < off["peak_holes"]


def test_lifetime_follows_ledger_close_plus_max_of_ttl_and_retention():
    # Nothing delayed, every ack kept: a message lives until its ledger closed
    # and retention ran out after that close.
    p = Point(ttl_min=30, retention_min=90, delayed_share=0.0, ack_fail=0.0,
              rollover_entries=300, **TINY)
    res = run_variant(p, "publish", False)
    (row,) = res["lifetimes"]
    assert row["fate"] == "consumed" and row["messages"] == 1200
    assert row["seed_rule_min"] == seed_rule_min(30, 90) == 120
    assert row["pulsar_rule_mae_min"] < 3          # retention check every 2 min
    assert row["pulsar_rule_mae_min"] < row["seed_rule_mae_min"]


def test_eviction_policy_acknowledges_the_oldest_holes():
    p = Point(ttl_min=240, retention_min=0, delayed_share=0.0, ack_fail=0.3,
              rollover_entries=500, quota_bytes=50 * 1024,
              quota_policy="consumer_backlog_eviction", **TINY)
    s = run_variant(p, "deliverable", False)["summary"]
    assert s["quota_actions"] > 0 and s["evicted"] > 0 and s["blocked_min"] == 0
    # Checked every minute and cut to 0.9 x the limit: the backlog never gets
    # more than one minute's messages (10) above the limit.
    assert 50 * 1024 <= s["peak_backlog_bytes"] <= 60 * 1024
    held = run_variant(Point(**{**p.__dict__, "quota_policy": "producer_exception"}),
                       "deliverable", False)["summary"]
    assert held["blocked_min"] > 0 and held["evicted"] == 0


def test_seed_rule():
    assert seed_rule_min(60, 180) == 240
    assert seed_rule_min(180, 60) == 180
    assert seed_rule_min(60, 60) == 60


# ---- command line ----------------------------------------------------------------------

def test_usage_errors_are_one_line_and_exit_2(tmp_path, capsys):
    from pylimiter.pulsar.cursor.pipeline import PROG, main, run

    def cli(argv):
        return run(main, PROG, argv)

    assert cli(["simulate", "--master", "mesos://h:1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unsupported master URL" in err
    for bad in (["simulate", "--ttl-min", "0"], ["simulate", "--ack-fail", "1.5"],
                ["simulate", "--quota-policy", "drop"], ["simulate", "--out", "/proc/x"],
                ["simulate", "--quota-kib", "-2"], ["simulate", "--rollover-entries", "1,x"]):
        with pytest.raises(SystemExit) as exc:
            cli(bad)
        assert exc.value.code == 2


@pytest.mark.slow
def test_cli_version_and_help():
    out = subprocess.run([sys.executable, "-m", "pylimiter.pulsar.cursor", "--version"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "pylimiter-pulsar" in out.stdout
    out = subprocess.run([sys.executable, "-m", "pylimiter.pulsar.cursor", "simulate", "--help"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "(default: 60,240)" in out.stdout


# ---- end to end on the shared session ---------------------------------------------------

def test_simulate_end_to_end(spark, tmp_path, capsys):
    from pylimiter.pulsar.cursor.pipeline import main

    out = tmp_path / "cursor"
    argv = ["simulate", "--ttl-min", "30", "--retention-min", "0,60", "--delayed-share", "0.3",
            "--ack-fail", "0.05", "--rollover-entries", "200", "--rate", "10",
            "--publish-min", "120", "--rollover-max-min", "60", "--quota-kib", "64",
            "--out", str(out), "--no-progress"]
    assert main(argv, spark=spark) == 0
    printed = capsys.readouterr().out
    assert "2 points x 4 subscriptions" in printed and "ours 0" in printed

    rows = spark.read.parquet(str(out / "summary.parquet")).collect()
    assert len(rows) == 8                                   # 2 points x 4 variants
    for r in rows:
        if r.rule == "deliverable":
            assert r.lost_before_delivery == 0              # never before delivery
        assert r.consumed + r.expired + r.evicted == r.published == 1200
    assert sum(r.lost_before_delivery for r in rows if r.rule == "publish") > 0
    (part,) = (out / "lifetimes.csv").glob("part-*.csv")
    with part.open() as f:
        fates = {row["fate"] for row in csv.DictReader(f)}
    assert "consumed" in fates
    assert spark.read.parquet(str(out / "series.parquet")).count() > 0

    html = (out / "index.html").read_text()
    assert "class='verdict'" in html and "were expired before their delivery time" in html
    for png in ("delayed_lost.png", "holes.png", "lifetime.png"):
        assert (out / png).stat().st_size > 10_000
        assert f"src='{png}'" in html
    assert spark.range(2).count() == 2                      # the shared session still runs
