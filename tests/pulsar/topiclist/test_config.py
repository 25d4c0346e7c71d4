"""Settings: each declared once (file, flags, start-up line, admin), Pulsar
keys, checked values.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist import protocol  # noqa: E402
from pylimiter.pulsar.topiclist.broker import Broker  # noqa: E402
from pylimiter.pulsar.topiclist.cli import PROG, main  # noqa: E402
from pylimiter.pulsar.topiclist.limits import (  # noqa: E402
    MB,
    ConfigError,
    TopicListConfig,
)
from pylimiter.spark.cli import run  # noqa: E402

from .kit import (  # noqa: E402
    ahttp,
    running,
    store_with,
)


def test_config_file_and_defaults(tmp_path):
    d = TopicListConfig()
    assert (d.heap_mb, d.direct_mb, d.heap_timeout_ms, d.direct_timeout_ms,
            d.heap_queue, d.direct_queue) == (100, 100, 25000, 25000, 10000, 10000)
    f = tmp_path / "broker.conf"
    f.write_text("# PIP-442\nclusterName=x\nmaxTopicListInFlightHeapMemSizeMB=0.5\n"
                 "maxTopicListInFlightDirectMemSizeMB = 0\n"
                 "maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMillis=100\n"
                 "maxTopicListInFlightDirectMemSizePermitsAcquireTimeoutMillis=200\n"
                 "maxTopicListInFlightHeapMemSizePermitsAcquireQueueSize=3\n"
                 "maxTopicListInFlightDirectMemSizePermitsAcquireQueueSize=4\n")
    c = TopicListConfig.from_properties(f)
    assert c.heap_bytes == 512 * 1024 and c.direct_bytes == 0
    assert (c.heap_timeout_ms, c.direct_timeout_ms, c.heap_queue, c.direct_queue) == \
        (100, 200, 3, 4)
    f.write_text("maxTopicListInFlightHeapMemSizeMB=lots\n")
    with pytest.raises(ConfigError, match="must be a number"):
        TopicListConfig.from_properties(f)
    with pytest.raises(ConfigError):
        TopicListConfig(heap_mb=-1)


def test_each_setting_declared_once_reaches_file_flags_startup_and_admin(tmp_path):
    """One declaration per setting: the Pulsar key read from the file, the
    flag, the start-up line and the admin API all come from it."""
    import argparse

    from pylimiter.spark.settings import add_setting_flags, setting_overrides

    decl = TopicListConfig.settings()
    assert [f.name for f in decl] == ["heap_mb", "direct_mb", "heap_timeout_ms",
                                      "direct_timeout_ms", "heap_queue", "direct_queue",
                                      "max_message_size", "pattern_max_length", "keep_alive_s",
                                      "requests_per_connection", "write_timeout_ms",
                                      "inbound_mb", "watchers_mb", "watchers_per_connection",
                                      "consumers_per_connection", "lookups_per_connection",
                                      "name_max_length"]
    limits = [d for d in decl if d.metadata["group"] == "limits"]
    assert len(limits) == 6
    f = tmp_path / "broker.conf"
    f.write_text("".join(f"{d.metadata['key']}={i + 1}\n" for i, d in enumerate(decl)))
    cfg = TopicListConfig.from_properties(f)
    assert [getattr(cfg, d.name) for d in decl] == list(range(1, len(decl) + 1))
    ap = argparse.ArgumentParser()
    add_setting_flags(ap, TopicListConfig)
    flags = ["--heap-mb", "0.5", "--direct-timeout-ms", "7", "--heap-queue", "9",
             "--keep-alive-s", "3"]
    over = setting_overrides(ap.parse_args(flags), TopicListConfig)
    assert over == {"heap_mb": 0.5, "direct_timeout_ms": 7, "heap_queue": 9, "keep_alive_s": 3}
    help_text = "".join(ap.format_help().split())    # argparse wraps long keys
    for d in decl:
        assert d.metadata["key"] in help_text
    line = cfg.describe()
    assert all(f"{d.name} {i + 1} {d.metadata['unit']}" in line for i, d in enumerate(decl))

    async def admin():
        async with running(Broker(cfg, store=store_with())) as b:
            st, body = await ahttp("GET", f"{b.admin_url}/admin/limits")
            assert st == 200 and json.loads(body) == {d.name: i + 1 for i, d in enumerate(limits)}
            assert b.max_frame == 7 + 10 * 1024 and b.config.keep_alive_s == 9
    asyncio.run(admin())


@pytest.mark.parametrize("line, needle", [
    ("maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMillis=inf", "must be an integer"),
    ("maxTopicListInFlightHeapMemSizePermitsAcquireQueueSize=2.9", "must be an integer, not '2.9'"),
    ("maxTopicListInFlightDirectMemSizeMB=1e13", "from 0 to"),
    ("maxTopicListInFlightHeapMemSizeMB=nan", "from 0 to"),
    ("maxTopicListInFlightHeapMemSizeMB=-1", "from 0 to"),
    ("maxTopicListInFlightHeapMemSizeMb=5", "did you mean maxTopicListInFlightHeapMemSizeMB?"),
    ("maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMilis=5",
     "did you mean maxTopicListInFlightHeapMemSizePermitsAcquireTimeoutMillis?"),
    ("keepAliveIntervalSecond=5", "did you mean keepAliveIntervalSeconds?"),
    ("maxMessageSize=0", "at least 1 byte"),
])
def test_bad_config_files_are_one_line_usage_errors(tmp_path, capsys, line, needle):
    f = tmp_path / "broker.conf"
    f.write_text(f"clusterName=standalone\n{line}\n")
    with pytest.raises(ConfigError, match=re.escape(needle)):
        TopicListConfig.from_properties(f)
    assert run(main, PROG, ["broker", "--config", str(f)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and needle in err and "Traceback" not in err


def test_unrelated_broker_conf_keys_are_ignored(tmp_path):
    f = tmp_path / "broker.conf"
    f.write_text("clusterName=x\nmanagedLedgerCacheSizeMB=512\nsubscriptionPatternMaxLength=80\n")
    assert TopicListConfig.from_properties(f).pattern_max_length == 80


def test_default_frame_cap_is_pulsars_max_message_size_plus_padding():
    assert TopicListConfig().max_message_size == 5 * MB
    assert protocol.DEFAULT_MAX_FRAME == 5 * MB + 10 * 1024
