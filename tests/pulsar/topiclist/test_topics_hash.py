"""Pulsar's topics hash (TopicList.calculateHash), against a reference written
out independently.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import struct

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pylimiter.pulsar.topiclist import protocol  # noqa: E402
from pylimiter.pulsar.topiclist.broker import Broker  # noqa: E402
from pylimiter.pulsar.topiclist.limits import TopicListConfig  # noqa: E402

from .kit import (  # noqa: E402
    NS,
    TOPICS,
    run_bounded,
    running,
    store_with,
)


def crc32c_reference(data: bytes) -> int:
    """Bit-at-a-time CRC-32C (Castagnoli, reflected polynomial 0x82F63B78,
    RFC 3720 section 12.1), written out independently of the service."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def pulsar_hash_reference(topics) -> str:
    """TopicList.calculateHash step by step: Arrays.sort (UTF-16 code unit
    order), UTF-8 bytes joined by ',', Guava crc32c, HashCode.toString
    (the int's bytes little-endian first)."""
    names = sorted(topics, key=lambda t: [unit for unit in
                                          struct.unpack(f">{len(t.encode('utf-16-be')) // 2}H",
                                                        t.encode("utf-16-be"))])
    crc = crc32c_reference(",".join(names).encode("utf-8"))
    return "".join(f"{(crc >> shift) & 0xFF:02x}" for shift in (0, 8, 16, 24))


def test_crc32c_reference_matches_rfc3720_vectors():
    assert crc32c_reference(b"123456789") == 0xE3069283
    assert crc32c_reference(bytes(32)) == 0x8A9136AA
    assert crc32c_reference(b"\xff" * 32) == 0x62A8AB43
    assert crc32c_reference(bytes(range(32))) == 0x46DD794E


def test_topics_hash_is_pulsars_calculate_hash():
    assert protocol.topics_hash(["123456789"]) == "839206e3"     # 0xE3069283, Guava's order
    assert protocol.topics_hash([]) == "00000000"
    names = ["persistent://my-property/my-ns/pattern-topic-1",
             "persistent://my-property/my-ns/pattern-topic-2",
             "persistent://my-property/my-ns/pattern-topic-3"]   # Pulsar's TopicListTest
    assert protocol.topics_hash(names[::-1]) == protocol.topics_hash(names) \
        == pulsar_hash_reference(names)
    assert protocol.topics_hash(names[:2]) != protocol.topics_hash(names)
    # Java sorts by UTF-16 code unit: U+1F600 (D83D DE00) comes before
    # U+FF61, where code point order puts it after.
    java = crc32c_reference("\U0001F600,\uff61".encode()).to_bytes(4, "little").hex()
    code_points = crc32c_reference("\uff61,\U0001F600".encode()).to_bytes(4, "little").hex()
    assert protocol.topics_hash(["\uff61", "\U0001F600"]) == java != code_points


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=8))
def test_topics_hash_matches_the_reference_for_any_names(names):
    assert protocol.topics_hash(names) == pulsar_hash_reference(names)


def test_a_client_computing_pulsars_hash_gets_changed_false():
    async def main():
        async with running(Broker(TopicListConfig(), store=store_with())) as b:
            c = await protocol.ClientConnection.open(b.service_url)
            mine = pulsar_hash_reference(TOPICS[:3])
            r, _ = await c.get_topics(NS)
            assert r.topics_hash == mine
            r, _ = await c.get_topics(NS, topics_hash=mine)
            assert not r.changed and list(r.topics) == []
            await c.close()
    run_bounded(main())
