"""``python -m pylimiter.pulsar.balance simulate`` end to end on the shared
local[2] session: a small generated cluster checked against the invariants
(every topic in exactly one bundle, every bundle owned by exactly one live
broker, no namespace over max_bundles, bundle loads summing to topic loads),
the same rows replayed from a file giving the same decisions, and bad input
ending in one line with exit status 2."""

from __future__ import annotations

import math
import os
import threading

import pytest

from pylimiter.pulsar.balance.cluster import Settings
from pylimiter.pulsar.balance.generate import GeneratorSpec
from pylimiter.pulsar.balance.pipeline import PROG, build_parser, main
from pylimiter.pulsar.balance.source import GeneratedSource
from pylimiter.spark.cli import run
from pylimiter.spark.settings import flag_of
from tests._helpers import run_module
from tests.spark.pages import files_beside

# the wheel check installs only pytest and hypothesis: skip, not fail collection
pd = pytest.importorskip("pandas")

SMALL = ["--topics", "5000", "--namespaces", "10", "--steps", "5", "--brokers", "4",
         "--max-topics", "150", "--broker-msg-rate", "8000", "--broker-bandwidth-mbytes", "5",
         "--min-throughput-mb", "0.05", "--max-bundles", "16", "--no-progress"]
LOADS = ["msg_rate_in", "msg_rate_out", "msg_throughput_in", "msg_throughput_out"]


def _table(out, name):
    return pd.read_parquet(out / f"{name}.parquet")


# ---- bad input (first: cheap jobs that warm the shared session up) --------------


