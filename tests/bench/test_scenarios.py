"""pylimiter.bench.scenarios: every scenario's trial on both implementations
(no Spark)."""

from __future__ import annotations

import pytest

from pylimiter.bench.scenarios import SCENARIOS, run_trial


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_trial_row_is_complete_and_clean(impl, scenario):
    name = impl.tag
    row = run_trial(scenario, name, 8, 4, budget_s=0.01)
    assert row["scenario"] == scenario and row["impl"] == name
    assert row["ops"] > 0 and row["ns_per_op"] > 0
    assert row["ops_per_s"] == pytest.approx(1e9 / row["ns_per_op"])
    assert row["errors"] == 0
    assert row["leaked_permits"] == 0
    assert row["rounds"] >= 3
    if SCENARIOS[scenario].anchor:
        assert row["anchor_ns_per_op"] > 0
        # The median of per-round ratios, not a ratio of medians.
        assert 0 < row["speedup_lo"] <= row["speedup"] <= row["speedup_hi"]
    else:
        assert row["anchor_ns_per_op"] is None and row["speedup"] is None
    if SCENARIOS[scenario].baseline and SCENARIOS[scenario].anchor:
        assert row["baseline_ns_per_op"] > 0 and row["cost_ratio"] is not None
    else:
        assert row["cost_ratio"] is None
    if scenario in ("tasks", "threads", "weighted", "dual", "uncontended-async",
                    "uncontended-threads", "scaling"):
        assert 0 <= row["wait_p50_us"] <= row["wait_p99_us"] <= row["wait_max_us"]


def test_trial_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown scenario"):
        run_trial("nope", "c", 1, 1)
    with pytest.raises(ValueError, match="unknown implementation"):
        run_trial("tasks", "rust", 1, 1)
