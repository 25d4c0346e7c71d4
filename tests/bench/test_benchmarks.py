"""benchmarks/ (not part of the distribution; these skip in an installed
wheel's test run): the figures, the table runner, the micro report."""

from __future__ import annotations

import asyncio
import csv
import json
import re
import sys

import pytest


def test_figure_value_and_target_by_kind():
    figures = pytest.importorskip("benchmarks.figures")
    faster, cost, slower = (figures.BY_KEY[k] for k in ("await", "tasks", "pure"))
    assert faster.value({"mine": 100, "anchor": 350}) == 3.5
    assert slower.value({"mine": 600, "anchor": 100}) == 6.0
    # (mine - base) / (anchor - base): pylimiter's share of the work only.
    assert cost.value({"base": 5000, "mine": 6000, "anchor": 9000}) == 0.25
    assert faster.target((3, 12)) == 2.5 and faster.meets(2.6, (3, 12))
    assert not faster.meets(2.4, (3, 12)) and faster.meets(2.4, (3, 9)) is None
    assert cost.meets(0.5, (3, 11)) and not cost.meets(0.51, (3, 11))


@pytest.mark.c_extension
def test_figure_measured_side_by_side():
    figures = pytest.importorskip("benchmarks.figures")
    from pylimiter._impls import PY, C

    res = figures.measure(figures.BY_KEY["tasks"], C.module, PY.module, "asyncio", rounds=3)
    assert res["n"] == 3 and res["rounds"] == 3
    assert res["lo"] <= res["q1"] <= res["median"] <= res["q3"] <= res["hi"]
    assert min(res[f"{s}_ns_per_op"] for s in ("base", "mine", "anchor")) > 0
    assert res["target"] == 0.5 and res["meets"] == (res["median"] <= 0.5)
    assert res["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    with pytest.raises(ValueError, match="unknown loop"):
        figures.new_loop("trio")


@pytest.mark.c_extension
def test_table_worker_and_markdown(tmp_path, capsys):
    table = pytest.importorskip("benchmarks.table")
    out = tmp_path / "rows.json"
    assert table.main(["--worker", str(out), "--figures", "await,blocking", "--loops",
                       "asyncio", "--scale", "0.1"]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["figure"], r["loop"]) for r in rows] == [("await", "asyncio"), ("blocking", "-")]
    other = dict(rows[0], python="3.99", python_full="3.99.0", target=None, meets=None)
    readme = table.ROOT / "README.md"
    before = readme.read_bytes() if readme.exists() else None
    md = table.write_outputs(rows + [other], {"CPU": "cpu", "OS": "os", "pylimiter": "x",
                                              "date": "today"}, tmp_path).read_text()
    # a run into another folder leaves the checkout's README as it was
    assert (readme.read_bytes() if readme.exists() else None) == before
    head = [line for line in md.splitlines() if line.startswith("| figure")][0]
    assert head.index(f"({rows[0]['python_full']})") < head.index("(3.99.0)")
    await_row = [line for line in md.splitlines() if line.startswith("| `await acquire(1)`")][0]
    assert f"{rows[0]['median']:.2f}x [" in await_row and await_row.count("x [") == 2
    assert "Command: `make bench-table`" in md
    with open(tmp_path / "figures.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    with pytest.raises(SystemExit) as exit_:                # not a version it measures
        table.main(["--pythons", "2.7"])
    assert exit_.value.code == 2 and "unknown '2.7'" in capsys.readouterr().err


def test_micro_report_prints_figures_against_targets(tmp_path, capsys):
    report = pytest.importorskip("benchmarks.micro.report")
    data = {"machine_info": {"python_implementation": "CPython", "python_version": "3.11.7"},
            "benchmarks": [
                {"group": "uncontended-async", "params": {"loop": "asyncio", "impl": "c"},
                 "extra_info": {"ops": 1000}, "stats": {"median": 1.3e-4, "iqr": 1e-6}},
                {"group": "figures", "params": {}, "stats": {"median": 1.0, "iqr": 0.0},
                 "extra_info": {"figure": "tasks", "loop": "uvloop", "kind": "cost",
                                "median": 0.85, "q1": 0.8, "q3": 0.9, "target": 0.5,
                                "meets": False}}]}
    path = tmp_path / "micro.json"
    path.write_text(json.dumps(data))
    assert report.main(str(path)) == 0
    out = capsys.readouterr().out
    assert "130" in out                     # 1.3e-4 s / 1000 ops
    assert "0.85 [0.80-0.90]" in out and "<= 0.50" in out and "MISS" in out


def test_park_wake_splits_each_loops_figure(capsys):
    park_wake = pytest.importorskip("benchmarks.park_wake")
    assert park_wake.main(["--rounds", "3", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    loops = [line.split(":")[0].strip() for line in out.splitlines() if "no limiter" in line]
    assert loops[0] == "asyncio" and set(loops) <= {"asyncio", "uvloop"}
    for kind in ("pylimiter", "asyncio"):
        rows = [line for line in out.splitlines() if line.strip().startswith(kind + " ")]
        assert len(rows) == len(loops)
        assert all("uncontended +" in r and "park+wake +" in r for r in rows)
    costs = re.findall(r"cost: (-?\d+\.\d+) \[", out)
    assert len(costs) == len(loops)
    with pytest.raises(SystemExit):
        park_wake.main(["--rounds", "x"])


def test_pure_floor_prototypes_keep_their_books_and_every_step_prints(capsys):
    floor = pytest.importorskip("benchmarks.pure_floor")

    async def cycle(sem):
        for _ in range(3):
            p = await sem.acquire(4)
            assert sem._avail == 6
            sem.release(p)
            sem.release(p)   # a second release gives nothing back
        return sem._avail

    for level, step in enumerate(floor.STEPS):
        sem = floor.prototype(level)(10)
        assert asyncio.run(cycle(sem)) == 10, step
        with pytest.raises(TypeError):
            sem.release(object())
        if level >= floor.STEPS.index("checks"):
            with pytest.raises(ValueError):
                sem.acquire(11)
    assert floor.main(["--rounds", "2", "--ops", "20"]) == 0
    out = capsys.readouterr().out
    rows = [ln.split()[0] for ln in out.splitlines() if ln.startswith("  ")]
    assert rows == [*floor.STEPS, "twin"]
    assert all(re.search(r"\d+\.\d\dx \[", ln) for ln in out.splitlines()[1:])
    with pytest.raises(SystemExit):
        floor.main(["--rounds", "1"])