def _fail(spark, capsys, argv):
    code = run(lambda a: main(a, spark=spark), PROG, argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and "Traceback" not in err[0]
    return err[0]


GOOD = ("step,topic,msg_rate_in,msg_rate_out,msg_throughput_in,msg_throughput_out,"
        "producers,consumers\n"
        "0,persistent://a/b/t1,1,2,3,4,1,1\n"
        "0,persistent://a/b/t2,1,2,3,4,1,1\n")


@pytest.mark.parametrize("text, needle", [
    (GOOD + "1,persistent://a/b/t1,abc,2,3,4,1,1\n", "row 3: column msg_rate_in"),
    (GOOD + "1,persistent://a/b/t1,1,2,3,-4,1,1\n", "row 3: column msg_throughput_out"),
    (GOOD + "1.5,persistent://a/b/t1,1,2,3,4,1,1\n", "row 3: column step"),
    (GOOD + "1,not-a-topic,1,2,3,4,1,1\n", "row 3: column topic"),
    (GOOD + "1,persistent://a/b/t1,1,2,3,4,,1\n", "row 3: column producers"),
    (GOOD + "0,persistent://a/b/t1,1,2,3,4,1,1\n", "step 0 has topic persistent://a/b/t1 2 times"),
    ("step,topic,msg_rate_in\n0,persistent://a/b/c,1\n", "missing columns msg_rate_out"),
])
@pytest.mark.slow
def test_malformed_csv_is_one_line_naming_column_and_row(spark, capsys, tmp_path, text, needle):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    line = _fail(spark, capsys, ["simulate", "--input", str(path), "--out", str(tmp_path / "o"),
                                 "--no-progress"])
    assert needle in line and str(path) in line


@pytest.mark.slow
def test_malformed_json_line(spark, capsys, tmp_path):
    path = tmp_path / "bad.jsonl"
    good = ('{"step": 0, "topic": "persistent://a/b/t", "msg_rate_in": 1, "msg_rate_out": 1, '
            '"msg_throughput_in": 1, "msg_throughput_out": 1, "producers": 1, "consumers": 1}\n')
    path.write_text(good + "{oops\n")
    line = _fail(spark, capsys, ["simulate", "--input", str(path), "--out", str(tmp_path / "o")])
    assert "row 2 is not valid JSON" in line


@pytest.mark.slow
def test_parquet_with_wrong_types(spark, capsys, tmp_path):
    path = tmp_path / "bad.parquet"
    pd.DataFrame({"step": [0], "topic": [1], "msg_rate_in": [1.0], "msg_rate_out": [1.0],
                  "msg_throughput_in": [1.0], "msg_throughput_out": [1.0], "producers": [1],
                  "consumers": [1]}).to_parquet(path)
    line = _fail(spark, capsys, ["simulate", "--input", str(path), "--out", str(tmp_path / "o")])
    assert "column topic has type bigint, expected string" in line


@pytest.mark.parametrize("name, needle", [("rows.txt", "unknown file type '.txt'"),
                                          ("missing.csv", "no such file")])
@pytest.mark.slow
def test_unknown_or_missing_input(spark, capsys, tmp_path, name, needle):
    path = tmp_path / name
    if name != "missing.csv":
        path.write_text(GOOD)
    line = _fail(spark, capsys, ["simulate", "--input", str(path), "--out", str(tmp_path / "o")])
    assert needle in line


@pytest.mark.parametrize("column", ["msg_rate_in", "msg_rate_out", "msg_throughput_in",
                                    "msg_throughput_out"])
@pytest.mark.slow
def test_a_rate_out_of_range_names_its_column_and_row(spark, capsys, tmp_path, column):
    # 1e308 once passed the checks and overflowed the usage percentages: an
    # internal ValueError, no column, no row.
    row = {"step": "1", "topic": "persistent://a/b/t1", "msg_rate_in": "1", "msg_rate_out": "2",
           "msg_throughput_in": "3", "msg_throughput_out": "4", "producers": "1",
           "consumers": "1", column: "1e308"}
    path = tmp_path / "big.csv"
    path.write_text(GOOD + ",".join(row.values()) + "\n")
    line = _fail(spark, capsys, ["simulate", "--input", str(path), "--out", str(tmp_path / "o")])
    assert f"row 3: column {column} is not a number from 0 to 1e+15 (got '1e308')" in line
    assert "ValueError" not in line


@pytest.mark.slow
def test_the_largest_rate_allowed_runs(spark, tmp_path):
    from pylimiter.pulsar.balance.source import MAX_RATE

    rows = GOOD.replace(",1,2,3,4,1,1", f",{MAX_RATE:.0f},{MAX_RATE:.0f},{MAX_RATE:.0f},"
                                        f"{MAX_RATE:.0f},1,1")
    path = tmp_path / "max.csv"
    path.write_text(rows)
    assert main(["simulate", "--input", str(path), "--out", str(tmp_path / "o"), "--no-report",
                 "--no-progress", "--broker-msg-rate", "1",
                 "--broker-bandwidth-mbytes", "0.001"], spark=spark) == 0
    steps = _table(tmp_path / "o", "steps")
    assert (steps["max_usage"] > 1e10).all() and steps["max_usage"].map(math.isfinite).all()


@pytest.mark.slow
def test_a_csv_with_a_byte_order_mark_is_read(spark, tmp_path):
    from pylimiter.pulsar.balance.source import check_input, load_input

    plain, bom = tmp_path / "plain.csv", tmp_path / "bom.csv"
    plain.write_text(GOOD)
    bom.write_text(GOOD, encoding="utf-8-sig")      # Excel's "CSV UTF-8"
    assert bom.read_bytes().startswith(b"\xef\xbb\xbfstep,")
    check_input(bom)
    got = load_input(spark, bom).toPandas()
    assert list(got.columns) == list(load_input(spark, plain).columns)
    assert got.equals(load_input(spark, plain).toPandas())
    assert main(["simulate", "--input", str(bom), "--out", str(tmp_path / "o"), "--no-report",
                 "--no-progress"], spark=spark) == 0
    assert len(_table(tmp_path / "o", "steps")) > 0


def _fifo(tmp_path, name="rows.csv"):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _at_once(fn, path):
    """fn(path)'s result or exception, which must come without waiting on
    the FIFO at ``path``: if it waits, a writer opens the FIFO (again, for
    Spark's reader too) until it lets go, and the test fails."""
    result = {}

    def call():
        try:
            result["value"] = fn(path)
        except BaseException as exc:     # noqa: BLE001 - handed to the test thread
            result["exc"] = exc
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        for _ in range(600):
            try:        # only when a reader waits: else ENXIO
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
            t.join(0.5)
            if not t.is_alive():
                break
        pytest.fail(f"{fn} waited on the FIFO {path}")
    return result


def _refused_at_once(fn, path):
    from pylimiter.spark.cli import UsageError

    result = _at_once(fn, path)
    assert isinstance(result.get("exc"), UsageError), result
    return str(result["exc"])


def test_a_fifo_input_is_refused_at_once(tmp_path):
    from pylimiter.pulsar.balance.source import check_input

    fifo = _fifo(tmp_path)
    assert "not a regular file (a FIFO)" in _refused_at_once(check_input, fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "a.csv").write_text(GOOD)
    os.mkfifo(folder / "b.csv")
    assert "b.csv: not a regular file (a FIFO)" in _refused_at_once(check_input, folder)


@pytest.mark.slow
def test_a_fifo_input_is_refused_by_the_command_and_load_input(spark, capsys, tmp_path):
    from pylimiter.pulsar.balance.source import load_input

    fifo = _fifo(tmp_path)
    argv = ["simulate", "--input", str(fifo), "--out", str(tmp_path / "o")]
    code = _at_once(lambda p: run(lambda a: main(a, spark=spark), PROG, argv), fifo)["value"]
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "not a regular file (a FIFO)" in err[0], err
    msg = _refused_at_once(lambda p: load_input(spark, p), fifo)
    assert "not a regular file (a FIFO)" in msg


@pytest.mark.slow
def test_option_combinations_that_do_not_fit(spark, capsys, tmp_path):
    line = _fail(spark, capsys, ["simulate", "--split-algorithm", "specified_positions_divide",
                                 "--out", str(tmp_path)])
    assert "needs --split-positions" in line
    line = _fail(spark, capsys, ["simulate", "--default-bundles", "64", "--max-bundles", "32",
                                 "--out", str(tmp_path)])
    assert "--default-bundles 64 is above --max-bundles 32" in line



# ---- a small generated cluster end to end ----------------------------------------


@pytest.fixture(scope="module")
def small_run(spark, tmp_path_factory):
    # reports/balance, as `make balance` writes it: the run's index follows
    out = tmp_path_factory.mktemp("run") / "reports" / "balance"
    assert main(["simulate", *SMALL, "--out", str(out)], spark=spark) == 0
    src = GeneratedSource(spark, GeneratorSpec(topics=5000, namespaces=10, steps=5, seed=1))
    try:
        rows = src.rows(range(5)).toPandas()
    finally:
        src.close()
    return out, rows


@pytest.mark.slow
def test_report_and_tables_are_written(small_run):
    out, _ = small_run
    html = (out / "index.html").read_text()
    assert "class='verdict'" in html and "LeastLongTermMessageRate + ThresholdShedder" in html
    assert "ThresholdShedder narrows the spread under uniform random placement" in html
    for png in ("usage.png", "spread.png", "heatmap.png", "unloads.png", "bundles.png"):
        assert (out / png).stat().st_size > 5000
        assert f"src='{png}'" in html
    for name in ("steps", "brokers", "decisions", "bundle_loads", "bundles", "ownership",
                 "summary"):
        assert (out / f"{name}.parquet").is_file() and (out / f"{name}.csv").is_file()
    steps = _table(out, "steps")
    assert set(steps["strategy"]) == {"lltmr+shed", "lltmr", "random+shed", "random"}
    assert sorted(steps["step"].unique()) == [0, 1, 2, 3, 4]
    assert (out / "timings.json").exists()
    names = files_beside(out / "index.html")
    assert {f"{t}.csv" for t in ("steps", "brokers", "decisions", "summary")} <= set(names)
    assert "timings.json" in names
    index = (out.parent / "index.html").read_text()
    assert "<a href='balance/index.html'>Pulsar bundle load balancing" in index
    assert "ThresholdShedder reduces the broker-steps above the 85% overload threshold" in index


@pytest.mark.slow
def test_splits_and_unloads_happen(small_run):
    out, _ = small_run
    dec = _table(out, "decisions")
    assert (dec["action"] == "split").sum() > 0
    assert (dec[dec["strategy"].str.endswith("+shed")]["action"] == "unload").sum() > 0
    assert (dec[~dec["strategy"].str.endswith("+shed")]["action"] == "unload").sum() == 0


@pytest.mark.slow
def test_every_topic_lies_in_exactly_one_bundle_at_every_step(small_run):
    out, rows = small_run
    loads = _table(out, "bundle_loads")
    for step, topics in rows.groupby("step"):
        layout = loads[loads["step"] == step]
        ns = topics["topic"].str.extract(r"^[a-z-]+://([^/]+/[^/]+)/")[0]
        hits = pd.Series(0, index=topics.index)
        for b in layout.itertuples():
            inside = (ns == b.namespace) & (topics["hash"] >= b.lower) & (topics["hash"] <= b.upper)
            hits += inside.astype(int)
        assert (hits == 1).all(), f"step {step}: {int((hits != 1).sum())} topics misplaced"


@pytest.mark.slow
def test_bundle_loads_sum_to_topic_loads_at_every_step(small_run):
    out, rows = small_run
    loads = _table(out, "bundle_loads")
    by_step = loads.groupby("step")[["topics", "sessions", *LOADS]].sum()
    topic_sums = rows.groupby("step")[LOADS].sum()
    counts = rows.groupby("step").size()
    sessions = (rows["producers"] + rows["consumers"]).groupby(rows["step"]).sum()
    for step in counts.index:
        assert by_step.loc[step, "topics"] == counts[step]
        assert by_step.loc[step, "sessions"] == sessions[step]
        for c in LOADS:
            assert by_step.loc[step, c] == pytest.approx(topic_sums.loc[step, c], rel=1e-9)


@pytest.mark.slow
def test_every_bundle_owned_by_exactly_one_live_broker(small_run):
    out, _ = small_run
    bundles = _table(out, "bundles")
    own = _table(out, "ownership")
    live = {f"broker-{i:02d}" for i in range(1, 5)}
    for strategy, o in own.groupby("strategy"):
        assert sorted(o["bundle"]) == sorted(bundles["bundle"]), strategy
        assert not o["bundle"].duplicated().any()
        assert set(o["broker"]) <= live
    assert bundles.groupby("namespace").size().max() <= 16
    # Bundles tile each namespace's hash range.
    for ns, b in bundles.groupby("namespace"):
        b = b.sort_values("lower")
        assert b["lower"].iloc[0] == 0 and b["upper"].iloc[-1] == 0xFFFFFFFF
        assert (b["lower"].iloc[1:].values == b["upper"].iloc[:-1].values).all()
        assert b["last"].tolist() == [False] * (len(b) - 1) + [True]


@pytest.mark.slow
def test_replaying_the_rows_from_a_file_gives_the_same_decisions(spark, small_run, tmp_path):
    out, rows = small_run
    src = tmp_path / "rows.csv"
    cols = ["step", "topic", *LOADS, "producers", "consumers"]
    rows[cols].to_csv(src, index=False, float_format="%.17g")
    replay = tmp_path / "replay"
    argv = ["simulate", *SMALL, "--input", str(src), "--out", str(replay), "--no-report"]
    assert main(argv, spark=spark) == 0
    a = _table(out, "decisions").sort_values(["strategy", "step", "action", "bundle"])
    b = _table(replay, "decisions").sort_values(["strategy", "step", "action", "bundle"])
    key = ["strategy", "step", "action", "bundle", "from_broker", "to_broker"]
    assert a[key].reset_index(drop=True).equals(b[key].reset_index(drop=True))
    sa = _table(out, "steps").sort_values(["strategy", "step"]).reset_index(drop=True)
    sb = _table(replay, "steps").sort_values(["strategy", "step"]).reset_index(drop=True)
    assert sa["max_usage"].tolist() == pytest.approx(sb["max_usage"].tolist())
    assert not (replay / "index.html").exists()


@pytest.mark.slow
def test_json_lines_and_parquet_inputs(spark, tmp_path):
    rows = pd.DataFrame({
        "step": [0, 0, 1, 1], "topic": [f"persistent://a/b/t{i}" for i in (1, 2, 1, 2)],
        "msg_rate_in": [10.0, 20.0, 30.0, 0.0], "msg_rate_out": [1.0, 2.0, 3.0, 0.0],
        "msg_throughput_in": [1e3, 2e3, 3e3, 0.0], "msg_throughput_out": [1.0, 1.0, 1.0, 0.0],
        "producers": [1, 1, 1, 0], "consumers": [0, 2, 1, 0]})
    for kind in ("jsonl", "parquet"):
        path = tmp_path / f"rows.{kind}"
        if kind == "jsonl":
            rows.to_json(path, orient="records", lines=True)
        else:
            rows.to_parquet(path)
        out = tmp_path / kind
        assert main(["simulate", "--input", str(path), "--brokers", "2", "--out", str(out),
                     "--no-progress", "--no-report"], spark=spark) == 0
        loads = _table(out, "bundle_loads")
        assert loads.groupby("step")["msg_rate_in"].sum().tolist() == [30.0, 30.0]
        assert loads.groupby("step")["topics"].sum().tolist() == [2, 2]


# ---- the command line, in a subprocess -----------------------------------------------------


def _cli(*args, timeout=120):
    return run_module("pylimiter.pulsar.balance", *args, timeout=timeout)


@pytest.mark.slow
def test_help_documents_every_option():
    proc = _cli("simulate", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    sub = build_parser()._subparsers._group_actions[0].choices["simulate"]
    for action in sub._actions:
        for opt in action.option_strings:
            assert opt in text, opt
    # every setting's flag, Pulsar key and default come from its declaration
    for f in Settings.settings():
        assert f"{flag_of(f)} " in text and f"{f.metadata['key']}" in text, f.name
    for needle in ("(default: 600000)", "--no-auto-split turns off: split bundles",
                   "overrides defaultNamespaceBundleSplitAlgorithm (default range_equally_divide)",
                   "overrides loadBalancerBrokerThresholdShedderPercentage (default 10 %)",
                   "overrides loadBalancerNamespaceMaximumBundles (default 128 bundles)",
                   "(default: reports/balance)", "(default: local[*])"):
        assert needle in text, needle
    assert _cli("--version").stdout.startswith(PROG)


@pytest.mark.slow
@pytest.mark.parametrize("argv, needle", [
    (["simulate", "--split-algorithm", "hash_divide"],
     "split_algorithm must be one of range_equally_divide"),
    (["simulate", "--topics", "-5"], "must be at least 1, got -5"),
    (["simulate", "--brokers", "0"], "must be at least 1, got 0"),
    (["simulate", "--max-topics", "-1"], "max_topics must be an integer from 0 to"),
    (["simulate", "--max-sessions", "-2"], "max_sessions must be an integer from -1 to"),
    (["simulate", "--max-msg-rate", "-3"], "max_msg_rate must be a number from 0 to"),
    (["simulate", "--max-msg-rate", "nan"], "max_msg_rate must be a number from 0 to"),
    (["simulate", "--history", "1.5"], "history must be a number from 0 to 1, not 1.5"),
    (["simulate", "--grace-steps", "2.5"], "must be an integer, not '2.5'"),
    (["simulate", "--weights", "gpu=1"], "expected name=weight pairs"),
    (["simulate", "--split-positions", "0x1ffffffff"], "within 0..0xffffffff"),
    (["simulate", "--broker-msg-rate", "1e-300"], "--broker-msg-rate must be at least 1"),
    (["simulate", "--broker-bandwidth-mbytes", "1e-9"],
     "--broker-bandwidth-mbytes must be at least 0.001"),
    (["simulate", "--out", "/proc/nope/x"], "cannot write to /proc/nope/x"),
    (["simulate", "--master", "spark://127.0.0.1:9"], "does not answer"),
])
def test_cli_usage_errors_are_one_line_exit_2(argv, needle):
    proc = _cli(*argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert needle in lines[-1], proc.stderr
    assert "Traceback" not in proc.stderr and "at org.apache" not in proc.stderr


def test_settings_from_the_command_line():
    from pylimiter.pulsar.balance.load import LoadWeights
    from pylimiter.pulsar.balance.pipeline import settings_from

    args = build_parser().parse_args(["simulate"])
    s = settings_from(args)
    assert s.weights == LoadWeights() and s.max_bundles == 128 and s.grace_steps == 30
    assert s.capacity.bandwidth_in == 200 * 1024 * 1024
    args = build_parser().parse_args([
        "simulate", "--weights", "cpu=2,direct-memory=0.5", "--split-algorithm",
        "specified_positions_divide", "--split-positions", "0x40000000,3221225472",
        "--no-auto-unload-split-bundles", "--lower-boundary-shedding", "--max-sessions", "0"])
    s = settings_from(args)
    assert s.weights == LoadWeights(cpu=2, direct_memory=0.5)
    assert s.split_positions == (0x40000000, 0xC0000000)
    assert not s.auto_unload_split_bundles and s.lower_boundary_shedding
    assert s.max_sessions == 0
    s = settings_from(build_parser().parse_args(["simulate", "--no-auto-split", "--history", "0",
                                                 "--max-msg-rate", "5"]))
    assert not s.auto_split and s.auto_unload_split_bundles
    assert s.history == 0 and s.max_msg_rate == 5.0 and s.max_sessions == 1000
