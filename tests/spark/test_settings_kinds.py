"""pylimiter.spark.settings beyond numbers: switches, choices, settings
selected by group, swept settings and the report table, on a toy subsystem
of their own (the balance and cache declarations use all of these)."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass

import pytest

from pylimiter.spark.settings import (
    ConfigError,
    Settings,
    add_setting_flags,
    add_sweep_flag,
    flag_of,
    setting,
    setting_overrides,
)

ALGORITHMS = ("range", "count")


@dataclass(frozen=True)
class Toy(Settings):
    """A switch on and one off, a choice, a percentage, a unitless fraction."""

    split: bool = setting("autoSplitEnabled", True, "", "split big bundles", group="split")
    lower: bool = setting("lowerBoundaryEnabled", False, "", "also lift idle brokers",
                          group="shed")
    algorithm: str = setting("splitAlgorithm", "range", "", "how to split", group="split",
                             choices=ALGORITHMS)
    threshold_pct: float = setting("thresholdPercentage", 10.0, "%", "how far above",
                                   group="shed")
    history: float = setting("historyPercentage", 0.9, "", "weight of the past",
                             group="shed", maximum=1)


def _parser(**kw):
    ap = argparse.ArgumentParser()
    add_setting_flags(ap, Toy, **kw)
    return ap


def test_switch_flags_turn_the_default_around_and_only_what_is_given_counts():
    assert [flag_of(f) for f in Toy.settings()] == [
        "--no-split", "--lower", "--algorithm", "--threshold-pct", "--history"]
    ap = _parser()
    assert setting_overrides(ap.parse_args([]), Toy) == {}
    given = setting_overrides(ap.parse_args(["--no-split", "--lower", "--algorithm", "count"]),
                              Toy)
    assert given == {"split": False, "lower": True, "algorithm": "count"}
    toy = dataclasses.replace(Toy(), **given)
    assert (toy.split, toy.lower, toy.algorithm) == (False, True, "count")
    text = " ".join(ap.format_help().split())
    assert "--no-split turns off: split big bundles; sets autoSplitEnabled=false " \
           "(default true)" in text
    assert "--lower turns on: also lift idle brokers; sets lowerBoundaryEnabled=true " \
           "(default false)" in text
    # a % unit is text, not an argparse format; a unit that is not a word is N
    assert "--threshold-pct N how far above; overrides thresholdPercentage (default 10 %)" \
           in text
    assert "(default 0.9)" in text and "{range,count}" in text


def test_groups_select_flags_and_overrides():
    ap = _parser(group="shed")
    opts = {o for a in ap._actions for o in a.option_strings}
    assert {"--lower", "--threshold-pct", "--history"} <= opts
    assert not {"--no-split", "--algorithm"} & opts
    ns = argparse.Namespace(split=False, lower=True, algorithm=None, threshold_pct=None,
                            history=None)
    assert setting_overrides(ns, Toy, group="shed") == {"lower": True}
    assert setting_overrides(ns, Toy) == {"split": False, "lower": True}


@pytest.mark.parametrize("kw, needle", [
    ({"split": 1}, "split must be true or false, not 1"),
    ({"lower": "true"}, "lower must be true or false, not 'true'"),
    ({"algorithm": "hash"}, "algorithm must be one of range, count, not 'hash'"),
    ({"algorithm": 1}, "algorithm must be one of range, count, not 1"),
    ({"history": 1.5}, "history must be a number from 0 to 1, not 1.5"),
    ({"threshold_pct": -1}, "threshold_pct must be a number from 0 to 2147483647 %, not -1"),
])
def test_values_are_checked_at_construction(kw, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        Toy(**kw)


@pytest.mark.parametrize("argv, needle", [
    (["--algorithm", "hash"], "algorithm must be one of range, count, not 'hash'"),
    (["--history", "2"], "history must be a number from 0 to 1, not 2.0"),
])
def test_bad_flags_are_argparse_errors(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_a_choice_default_must_be_one_of_the_choices():
    with pytest.raises(ValueError, match="default 'x' is not one of the choices"):
        setting("k", "x", "", "doc", choices=("a", "b"))


def test_properties_read_switches_and_choices(tmp_path):
    f = tmp_path / "broker.conf"
    f.write_text("autoSplitEnabled=FALSE\nlowerBoundaryEnabled = true\nsplitAlgorithm=count\n")
    toy = Toy.from_properties(f)
    assert (toy.split, toy.lower, toy.algorithm) == (False, True, "count")
    assert toy.describe() == ("split false, lower true, algorithm count, threshold_pct 10 %, "
                              "history 0.9")
    for line, needle in [("autoSplitEnabled=yes", "must be true or false, not 'yes'"),
                         ("splitAlgorithm=hash", "must be one of range, count")]:
        f.write_text(line + "\n")
        with pytest.raises(ConfigError, match=re.escape(needle)):
            Toy.from_properties(f)


def test_sweep_flag_takes_checked_lists_with_a_default(capsys):
    ap = argparse.ArgumentParser()
    add_sweep_flag(ap, Toy, "threshold_pct", [5.0, 10.0])
    assert ap.parse_args([]).threshold_pct == [5.0, 10.0]
    assert ap.parse_args(["--threshold-pct", "1, 2,3"]).threshold_pct == [1.0, 2.0, 3.0]
    text = " ".join(ap.format_help().split())
    assert "--threshold-pct N,... how far above; the thresholdPercentage values to sweep (%)" \
           in text
    for bad, needle in [("1,-2", "threshold_pct must be a number from 0"),
                        (",", "expected comma-separated values")]:
        with pytest.raises(SystemExit):
            ap.parse_args(["--threshold-pct", bad])
        assert needle in capsys.readouterr().err


def test_table_lists_key_value_with_unit_and_flag():
    rows = Toy(lower=True).table()
    assert rows[:2] == [("autoSplitEnabled", "true", "--no-split"),
                        ("lowerBoundaryEnabled", "true", "--lower")]
    assert ("thresholdPercentage", "10 %", "--threshold-pct") in rows
    assert [r[0] for r in Toy().table(group="split")] == ["autoSplitEnabled", "splitAlgorithm"]
