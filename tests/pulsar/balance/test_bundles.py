"""pylimiter.pulsar.balance.bundles: topic_hash, Bundle and NamespaceBundles, with
Pulsar's NamespaceBundlesTest restated and hypothesis properties."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pylimiter.pulsar.balance import (
    Bundle,
    NamespaceBundles,
    topic_hash,
)


def test_topic_hash_is_unsigned_crc32_of_utf8():
    name = "persistent://tenant/ns/t"
    assert topic_hash(name) == zlib.crc32(name.encode()) & 0xFFFFFFFF
    assert topic_hash("persistent://t/ns/é") == zlib.crc32("persistent://t/ns/é".encode("utf-8"))
    # A name whose signed CRC-32 would be negative still comes back unsigned.
    assert any(topic_hash(f"t{i}") > 0x7FFFFFFF for i in range(20))
    assert all(0 <= topic_hash(f"t{i}") <= 0xFFFFFFFF for i in range(100))
    with pytest.raises(TypeError):
        topic_hash(b"bytes")


def test_bundle_name_and_ranges():
    b = Bundle(0x10, 0x20)
    assert b.name == "0x00000010_0x00000020"
    assert b.contains(0x10) and b.contains(0x1F) and not b.contains(0x20)
    last = Bundle(0x80000000, 0xFFFFFFFF, last=True)
    assert last.contains(0xFFFFFFFF) and last.contains(0x80000000)
    assert not Bundle(0x80000000, 0xFFFFFFFF).contains(0xFFFFFFFF)
    with pytest.raises(ValueError):
        Bundle(5, 5)
    with pytest.raises(ValueError):
        Bundle(-1, 5)
    with pytest.raises(ValueError):
        Bundle(0, 1 << 32)


def test_default_bundles_cut_the_range_evenly():
    four = NamespaceBundles.default(4)
    assert four.boundaries == (0, 0x40000000, 0x80000000, 0xC0000000, 0xFFFFFFFF)
    assert [b.name for b in four.bundles] == [
        "0x00000000_0x40000000", "0x40000000_0x80000000", "0x80000000_0xc0000000",
        "0xc0000000_0xffffffff"]
    assert [b.last for b in four.bundles] == [False, False, False, True]
    assert NamespaceBundles.default(1).boundaries == (0, 0xFFFFFFFF)
    assert NamespaceBundles.default(2).boundaries == (0, 0x80000000, 0xFFFFFFFF)
    three = NamespaceBundles.default(3)
    s = (1 << 32) // 3
    assert three.boundaries == (0, s, 2 * s, 0xFFFFFFFF)
    for n in (0, -1):
        with pytest.raises(ValueError):
            NamespaceBundles.default(n)


@pytest.mark.parametrize("bounds, needle", [
    ([0], "Need to specify at least 2 boundaries"),
    ([], "Need to specify at least 2 boundaries"),
    ([0, 0x80000000, 0x40000000, 0xFFFFFFFF], "unsorted"),
    ([0, 0x40000000, 0x40000000, 0xFFFFFFFF], "duplicated"),
    ([1, 0xFFFFFFFF], "first boundary"),
    ([0, 0xFFFFFFFE], "last boundary"),
    ([0, 1 << 32], "outside the hash range"),
    ([-1, 0xFFFFFFFF], "outside the hash range"),
])
def test_bad_boundaries_are_value_errors(bounds, needle):
    with pytest.raises(ValueError, match=needle):
        NamespaceBundles(bounds)


def test_find_uses_the_largest_boundary_at_or_below_the_hash():
    nb = NamespaceBundles([0, 0x40000000, 0x80000000, 0xFFFFFFFF])
    assert nb.find(0).lower == 0
    assert nb.find(0x3FFFFFFF).lower == 0
    assert nb.find(0x40000000).lower == 0x40000000
    assert nb.find(0x80000000).lower == 0x80000000
    assert nb.find(0xFFFFFFFF) == nb.bundles[-1]       # the last boundary: the last bundle
    name = "persistent://pulsar/use/ns2/topic-1"
    assert nb.find(name) == nb.find(topic_hash(name))
    assert nb.find(name).contains(topic_hash(name))
    for bad in (-1, 1 << 32):
        with pytest.raises(ValueError):
            nb.find(bad)
    with pytest.raises(TypeError):
        nb.find(1.5)


def test_split_replaces_one_bundle():
    nb = NamespaceBundles([0, 0x80000000, 0xFFFFFFFF])
    first = nb.bundles[0]
    after = nb.split(first, [0x40000000])
    # The blog's example: [0x0000, 0x8000, 0xFFFF] split at 0x4000.
    assert after.boundaries == (0, 0x40000000, 0x80000000, 0xFFFFFFFF)
    assert nb.boundaries == (0, 0x80000000, 0xFFFFFFFF)          # immutable
    assert len(nb.split(nb.bundles[1], [0x90000000, 0xA0000000])) == 4
    assert nb.split(nb.bundles[1], [0x90000000]).bundles[-1].last


@pytest.mark.parametrize("cuts", [[], [0], [0x80000000], [0x50000000, 0x40000000],
                                  [0x40000000, 0x40000000], [0x90000000]])
def test_split_rejects_boundaries_not_strictly_inside_and_ascending(cuts):
    nb = NamespaceBundles([0, 0x80000000, 0xFFFFFFFF])
    with pytest.raises(ValueError):
        nb.split(nb.bundles[0], cuts)


def test_split_rejects_a_foreign_bundle():
    nb = NamespaceBundles([0, 0x80000000, 0xFFFFFFFF])
    for foreign in (Bundle(0, 0x40000000), Bundle(0x80000000, 0xFFFFFFFF)):
        with pytest.raises(ValueError, match="not a bundle of this namespace"):
            nb.split(foreign, [0x20000000 if foreign.lower == 0 else 0x90000000])


_hashes = st.integers(0, 0xFFFFFFFF)


@st.composite
def _namespace_and_split(draw):
    inner = draw(st.lists(st.integers(1, 0xFFFFFFFE), unique=True, max_size=12))
    nb = NamespaceBundles([0, *sorted(inner), 0xFFFFFFFF])
    i = draw(st.integers(0, len(nb) - 1))
    b = nb.bundles[i]
    assume(b.upper - b.lower >= 2)
    cuts = draw(st.lists(st.integers(b.lower + 1, b.upper - 1), unique=True, min_size=1,
                         max_size=5))
    return nb, b, sorted(cuts)


@settings(max_examples=300, deadline=None)
@given(_namespace_and_split(), st.lists(_hashes, max_size=30))
def test_every_hash_lies_in_exactly_one_bundle_before_and_after_a_split(case, hashes):
    nb, bundle, cuts = case
    after = nb.split(bundle, cuts)
    probes = hashes + list(nb.boundaries) + list(after.boundaries) + [c - 1 for c in cuts]
    for layout in (nb, after):
        for h in probes:
            holders = [b for b in layout.bundles if b.contains(h)]
            assert len(holders) == 1
            assert layout.find(h) == holders[0]
    assert len(after) == len(nb) + len(cuts)
