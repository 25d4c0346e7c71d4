"""python -m pylimiter.bench's host-wide scenarios on Spark (the shared
local[2] session): one barrier stage per core count, every Python worker on
one SharedSemaphore; the tables, the terminal summary and the report's
section."""

from __future__ import annotations

import csv
import html as _html

import pytest

from tests.spark.pages import files_beside


def _rows(out, name):
    with (out / f"{name}.csv").open(encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.c_extension
def test_host_wide_stages_on_spark(spark, tmp_path, capsys):
    from pylimiter.bench.pipeline import main

    out = tmp_path / "bench"
    rc = main(["--scenarios", "host-handoff,host-load", "--impls", "c", "--host-cores", "2",
               "--repeats", "1", "--budget", "0.1", "--scaling", "0", "--no-progress",
               "--out", str(out)], spark=spark)
    cap = capsys.readouterr()
    assert rc == 0, cap.out[-3000:] + cap.err[-3000:]
    assert "host-wide: host-handoff, host-load per core count" in cap.out
    assert "host-wide: one SharedSemaphore per host (this session: 1 executor x 2 cores)" \
        in cap.out

    rows = _rows(out, "host_rows")
    # per k: k processes x (1 round) x sides (handoff: shared and flock; load: shared)
    assert len(rows) == sum(k * 3 for k in (1, 2))
    for scenario in ("host-handoff", "host-load"):
        for k in (1, 2):
            pids = {r["pid"] for r in rows if (r["scenario"], r["cores"]) == (scenario, str(k))}
            assert len(pids) == k      # k Python workers at once, one process each
    assert all(r["failure"] == "" for r in rows), [r["failure"] for r in rows]
    summary = _rows(out, "host_summary")
    assert {(r["scenario"], r["side"], r["cores"]) for r in summary} == {
        (s, side, k) for s, sides in (("host-handoff", ("shared", "flock")),
                                      ("host-load", ("shared",)))
        for side in sides for k in ("1", "2")}
    for r in summary:
        assert float(r["grants_per_s"]) > 0
        assert r["leaked"] == "0" and r["unbalanced"] == "0" and r["errors"] == "0"
        if r["side"] == "shared":
            # The segment's high-water mark: the load reaches the limit, never more.
            assert int(r["peak"]) == int(r["limit"]) == (1 if "handoff" in r["scenario"]
                                                         else 16)
    assert len(_rows(out, "host_rounds")) == len(summary)    # one round each

    index = out / "index.html"
    assert (out / "hostwide.png").stat().st_size > 0
    assert {"host_summary.csv", "host_rounds.csv", "host_rows.csv"} <= set(files_beside(index))
    page = _html.unescape(index.read_text())
    assert "Host-wide: one SharedSemaphore per host" in page
    assert "so the processes on one host share one budget" in page
    assert ("host-handoff: high-water mark 1 <= limit 1; host-load: high-water mark 16 <= "
            "limit 16 (up to 2 workers on one host, c)") in page
    assert "0 permits held or queued, 0 in holders(), 0 errors, 0 failed rows after " \
           "4 stages" in page
    assert "hostwide.png" in page


@pytest.mark.slow
def test_host_wide_only_is_not_an_empty_grid():
    """--scenarios host-load alone is work to do; with --host-cores 0 too,
    nothing is left and the command says so before starting Spark."""
    pytest.importorskip("pyspark")
    from pylimiter.bench import pipeline
    from pylimiter.spark.cli import UsageError

    with pytest.raises(UsageError, match="the grid is empty"):
        pipeline.main(["--scenarios", "host-load", "--host-cores", "0", "--scaling", "0"])
    args = pipeline.build_parser().parse_args(["--scenarios", "host-load"])
    assert pipeline.expand_grid(args) == [] and args.scenarios == ["host-load"]
    default = pipeline.build_parser().parse_args([])
    assert {"host-handoff", "host-load"} <= set(default.scenarios)
    assert not any(t["scenario"].startswith("host-") for t in pipeline.expand_grid(default))
