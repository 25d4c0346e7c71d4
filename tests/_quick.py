"""What the quick loop (`make check`, ``pytest -m "not slow"``) leaves out,
decided here from what a test uses rather than by hand.

Two kinds of cost, two sources of truth:

- **Structural**: a test that starts a JVM (the ``spark`` fixture, a Spark
  session of its own), a child process (``subprocess``, ``multiprocessing``,
  reached directly or through any helper of tests/: ``run_module``,
  ``run_script``, a fixture that starts a server in a child), a type check
  (mypy) or the C compiler tier (``c_core``).  Found by reading the names the
  test's code, its fixtures' code and the tests/ helpers they call refer to
  (their bytecode), so a new test of that kind is slow without anyone
  marking it.  These tests are also left out of the pure-mode stage of
  `make test`: a child runs on the compiled extension as a user's command
  does, a JVM pipeline and the C core do not depend on the twin, and a type
  check reads the sources.
- **Measured**: every other test that took more than ``QUICK_LIMIT_S`` in the
  last `make durations` run (tests/durations.json, committed).  These stay
  in the pure-mode stage: being slow says nothing about which twin a test
  needs.

A test of the quick loop that took well over the limit in this run, and is
not in durations.json yet, is named at the end of the run with the command
that measures again.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import types
from pathlib import Path
from typing import Optional

import pytest

DURATIONS = Path(__file__).resolve().with_name("durations.json")
#: A test measured above this many seconds (setup, call and teardown, on
#: the machine that ran `make durations`) leaves the quick loop.
QUICK_LIMIT_S = float(os.environ.get("PYLIMITER_QUICK_LIMIT_S", "0.25"))
#: durations.json keeps every test at or above this many seconds, so that
#: the limit can be lowered without measuring again.
RECORD_FLOOR_S = 0.1

#: module name -> why a test that uses it is slow.
HEAVY_MODULES = {
    "subprocess": "a child process",
    "multiprocessing": "a child process",
    "concurrent.futures.process": "a child process",
    "mypy": "a type check",
    "mypy.api": "a type check",
    "pyspark": "a JVM",
    "pyspark.sql": "a JVM",
}
#: objects outside tests/ that start something heavy, by qualified name.
HEAVY_OBJECTS = {
    "pylimiter.spark.session.spark_session": "a JVM",
}
#: fixtures that stand for a heavy resource.
HEAVY_FIXTURES = {"spark": "a JVM"}
#: markers that say what the test runs.
HEAVY_MARKERS = {"c_core": "a C compiler", "spark": "a JVM"}

_MAX_DEPTH = 5


def _is_ours(obj) -> bool:
    mod = getattr(obj, "__module__", None) or ""
    return mod == "tests" or mod.startswith("tests.") or mod == "conftest" \
        or mod.endswith(".conftest")


def _heavy_object(obj) -> Optional[str]:
    if isinstance(obj, types.ModuleType):
        name = obj.__name__
        return HEAVY_MODULES.get(name) or HEAVY_MODULES.get(name.partition(".")[0])
    mod = getattr(obj, "__module__", None)
    if not isinstance(mod, str):
        return None
    qual = f"{mod}.{getattr(obj, '__qualname__', '')}"
    if qual in HEAVY_OBJECTS:
        return HEAVY_OBJECTS[qual]
    if mod in HEAVY_MODULES and (inspect.isfunction(obj) or inspect.isclass(obj)
                                 or inspect.isbuiltin(obj)):
        return HEAVY_MODULES[mod]
    if mod.partition(".")[0] == "pyspark":
        return "a JVM"
    return None


def _codes(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _functions_of(obj):
    """The plain functions behind a function, a method or a class."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    inner = getattr(getattr(obj, "hypothesis", None), "inner_test", None)
    if inner is not None:
        yield from _functions_of(inner)
    if inspect.isfunction(obj):
        yield obj
    elif inspect.ismethod(obj):
        yield obj.__func__
    elif inspect.isclass(obj):
        for value in vars(obj).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            elif isinstance(value, property):
                value = value.fget
            if inspect.isfunction(value):
                yield value


