"""pylimiter.spark.settings: one declaration per setting, and everything
derived from it (config file, flags, start-up line, checks), on a toy
subsystem of its own."""

from __future__ import annotations

import argparse
import dataclasses
import re
from dataclasses import dataclass

import pytest

from pylimiter.spark.settings import (
    JAVA_INT_MAX,
    ConfigError,
    Settings,
    add_setting_flags,
    check_value,
    closest_key,
    flag_of,
    is_setting,
    setting,
    setting_overrides,
)


@dataclass(frozen=True)
class CacheSettings(Settings):
    """A toy subsystem: two groups, a float, ints, a minimum."""

    KEY_FAMILIES = ("managedLedgerCache",)

    size_mb: float = setting("managedLedgerCacheSizeMB", 512.0, "MB",
                             "entry cache size (0 disables)", group="cache")
    evict_ms: int = setting("managedLedgerCacheEvictionIntervalMs", 10, "ms",
                            "how often the cache is trimmed", group="cache", minimum=1)
    readers: int = setting("managedLedgerMaxReaders", 4, "readers", "read threads",
                           maximum=64)
    label: str = "not a setting"     # plain fields are left alone


def test_declaration_order_defaults_and_plain_fields():
    assert [f.name for f in CacheSettings.settings()] == ["size_mb", "evict_ms", "readers"]
    c = CacheSettings()
    assert (c.size_mb, c.evict_ms, c.readers, c.label) == (512.0, 10, 4, "not a setting")
    label = next(f for f in dataclasses.fields(CacheSettings) if f.name == "label")
    assert not is_setting(label)
    assert CacheSettings.setting_named("evict_ms").metadata["key"] == \
        "managedLedgerCacheEvictionIntervalMs"
    with pytest.raises(KeyError):
        CacheSettings.setting_named("label")


@pytest.mark.parametrize("kw, needle", [
    ({"size_mb": -1.0}, "size_mb must be a number from 0 to"),
    ({"size_mb": float("inf")}, "size_mb must be a number"),
    ({"size_mb": float("nan")}, "size_mb must be a number"),
    ({"size_mb": "5"}, "size_mb must be a number, not '5'"),
    ({"evict_ms": 0}, "evict_ms must be an integer from 1 to"),
    ({"evict_ms": 2.5}, "evict_ms must be an integer, not 2.5"),
    ({"evict_ms": True}, "evict_ms must be an integer, not True"),
    ({"readers": 65}, "readers must be an integer from 0 to 64 readers, not 65"),
])
def test_values_are_checked_at_construction(kw, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        CacheSettings(**kw)


def test_an_int_is_a_valid_number_setting_and_the_maximum_defaults_to_a_java_int():
    assert CacheSettings(size_mb=1).size_mb == 1
    f = CacheSettings.setting_named("size_mb")
    assert f.metadata["maximum"] == JAVA_INT_MAX
    check_value(f, JAVA_INT_MAX)
    with pytest.raises(ConfigError):
        check_value(f, JAVA_INT_MAX + 1)


def test_a_range_that_is_empty_is_refused_where_it_is_declared():
    with pytest.raises(ValueError, match="minimum 5 is above maximum 1"):
        setting("k", 1, "x", "doc", minimum=5, maximum=1)


def test_properties_file_with_comments_both_separators_and_other_keys(tmp_path):
    f = tmp_path / "broker.conf"
    f.write_text("# comment\n! also a comment\n\nclusterName=x\n"
                 "managedLedgerCacheSizeMB = 0.5\nmanagedLedgerMaxReaders: 8\n")
    c = CacheSettings.from_properties(f)
    assert (c.size_mb, c.evict_ms, c.readers) == (0.5, 10, 8)
    base = CacheSettings(evict_ms=99)
    assert CacheSettings.from_properties(f, base).evict_ms == 99


@pytest.mark.parametrize("line, needle", [
    ("managedLedgerCacheSizeMb=5", ":1: unknown key managedLedgerCacheSizeMb; did you mean "
                                   "managedLedgerCacheSizeMB?"),
    ("managedLedgerCacheSize=5", "did you mean managedLedgerCacheSizeMB?"),
    ("managedLedgerCacheEvictionFrequency=5", "did you mean managedLedgerCache"),
    ("managedLedgerMaxReader=3", "did you mean managedLedgerMaxReaders?"),
    ("managedLedgerCacheEvictionIntervalMs=2.9", ":1: managedLedgerCacheEvictionIntervalMs: "
                                                "must be an integer, not '2.9'"),
    ("managedLedgerCacheEvictionIntervalMs=0", "evict_ms must be an integer from 1 to"),
    ("managedLedgerCacheSizeMB=lots", "must be a number, not 'lots'"),
])
def test_bad_properties_are_config_errors_with_file_and_line(tmp_path, line, needle):
    f = tmp_path / "broker.conf"
    f.write_text(f"{line}\n")
    with pytest.raises(ConfigError) as e:
        CacheSettings.from_properties(f)
    assert needle in str(e.value) and str(f) in str(e.value)


def test_closest_key_folds_case_matches_close_and_knows_families():
    known = ["maxTopicListInFlightHeapMemSizeMB", "keepAliveIntervalSeconds"]
    assert closest_key("maxtopiclistinflightheapmemsizemb", known) == known[0]
    assert closest_key("keepAliveIntervalSecond", known) == known[1]
    assert closest_key("maxTopicListInFlightQueue", known) is None
    assert closest_key("maxTopicListInFlightQueue", known,
                       families=("maxTopicListInFlight",)) == known[0]
    assert closest_key("clusterName", known, families=("maxTopicListInFlight",)) is None


def test_flags_are_kebab_case_default_none_and_name_key_unit_default():
    ap = argparse.ArgumentParser()
    group = ap.add_argument_group("settings")
    add_setting_flags(group, CacheSettings)
    assert [flag_of(f) for f in CacheSettings.settings()] == \
        ["--size-mb", "--evict-ms", "--readers"]
    ns = ap.parse_args(["--evict-ms", "25"])
    assert (ns.size_mb, ns.evict_ms, ns.readers) == (None, 25, None)
    assert setting_overrides(ns, CacheSettings) == {"evict_ms": 25}
    cfg = dataclasses.replace(CacheSettings(), **setting_overrides(ns, CacheSettings))
    assert cfg.evict_ms == 25
    text = " ".join(ap.format_help().split())
    assert "how often the cache is trimmed; overrides managedLedgerCacheEvictionIntervalMs " \
           "(default 10 ms)" in text
    assert "--size-mb MB" in text and "(default 512 MB)" in text


@pytest.mark.parametrize("argv", [["--evict-ms", "0"], ["--evict-ms", "1.5"],
                                  ["--size-mb", "inf"], ["--readers", "100"]])
def test_bad_flag_values_are_argparse_errors(argv, capsys):
    ap = argparse.ArgumentParser()
    add_setting_flags(ap, CacheSettings)
    with pytest.raises(SystemExit) as e:
        ap.parse_args(argv)
    assert e.value.code == 2
    assert "must be" in capsys.readouterr().err


def test_describe_and_as_dict_by_group():
    c = CacheSettings(size_mb=0.25)
    assert c.describe() == "size_mb 0.25 MB, evict_ms 10 ms, readers 4 readers"
    assert c.as_dict() == {"size_mb": 0.25, "evict_ms": 10, "readers": 4}
    assert c.as_dict("cache") == {"size_mb": 0.25, "evict_ms": 10}
