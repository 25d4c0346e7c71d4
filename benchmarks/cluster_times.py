"""Local vs standalone wall time of the four pipelines at their default
scale: ``python -m benchmarks.cluster_times`` (after ``make cluster-env``).

One standalone master and one worker on 127.0.0.1 with as many cores as
local[*] has (tests/cluster/standalone.py; the worker's Python has no
pylimiter, so --executor-env ships it), each pipeline run as a user runs
it, once with --master local[*] and once on the cluster, alternating (ABAB
over the pipelines, the order flipped for every other one); wall time of
the whole command, JVM start included.  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = ROOT / "build" / "cluster-env" / "pylimiter-env.tar.gz"
PIPELINES = {
    "bench": ["pylimiter.bench", "--no-progress"],
    "cache-sim": ["pylimiter.pulsar.cache", "simulate", "--no-progress"],
    "cursor-sim": ["pylimiter.pulsar.cursor", "simulate", "--no-progress"],
    "balance": ["pylimiter.pulsar.balance", "simulate", "--no-progress"],
}


def _run(args, env, out) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *args, "--out", str(out)], env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(PIPELINES), help="comma-separated pipelines")
    args = ap.parse_args()
    from tests.cluster.standalone import standalone

    if not ARCHIVE.is_file():
        raise SystemExit(f"{ARCHIVE} is missing: make cluster-env")
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="plim-cluster-times-") as tmp, \
            standalone(Path(tmp), cores=cores) as c:
        env = c.driver_env()
        for i, name in enumerate(args.only.split(",")):
            cmd = PIPELINES[name]
            local = [*cmd, "--master", "local[*]"]
            remote = [*cmd, *c.flags(), "--executor-env", str(ARCHIVE)]
            order = [("local", local), ("standalone", remote)]
            if i % 2:
                order.reverse()
            times = {}
            for mode, argv in order:
                times[mode] = _run(argv, env, Path(tmp) / f"{name}-{mode}")
                print(f"{name} {mode}: {times[mode]:.1f} s", file=sys.stderr, flush=True)
            rows.append((name, times["local"], times["standalone"]))
    print("| pipeline | local[*] | standalone (1 worker, --executor-env) | ratio |")
    print("|---|---:|---:|---:|")
    for name, lo, st in rows:
        print(f"| {name} | {lo:.1f} s | {st:.1f} s | {st / lo:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
