"""The command line of ``python -m pylimiter.pulsar.topiclist {broker,proxy,load}``.

`main(argv)` returns the exit status; __main__.py runs it through the shared
runner, pylimiter.spark.cli.run, which turns errors into one line and status
2/1/130."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

from pylimiter.spark.cli import (
    UsageError,
    fmt_bytes,
    fmt_rate,
    fmt_seconds,
    make_parser,
    non_negative_float,
    non_negative_int,
    port,
    positive_float,
    positive_int,
    require,
    run,  # re-exported: __main__.py is `run(main, PROG)` and nothing else
    subparsers,
)
from pylimiter.spark.report import plural

__all__ = ["NEEDS", "PROG", "build_parser", "describe_load", "describe_preset", "main",
           "run"]

PROG = "python -m pylimiter.pulsar.topiclist"
#: What the service imports beyond pylimiter (the `topiclist` extra).
NEEDS = ("google.protobuf", "re2", "google_crc32c", "aiohttp", "prometheus_client")


def _limit_args(ap):
    from ...spark.settings import add_setting_flags
    from .limits import TopicListConfig

    group = ap.add_argument_group("settings (override the config file)")
    group.add_argument("--config", type=Path,
                       help="broker.conf/proxy.conf-style properties file")
    add_setting_flags(group, TopicListConfig)
    ap.add_argument("--host", default="127.0.0.1", help="listen address")
    ap.add_argument("--port", type=port, default=0, help="binary protocol port (0: any free)")
    ap.add_argument("--admin-port", type=port, default=0,
                    help="admin/metrics HTTP port (0: any free)")
    ap.add_argument("--cluster", default="standalone", help="the metrics' cluster label")
    ap.add_argument("-v", "--verbose", action="store_true", help="log each connection event")


def build_parser():
    """The argument parser: broker, proxy and load sub-commands."""
    ap = make_parser(PROG, "PIP-442 topic-list broker, proxy and load generator on "
                           "pylimiter's dual memory limiter (extra: topiclist).")
    sub = subparsers(ap, dest="command", required=True, metavar="COMMAND",
                     help="run `COMMAND --help` for its options")
    b = sub.add_parser("broker", usage="%(prog)s [options]",
                       help="serve topic lists (default: one namespace, generated topics)")
    b.add_argument("--namespace", default="public/default", help="namespace of the generated "
                                                                 "topics")
    b.add_argument("--topics", type=non_negative_int, default=1000,
                   help="how many topics to generate")
    b.add_argument("--topics-file", type=Path,
                   help="one full topic name per line, instead of generated topics")
    _limit_args(b)
    p = sub.add_parser("proxy", usage="%(prog)s --broker URL [options]",
                       help="forward topic lists from a broker, with limits")
    p.add_argument("--broker", required=True, help="pulsar://host:port of the broker")
    _limit_args(p)
    from .presets import PRESETS

    ld = sub.add_parser(
        "load", usage="%(prog)s (--url URL | --preset NAME) [options]",
        help="N connections listing a namespace for a duration; --preset limits starts its "
             "own broker and shows its limits acting",
        epilog=textwrap.fill("presets (each starts a broker of its own; --topics, "
                             "--connections, --duration and --read-delay, when given, "
                             "override the preset's):", 78) + "\n" + "\n".join(
                   textwrap.fill(p.help, 78, initial_indent=f"  {p.name}: ",
                                 subsequent_indent="    ") for p in PRESETS.values()))
    ld.add_argument("--url", help="pulsar://host:port (broker or proxy)")
    ld.add_argument("--admin", help="http://host:port of its admin API, for peak RSS/permits")
    ld.add_argument("--preset", choices=sorted(PRESETS),
                    help="instead of --url: start a broker sized for the preset's load, run "
                         "it, and print each pool's waits, refusals and peak against its "
                         "limit, and the broker's peak memory (see below)")
    ld.add_argument("--namespace", default="public/default", help="namespace to list")
    ld.add_argument("--topics", type=positive_int, default=None,
                    help="with --preset: topics in its broker's namespace (the pools are "
                         "sized in listings of it)")
    # With --preset, these three keep the preset's values unless given.
    ld.add_argument("--connections", type=positive_int, default=10, action=_Given,
                    help="client connections")
    ld.add_argument("--duration", type=positive_float, default=10.0, action=_Given,
                    help="seconds")
    ld.add_argument("--max-requests", type=positive_int, default=None,
                    help="stop after this many requests in all")
    ld.add_argument("--read-delay", type=non_negative_float, default=0.0, action=_Given,
                    help="seconds each client waits before reading a response (slow "
                         "readers; with --preset, the delay of its slow readers)")
    ld.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


class _Given(argparse.Action):
    """Store the value and note that it was given (in `given`), so that a
    preset keeps its own value for a flag left at its default."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        given = set(getattr(namespace, "given", ()))
        given.add(self.dest)
        namespace.given = given


