"""Acknowledgment-hole tracking at scale: pylimiter's AckRangeSet against a
per-ledger ``pyroaring.BitMap`` set (Pulsar's idea: one RoaringBitmap per
ledger in ``OpenLongPairRangeSet``).

    python -m benchmarks.cursor_holes [--entries 1000000] [--rounds 7]
    python -m benchmarks.cursor_holes --random-acks 400000

Patterns, over ``--entries`` entries in ledgers of ``--ledger-entries``
(Pulsar's managedLedgerMaxEntriesPerLedger, 50,000):

- ``sequential``: every entry acknowledged, in order;
- ``holes-1%``:  1% of the entries never acknowledged (seeded), the rest in order;
- ``key-shared``: every other entry acknowledged (Key_Shared-like), in order;
- ``key-shared-random``: the same acks in random order (seeded): the
  sparse-same-ledger case, every ack lands between existing ranges;
- ``one-per-ledger``: the first entry of each of --entries / 10 ledgers.

Speed: ns per ack of ``add`` + coalesce, building the whole set from
nothing; the list of positions is made beforehand (not timed).  Both sides
run in this one process, alternating (ABAB, order flipped every round); the
figure is the median over rounds of thread CPU time.  The bitmap side is the
cheapest equivalent loop: look the ledger's bitmap up, ``BitMap.add(entry)``
(no "was it new" answer, which AckRangeSet.add gives).

Memory: bytes held once the set is built.  AckRangeSet: tracemalloc (all its
memory comes from Python's allocators), checked against ``sys.getsizeof``.
Bitmap: the growth of glibc's ``mallinfo2`` in-use bytes while 40 clones of
the set's bitmaps are made, divided by 40 (CRoaring allocates with malloc;
malloc's chunk headers count, as they cost memory), plus the BitMap objects
and the dict in Python's small-object arenas.  Also measured after
``run_optimize()`` + ``shrink_to_fit()`` (Pulsar does not run-optimize).
A sweep over hole rates finds where each structure is smaller.

``--random-acks N`` only times N acks in random order (seeded) for three
layouts (every other entry of one ledger, one entry per ledger, a
permutation of one ledger), CPU seconds each: the O(log n)-per-ack check of
issue 18, to run against an older AckRangeSet for a before/after.

Results: benchmarks/results/cursor_holes.csv, cursor_holes_memory.csv and
cursor_holes_memory.png, and a table on stdout.  Excluded: recovery,
persistence, and the JVM's own per-object overhead of Pulsar's Java objects.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import gc
import random
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

from pylimiter.pulsar.cursor import AckRangeSet

OUT = Path(__file__).resolve().parent / "results"


class BitmapAckSet:
    """Acknowledged positions as one pyroaring BitMap per ledger."""

    def __init__(self):
        from pyroaring import BitMap

        self._new = BitMap
        self.ledgers = {}

    def add(self, position):
        ledger, entry = position
        bm = self.ledgers.get(ledger)
        if bm is None:
            bm = self.ledgers[ledger] = self._new()
        bm.add(entry)

    def optimize(self):
        for bm in self.ledgers.values():
            bm.run_optimize()
            bm.shrink_to_fit()

    def cardinality(self):
        return sum(len(b) for b in self.ledgers.values())


# ---- workloads -------------------------------------------------------------------------

def positions(pattern: str, n: int, per_ledger: int, seed: int = 7, hole_rate: float = 0.0):
    """The acknowledged positions of a pattern, in ack order; and the hole count."""
    rng = random.Random(seed)
    if pattern == "key-shared-random":
        out, holes = positions("key-shared", n, per_ledger)
        rng.shuffle(out)
        return out, holes
    if pattern == "one-per-ledger":
        ledgers = n // 10
        return [(i, 0) for i in range(ledgers)], ledgers * 9
    out = []
    holes = 0
    for i in range(n):
        if pattern == "key-shared":
            hole = i % 2 == 1
        elif pattern == "sequential":
            hole = False
        else:
            hole = rng.random() < hole_rate
        if hole:
            holes += 1
        else:
            out.append((i // per_ledger, i % per_ledger))
    return out, holes


PATTERNS = {"sequential": 0.0, "holes-1%": 0.01, "key-shared": 0.5, "key-shared-random": 0.5,
            "one-per-ledger": 0.0}


# ---- measurement -----------------------------------------------------------------------

def _build(kind, acks):
    s = AckRangeSet() if kind == "ranges" else BitmapAckSet()
    add = s.add
    t0 = time.thread_time_ns()
    for p in acks:
        add(p)
    return s, time.thread_time_ns() - t0


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


_LIBC = ctypes.CDLL(None)
_LIBC.mallinfo2.restype = _Mallinfo2


def _malloc_in_use() -> int:
    """glibc's bytes in use (chunks handed out, mmapped ones included)."""
    info = _LIBC.mallinfo2()
    return info.uordblks + info.hblkhd


