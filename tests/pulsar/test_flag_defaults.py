"""Every command's flag defaults are its library's defaults, for the four
subsystems (the topic-list service, and the cache, cursor and balance
simulators): a flag left out runs what the library does by default.

Each flag of a command is one of: a Pulsar setting (declared once in the
subsystem's Settings; its flag's default is None, so that only what is
given overrides, and its help shows the setting's default); a flag whose
value a library object takes (its parsed default must equal that object's
default); or a flag with no library default at all (what to sweep, where to
run, where to write), listed below with the reason.  A new flag must be one
of the three, or this test says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re

import pytest

from pylimiter.spark.settings import Settings, _with_unit

#: Flags every Spark pipeline takes, with no library default (spark.flags).
RUN = {"master", "executor_env", "conf", "out", "no_progress", "no_report"}


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """dest -> action, for every option but --help/--version."""
    return {a.dest: a for a in parser._actions if a.option_strings
            and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))}


def _shown_default(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = " ".join(parser._get_formatter()._expand_help(action).split())
    m = re.search(r"\(default:? ([^()]*)\)$", text)
    assert m, f"{action.option_strings[0]}: --help shows no default: {text!r}"
    return m.group(1)


def library_default(owners, name: str):
    """The default the first of ``owners`` (dataclasses, or callables by
    their signature) declares for ``name``; LookupError if none does."""
    for owner in owners:
        if dataclasses.is_dataclass(owner):
            for f in dataclasses.fields(owner):
                if f.name != name:
                    continue
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
        else:
            param = inspect.signature(owner).parameters.get(name)
            if param is not None and param.default is not inspect.Parameter.empty:
                return param.default
    raise LookupError(name)


def check(parser, argv, settings: type[Settings], owners=(), mapped=None, none=()):
    """What is wrong with the flags of ``parser`` (the sub-command's) parsed
    from ``argv``: see the module's docstring.  ``mapped``: dest -> the
    library default a flag's parsed value must equal, where the names
    differ; ``none``: the flags with no library default."""
    ns = parser.parse_args(argv)
    problems = []
    declared = {f.name: f for f in settings.settings()}
    for dest, action in _flags(parser).items():
        value = getattr(ns, dest)
        if dest in none or dest in RUN:
            continue
        if dest in declared:
            f = declared[dest]
            shown = _shown_default(parser, action)
            if value is not None:
                problems.append(f"{dest}: a setting's flag defaults to {value!r}, not None")
            if shown != _with_unit(f.default, f.metadata["unit"]):
                problems.append(f"{dest}: --help shows {shown!r}, the setting's default is "
                                f"{f.default!r}")
            continue
        if mapped and dest in mapped:
            expected = mapped[dest]
        else:
            try:
                expected = library_default(owners, dest)
            except LookupError:
                problems.append(f"{dest}: no library default and not listed as having none")
                continue
        if value != expected:
            problems.append(f"{dest}: the flag's default is {value!r}, the library's "
                            f"{expected!r}")
    return problems


# ---- the cursor ----------------------------------------------------------------------


def test_cursor_flags_default_to_the_library():
    from pylimiter.pulsar.cursor import pipeline
    from pylimiter.pulsar.cursor.replay import Point

    sweep = ["--ttl-min", "60", "--retention-min", "0", "--delayed-share", "0.1",
             "--ack-fail", "0.002", "--rollover-entries", "1000"]
    parser = _subcommand(pipeline.build_parser(), "simulate")
    assert check(parser, sweep, Point, owners=[Point],
                 none={"ttl_min", "retention_min", "delayed_share", "ack_fail",
                       "rollover_entries"}) == []
    # and the point the command runs is the library's, all but the sweep
    (point,) = pipeline.points_of(pipeline.build_parser().parse_args(["simulate", *sweep]))
    assert point == Point(60, 0, 0.1, 0.002, 1000)


def test_cursor_quota_is_pulsars_default_none():
    # backlogQuotaDefaultLimitBytes=-1 (no quota) and
    # backlogQuotaDefaultRetentionPolicy=producer_request_hold in broker.conf
    from pylimiter.pulsar.cursor.lifecycle import BacklogQuota
    from pylimiter.pulsar.cursor.replay import Point

    p = Point(60, 0, 0.1, 0.002, 1000)
    q = BacklogQuota()
    assert (p.quota_bytes, p.quota_policy) == (q.limit_size, q.policy) \
        == (-1, "producer_request_hold")


# ---- balance -------------------------------------------------------------------------


def test_balance_flags_default_to_the_library():
    from pylimiter.pulsar.balance import pipeline
    from pylimiter.pulsar.balance.cluster import BrokerCapacity, Settings
    from pylimiter.pulsar.balance.generate import GeneratorSpec
    from pylimiter.pulsar.balance.load import LoadWeights
    from pylimiter.pulsar.balance.split import MIB

    cap = BrokerCapacity()
    parser = _subcommand(pipeline.build_parser(), "simulate")
    assert check(parser, [], Settings, owners=[GeneratorSpec, Settings],
                 mapped={"broker_msg_rate": cap.msg_rate,
                         "broker_bandwidth_mbytes": cap.bandwidth_in / MIB,
                         "weights": LoadWeights()},
                 none={"input", "brokers"}) == []
    # the whole Settings the command runs with, capacity and weights included
    args = pipeline.build_parser().parse_args(["simulate"])
    assert pipeline.settings_from(args) == Settings()
    assert cap.bandwidth_in == cap.bandwidth_out


# ---- the cache -----------------------------------------------------------------------


def test_cache_flags_default_to_the_library():
    from pylimiter.pulsar.cache import pipeline
    from pylimiter.pulsar.cache._common import CacheSettings
    from pylimiter.pulsar.cache.workloads import Trace

    parser = _subcommand(pipeline.build_parser(), "simulate")
    assert check(parser, [], CacheSettings, owners=[Trace],
                 none={"workloads", "policies", "cache_size_mb", "seeds",
                       "scan_topics"}) == []
    assert pipeline.settings_from(pipeline.build_parser().parse_args(["simulate"])) \
        == CacheSettings()


# ---- the topic-list service ----------------------------------------------------------


@pytest.mark.parametrize("command, argv", [("broker", []),
                                           ("proxy", ["--broker", "pulsar://127.0.0.1:1"])])
def test_topiclist_service_flags_default_to_the_library(command, argv):
    pytest.importorskip("google.protobuf")
    from pylimiter.pulsar.topiclist import cli
    from pylimiter.pulsar.topiclist.limits import TopicListConfig
    from pylimiter.pulsar.topiclist.server import ServiceBase

    parser = _subcommand(cli.build_parser(), command)
    assert check(parser, argv, TopicListConfig, owners=[ServiceBase],
                 none={"config", "namespace", "topics", "topics_file", "broker",
                       "verbose"}) == []
    args = cli.build_parser().parse_args([command, *argv])
    assert cli._config(args) == TopicListConfig()


def test_topiclist_load_flags_default_to_the_library():
    pytest.importorskip("google.protobuf")
    from pylimiter.pulsar.topiclist import cli
    from pylimiter.pulsar.topiclist.limits import TopicListConfig
    from pylimiter.pulsar.topiclist.loadgen import run_load

    parser = _subcommand(cli.build_parser(), "load")
    assert check(parser, [], TopicListConfig, owners=[run_load],
                 none={"url", "admin", "preset", "namespace", "topics", "connections",
                       "duration", "json"}) == []


def test_a_flag_that_disagrees_is_named():
    @dataclasses.dataclass(frozen=True)
    class Lib(Settings):
        rate: int = 20

    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=30)
    ap.add_argument("--other", default="x")
    assert check(ap, [], Lib, owners=[Lib]) == [
        "rate: the flag's default is 30, the library's 20",
        "other: no library default and not listed as having none"]
