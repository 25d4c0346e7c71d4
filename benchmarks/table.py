"""``python -m benchmarks.table``: the speed figures on every CPython
here (3.10-3.15), on the default event loop and on uvloop, into
``benchmarks/results/figures.md`` (and ``figures.csv``, one row per figure,
loop and Python, with median, quartiles and extremes over rounds), and
``benchmarks/results/headline.md``, the few figures README.md and the docs'
Performance page show: written here, copied into README.md between its
``<!-- headline:start -->`` / ``<!-- headline:end -->`` markers and included
by the docs, so that no figure is typed twice (tests/test_headline.py holds
README.md to the file).

For each interpreter the extension is built in place by a venv of that
version (``.venv-bench-3.X``, created once with uvloop, Cython and
setuptools, then reused), and one worker process measures every figure of
:mod:`benchmarks.figures`: each is a ratio of sides measured in that same
process, in interleaved rounds with the order flipped every round, in thread
CPU time; the figure is the median over rounds.  Versions that are not
installed are reported and skipped.

3.10-3.13 are pyenv's builds of python.org's sources.  3.14 and 3.15 are
Debian sid's packages (Debian-patched builds: their own compiler flags and
patches), run inside the sid root that ``wheels/pythons.sh`` makes, through
``wheels/in_sid.sh``; the table says so in their column headers.

    python -m benchmarks.table                       # what `make bench-table` runs
    python -m benchmarks.table --pythons 3.12 --loops asyncio --figures await,tasks
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
VERSIONS = ["3.10", "3.11", "3.12", "3.13", "3.14", "3.15"]
#: Reachable here only as Debian sid packages, run in the sid root.
SID_VERSIONS = {"3.14", "3.15"}
RESULTS = ROOT / "benchmarks" / "results"
SID_ROOT = ROOT / "wheels" / "work" / "sid" / "amd64"
IN_SID = [ROOT / "wheels" / "in_sid.sh", "amd64"]
PROG = "python -m benchmarks.table"
COMMAND = "make bench-table"


def find_python(version: str) -> Path | None:
    """This interpreter if it is ``version``, else the newest pyenv one; for
    3.14/3.15 the sid root's (a path inside the root: run it through
    ``IN_SID``)."""
    if f"{sys.version_info[0]}.{sys.version_info[1]}" == version:
        return Path(sys.executable)
    if version in SID_VERSIONS:
        ok = ((SID_ROOT / ".stage-base").exists()
              and (SID_ROOT / f"usr/bin/python{version}").exists())
        return Path(f"/usr/bin/python{version}") if ok else None
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"),
                   key=lambda p: [int(x) for x in p.parent.parent.name.split(".")
                                  if x.isdigit()])
    return found[-1] if found else None


def _run(cmd, **kw) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n" + "\n".join(tail))
    return proc.stdout


def runner(version: str) -> list:
    """What a command for ``version`` is run through (the sid root or nothing)."""
    return IN_SID if version in SID_VERSIONS else []


def prepare(version: str, py: Path) -> Path:
    """The interpreter that will measure ``version``, with the extension
    built in place for it."""
    pre = runner(version)
    if py == Path(sys.executable):
        vpy = py
    else:
        venv = ROOT / f".venv-bench-{version}"
        vpy = venv / "bin" / "python"
        if not (venv / ".ready").exists():
            print(f"  creating {venv.name} (uvloop, Cython, setuptools)", flush=True)
            _run([*pre, py, "-m", "venv", "--clear", venv])
            _run([*pre, vpy, "-m", "pip", "install", "-q", "uvloop>=0.19", "Cython>=3.0.10",
                  "setuptools>=77"])
            (venv / ".ready").touch()
    _run([*pre, vpy, "setup.py", "-q", "build_ext", "--inplace"], cwd=ROOT)
    return vpy


def worker(args) -> int:
    """Measure the figures in this process and write them as JSON."""
    import pylimiter
    from pylimiter._impls import IMPLEMENTATIONS

    from .figures import BY_KEY, FIGURES, LOOPS, measure

    if pylimiter.IMPLEMENTATION != "c":
        raise SystemExit("the C extension did not load; the table measures it")
    c, py = IMPLEMENTATIONS["c"].module, IMPLEMENTATIONS["python"].module
    figures = [BY_KEY[k] for k in args.figures] if args.figures else FIGURES
    rows = []
    for fig in figures:
        for loop in (args.loops if fig.uses_loop else ["-"]):
            if loop not in LOOPS and loop != "-":
                continue
            row = measure(fig, c, py, loop, scale=args.scale)
            if row is not None:
                rows.append(row)
                print(f"  {row['python']:5} {fig.key:18} {loop:8} {_cell(row)}", flush=True)
    try:
        import uvloop
        uv = uvloop.__version__
    except ImportError:
        uv = None
    Path(args.worker).write_text(json.dumps({"rows": rows, "uvloop": uv}))
    return 0


def _fmt(kind: str, v: float) -> str:
    return f"{v:.2f}x" if kind in ("faster", "slower") else f"{v:.2f}"


def _cell(r: dict) -> str:
    mark = {True: " ✓", False: " ✗", None: ""}[r["meets"]]
    return (f"{_fmt(r['kind'], r['median'])} [{r['q1']:.2f}–{r['q3']:.2f}]{mark}")


def _goal(cells: list) -> str:
    """The targets of a row; per version where they differ."""
    have = [r for r in cells if r and r["target"] is not None]
    if not have:
        return ""
    op = ">= " if have[0]["kind"] == "faster" else "<= "
    goals = {r["python"]: op + _fmt(r["kind"], r["target"]) for r in have}
    if len(set(goals.values())) == 1:
        return next(iter(goals.values()))
    return "; ".join(f"{v}: {g}" for v, g in goals.items())


def write_outputs(rows: list[dict], env: dict, out: Path) -> Path:
    from .figures import FIGURES

    out.mkdir(parents=True, exist_ok=True)
    fields = ["figure", "loop", "python", "python_full", "build", "kind", "rounds", "median",
              "q1", "q3", "lo", "hi", "n", "target", "meets", "mine_ns_per_op", "anchor_ns_per_op",
              "base_ns_per_op"]
    (out / "figures.json").write_text(json.dumps({"env": env}, indent=1, sort_keys=True) + "\n")
    with (out / "figures.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (round(v, 4) if isinstance(v, float) else v)
                        for k, v in r.items()})
    versions = sorted({r["python"] for r in rows}, key=lambda v: tuple(map(int, v.split("."))))
    builds = {r["python"]: r.get("build", "") for r in rows}
    full = {v: r["python_full"] + (", Debian" if builds[v].startswith("Debian") else "")
            for v, r in ((r["python"], r) for r in rows)}
    by = {(r["figure"], r["loop"], r["python"]): r for r in rows}
    lines = [
        "# The speed figures, measured",
        "",
        f"Command: `{COMMAND}` (`{PROG}`).  Machine: {env['CPU']}, {env['OS']}; "
        f"pylimiter {env['pylimiter']}; uvloop {env.get('uvloop') or 'not installed'}; "
        f"{env['date']}.",
        "",
        "Each cell: the median over rounds of a ratio measured in one process, "
        "[first–third quartile]; rounds interleaved with the order flipped every "
        "round, thread CPU time.  ✓/✗: meets the project's target or not "
        "(no mark: no target for that Python).  x faster = anchor's time / "
        "pylimiter's; cost = (pylimiter - baseline) / (anchor - baseline), lower "
        "is better; x slower = pylimiter's time / anchor's.  Extremes and ns/op of "
        "every side are in `figures.csv`.  A negative cost means pylimiter's "
        "side took less time than the baseline itself (its timed-out waiters "
        "share one timer; the baseline's sleeping tasks have one each).",
        "",
        "Interpreters: " + "; ".join(f"{v}: {builds[v] or 'as found'}" for v in versions)
        + ".  Debian's are patched builds (Debian's patches and compiler flags), run "
        "in a Debian sid root (`wheels/pythons.sh`); their figures are not python.org "
        "builds' figures.",
        "",
        "| figure | loop | target | " + " | ".join(f"{v} ({full[v]})" for v in versions) + " |",
        "|---|---|---|" + "---|" * len(versions),
    ]
    for fig in FIGURES:
        for loop in ("asyncio", "uvloop", "-"):
            cells = [by.get((fig.key, loop, v)) for v in versions]
            if not any(cells):
                continue
            lines.append(f"| {fig.title} | {loop} | {_goal(cells)} | "
                         + " | ".join(_cell(r) if r else "n/a" for r in cells) + " |")
    notes = sorted({f"`{f.key}`: {f.note}" for f in FIGURES if f.note})
    if notes:
        lines += ["", "n/a: not measurable there (" + "; ".join(notes) + ")."]
    md = out / "figures.md"
    md.write_text("\n".join(lines) + "\n", encoding="utf-8")
    write_headline(rows, env, versions, full, out / "headline.md")
    return md


#: The figures README.md shows (default event loop): key -> its row label.
HEADLINE = (
    ("await", "`await sem.acquire()` + `release`, uncontended: x faster than asyncio.Semaphore"),
    ("async-with-sem", "`async with sem:`: x faster than asyncio.Semaphore's"),
    ("tasks", "1,000 tasks on 10 permits: cost over no limiter, / asyncio.Semaphore's"),
    ("cancel", "10,000 waiters cancelled: x cheaper than asyncio.Semaphore"),
    ("blocking", "`acquire_blocking(1)` + `release`: x faster than threading.Semaphore"),
    ("pure", "pure-Python twin, uncontended `await`: / asyncio.Semaphore's time"),
)
HEADLINE_START = "<!-- headline:start -->"
#: Absolute, so the link works from README.md and from the docs site alike.
REPO_BLOB = "https://github.com/pylimiter/pylimiter-pulsar/blob/main"
HEADLINE_END = "<!-- headline:end -->"


def headline_text(rows: list[dict], env: dict, versions: list[str], full: dict) -> str:
    """The README's figures: medians only, one column per CPython, the
    machine and date, and where the quartiles are."""
    # The default loop's row, or the loop-less one (threads).
    by = {(r["figure"], r["python"]): r for r in rows if r["loop"] in ("asyncio", "-")}
    lines = ["| figure | " + " | ".join(full[v].replace(", Debian", " (Debian)") for v in versions)
             + " |", "|---|" + "---:|" * len(versions)]
    for key, label in HEADLINE:
        cells = [by.get((key, v)) for v in versions]
        if not any(cells):
            continue
        lines.append(f"| {label} | " + " | ".join(
            _fmt(r["kind"], r["median"]) if r else "n/a" for r in cells) + " |")
    lines += ["", f"Medians of ratios measured side by side in one process (interleaved "
              f"rounds, thread CPU time) by `{COMMAND}` on {env['CPU']}, {env['date']}; "
              f"quartiles, uvloop and more figures in "
              f"[benchmarks/results/figures.md]({REPO_BLOB}/benchmarks/results/figures.md)."]
    return "\n".join(lines) + "\n"


def write_headline(rows: list[dict], env: dict, versions: list[str], full: dict,
                   path: Path) -> None:
    """headline.md, then README.md's copy between the markers: only for the
    checkout's own results folder (a run into another folder, such as a
    test's, leaves the README alone; an installed tree has no README)."""
    text = headline_text(rows, env, versions, full)
    path.write_text(text, encoding="utf-8")
    if path.resolve().parent == RESULTS.resolve():
        sync_readme(text)


