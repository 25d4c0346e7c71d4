"""pylimiter.spark.interleave: rounds interleaved, the order flipped, the
warm-up dropped, spreads over rounds."""

from __future__ import annotations

import pytest

from pylimiter.spark.interleave import Spread, interleaved, per_round


def test_interleaved_flips_the_order_and_drops_warmup():
    calls = []
    sides = {name: (lambda name=name: calls.append(name) or len(calls)) for name in "abc"}
    out = interleaved(sides, 3, warmup=1)
    assert "".join(calls) == "abc" "cba" "abc" "cba"
    # Round 0 (warm-up) dropped: what each side returned in rounds 1-3.
    assert out == {"a": [6, 7, 12], "b": [5, 8, 11], "c": [4, 9, 10]}


def test_interleaved_budget_adds_rounds_and_before_runs_ahead_of_each_side():
    seen = []
    out = interleaved({"a": lambda: seen.append("a") or 1}, 2, warmup=0, budget_s=0.05,
                      before=lambda: seen.append("gc"))
    assert len(out["a"]) > 2      # rounds kept coming until the budget was spent
    assert seen[:4] == ["gc", "a", "gc", "a"]
    with pytest.raises(ValueError, match="at least 1"):
        interleaved({"a": lambda: 1}, 0)


def test_spread_and_per_round():
    s = Spread.of([5.0, 1.0, 3.0, 2.0, 4.0, float("nan")])
    assert (s.median, s.q1, s.q3, s.lo, s.hi, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert s.iqr == 2.0 and s.as_dict("x_")["x_median"] == 3.0
    assert Spread.of([7]).q1 == Spread.of([7]).q3 == 7
    with pytest.raises(ValueError):
        Spread.of([float("nan")])
    ratios = per_round({"mine": [1, 2, 4], "anchor": [4, 4, 4]},
                       lambda mine, anchor: anchor / mine)
    assert ratios == [4.0, 2.0, 1.0]
