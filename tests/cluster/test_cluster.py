"""Every pipeline on a standalone cluster whose executors' Python has no
pylimiter (conftest): with ``--executor-env`` each finishes, writes complete
tables on the driver's disk and gets local mode's results; without it, the
pipelines that need pylimiter on executors stop before any work, in one line
naming the fix."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _cli(cluster, module, *args, timeout=420):
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True,
                          text=True, timeout=timeout, env=cluster.driver_env(),
                          cwd=cluster.tmp)
    return proc


def _file(out: Path, name: str) -> Path:
    """A table's single file (write_table writes ``name.csv``, not a folder
    of part files, since issue 32)."""
    path = out / name
    assert path.is_file(), f"{path}: not a single file"
    return path


def _table(out: Path, name: str, drop=()) -> list[dict]:
    """A table's CSV rows without the ``drop`` columns (timings), sorted."""
    with _file(out, f"{name}.csv").open() as f:
        rows = [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(f)]
    return sorted(rows, key=lambda r: sorted(r.items()))


def _parquet_rows(out: Path, name: str) -> int:
    import pyarrow.parquet as pq

    return pq.read_table(_file(out, f"{name}.parquet")).num_rows


def _ok(proc):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _same(local: Path, remote: Path, names, drop=()):
    for name in names:
        mine, theirs = _table(local, name, drop), _table(remote, name, drop)
        assert mine, f"{name}: local run wrote no rows"
        assert theirs == mine, f"{name}: the cluster's rows differ from local[*]'s"
        assert _parquet_rows(remote, name) == len(theirs), name
        assert not list(remote.glob(f".{name}.*.tmp")), name     # written whole


def test_cache_sim_on_the_cluster_equals_local(cluster, archive, spark, tmp_path):
    from pylimiter.pulsar.cache.pipeline import main

    args = ["simulate", "--workloads", "catchup", "--policies", "pip430,lru",
            "--cache-size-mb", "8", "--scale", "0.05", "--duration", "30",
            "--scan-topics", "100", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "local")], spark=spark) == 0
    proc = _cli(cluster, "pylimiter.pulsar.cache", *args, *cluster.flags(),
                "--executor-env", str(archive), "--out", str(tmp_path / "cluster"))
    _ok(proc)
    timing = ("eviction_cpu_ns", "eviction_ns_per_pass", "max_pass_ns", "replay_seconds",
              "eviction_us_per_pass", "max_pass_us", "ns_per_pass")
    _same(tmp_path / "local", tmp_path / "cluster", ["runs", "summary"], drop=timing)
    assert {r["topics"] for r in _table(tmp_path / "cluster", "scan")} == {"100"}
    assert (tmp_path / "cluster" / "index.html").stat().st_size > 0


