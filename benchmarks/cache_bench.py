"""The broker entry cache's speed and memory targets,
each measured against its anchor in ONE process, rounds interleaved (ABAB,
order flipped every round), medians over rounds, thread CPU time.

    python -m benchmarks.cache_bench [--rounds 21] [--quick]

1. ``churn``: a full cache of --entries entries; one operation = insert a new
   entry + get a cached one + (amortised) the eviction of one entry, against
   ``cachetools.LRUCache``'s set (which evicts one) + get.  Target: ratio
   <= 1.0.  Measured for the C implementation and the pure twin.
2. ``scan``: one timestamp eviction pass with nothing to evict, at 100 ..
   100,000 topics each caching one fresh entry: the removal queue's
   ``run_eviction`` against the ``legacy`` policy's per-cache scan.
   Target: >= 1000x cheaper at 100,000 topics.
3. ``memory``: resident memory (RSS, /proc/self/statm) grown by inserting
   --memory-entries entries into one cache, each layout in a fresh child
   interpreter, payloads allocated before the first reading, so only what
   the cache adds is counted: the entry objects, the queue links and the
   position index (its pages come from malloc, which tracemalloc does not
   see).  Layouts: ``dense`` (consecutive entry ids), ``sparse`` (one entry
   per 64-id index page) and ``one-per-ledger``; the anchor column adds the
   bytes object's 33-byte header.  Target: <= 200 bytes, and within
   ENTRY_OVERHEAD_BYTES (192), the per-entry cost EntryCacheManager counts
   against max_size_bytes.

Excluded: payload allocation, building the position tuples (the caller's),
interpreter start-up.  Results: a table on stdout and
benchmarks/results/cache_bench.csv.
"""

from __future__ import annotations

import argparse
import csv
import gc
import statistics
import sys
import time
from importlib import import_module
from pathlib import Path

from pylimiter._impls import TWINS
from pylimiter.pulsar.cache import ENTRY_OVERHEAD_BYTES

OUT = Path(__file__).resolve().parent / "results"
IMPLS = dict(zip(("c", "python"), TWINS["cache"]))


def _interleaved(a, b, rounds: int) -> tuple[float, float]:
    """Median ns of a() and b() over `rounds`, run ABAB with the order
    flipped every round.  Each callable returns (thread ns, ops)."""
    ta, tb = [], []
    for r in range(rounds):
        for f, acc in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
            gc.collect()
            ns, ops = f()
            acc.append(ns / ops)
    return statistics.median(ta), statistics.median(tb)


# ---- 1. churn -------------------------------------------------------------------------------


def churn_cache(mod, entries: int, ops: int):
    payload = b"x" * 100
    # Room for exactly `entries` entries, each counting its 100 bytes plus
    # the manager's per-entry overhead.
    m = mod.EntryCacheManager(entries * (100 + ENTRY_OVERHEAD_BYTES))
    c = m.cache("topic")
    for i in range(entries):
        c.insert((1, i), payload)
    state = {"next": entries}
    keys = [(1, i) for i in range(entries, entries + ops * 64)]   # made outside the timing

    def run():
        n = state["next"]
        insert, get = c.insert, c.get
        ks = keys
        base = n - entries
        t0 = time.thread_time_ns()
        for k in range(ops):
            insert(ks[base + k], payload)
            get(ks[base + k])           # a hit on a recent entry
        t1 = time.thread_time_ns()
        state["next"] = n + ops
        return t1 - t0, ops
    return run, m


def churn_cachetools(entries: int, ops: int):
    from cachetools import LRUCache

    payload = b"x" * 100
    c = LRUCache(maxsize=entries)
    for i in range(entries):
        c[(1, i)] = payload
    state = {"next": entries}
    keys = [(1, i) for i in range(entries, entries + ops * 64)]

    def run():
        n = state["next"]
        ks = keys
        base = n - entries
        setitem, getitem = c.__setitem__, c.__getitem__
        t0 = time.thread_time_ns()
        for k in range(ops):
            setitem(ks[base + k], payload)
            getitem(ks[base + k])
        t1 = time.thread_time_ns()
        state["next"] = n + ops
        return t1 - t0, ops
    return run


