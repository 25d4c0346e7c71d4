"""tests/_quick.py decides what the quick loop leaves out: a test is slow by
what it runs (a JVM, a child process, a type check, the C compiler tier),
found in its code, its fixtures and the tests/ helpers they call, or by what
it took (tests/durations.json); only the first kind leaves the pure-mode
stage too."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from tests import _helpers, _quick, _robust


def _child_by_local_import():
    import subprocess as sp

    return sp.run


def _calls_a_helper_that_starts_a_child():
    return _helpers.run_module("pylimiter", "--version")


def _starts_nothing():
    return _helpers.run(None)


def _nested_child():
    def inner():
        return subprocess.Popen
    return inner


class _Harness:
    def start(self):
        return _robust.run_script("pass")


def _uses_a_harness_class():
    return _Harness().start()


@pytest.mark.parametrize("func, why", [
    (_helpers.run_module, "a child process"),
    (_robust.run_script, "a child process"),
    (_child_by_local_import, "a child process"),
    (_calls_a_helper_that_starts_a_child, "a child process"),
    (_nested_child, "a child process"),
    (_uses_a_harness_class, "a child process"),
    (_starts_nothing, None),
    (_helpers.check_invariant, None),
])
def test_scanner_follows_helpers(func, why):
    assert _quick.Scanner().reason(func) == why


def test_a_type_check_is_found():
    mod = pytest.importorskip("tests.test_typing")
    tests = [v for k, v in vars(mod).items() if k.startswith("test_")]
    found = [_quick.Scanner().reason(t) for t in tests]
    assert found.count("a type check") >= 3   # the three mypy runs


class FakeItem:
    """What QuickLoop reads of a pytest item."""

    def __init__(self, nodeid, function=None, markers=(), fixtures=()):
        self.nodeid = nodeid
        self.function = function or SAMPLES["nothing"]
        self.fixturenames = [name for name, _ in fixtures]
        self._fixtureinfo = SimpleNamespace(name2fixturedefs={
            name: [SimpleNamespace(func=fn)] for name, fn in fixtures})
        self.markers = list(markers)

    def add_marker(self, mark):
        self.markers.append(mark.name)

    def get_closest_marker(self, name):
        return name if name in self.markers else None


def _fixture_that_starts_a_server():
    return _helpers.run_module("pylimiter.pulsar.topiclist", "broker")


#: The samples by name: a test that named the functions themselves would be
#: found slow too (the scanner cannot tell a call from a mention).
SAMPLES = {"child": _calls_a_helper_that_starts_a_child, "nothing": _starts_nothing,
           "server": _fixture_that_starts_a_server}


@pytest.fixture
def loop(tmp_path, monkeypatch):
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"tests": {"t::measured_slow": 2.5, "t::measured_quick": 0.01}}))
    monkeypatch.setattr(_quick, "DURATIONS", path)
    monkeypatch.setattr(_quick, "QUICK_LIMIT_S", 0.3)
    config = SimpleNamespace(getoption=lambda name: None)
    return _quick.QuickLoop(config)


def test_structural_and_measured_marks(loop):
    items = {
        "plain": FakeItem("t::plain"),
        "child": FakeItem("t::child", SAMPLES["child"]),
        "jvm": FakeItem("t::jvm", fixtures=[("spark", SAMPLES["nothing"])]),
        "compiler": FakeItem("t::compiler", markers=["c_core"]),
        "fixture": FakeItem("t::fixture", fixtures=[("server", SAMPLES["server"])]),
        "measured_slow": FakeItem("t::measured_slow"),
        "measured_quick": FakeItem("t::measured_quick"),
    }
    loop.modify(list(items.values()))
    marks = {k: set(v.markers) for k, v in items.items()}
    assert marks == {
        "plain": {"pure_mode"},
        "child": {"slow"},
        "jvm": {"slow"},
        "compiler": {"c_core", "slow"},
        "fixture": {"slow"},
        "measured_slow": {"pure_mode", "slow"},
        "measured_quick": {"pure_mode"},
    }
    assert loop.reasons == {"a child process": 2, "a JVM": 1, "a C compiler": 1,
                            "over 0.3 s (tests/durations.json)": 1}


def test_recording_marks_nothing_by_time(tmp_path):
    config = SimpleNamespace(getoption=lambda name: str(tmp_path / "d.json"))
    loop = _quick.QuickLoop(config)
    item = FakeItem("t::measured_slow")
    loop.durations = {}   # what --record-durations starts from
    loop.modify([item])
    assert item.markers == ["pure_mode"]


def test_write_and_load_durations(tmp_path):
    path = tmp_path / "d.json"
    n = _quick.write_durations(path, {"a": 0.05, "b": 1.234, "c": 0.2}, "pytest -m x")
    assert n == 2
    data = json.loads(path.read_text())
    assert list(data["tests"]) == ["b", "c"] and data["tests"]["b"] == 1.23
    assert data["command"] == "pytest -m x"
    assert _quick.load_durations(path) == {"b": 1.23, "c": 0.2}
    assert _quick.load_durations(tmp_path / "missing.json") == {}


def test_the_committed_durations_file_reads():
    assert all(v >= _quick.RECORD_FLOOR_S for v in _quick.load_durations().values())
