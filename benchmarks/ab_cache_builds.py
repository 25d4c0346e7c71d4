"""``python -m benchmarks.ab_cache_builds DIR_A DIR_B``: is build B of the
entry cache's C extension faster than build A?  Both builds are loaded into
this one interpreter (each directory holds a ``_cache_c.cpython-3XY-*.so``
for this Python; two files at two paths are two modules with their own
types), and each part runs on A's cache and on B's in interleaved rounds,
the order flipped every round (pylimiter.spark.interleave), timed in thread
CPU time; a part's figure is the median over rounds of B's time / A's, with
its [first-third quartile].

Parts: ``get_range-N`` reads a range of N cached entries (N = 1, 10, 100,
1000), ``get`` one hit, ``insert`` one insert and its invalidation.

    python -m benchmarks.ab_cache_builds build/old build/new --parts get_range-100,get
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
from pathlib import Path

from pylimiter.spark.interleave import CPU, Spread, interleaved, per_round

RANGES = (1, 10, 100, 1000)
PARTS = (*(f"get_range-{n}" for n in RANGES), "get", "insert")
PAYLOAD = b"x" * 100


def load(directory: str):
    """The cache extension in ``directory`` built for this Python, as a
    module of its own."""
    import pylimiter.pulsar.cache  # noqa: F401  the package its relative imports need

    tag = f"cpython-{sys.version_info[0]}{sys.version_info[1]}"
    found = sorted(Path(directory).glob(f"_cache_c.{tag}*.so"))
    if not found:
        raise SystemExit(f"no _cache_c.{tag}*.so in {directory}")
    spec = importlib.util.spec_from_file_location("pylimiter.pulsar.cache._cache_c", found[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    ap = argparse.ArgumentParser(prog="python -m benchmarks.ab_cache_builds",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("dir_a")
    ap.add_argument("dir_b")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--rounds", type=int, default=31)
    ap.add_argument("--ops", type=int, default=20000)
    args = ap.parse_args(argv)
    chosen = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown or args.rounds < 2 or args.ops < 1:
        ap.error(f"parts are {', '.join(PARTS)}; --rounds >= 2, --ops >= 1")
    mods = [load(d) for d in (args.dir_a, args.dir_b)]
    print(f"CPython {sys.version.split()[0]}: ns per operation, B/A per round")
    for name in chosen:
        ops = args.ops if not name.startswith("get_range-") else max(
            200, args.ops * 10 // int(name.split("-")[1]))
        got = interleaved({"a": part(mods[0], name, ops), "b": part(mods[1], name, ops)},
                          rounds=args.rounds, warmup=1, before=gc.collect)
        r = Spread.of(per_round(got, lambda a, b: b / a))
        print(f"  {name:15s} A {statistics.median(got['a']):8.1f}  "
              f"B {statistics.median(got['b']):8.1f}  B/A {r.median:.3f} [{r.q1:.3f}-{r.q3:.3f}]",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