def bench_churn(rounds: int, entries: int, ops: int) -> list[dict]:
    rows = []
    for impl, modname in IMPLS.items():
        mod = import_module(modname)
        ours, m = churn_cache(mod, entries, ops)
        theirs = churn_cachetools(entries, ops)
        a, b = _interleaved(ours, theirs, rounds)
        st = m.stats()
        assert st.size <= entries * (100 + ENTRY_OVERHEAD_BYTES) and st.evicted_entries > 0
        rows.append(dict(benchmark="churn", impl=impl, param=entries, ours_ns=a,
                         anchor="cachetools.LRUCache", anchor_ns=b, ratio=a / b))
    return rows


# ---- 2. scan ------------------------------------------------------------------------------------


def bench_scan(rounds: int, topics_list: list[int]) -> list[dict]:
    from pylimiter.pulsar.cache.scan import idle_pass_ns

    rows = []
    for topics in topics_list:
        ns = idle_pass_ns(topics, ("pip430", "legacy"), rounds=rounds)
        rows.append(dict(benchmark="scan", impl="c", param=topics, ours_ns=ns["pip430"],
                         anchor="legacy per-cache scan", anchor_ns=ns["legacy"],
                         ratio=ns["pip430"] / ns["legacy"]))
    return rows


# ---- 3. memory -----------------------------------------------------------------------------------


_MEMORY_CHILD = """
import gc, sys
from importlib import import_module
mod = import_module(sys.argv[1])
n, layout = int(sys.argv[2]), sys.argv[3]
pos = {"dense": [(7, i) for i in range(n)], "sparse": [(7, 64 * i) for i in range(n)],
       "one-per-ledger": [(i, 0) for i in range(n)]}[layout]
payloads = [i.to_bytes(8, "little") * 8 for i in range(n)]    # 64-byte payloads
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
gc.collect()
before = rss()
m = mod.EntryCacheManager(1 << 62)
c = m.cache("persistent://tenant/ns/topic")
for p, d in zip(pos, payloads):
    c.insert(p, d)
gc.collect()
assert m.stats().entries == n
print((rss() - before) / n)
"""


def bench_memory(n: int) -> list[dict]:
    import subprocess

    if not sys.platform.startswith("linux"):
        print("memory: skipped (reads /proc/self/statm)")
        return []
    rows = []
    for impl, modname in IMPLS.items():
        for layout in ("dense", "sparse", "one-per-ledger"):
            out = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, modname, str(n), layout],
                                 capture_output=True, text=True, check=True)
            per = float(out.stdout)
            rows.append(dict(benchmark="memory", impl=impl, param=f"{n}/{layout}",
                             ours_ns=per, anchor="bytes/entry incl. the bytes header",
                             anchor_ns=per + 33, ratio=None))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cache_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--entries", type=int, default=10_000, help="churn: cache size in entries")
    ap.add_argument("--ops", type=int, default=20_000, help="churn: operations per round")
    ap.add_argument("--topics", default="100,1000,10000,100000")
    ap.add_argument("--memory-entries", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--out", type=Path, default=OUT / "cache_bench.csv")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.ops, args.memory_entries, args.topics = 3, 2000, 20_000, "100,1000"
    topics = [int(x) for x in args.topics.split(",")]
    print(f"Python {sys.version.split()[0]}; {args.rounds} rounds, interleaved, thread CPU time")
    rows = bench_churn(args.rounds, args.entries, args.ops)
    rows += bench_scan(args.rounds, topics)
    rows += bench_memory(args.memory_entries)
    print(f"{'benchmark':<8} {'impl':<7} {'param':>22} {'ours':>12} {'anchor':>12}  ratio")
    for r in rows:
        unit = "B" if r["benchmark"] == "memory" else "ns"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.4g}"
        print(f"{r['benchmark']:<8} {r['impl']:<7} {r['param']:>22} {r['ours_ns']:>10.1f}{unit:>2} "
              f"{r['anchor_ns']:>10.1f}{unit:>2}  {ratio}  ({r['anchor']})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
