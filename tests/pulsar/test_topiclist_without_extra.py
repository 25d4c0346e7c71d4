"""The topic-list command's parser (and so its --help, --version and usage
errors) works without the `topiclist` extra: an installed wheel without it
lists its commands and presets, and names the extra only when a command
needs it."""

from __future__ import annotations

import sys


def test_the_parser_and_presets_import_nothing_of_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("pylimiter.pulsar.topiclist.")]:
        monkeypatch.delitem(sys.modules, name)
    for module in ("google_crc32c", "re2", "google.protobuf", "aiohttp"):
        monkeypatch.setitem(sys.modules, module, None)   # import fails
    from pylimiter.pulsar.topiclist import cli

    parser = cli.build_parser()
    assert "--preset" in parser.format_help() or any(
        "--preset" in sub.format_help()
        for action in parser._subparsers._group_actions
        for sub in action.choices.values())
    from pylimiter.pulsar.topiclist.presets import PRESETS

    assert "limits" in PRESETS
    assert "pylimiter.pulsar.topiclist.protocol" not in sys.modules