class Scanner:
    """Reads what test code refers to, following the helpers of tests/;
    one per session, results cached per function."""

    def __init__(self):
        self._cache: dict[types.CodeType, Optional[str]] = {}

    def reason(self, obj) -> Optional[str]:
        """Why ``obj`` (a test function, a fixture, a helper, a class) is
        slow, or None."""
        for func in _functions_of(obj):
            why = self._function(func, 0)
            if why:
                return why
        return None

    def _function(self, func: types.FunctionType, depth: int) -> Optional[str]:
        code = func.__code__
        if code in self._cache:
            return self._cache[code]
        self._cache[code] = None   # a recursion back here finds nothing new
        why = self._scan(func, depth)
        self._cache[code] = why
        return why

    def _scan(self, func: types.FunctionType, depth: int) -> Optional[str]:
        glb = func.__globals__
        package = glb.get("__package__") or ""
        names: set[str] = set()
        for code in _codes(func.__code__):
            names.update(code.co_names)
        # What the names can be: globals, and modules imported inside the
        # function (absolute or relative to its package), whose attributes
        # the same code then names.
        found = []
        for name in names:
            if name in glb:
                found.append(glb[name])
            for full in (name, f"{package}.{name}" if package else None):
                mod = sys.modules.get(full) if full else None
                if mod is not None:
                    found.append(mod)
            if name in HEAVY_MODULES:   # imported inside, maybe not yet loaded
                return HEAVY_MODULES[name]
        modules = [m for m in found if isinstance(m, types.ModuleType)]
        for mod in modules:
            for name in names:
                attr = getattr(mod, name, None)
                if attr is not None:
                    found.append(attr)
        for obj in found:
            why = _heavy_object(obj)
            if why:
                return why
        if depth >= _MAX_DEPTH:
            return None
        for obj in found:
            if isinstance(obj, types.ModuleType) or not _is_ours(obj):
                continue
            for helper in _functions_of(obj):
                why = self._function(helper, depth + 1)
                if why:
                    return why
        return None


def structural_reason(item, scanner: Scanner) -> Optional[str]:
    """Why ``item`` is slow by what it runs, or None."""
    for marker, why in HEAVY_MARKERS.items():
        if item.get_closest_marker(marker):
            return why
    fixturenames = getattr(item, "fixturenames", ())
    for name, why in HEAVY_FIXTURES.items():
        if name in fixturenames:
            return why
    func = getattr(item, "function", None) or getattr(item, "obj", None)
    if func is not None:
        why = scanner.reason(func)
        if why:
            return why
    info = getattr(item, "_fixtureinfo", None)
    for defs in (getattr(info, "name2fixturedefs", None) or {}).values():
        for fixturedef in defs:
            fn = getattr(fixturedef, "func", None)
            if fn is not None and _is_ours(fn):
                why = scanner.reason(fn)
                if why:
                    return why
    return None


def load_durations(path: Optional[Path] = None) -> dict[str, float]:
    """tests/durations.json's node id -> seconds ({} if absent)."""
    try:
        data = json.loads((path or DURATIONS).read_text())
    except FileNotFoundError:
        return {}
    return {k: float(v) for k, v in data.get("tests", {}).items()}


def write_durations(path: Path, seconds: dict[str, float], command: str) -> int:
    """Write the tests at or above RECORD_FLOOR_S, slowest first; returns
    how many."""
    kept = {k: round(v, 2) for k, v in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
            if v >= RECORD_FLOOR_S}
    try:
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "unknown"
    data = {
        "about": "Seconds per test (setup + call + teardown) of the last `make durations`; "
                 "tests/_quick.py leaves those above QUICK_LIMIT_S out of the quick loop.",
        "command": command,
        "load_average_at_end": load,
        "floor_s": RECORD_FLOOR_S,
        "tests": kept,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    return len(kept)


class QuickLoop:
    """The pytest plugin: marks at collection, measures while running."""

    def __init__(self, config):
        self.config = config
        self.record = config.getoption("--record-durations")
        self.durations = {} if self.record else load_durations()
        self.scanner = Scanner()
        self.reasons: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.quick_ids: set[str] = set()

    def modify(self, items) -> None:
        for item in items:
            why = structural_reason(item, self.scanner)
            if why:
                item.add_marker(pytest.mark.slow)
            else:
                item.add_marker(pytest.mark.pure_mode)
                measured = self.durations.get(item.nodeid)
                if measured is not None and measured > QUICK_LIMIT_S:
                    why = f"over {QUICK_LIMIT_S:g} s (tests/durations.json)"
                    item.add_marker(pytest.mark.slow)
            if why:
                self.reasons[why] = self.reasons.get(why, 0) + 1
            elif not item.get_closest_marker("slow"):
                self.quick_ids.add(item.nodeid)

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session) -> None:
        if self.record and self.seconds:
            n = write_durations(Path(self.record), self.seconds,
                                "pytest " + " ".join(self.config.invocation_params.args))
            self.config._quick_recorded = n

    def pytest_terminal_summary(self, terminalreporter) -> None:
        tr = terminalreporter
        if self.record:
            n = getattr(self.config, "_quick_recorded", 0)
            tr.write_line(f"durations: {n} tests at or above {RECORD_FLOOR_S} s "
                          f"written to {self.record}")
            return
        warn_at = max(1.0, 2 * QUICK_LIMIT_S)
        late = sorted((s, k) for k, s in self.seconds.items()
                      if k in self.quick_ids and s > warn_at and k not in self.durations)
        if late:
            tr.write_sep("-", "quick loop")
            tr.write_line(f"{len(late)} test(s) of the quick loop took over {warn_at:g} s and "
                          f"are not in tests/durations.json (`make durations` measures again):")
            for s, k in reversed(late[-10:]):
                tr.write_line(f"  {s:6.2f} s  {k}")
