"""python -m pylimiter.pulsar.topiclist {broker,proxy,load} ..."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from dataclasses import replace
from pathlib import Path

PROG = "python -m pylimiter.pulsar.topiclist"


def _limit_args(ap):
    from .limits import add_setting_flags

    group = ap.add_argument_group("PIP-442 limits (override the config file)")
    group.add_argument("--config", type=Path, help="broker.conf/proxy.conf-style properties file")
    add_setting_flags(group)
    ap.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="binary protocol port (0: any free)")
    ap.add_argument("--admin-port", type=int, default=0, help="admin/metrics HTTP port (0: any free)")
    ap.add_argument("--cluster", default="standalone", help="the metrics' cluster label")
    ap.add_argument("-v", "--verbose", action="store_true")


def build_parser():
    ap = argparse.ArgumentParser(prog=PROG, description="PIP-442 topic-list broker, proxy "
                                 "and load generator on pylimiter's dual memory limiter.")
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("broker", help="serve topic lists (default: one namespace, generated topics)")
    b.add_argument("--namespace", default="public/default")
    b.add_argument("--topics", type=int, default=1000, help="generated topics (default 1000)")
    b.add_argument("--topics-file", type=Path, help="one full topic name per line, instead")
    _limit_args(b)
    p = sub.add_parser("proxy", help="forward topic lists from a broker, with limits")
    p.add_argument("--broker", required=True, help="pulsar://host:port of the broker")
    _limit_args(p)
    ld = sub.add_parser("load", help="N connections listing a namespace for a duration")
    ld.add_argument("--url", required=True, help="pulsar://host:port (broker or proxy)")
    ld.add_argument("--admin", help="http://host:port of its admin API, for peak RSS/permits")
    ld.add_argument("--namespace", default="public/default")
    ld.add_argument("--connections", type=int, default=10)
    ld.add_argument("--duration", type=float, default=10.0)
    ld.add_argument("--max-requests", type=int, default=None)
    ld.add_argument("--read-delay", type=float, default=0.0,
                    help="seconds each client waits before reading a response (slow readers)")
    ld.add_argument("--json", action="store_true", help="print the result as JSON")
    return ap


def _config(args):
    from .limits import ConfigError, TopicListConfig, setting_overrides

    try:
        cfg = TopicListConfig.from_properties(args.config) if args.config else TopicListConfig()
        return replace(cfg, **setting_overrides(args))
    except (ConfigError, OSError) as exc:
        raise SystemExit(f"{PROG}: error: {exc}")


async def _serve(service):
    await service.start()
    print(f"{service.role}: {service.service_url}  admin: {service.admin_url}  "
          f"(metrics {service.admin_url}/metrics)", flush=True)
    print(f"limits: {service.limiter.config.describe()}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await service.stop()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "verbose", False):
        logging.basicConfig(level=logging.INFO)
    if args.command == "broker":
        from .broker import Broker, TopicStore, generated_topics
        from .protocol import split_topic

        store = TopicStore()
        try:
            if args.topics_file:
                names = [ln.strip() for ln in args.topics_file.read_text().splitlines()
                         if ln.strip() and not ln.startswith("#")]
                for n in names:
                    split_topic(n)
            else:
                if args.topics < 0:
                    raise ValueError("--topics must be >= 0")
                names = generated_topics(args.namespace, args.topics)
                store.namespaces.setdefault(args.namespace, {})
        except (OSError, ValueError) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
        store.add_many(names)
        svc = Broker(_config(args), store=store, host=args.host, port=args.port,
                     admin_port=args.admin_port, cluster=args.cluster)
        print("namespaces: " + ", ".join(f"{ns} ({len(t)} topics)"
                                          for ns, t in store.namespaces.items()), flush=True)
    elif args.command == "proxy":
        from .proxy import Proxy

        try:
            svc = Proxy(_config(args), broker_url=args.broker, host=args.host, port=args.port,
                        admin_port=args.admin_port, cluster=args.cluster)
        except ValueError as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 2
    else:
        from .loadgen import run_load

        if args.connections < 1 or args.duration <= 0:
            print(f"{PROG}: error: --connections must be >= 1 and --duration > 0",
                  file=sys.stderr)
            return 2
        try:
            res = asyncio.run(run_load(args.url, args.namespace, args.connections,
                                       args.duration, admin_url=args.admin,
                                       max_requests=args.max_requests,
                                       read_delay=args.read_delay))
        except (OSError, ValueError) as exc:
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return 1
        s = res.summary()
        if args.json:
            print(json.dumps(s))
        else:
            for k, v in s.items():
                print(f"{k:>20}: {v}")
        return 0
    try:
        asyncio.run(_serve(svc))
    except OSError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