def memory(kind, acks) -> dict:
    """Bytes the built structure holds (and, for the bitmap, run-optimized)."""
    gc.collect()
    if kind == "ranges":
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        s, _ = _build(kind, acks)
        gc.collect()
        out = {"bytes": tracemalloc.get_traced_memory()[0] - base,
               "getsizeof": sys.getsizeof(s), "ranges": len(s)}
        tracemalloc.stop()
        return out
    s, _ = _build(kind, acks)
    out = {"bytes": _bitmap_bytes(s)}
    s.optimize()
    out["bytes_optimized"] = _bitmap_bytes(s)
    return out


def _bitmap_bytes(s, copies: int = 40) -> float:
    """Bytes one BitmapAckSet holds: ``copies`` clones of its bitmaps are
    made inside a window where nothing else allocates, and the growth of
    malloc's in-use bytes is divided by ``copies`` (one build alone moves
    mallinfo by less than its noise).  No tracemalloc: its bookkeeping is
    malloc'ed too."""
    from pyroaring import BitMap

    bitmaps = list(s.ledgers.values())
    gc.collect()
    gc.disable()
    try:
        base = _malloc_in_use()
        clones = [[BitMap(b, optimize=False) for b in bitmaps] for _ in range(copies)]
        grown = _malloc_in_use() - base
    finally:
        gc.enable()
    # The lists holding the clones are not part of a set; Python hands
    # blocks over 512 bytes to malloc, smaller ones live in its arenas.
    for lst in [clones, *clones]:
        size = sys.getsizeof(lst)
        grown -= size if size > 512 else 0
    # The BitMap objects and the dict of a set live in Python's arenas.
    small = sum(type(b).__basicsize__ for b in bitmaps) + sys.getsizeof(s.ledgers)
    return round(grown / copies + small)


def speed(acks, rounds: int) -> dict:
    """Median ns per ack of each side over interleaved rounds."""
    times = {"ranges": [], "bitmap": []}
    for r in range(rounds):
        order = ("ranges", "bitmap") if r % 2 == 0 else ("bitmap", "ranges")
        for kind in order:
            gc.collect()
            gc.disable()
            try:
                s, ns = _build(kind, acks)
            finally:
                gc.enable()
            times[kind].append(ns / len(acks))
            del s
    return {k: statistics.median(v) for k, v in times.items()}