def test_cursor_sim_on_the_cluster_equals_local(cluster, archive, spark, tmp_path):
    from pylimiter.pulsar.cursor.pipeline import main

    args = ["simulate", "--ttl-min", "60", "--retention-min", "0", "--delayed-share", "0.1",
            "--ack-fail", "0.02", "--rollover-entries", "1000", "--publish-min", "120",
            "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "local")], spark=spark) == 0
    proc = _cli(cluster, "pylimiter.pulsar.cursor", *args, *cluster.flags(),
                "--executor-env", str(archive), "--out", str(tmp_path / "cluster"))
    _ok(proc)
    _same(tmp_path / "local", tmp_path / "cluster", ["summary", "series", "lifetimes"],
          drop=("seconds",))
    assert (tmp_path / "cluster" / "index.html").stat().st_size > 0


def test_balance_on_the_cluster_equals_local(cluster, archive, spark, tmp_path):
    from pylimiter.pulsar.balance.pipeline import main

    args = ["simulate", "--topics", "3000", "--namespaces", "12", "--steps", "8",
            "--brokers", "4", "--no-progress"]
    assert main([*args, "--out", str(tmp_path / "local")], spark=spark) == 0
    proc = _cli(cluster, "pylimiter.pulsar.balance", *args, *cluster.flags(),
                "--executor-env", str(archive), "--out", str(tmp_path / "cluster"))
    _ok(proc)
    tables = ("steps", "brokers", "decisions", "bundle_loads", "bundles", "ownership",
              "summary")
    for name in tables:      # byte for byte
        a, b = _file(tmp_path / "local", f"{name}.csv"), _file(tmp_path / "cluster",
                                                            f"{name}.csv")
        assert a.read_bytes() == b.read_bytes(), name
    _same(tmp_path / "local", tmp_path / "cluster", [t for t in tables if t != "decisions"])
    assert (tmp_path / "cluster" / "index.html").stat().st_size > 0


@pytest.mark.c_extension
def test_bench_on_the_cluster_runs_the_same_grid(cluster, archive, spark, tmp_path):
    from pylimiter.bench.pipeline import main

    args = ["--scenarios", "tasks,uncontended-threads", "--concurrency", "4", "--repeats", "1",
            "--budget", "0.02", "--scaling", "1", "--no-progress", "--no-report"]
    assert main([*args, "--out", str(tmp_path / "local")], spark=spark) == 0
    proc = _cli(cluster, "pylimiter.bench", *args, *cluster.flags(),
                "--executor-env", str(archive), "--out", str(tmp_path / "cluster"))
    _ok(proc)
    # The header names the executors' real Python: the unpacked archive's.
    header = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Spark "))
    assert "/pylimiter_env/bin/python (Python 3." in header and "pylimiter c" in header, header
    assert sys.executable not in header
    # Timings differ from run to run; what ran, and how it ended, may not.
    same = ("trial", "repeat", "scenario", "impl", "concurrency", "permits", "errors",
            "leaked_permits", "failure")
    keep = lambda rows: sorted(tuple(r[k] for k in same) for r in rows)  # noqa: E731
    local = keep(_table(tmp_path / "local", "results"))
    remote = keep(_table(tmp_path / "cluster", "results"))
    assert remote == local and len(remote) == 4
    assert all(r[-1] == "" and r[-2] == "0" for r in remote)   # no failure, no leak
    workers = {r["worker"].split(":")[0] for r in _table(tmp_path / "cluster", "results")}
    assert workers and all(w for w in workers)
    assert _parquet_rows(tmp_path / "cluster", "summary") == 4


@pytest.mark.c_extension
def test_bench_host_wide_on_the_cluster(cluster, archive, tmp_path):
    """The host-wide scenarios on the cluster's executor (one worker of 2
    cores, one host): its Python workers, from the shipped environment,
    share one SharedSemaphore per stage; the budget holds and the books
    balance."""
    out = tmp_path / "cluster"
    proc = _cli(cluster, "pylimiter.bench", "--scenarios", "host-handoff,host-load",
                "--impls", "c", "--repeats", "2", "--budget", "0.1", "--scaling", "0",
                "--no-progress", *cluster.flags(), "--executor-env", str(archive),
                "--out", str(out))
    _ok(proc)
    assert "host-wide: one SharedSemaphore per host (this session: 1 executor x 2 cores)" \
        in proc.stdout
    # The executors ran the unpacked archive's Python, not this checkout.
    header = next(ln for ln in proc.stdout.splitlines() if ln.startswith("Spark "))
    assert "/pylimiter_env/bin/python (Python 3." in header, header
    rows = _table(out, "host_rows")
    assert rows and all(r["failure"] == "" for r in rows)
    assert {r["cores"] for r in rows} == {"1", "2"}
    summary = _table(out, "host_summary")
    for r in summary:
        assert r["leaked"] == "0" and r["unbalanced"] == "0" and r["errors"] == "0"
        if r["side"] == "shared":
            assert int(r["peak"]) == int(r["limit"])
    assert len({r["host"] for r in summary}) == 1
    page = (out / "index.html").read_text()
    assert "Host-wide: one SharedSemaphore per host" in page and "hostwide.png" in page


@pytest.mark.parametrize("module,args", [
    ("pylimiter.bench", ["--scenarios", "tasks", "--repeats", "1", "--scaling", "0"]),
    ("pylimiter.pulsar.cache", ["simulate", "--scale", "0.05"]),
    ("pylimiter.pulsar.cursor", ["simulate", "--publish-min", "60"]),
])
def test_without_executor_env_one_line_names_the_fix(cluster, tmp_path, module, args):
    before = {a["id"] for a in cluster.state().get("completedapps", [])}
    proc = _cli(cluster, module, *args, *cluster.flags(), "--no-progress",
                "--out", str(tmp_path / "out"), timeout=240)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "No module named 'pylimiter'" in lines[0] and "--executor-env" in lines[0], lines
    assert "make cluster-env" in lines[0]
    assert not list((tmp_path / "out").glob("*.csv")), "no work may start"
    # The application ended (stopped with exit code 1: YARN reports it as
    # failed; a standalone master lists every client-mode application that
    # stopped as FINISHED, whatever the code).
    apps = [a for a in cluster.state().get("completedapps", []) if a["id"] not in before]
    assert len(apps) == 1 and apps[0]["state"] in ("FINISHED", "FAILED"), apps


def test_balance_needs_only_python_on_the_executors(cluster, tmp_path):
    """balance needs no pylimiter on executors, only a Python of the
    driver's minor version: without --executor-env it runs on the worker's
    own python3 (the bare venv), not on the driver's interpreter path."""
    proc = _cli(cluster, "pylimiter.pulsar.balance", "simulate", "--topics", "500",
                "--namespaces", "4", "--steps", "3", "--brokers", "3", "--no-progress",
                "--no-report", *cluster.flags(), "--out", str(tmp_path / "out"))
    _ok(proc)
    assert _parquet_rows(tmp_path / "out", "steps") > 0
