"""python -m pylimiter.pulsar.cursor simulate: the command line and an
end-to-end sweep on the shared SparkSession."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from tests._helpers import needs_pyspark
from tests.spark.pages import files_beside


@needs_pyspark
def test_usage_errors_are_one_line_and_exit_2(tmp_path, capsys):
    from pylimiter.pulsar.cursor.pipeline import PROG, main, run

    def cli(argv):
        return run(main, PROG, argv)

    assert cli(["simulate", "--master", "mesos://h:1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unsupported master URL" in err
    for bad in (["simulate", "--ttl-min", "0"], ["simulate", "--ack-fail", "1.5"],
                ["simulate", "--quota-policy", "drop"], ["simulate", "--out", "/proc/x"],
                ["simulate", "--quota-bytes", "-2"], ["simulate", "--rollover-entries", "1,x"]):
        with pytest.raises(SystemExit) as exc:
            cli(bad)
        assert exc.value.code == 2


@pytest.mark.slow
def test_cli_version_and_help():
    out = subprocess.run([sys.executable, "-m", "pylimiter.pulsar.cursor", "--version"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "pylimiter-pulsar" in out.stdout
    out = subprocess.run([sys.executable, "-m", "pylimiter.pulsar.cursor", "simulate", "--help"],
                         check=False, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "(default: 60,240)" in out.stdout


# ---- end to end on the shared session ---------------------------------------------------

@pytest.mark.slow
def test_simulate_end_to_end(spark, tmp_path, capsys):
    from pylimiter.pulsar.cursor.pipeline import main

    out = tmp_path / "cursor"
    argv = ["simulate", "--ttl-min", "30", "--retention-min", "0,60", "--delayed-share", "0.3",
            "--ack-fail", "0.05", "--rollover-entries", "200", "--rate", "10",
            "--publish-min", "120", "--rollover-max-min", "60", "--quota-bytes", "65536",
            "--out", str(out), "--no-progress"]
    assert main(argv, spark=spark) == 0
    printed = capsys.readouterr().out
    assert "2 points x 4 subscriptions" in printed and "ours 0" in printed

    rows = spark.read.parquet(str(out / "summary.parquet")).collect()
    assert len(rows) == 8                                   # 2 points x 4 variants
    for r in rows:
        if r.rule == "deliverable":
            assert r.lost_before_delivery == 0              # never before delivery
        assert r.consumed + r.expired + r.evicted == r.published == 1200
    assert sum(r.lost_before_delivery for r in rows if r.rule == "publish") > 0
    assert (out / "lifetimes.csv").is_file()      # one CSV file, not a Spark folder
    with (out / "lifetimes.csv").open(encoding="utf-8") as f:
        fates = {row["fate"] for row in csv.DictReader(f)}
    assert "consumed" in fates
    assert spark.read.parquet(str(out / "series.parquet")).count() > 0

    html = (out / "index.html").read_text()
    assert "class='verdict'" in html and "expired before delivery under Pulsar&#x27;s rule" in html
    assert {"summary.csv", "series.csv", "lifetimes.csv"} <= set(files_beside(out / "index.html"))
    # Pulsar's TTL losing delayed messages is confirmed: a bad outcome, red.
    row = html[html.index("The article: Pulsar&#x27;s TTL"):]
    assert row[:row.index("</tr>")].endswith("<td class='bad'>yes</td>")
    for png in ("delayed_lost.png", "holes.png", "lifetime.png"):
        assert (out / png).stat().st_size > 10_000
        assert f"src='{png}'" in html
    assert spark.range(2).count() == 2                      # the shared session still runs
