"""Topics hashed into namespace bundles, as Pulsar's ``NamespaceBundles`` and
``NamespaceBundleFactory`` do it.

A namespace's topics are spread over the 32-bit hash range by the CRC-32 of
their full names.  The range is cut at ascending *boundaries* into bundles:
every bundle is closed-open ``[lower, upper)`` except the namespace's last,
which is closed ``[lower, 0xffffffff]`` so that the hash 0xffffffff has a home.
A bundle is the unit the load manager assigns to a broker, splits and
unloads; its full name is ``"tenant/ns/0x00000000_0x40000000"``.
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass
from typing import Iterator, Sequence, Union

__all__ = ["FULL_LOWER_BOUND", "FULL_UPPER_BOUND", "Bundle", "NamespaceBundles",
           "bundle_namespace", "topic_hash"]

#: NamespaceBundles.FULL_LOWER_BOUND / FULL_UPPER_BOUND: a namespace always
#: covers the whole 32-bit hash range.
FULL_LOWER_BOUND = 0x00000000
FULL_UPPER_BOUND = 0xFFFFFFFF


def topic_hash(topic: str) -> int:
    """topic_hash is the unsigned CRC-32 of the full topic name's UTF-8 bytes,
    e.g. of ``"persistent://tenant/ns/t"``: 0 .. 0xffffffff.

    Pulsar's ``NamespaceBundleFactory.getLongHashCode`` uses Guava's
    ``Hashing.crc32()`` padded to a long, which is zlib's CRC-32 read as
    unsigned (and Spark SQL's ``crc32``, which the pipeline uses)."""
    if not isinstance(topic, str):
        raise TypeError(f"topic must be a str, not {type(topic).__name__}")
    # str.encode of the base class: a subclass cannot override it.  A lone
    # surrogate is a UnicodeEncodeError, a ValueError.
    return zlib.crc32(str.encode(topic, "utf-8")) & 0xFFFFFFFF


#: NamespaceBundles.default refuses more bundles than this.  Pulsar's admin
#: API takes up to 2**32 (MAX_BUNDLES), which would be billions of objects
#: here; no namespace runs anywhere near this many.
MAX_DEFAULT_BUNDLES = 1 << 16


def _check_hash(value, what: str) -> int:
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{what} must be an int, not {type(value).__name__}")
        value = int.__index__(value)    # an int subclass: its plain value
    if not FULL_LOWER_BOUND <= value <= FULL_UPPER_BOUND:
        raise ValueError(f"{what} {value} is outside the hash range 0..0xffffffff")
    return value


def bundle_namespace(bundle_name: str) -> str:
    """The namespace of a full bundle name: the part before its last ``/``
    (Pulsar's ``LoadManagerShared.getNamespaceNameFromBundleName``)."""
    if type(bundle_name) is not str:
        raise TypeError(f"a bundle name must be a str, not {type(bundle_name).__name__}")
    pos = bundle_name.rfind("/")
    if pos <= 0:
        raise ValueError(f"bundle name {bundle_name!r} has no namespace "
                         "(expected 'tenant/ns/0x..._0x...')")
    return bundle_name[:pos]


@dataclass(frozen=True)
class Bundle:
    """Bundle is one hash range of a namespace: ``[lower, upper)``, or
    ``[lower, upper]`` when ``last`` (the namespace's last bundle)."""

    lower: int
    upper: int
    last: bool = False

    def __post_init__(self):
        object.__setattr__(self, "lower", _check_hash(self.lower, "lower"))
        object.__setattr__(self, "upper", _check_hash(self.upper, "upper"))
        if type(self.last) is not bool:
            raise TypeError(f"last must be a bool, not {type(self.last).__name__}")
        if self.lower >= self.upper:
            raise ValueError(f"bundle lower 0x{self.lower:08x} must be below upper "
                             f"0x{self.upper:08x}")

    @property
    def name(self) -> str:
        """The range as Pulsar writes it: ``0x00000000_0x40000000``."""
        return "0x%08x_0x%08x" % (self.lower, self.upper)

    def contains(self, hash: int) -> bool:  # noqa: A002 - the spec's name
        """True if ``hash`` (an int) lies in the range (closed at ``upper``
        only for the last bundle)."""
        if type(hash) is not int:
            if isinstance(hash, bool) or not isinstance(hash, int):
                raise TypeError(f"hash must be an int, not {type(hash).__name__}")
            hash = int.__index__(hash)  # noqa: A001
        if self.last:
            return self.lower <= hash <= self.upper
        return self.lower <= hash < self.upper


class NamespaceBundles:
    """NamespaceBundles is one namespace's cut of the hash range (immutable).

    ``boundaries`` are strictly ascending, start at 0x00000000 and end at
    0xffffffff; n + 1 boundaries make n bundles.  ``split`` returns a new
    object, as Pulsar's ``NamespaceBundleFactory.splitBundles`` does."""

    __slots__ = ("_boundaries", "_bundles")

    def __init__(self, boundaries: Sequence[int]):
        if isinstance(boundaries, (str, bytes)):
            raise TypeError("boundaries must be a sequence of ints")
        bounds = tuple(_check_hash(b, f"boundary {i}") for i, b in enumerate(boundaries))
        if len(bounds) < 2:
            raise ValueError("Need to specify at least 2 boundaries")
        if bounds[0] != FULL_LOWER_BOUND:
            raise ValueError(f"the first boundary must be 0x00000000, not 0x{bounds[0]:08x}")
        if bounds[-1] != FULL_UPPER_BOUND:
            raise ValueError(f"the last boundary must be 0xffffffff, not 0x{bounds[-1]:08x}")
        for i in range(1, len(bounds)):
            if bounds[i] <= bounds[i - 1]:
                kind = "duplicated" if bounds[i] == bounds[i - 1] else "unsorted"
                raise ValueError(f"boundaries must be strictly ascending: {kind} boundary "
                                 f"0x{bounds[i]:08x} at index {i}")
        self._boundaries = bounds
        n = len(bounds) - 1
        self._bundles = tuple(Bundle(bounds[i], bounds[i + 1], i == n - 1) for i in range(n))

    @classmethod
    def default(cls, num_bundles: int) -> "NamespaceBundles":
        """The bundles a new namespace gets (``defaultNumberOfNamespaceBundles``,
        Pulsar's default 4): boundaries 0, s, 2s, ..., (n-1)s, 0xffffffff with
        s = 2**32 // n, as ``NamespacesBase.getBundles`` computes them.
        At most MAX_DEFAULT_BUNDLES (65,536)."""
        if isinstance(num_bundles, bool) or not isinstance(num_bundles, int):
            raise TypeError(f"num_bundles must be an int, not {type(num_bundles).__name__}")
        num_bundles = int.__index__(num_bundles)
        if num_bundles <= 0:
            raise ValueError(f"num_bundles must be at least 1, got {num_bundles}")
        if num_bundles > MAX_DEFAULT_BUNDLES:
            raise ValueError(f"num_bundles must be at most {MAX_DEFAULT_BUNDLES}, "
                             f"got {num_bundles}")
        step = (1 << 32) // num_bundles
        return cls([i * step for i in range(num_bundles)] + [FULL_UPPER_BOUND])

    @property
    def boundaries(self) -> tuple[int, ...]:
        """The ascending boundaries, first 0 and last 0xffffffff."""
        return self._boundaries

    @property
    def bundles(self) -> tuple[Bundle, ...]:
        """The bundles in hash order; only the last has ``last=True``."""
        return self._bundles

    def __len__(self) -> int:
        return len(self._bundles)

    def __iter__(self) -> Iterator[Bundle]:
        return iter(self._bundles)

    def __eq__(self, other) -> bool:
        # False, not NotImplemented, for anything else: Python would then ask
        # the other object, whose __eq__ may do anything.
        if type(other) is not NamespaceBundles:
            return False
        return self._boundaries == other._boundaries

    def __hash__(self) -> int:
        return hash(self._boundaries)

    def __repr__(self) -> str:
        return f"NamespaceBundles({len(self._bundles)} bundles)"

    def index(self, hash: int) -> int:  # noqa: A002
        """The position in ``bundles`` of the bundle holding ``hash``: the
        largest boundary <= hash (the last boundary belongs to the last
        bundle), as ``NamespaceBundles.getBundle`` binary-searches it.
        TypeError for anything but an int, ValueError outside 0..0xffffffff."""
        hash = _check_hash(hash, "hash")  # noqa: A001
        i = bisect.bisect_right(self._boundaries, hash) - 1
        return min(i, len(self._bundles) - 1)

    def find(self, topic_or_hash: Union[str, int]) -> Bundle:
        """The bundle whose range holds the topic (by ``topic_hash``) or the
        hash.  An int outside 0..0xffffffff is a ValueError."""
        if type(topic_or_hash) is str:
            h = topic_hash(topic_or_hash)
        else:
            h = _check_hash(topic_or_hash, "hash")
        return self._bundles[self.index(h)]

    def split(self, bundle: Bundle, boundaries: Sequence[int]) -> "NamespaceBundles":
        """A new NamespaceBundles in which ``bundle`` is replaced by
        ``len(boundaries) + 1`` bundles.  ``boundaries`` must be non-empty,
        strictly ascending and each strictly inside (lower, upper); ``bundle``
        must be one of ``bundles``.  Anything else is a ValueError."""
        if not isinstance(bundle, Bundle):
            raise TypeError(f"bundle must be a Bundle, not {type(bundle).__name__}")
        i = bisect.bisect_left(self._boundaries, bundle.lower)
        if i >= len(self._bundles) or self._bundles[i] != bundle:
            raise ValueError(f"bundle {bundle.name} is not a bundle of this namespace")
        if isinstance(boundaries, (str, bytes)):
            raise TypeError("split boundaries must be a sequence of ints")
        cuts = [_check_hash(c, "split boundary") for c in boundaries]
        if not cuts:
            raise ValueError("split boundaries must not be empty")
        prev = bundle.lower
        for c in cuts:
            if not bundle.lower < c < bundle.upper:
                raise ValueError(f"split boundary 0x{c:08x} is not strictly inside "
                                 f"{bundle.name}")
            if c <= prev:
                raise ValueError(f"split boundaries must be strictly ascending (0x{c:08x} "
                                 f"after 0x{prev:08x})")
            prev = c
        return NamespaceBundles(self._boundaries[:i + 1] + tuple(cuts) + self._boundaries[i + 1:])
