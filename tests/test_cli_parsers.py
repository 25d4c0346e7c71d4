"""Every ``python -m pylimiter...`` command (issue 23 item 8): each flag and
sub-command says what it does in ``--help``, and a usage error shows one
usage line and the error, not the whole option list."""

from __future__ import annotations

import argparse
import importlib

import pytest

#: module with build_parser/main/PROG -> argv that reaches each parser with a bad value
CLIS = {
    "pylimiter.bench.pipeline": [["--repeats", "0"]],
    "pylimiter.pulsar.balance.pipeline": [["simulate", "--brokers", "0"]],
    "pylimiter.pulsar.cache.pipeline": [["simulate", "--scale", "0"]],
    "pylimiter.pulsar.cursor.pipeline": [["simulate", "--seed", "x"]],
    "pylimiter.pulsar.topiclist.cli": [["broker", "--port", "x"], ["proxy", "--port", "x"],
                                       ["load", "--connections", "0"]],
}


def _parsers(parser, path):
    """(command words, parser) for the parser and every sub-command's, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + [name])


def _module(name):
    # The parsers import nothing heavy: pyspark and the topiclist extra
    # are imported after parsing.
    return importlib.import_module(name)


@pytest.mark.parametrize("name", list(CLIS))
def test_every_flag_and_command_has_help(name):
    mod = _module(name)
    missing = []
    for path, parser in _parsers(mod.build_parser(), [mod.PROG]):
        for action in parser._actions:
            text = (action.help or "").strip()
            if not text or text == argparse.SUPPRESS:
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}")
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:   # the sub-commands' one-liners
                    if not (choice.help or "").strip():
                        missing.append(f"{' '.join(path)} {choice.dest}")
    assert not missing, "flags without help: " + ", ".join(missing)


def test_the_walk_sees_sub_command_flags():
    """The check above would pass vacuously if it never reached a sub-command."""
    mod = _module("pylimiter.pulsar.cursor.pipeline")
    seen = {opt for path, p in _parsers(mod.build_parser(), [mod.PROG]) if path[1:] == ["simulate"]
            for a in p._actions for opt in a.option_strings}
    assert {"--quota-policy", "--seed", "--ttl-min", "--master"} <= seen


@pytest.mark.parametrize("name, argv", [(n, a) for n, argvs in CLIS.items() for a in argvs],
                         ids=lambda v: v if isinstance(v, str) else " ".join(v))
def test_usage_error_is_one_usage_line_and_the_error(name, argv, capsys):
    mod = _module(name)
    with pytest.raises(SystemExit) as exc:
        mod.main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    command = " ".join([mod.PROG] + [a for a in argv[:1] if not a.startswith("-")])
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"usage: {command} ") and "[options]" in lines[0], lines
    assert lines[1].startswith(f"{command}: error: argument {argv[-2]}: "), lines


@pytest.mark.parametrize("name", [n for n in CLIS if n != "pylimiter.bench.pipeline"])
def test_missing_command_shows_the_one_line_usage(name, capsys):
    mod = _module(name)
    with pytest.raises(SystemExit) as exc:
        mod.main([])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[0] == f"usage: {mod.PROG} [-h] [--version] COMMAND ...", lines
    assert lines[1].endswith("the following arguments are required: COMMAND")


def test_help_still_lists_every_option(capsys):
    """The short usage line is for errors; --help keeps every flag."""
    mod = _module("pylimiter.pulsar.cursor.pipeline")
    with pytest.raises(SystemExit):
        mod.main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--quota-policy {producer_request_hold," in text
    assert "random seed of each point's traffic" in text and "(default: 1)" in text


@pytest.mark.parametrize("name, argv", [
    ("pylimiter.bench.pipeline", ["--bogus"]),
    ("pylimiter.pulsar.balance.pipeline", ["simulate", "--bogus"]),
    ("pylimiter.pulsar.cache.pipeline", ["simulate", "--bogus"]),
    ("pylimiter.pulsar.cursor.pipeline", ["simulate", "--bogus"]),
    ("pylimiter.pulsar.topiclist.cli", ["broker", "--bogus"]),
])
def test_unknown_flag_is_one_usage_line_and_the_error(name, argv, capsys):
    # the sub-command's own usage, not the top parser's
    mod = _module(name)
    with pytest.raises(SystemExit) as exc:
        mod.main(argv)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    command = " ".join([mod.PROG] + argv[:-1])
    assert len(lines) == 2 and lines[0].startswith(f"usage: {command} "), lines
    assert lines[1] == f"{command}: error: unrecognized arguments: --bogus"