def random_acks(n: int) -> int:
    """CPU seconds of n acks in random order, per layout."""
    for label, acks in (("every other entry of one ledger", [(1, 2 * e) for e in range(n)]),
                        ("one entry in each of n ledgers", [(led, 0) for led in range(n)]),
                        ("a permutation of one ledger", [(1, e) for e in range(n)])):
        random.Random(2).shuffle(acks)
        s = AckRangeSet()
        add = s.add
        gc.collect()
        t0 = time.process_time()
        for p in acks:
            add(p)
        dt = time.process_time() - t0
        print(f"{n:,} random-order acks, {label}: {dt:.2f} s CPU "
              f"({1e9 * dt / n:,.0f} ns/ack), {len(s):,} ranges")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cursor_holes",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--ledger-entries", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--random-acks", type=int, default=0, metavar="N",
                    help="only time N acks in random order (three layouts) and exit")
    args = ap.parse_args(argv)
    if args.random_acks:
        return random_acks(args.random_acks)
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.version.split()[0]
    print(f"CPython {py}, {args.entries:,} entries, ledgers of {args.ledger_entries:,}, "
          f"{args.rounds} interleaved rounds")

    rows = []
    for pattern, rate in PATTERNS.items():
        acks, holes = positions(pattern, args.entries, args.ledger_entries, hole_rate=rate)
        sp = speed(acks, args.rounds)
        mr = memory("ranges", acks)
        mb = memory("bitmap", acks)
        rows.append({
            "pattern": pattern, "python": py, "entries": args.entries, "acks": len(acks),
            "holes": holes,
            "ranges": mr["ranges"], "ranges_ns_per_ack": round(sp["ranges"], 1),
            "bitmap_ns_per_ack": round(sp["bitmap"], 1),
            "speed_ratio": round(sp["ranges"] / sp["bitmap"], 2),
            "ranges_bytes": mr["bytes"], "ranges_getsizeof": mr["getsizeof"],
            "ranges_bytes_per_range": round(mr["bytes"] / max(mr["ranges"], 1), 1),
            "ranges_bytes_per_hole": round(mr["bytes"] / holes, 1) if holes else None,
            "bitmap_bytes": mb["bytes"], "bitmap_optimized_bytes": mb["bytes_optimized"],
        })
    with open(args.out / "cursor_holes.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    print(f"\n{'pattern':<17} {'ranges':>8} {'AckRangeSet':>12} {'BitMap':>9} {'ratio':>6}"
          f" {'AckRangeSet':>12} {'B/range':>8} {'BitMap':>10} {'BitMap opt':>11}")
    print(f"{'':<17} {'':>8} {'ns/ack':>12} {'ns/ack':>9} {'':>6} {'bytes':>12} {'':>8}"
          f" {'bytes':>10} {'bytes':>11}")
    for r in rows:
        print(f"{r['pattern']:<17} {r['ranges']:>8,} {r['ranges_ns_per_ack']:>12.0f} "
              f"{r['bitmap_ns_per_ack']:>9.0f} {r['speed_ratio']:>5.2f}x "
              f"{r['ranges_bytes']:>12,} {r['ranges_bytes_per_range']:>8.1f} "
              f"{r['bitmap_bytes']:>10,} {r['bitmap_optimized_bytes']:>11,}")

    # Where does each side win?  Memory only, over hole rates.
    sweep = []
    for rate in (0.0, 1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.5):
        acks, holes = positions("random", args.entries, args.ledger_entries, hole_rate=rate)
        mr = memory("ranges", acks)
        mb = memory("bitmap", acks)
        sweep.append({"hole_rate": rate, "holes": holes, "ranges": mr["ranges"],
                      "ranges_bytes": mr["bytes"], "bitmap_bytes": mb["bytes"],
                      "bitmap_optimized_bytes": mb["bytes_optimized"]})
    with open(args.out / "cursor_holes_memory.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(sweep[0]))
        w.writeheader()
        w.writerows(sweep)
    print(f"\n{'hole rate':>9} {'holes':>8} {'AckRangeSet':>12} {'BitMap':>10} {'BitMap opt':>11}")
    for r in sweep:
        print(f"{r['hole_rate']:>9g} {r['holes']:>8,} {r['ranges_bytes']:>12,} "
              f"{r['bitmap_bytes']:>10,} {r['bitmap_optimized_bytes']:>11,}")
    _plot(sweep, args.out / "cursor_holes_memory.png", args.entries)
    return 0


def _plot(sweep, path, entries):
    from pylimiter.spark.report import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = [max(r["hole_rate"], 1e-6) for r in sweep]
    ax.loglog(xs, [r["ranges_bytes"] for r in sweep], "o-", label="AckRangeSet")
    ax.loglog(xs, [r["bitmap_bytes"] for r in sweep], "s-", label="BitMap per ledger")
    ax.loglog(xs, [r["bitmap_optimized_bytes"] for r in sweep], "^--",
              label="BitMap per ledger, run-optimized")
    ax.set_xlabel("share of entries left unacknowledged (0 plotted at 1e-6)")
    ax.set_ylabel("bytes held")
    ax.set_title(f"Hole tracking memory, {entries:,} entries")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)


if __name__ == "__main__":
    sys.exit(main())