def sync_readme(text: str, readme: Path = ROOT / "README.md") -> bool:
    """Put ``text`` between README.md's headline markers; False when the
    README or its markers are missing."""
    if not readme.exists():
        return False
    doc = readme.read_text(encoding="utf-8")
    start, end = doc.find(HEADLINE_START), doc.find(HEADLINE_END)
    if start < 0 or end < start:
        return False
    doc = doc[:start + len(HEADLINE_START)] + "\n" + text + doc[end:]
    readme.write_text(doc, encoding="utf-8")
    return True


def render(out: Path) -> int:
    """The outputs again from a run's figures.csv and figures.json."""
    rows = []
    with (out / "figures.csv").open(newline="") as f:
        for r in csv.DictReader(f):
            for k in ("median", "q1", "q3", "lo", "hi", "target", "mine_ns_per_op",
                      "anchor_ns_per_op", "base_ns_per_op"):
                r[k] = float(r[k]) if r.get(k) not in (None, "") else None
            r["meets"] = {"True": True, "False": False}.get(r["meets"])
            rows.append(r)
    env = json.loads((out / "figures.json").read_text())["env"]
    md = write_outputs(rows, env, out)
    print(f"written: {md}, {out / 'headline.md'} (and README.md's copy)")
    return 0


def parent(args) -> int:
    from pylimiter.spark.report import environment

    rows, skipped, uv = [], [], None
    for version in args.pythons:
        py = find_python(version)
        if py is None:
            skipped.append(version)
            where = "the sid root: wheels/pythons.sh amd64" if version in SID_VERSIONS else PYENV
            print(f"skip {version}: no interpreter (looked in {where})", flush=True)
            continue
        print(f"== CPython {version}: {py}", flush=True)
        vpy = prepare(version, py)
        # In the worktree's build/: a worker in the sid root sees the
        # worktree at the same path, not the host's /tmp.
        (ROOT / "build").mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile(suffix=".json", dir=ROOT / "build") as tmp:
            cmd = [*runner(version), vpy, "-m", "benchmarks.table", "--worker", tmp.name, "--scale",
                   str(args.scale), "--loops", ",".join(args.loops)]
            if args.figures:
                cmd += ["--figures", ",".join(args.figures)]
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            env.pop("PYLIMITER_NO_EXTENSIONS", None)
            subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, check=True)
            data = json.loads(Path(tmp.name).read_text())
        # Debian's interpreters are patched builds: every figure says so.
        build = "Debian sid package" if version in SID_VERSIONS else "pyenv, python.org sources"
        rows += [dict(r, build=build) for r in data["rows"]]
        uv = uv or data["uvloop"]
    if not rows:
        print(f"{PROG}: error: nothing measured", file=sys.stderr)
        return 1
    md = write_outputs(rows, environment(None, uvloop=uv), args.out)
    print(md.read_text())
    print(f"written: {md} and {md.with_suffix('.csv')}")
    return 0


def main(argv=None) -> int:
    from pylimiter.spark.cli import make_parser, positive_float, run
    from pylimiter.spark.cli import name_list as names

    from .figures import BY_KEY

    ap = make_parser(PROG, __doc__.split("\n\n")[0])
    ap.add_argument("--pythons", type=names(VERSIONS), default=VERSIONS,
                    help="CPython versions to measure")
    ap.add_argument("--loops", type=names(["asyncio", "uvloop"]), default=["asyncio", "uvloop"])
    ap.add_argument("--figures", type=names(list(BY_KEY)), default=None,
                    help="figure keys (default: all)")
    ap.add_argument("--scale", type=positive_float, default=1.0,
                    help="multiplies every figure's number of rounds")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--render", action="store_true",
                    help="measure nothing: rewrite figures.md, headline.md and README.md's "
                         "copy from the figures.csv and figures.json already in --out")
    ap.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.render:
        return run(lambda _: render(args.out), PROG, argv)
    return run(lambda _: worker(args) if args.worker else parent(args), PROG, argv)


if __name__ == "__main__":
    sys.exit(main())
