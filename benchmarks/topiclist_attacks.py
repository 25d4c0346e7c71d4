"""Issue 19's hostile clients against the topic-list broker, before and after
the guards: what one attacker does to an honest client's latency and to the
broker's memory.

    python -m benchmarks.topiclist_attacks --before /tmp/tl_main [--pools 100,8]
        [--attacks non-reader,subscribe-names,...] [--duration 15] [--rounds 1]

For every (attack, pools) point and each side (`before`: the broker of the
source tree given by --before, e.g. `git archive main` unpacked with the built
extension copied in; `after`: this tree), a fresh broker process is started
on 127.0.0.1 (`python -m pylimiter.pulsar.topiclist broker --topics 1000`,
heap and direct pools of the given MiB; on the `after` side the inbound and
watcher budgets get the same size, or stay at their defaults for `default`).
Its idle RSS is read, the kernel's high-water mark reset
(/proc/PID/clear_refs = 5); the attack starts (pylimiter.pulsar.topiclist.
hostile, on an event loop of its own in a thread), and after a warm-up an
honest client connects, lists the namespace
and closes, every 0.25 s for --duration s (each probe bounded by 30 s, so a
probe that waits on a 25 s permit timeout shows as such).  Then the attack
stops, the broker gets SIGTERM (time to exit measured), and VmHWM gives its
peak RSS: growth = peak - idle.

`proxy-100k` is not an attack but issue 19's fourth finding: a broker with a
100,000-topic namespace whose answer (8.5 MB) is over maxMessageSize, and a
proxy in front of it with the given pools; 100 clients each list it once
through the proxy (each waits up to 300 s).  Its latency columns are the
100 listings', its growth the proxy's.

The two sides alternate, order flipped every round; figures are medians over
rounds.  Results: benchmarks/results/topiclist_attacks.csv and a Markdown
table on stdout.  Excluded: the clients' own memory and CPU (they run in this
process, on the same 2 cores as the broker, on both sides alike).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import statistics
import sys
import time
from pathlib import Path

from pylimiter.pulsar.topiclist import hostile

MB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "results"
NS = "public/default"
TOPICS = 1000


def _attack(name: str, url: str, storm: hostile.WatcherStorm):
    """The attack coroutine for a name (each as described in issue 19)."""
    if name == "non-reader":
        return hostile.non_reader(url, NS, requests=8000)
    if name == "subscribe-names":
        return hostile.subscribe_names(url, frames=60)
    if name == "partial-frames":
        return hostile.partial_frames(url, connections=100)
    if name == "pipelined-lookups":
        return hostile.pipelined_lookups(url, count=500_000)
    if name == "watchers":
        return hostile.watchers(url, NS, count=5000, per_connection=5000, result=storm)
    if name == "watcher-storm":
        return hostile.watchers(url, NS, count=20_000, per_connection=100, result=storm)
    if name == "all-memory":
        async def together():
            await asyncio.gather(
                hostile.subscribe_names(url, frames=60),
                hostile.partial_frames(url, connections=100),
                hostile.pipelined_lookups(url, count=500_000),
                hostile.watchers(url, NS, count=5000, per_connection=5000, result=storm))
        return together()
    raise ValueError(name)


ATTACKS = ("non-reader", "subscribe-names", "partial-frames", "pipelined-lookups", "watchers",
           "watcher-storm", "all-memory", "proxy-100k")
#: Topic names of the proxy case: 100,000 of them make an 8.5 MB answer.
LONG_NAME = "persistent://public/default/orders-of-a-rather-long-name-for-the-case-of-issue-19-"


def broker_args(pools: str, after: bool) -> list:
    args = ["--topics", str(TOPICS)]
    if pools != "default":
        args += ["--heap-mb", pools, "--direct-mb", pools]
        if after:
            args += ["--inbound-mb", pools, "--watchers-mb", pools]
    return args


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def measure_proxy(tree: Path, side: str, pools: str, topics_file: Path) -> dict:
    """Not an attack: 100 clients each list the 100,000-topic namespace once
    through the proxy (pools of the given size, waits of up to 10 min).
    Latency is each listing's; growth is the proxy's."""
    from pylimiter.pulsar.topiclist.loadgen import run_load

    broker = hostile.ServiceProcess("broker", "--topics-file", str(topics_file), tree=str(tree))
    args = ["--broker", broker.url, "--heap-timeout-ms", "600000", "--direct-timeout-ms",
            "600000"]
    if pools != "default":
        args += ["--heap-mb", pools, "--direct-mb", pools]
    proxy = None
    try:
        proxy = hostile.ServiceProcess("proxy", *args, tree=str(tree))
        time.sleep(0.5)
        base = proxy.rss()
        proxy.reset_peak()
        res = asyncio.run(run_load(proxy.url, NS, 100, 300.0, max_requests=100,
                                   request_timeout=300.0))
        peak = proxy.peak()
    finally:
        exit_s = proxy.stop()[0] if proxy is not None else float("nan")
        broker.stop()
    s = res.summary()
    ms = lambda v: None if v is None else v / 1000.0  # noqa: E731
    return {"attack": "proxy-100k", "pools_mib": pools, "side": side, "probes": 100,
            "served": res.responses, "p50_s": ms(s["p50_ms"]), "p99_s": ms(s["p99_ms"]),
            "max_s": ms(s["max_ms"]),
            "outcomes": f"responses {res.responses}, TooManyRequests "
                        f"{res.too_many_requests}, other {res.other_errors}",
            "growth_mib": round((peak - base) / MB, 1), "sigterm_exit_s": round(exit_s, 2),
            "watchers_created": 0}


def measure(tree: Path, side: str, attack: str, pools: str, duration: float) -> dict:
    if attack == "proxy-100k":
        topics_file = OUT / ".proxy_topics.txt"
        if not topics_file.exists():
            topics_file.parent.mkdir(parents=True, exist_ok=True)
            topics_file.write_text("".join(f"{LONG_NAME}{i:06d}\n" for i in range(100_000)))
        try:
            return measure_proxy(tree, side, pools, topics_file)
        finally:
            topics_file.unlink()
    svc = hostile.ServiceProcess("broker", *broker_args(pools, side == "after"), tree=str(tree))
    storm = hostile.WatcherStorm()
    try:
        time.sleep(0.5)
        base = svc.rss()
        svc.reset_peak()
        probes = asyncio.run(hostile.probe_during(lambda: _attack(attack, svc.url, storm),
                                                  svc.url, NS, duration=duration, warmup=3.0))
        peak = svc.peak()
    finally:
        exit_s, _, _ = svc.stop()
    lat = [p.seconds for p in probes]
    served = sum(p.outcome == "served" for p in probes)
    return {"attack": attack, "pools_mib": pools, "side": side, "probes": len(probes),
            "served": served, "p50_s": pct(lat, 0.5) if lat else None,
            "p99_s": pct(lat, 0.99) if lat else None,
            "max_s": max(lat) if lat else None,
            "outcomes": ",".join(sorted({p.outcome for p in probes})),
            "growth_mib": round((peak - base) / MB, 1), "sigterm_exit_s": round(exit_s, 2),
            "watchers_created": storm.created}


def median_rows(rows):
    out = []
    keys = sorted({(r["attack"], r["pools_mib"], r["side"]) for r in rows},
                  key=lambda k: (ATTACKS.index(k[0]), k[1] != "default", k[2] != "before"))
    for k in keys:
        rs = [r for r in rows if (r["attack"], r["pools_mib"], r["side"]) == k]
        m = dict(rs[0])
        for f in ("p50_s", "p99_s", "max_s", "growth_mib", "sigterm_exit_s"):
            vals = [r[f] for r in rs if r[f] is not None]
            m[f] = round(statistics.median(vals), 3) if vals else None
        for f in ("probes", "served", "watchers_created"):
            m[f] = sum(r[f] for r in rs)
        m["rounds"] = len(rs)
        out.append(m)
    return out


def _s(v, digits=2):
    if v is None or v == "":
        return "-"
    v = round(float(v), digits)
    return f"{v if v else 0.0:.{digits}f}"        # no "-0.0"


def markdown_table(summary) -> str:
    """The summary rows as the Markdown table of benchmarks/README.md."""
    out = ["| attack | pools MiB | side | honest p50 s | honest p99 s | served | "
           "broker RSS growth MiB | SIGTERM exit s |", "|---|---|---|---|---|---|---|---|"]
    for r in summary:
        out.append(f"| {r['attack']} | {r['pools_mib']} | {r['side']} | {_s(r['p50_s'])} | "
                   f"{_s(r['p99_s'])} | {r['served']}/{r['probes']} | "
                   f"{_s(r['growth_mib'], 1)} | {_s(r['sigterm_exit_s'])} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True,
                    help="source tree of the broker before the fixes (with its extension built)")
    ap.add_argument("--after", type=Path, default=ROOT, help="source tree after (this one)")
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--pools", default="default,8",
                    help="pool sizes in MiB, comma-separated ('default': the defaults)")
    ap.add_argument("--duration", type=float, default=15.0, help="seconds of probing per run")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--name", default="topiclist_attacks")
    args = ap.parse_args(argv)
    attacks = [a for a in args.attacks.split(",") if a]
    for a in attacks:
        if a not in ATTACKS:
            ap.error(f"unknown attack {a}; choose from {', '.join(ATTACKS)}")
    rows = []
    for rnd in range(args.rounds):
        for i, attack in enumerate(attacks):
            for pools in args.pools.split(","):
                sides = [("before", args.before), ("after", args.after)]
                if (rnd + i) % 2:
                    sides.reverse()
                for side, tree in sides:
                    r = measure(tree, side, attack, pools, args.duration)
                    r["round"] = rnd
                    rows.append(r)
                    print(r, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    summary = median_rows(rows)
    with open(args.out / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0]))
        w.writeheader()
        w.writerows(summary)
    print()
    print(markdown_table(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