def _given(args, name: str):
    """The flag's value if given on the command line, else None."""
    return getattr(args, name) if name in getattr(args, "given", ()) else None


def _config(args):
    from ...spark.settings import setting_overrides
    from .limits import ConfigError, TopicListConfig

    try:
        cfg = TopicListConfig.from_properties(args.config) if args.config else TopicListConfig()
        return replace(cfg, **setting_overrides(args, TopicListConfig))
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot read {args.config}: {exc.strerror or exc}") from None


async def _serve(service):
    """Run until SIGINT/SIGTERM, then stop: connections close, requests in
    flight end, permits go back; no traceback."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await service.start()
        print(f"{service.role}: {service.service_url}  admin: {service.admin_url}  "
              f"(metrics {service.admin_url}/metrics)", flush=True)
        print(f"limits: {service.limiter.config.describe()}", flush=True)
        await stop.wait()
        print(f"{service.role}: stopping ({plural(len(service.connections), 'connection')}, "
              f"{plural(service.stats()['in_flight'], 'request')} in flight)", flush=True)
    finally:
        await service.stop()


def _broker(args):
    from .broker import Broker, TopicStore, generated_topics
    from .protocol import split_topic

    store = TopicStore()
    if args.topics_file:
        try:
            names = [ln.strip() for ln in args.topics_file.read_text().splitlines()
                     if ln.strip() and not ln.startswith("#")]
            for n in names:
                split_topic(n)
        except OSError as exc:
            raise UsageError(f"cannot read {args.topics_file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise UsageError(f"{args.topics_file}: {exc}") from None
    else:
        names = generated_topics(args.namespace, args.topics)
        store.namespaces.setdefault(args.namespace, {})
    store.add_many(names)
    svc = Broker(_config(args), store=store, host=args.host, port=args.port,
                 admin_port=args.admin_port, cluster=args.cluster)
    print("namespaces: " + ", ".join(f"{ns} ({len(t)} topic{'' if len(t) == 1 else 's'})"
                                      for ns, t in store.namespaces.items()), flush=True)
    return svc


def _proxy(args):
    from .proxy import Proxy

    try:
        return Proxy(_config(args), broker_url=args.broker, host=args.host, port=args.port,
                     admin_port=args.admin_port, cluster=args.cluster)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _load(args) -> int:
    from .loadgen import run_load
    from .protocol import parse_url

    if args.preset is not None:
        return _load_preset(args)
    if args.url is None:
        raise UsageError("give --url pulsar://host:port (a broker or proxy), or --preset "
                         "NAME to start one")
    if args.topics is not None:
        raise UsageError("--topics goes with --preset (the broker at --url has its own)")
    try:
        parse_url(args.url)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(f"load: {plural(args.connections, 'connection')} on {args.url} for "
          f"{fmt_seconds(args.duration)}", file=sys.stderr, flush=True)
    res = asyncio.run(run_load(args.url, args.namespace, args.connections, args.duration,
                               admin_url=args.admin, max_requests=args.max_requests,
                               read_delay=args.read_delay))
    s = res.summary()
    if args.json:
        print(json.dumps(s))
        return 0
    for key, text in describe_load(s).items():
        print(f"{key:>20}: {text}")
    return 0


def _load_preset(args) -> int:
    from .loadgen import PRESETS, run_preset
    from .protocol import split_topic

    if args.url is not None or args.admin is not None:
        raise UsageError("--preset starts its own broker: drop --url/--admin (or drop "
                         "--preset to load a running one)")
    try:
        split_topic(f"persistent://{args.namespace}/x")
    except ValueError:
        raise UsageError(f"--namespace {args.namespace!r} is not tenant/namespace") from None
    preset = PRESETS[args.preset]
    if not args.json:
        print(f"load preset {preset.name!r}: starting a broker ...", file=sys.stderr,
              flush=True)
    res = asyncio.run(run_preset(preset, args.namespace, topics=args.topics,
                                 connections=_given(args, "connections"),
                                 duration=_given(args, "duration"),
                                 read_delay=_given(args, "read_delay"),
                                 max_requests=args.max_requests))
    if args.json:
        print(json.dumps(res))
    else:
        print("\n".join(describe_preset(res)))
    return 0


def describe_preset(r: dict) -> list:
    """A preset run in words: the setting, one row per pool (limit, peak,
    grants, waits, refusals), the clients' view and the broker's memory."""
    c = r["clients"]
    slow = (f", {r['slow_readers']} of them reading each answer "
            f"{fmt_seconds(r['read_delay_s'])} late" if r["slow_readers"] else "")
    lines = [
        f"broker: {plural(r['topics'], 'topic')} in {r['namespace']}; one listing holds "
        f"{fmt_bytes(r['listing_heap_bytes'])} of heap and "
        f"{fmt_bytes(r['answer_frame_bytes'])} of direct memory",
        f"limits: heap {fmt_bytes(r['pools']['heap']['limit'])} "
        f"({r['heap_listings']:g} listings), direct "
        f"{fmt_bytes(r['pools']['direct']['limit'])} ({r['direct_answers']:g} answers); a "
        f"wait times out after {fmt_seconds(r['timeout_ms'] / 1000)}, "
        f"{r['queue']} may queue per pool",
        f"load: {plural(r['connections'], 'connection')}{slow}, for "
        f"{fmt_seconds(r['duration_s'])}; a refused request is retried after "
        f"{fmt_seconds(r['retry_delay_s'])}",
        "",
    ]
    head = ("pool", "limit", "peak held", "grants", "waited", "mean wait", "p99 wait",
            "timed out", "queue full")
    rows = [head]
    for name in ("heap", "direct"):
        p = r["pools"][name]
        share = f" ({100 * p['peak'] / p['limit']:.0f}%)" if p["limit"] else ""
        mean = fmt_seconds(p["wait_s"] / p["waited"]) if p["waited"] else "-"
        p99 = "-" if p["wait_p99_le_s"] is None else f"<= {fmt_seconds(p['wait_p99_le_s'])}"
        rows.append((name, fmt_bytes(p["limit"]) if p["limit"] else "none",
                     fmt_bytes(p["peak"]) + share, str(p["granted"]), str(p["waited"]),
                     mean, p99, str(p["timeouts"]), str(p["queue_full"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
              for row in rows]
    lines.append("")

    def ms(v):
        return "-" if v is None else fmt_seconds(v / 1000.0)
    lines.append(f"clients: {plural(c['requests'], 'request')}: {c['responses']} answered "
                 f"({fmt_rate(c['rps'], 'resp')}), {c['too_many_requests']} refused with "
                 f"TooManyRequests, {c['other_errors']} other errors; latency p50 "
                 f"{ms(c['p50_ms'])}, p99 {ms(c['p99_ms'])}, max {ms(c['max_ms'])}")
    limits = r["pools"]["heap"]["limit"] + r["pools"]["direct"]["limit"]
    if r["rss_before_bytes"] is not None and r["rss_peak_bytes"] is not None:
        grew = r["rss_peak_bytes"] - r["rss_before_bytes"]
        lines.append(f"broker memory: RSS {fmt_bytes(r['rss_before_bytes'])} before the load, "
                     f"peak {fmt_bytes(r['rss_peak_bytes'])} ({'+' if grew >= 0 else ''}"
                     f"{fmt_bytes(grew)}; heap + direct limits {fmt_bytes(limits)})")
    return lines


def describe_load(s: dict) -> dict:
    """A load result in words: every number rounded, with its unit."""
    def ms(v):
        return "-" if v is None else fmt_seconds(v / 1000.0)

    out = {
        "connections": str(s["connections"]),
        "duration": fmt_seconds(s["duration_s"]),
        "requests": str(s["requests"]),
        "responses": f"{s['responses']} ({fmt_rate(s['rps'], 'resp')})",
        "received": fmt_bytes(s["bytes"]),
        "too_many_requests": str(s["too_many_requests"]),
        "other_errors": str(s["other_errors"]),
        "latency p50": ms(s["p50_ms"]),
        "latency p99": ms(s["p99_ms"]),
        "latency max": ms(s["max_ms"]),
    }
    for key, value in sorted(s.get("server", {}).items()):
        out[f"server {key}"] = fmt_bytes(value) if key.endswith("_bytes") else f"{value:g}"
    return out


def main(argv=None) -> int:
    """The CLI; returns the exit status (run() maps errors to 2/1/130)."""
    args = build_parser().parse_args(argv)
    require(NEEDS, "topiclist")
    if getattr(args, "verbose", False):
        logging.basicConfig(level=logging.INFO)
    if args.command == "load":
        return _load(args)
    svc = _broker(args) if args.command == "broker" else _proxy(args)
    asyncio.run(_serve(svc))
    return 0
