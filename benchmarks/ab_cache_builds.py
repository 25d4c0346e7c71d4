"""``python -m benchmarks.ab_cache_builds DIR_A DIR_B``: is build B of the
entry cache's C extension faster than build A?  Both builds are loaded into
this one interpreter (each directory holds a ``_cache_c.cpython-3XY-*.so``
for this Python; two files at two paths are two modules with their own
types), and each part runs on A's cache and on B's in interleaved rounds,
the order flipped every round, timed in thread CPU time; a part's figure is
the median over rounds of B's time / A's, with its [first-third quartile]
(the command line and the loop are ``benchmarks.ab_builds``').

Parts: ``get_range-N`` reads a range of N cached entries (N = 1, 10, 100,
1000), ``get`` one hit, ``insert`` one insert and its invalidation.

    python -m benchmarks.ab_cache_builds build/old build/new --parts get_range-100,get
"""

from __future__ import annotations

import sys

from benchmarks.ab_builds import compare, load
from pylimiter.spark.interleave import CPU

RANGES = (1, 10, 100, 1000)
PARTS = (*(f"get_range-{n}" for n in RANGES), "get", "insert")
PAYLOAD = b"x" * 100


def load_cache(directory: str):
    """The cache extension in ``directory`` built for this Python."""
    return load(directory, "_cache_c", "pylimiter.pulsar.cache._cache_c")


def ops_of(name: str, ops: int) -> int:
    """Fewer calls for a long range: about the same time per side."""
    if name.startswith("get_range-"):
        return max(200, ops * 10 // int(name.split("-")[1]))
    return ops


def part(mod, name: str, ops: int):
    """A side: runs ``name`` ``ops`` times on a cache of its own, returns
    ns per operation."""
    m = mod.EntryCacheManager(1 << 40, entry_overhead_bytes=0)
    c = m.cache("t")
    for i in range(max(RANGES)):
        c.insert((1, i), PAYLOAD)
    if name.startswith("get_range-"):
        n, fn = int(name.split("-")[1]), c.get_range
        first, last = (1, 0), (1, n - 1)

        def body():
            for _ in range(ops):
                fn(first, last)
    elif name == "get":
        fn, pos = c.get, (1, 7)

        def body():
            for _ in range(ops):
                fn(pos)
    else:
        ins, inv, pos = c.insert, c.invalidate_up_to, (0, 1)

        def body():
            for _ in range(ops):
                ins(pos, PAYLOAD)
                inv(pos)

    def run() -> float:
        t0 = CPU()
        body()
        return (CPU() - t0) / ops
    return run


def main(argv=None) -> int:
    return compare("python -m benchmarks.ab_cache_builds", __doc__, PARTS, part, load_cache,
                   argv, rounds=31, ops_of=ops_of)


if __name__ == "__main__":
    sys.exit(main())
