"""pylimiter.pulsar.cursor.replay: one subscription's lifecycle without Spark."""

from __future__ import annotations

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
