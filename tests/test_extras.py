"""Hints name an install that works today: a missing extra's message says
which module is missing, which package provides it, `pip install '.[extra]'`
from a checkout and the extra's real packages, never the distribution name
(not on PyPI) and never a bare namespace such as "google"
(pylimiter/_extras.py, a copy of pyproject.toml's extras checked here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pylimiter import _extras
from pylimiter.spark.cli import UsageError, require

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"


def test_the_copy_of_the_extras_matches_pyproject():
    tomllib = pytest.importorskip("tomllib")
    if not PYPROJECT.is_file():
        pytest.skip("no pyproject.toml next to the tests (an installed wheel's run)")
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert {k: tuple(v) for k, v in declared.items()} == _extras.EXTRAS


def test_every_module_a_command_requires_has_a_provider_in_its_extra():
    from pylimiter.pulsar.topiclist.cli import NEEDS

    names = {_extras.requirement_name(r) for r in _extras.EXTRAS["topiclist"]}
    assert {_extras.provider(m) for m in NEEDS} <= names
    spark = {_extras.requirement_name(r) for r in _extras.EXTRAS["spark"]}
    for module in ("pyspark", "pandas", "pyarrow", "matplotlib", "rich"):
        assert _extras.provider(module) in spark


@pytest.mark.parametrize("module, dist", [
    ("google.protobuf", "protobuf"), ("google.protobuf.message", "protobuf"),
    ("re2", "google-re2"), ("google_crc32c", "google-crc32c"),
    ("prometheus_client", "prometheus_client"), ("aiohttp", "aiohttp"),
    ("pyspark.sql", "pyspark"), ("somewhere_else", "somewhere_else"),
])
def test_provider_names_the_distribution(module, dist):
    assert _extras.provider(module) == dist


def test_markers_pick_this_pythons_pandas():
    reqs = _extras.requirements("spark")
    pandas = [r for r in reqs if r.startswith("pandas")]
    assert pandas == (["pandas>=3.1"] if sys.version_info >= (3, 15) else ["pandas>=1.5,<3"])
    assert all(";" not in r for r in reqs)


def test_a_missing_namespace_names_the_module_and_its_package():
    text = _extras.missing("google.protobuf", "topiclist", cause="google")
    assert text.startswith("google.protobuf is missing (it comes from the protobuf package)")
    assert "google is missing" not in text


def test_a_missing_dependency_names_both():
    text = _extras.missing("pyspark", "spark", cause="py4j")
    assert text.startswith("py4j is missing (it comes from the py4j package, which pyspark needs)")


def test_a_broken_module_says_why():
    text = _extras.missing("google.protobuf", "topiclist", error="protobuf 6 is too old")
    assert text.startswith("google.protobuf cannot be imported (protobuf 6 is too old)")


@pytest.mark.parametrize("extra", sorted(_extras.EXTRAS))
def test_every_hint_is_an_install_that_works_today(extra):
    hint = _extras.install_hint(extra)
    assert f"pip install '.[{extra}]'" in hint
    for req in _extras.requirements(extra):
        assert f"'{req}'" in hint
    assert "pylimiter-pulsar" not in hint


def test_require_with_a_namespace_missing(monkeypatch):
    # As on a machine without protobuf: the `google` namespace itself is gone.
    for name in [m for m in sys.modules if m == "google" or m.startswith("google.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "google", None)
    with pytest.raises(UsageError) as err:
        require(["google.protobuf"], "topiclist")
    text = str(err.value)
    assert text.startswith("google.protobuf is missing (it comes from the protobuf package)")
    assert "'google-re2>=1.1'" in text and "pip install '.[topiclist]'" in text


def test_the_prometheus_import_error_names_the_install(monkeypatch):
    monkeypatch.delitem(sys.modules, "pylimiter.prometheus", raising=False)
    for name in [m for m in sys.modules if m.startswith("prometheus_client")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ImportError) as err:
        import pylimiter.prometheus  # noqa: F401
    text = str(err.value)
    assert "pip install '.[prometheus]'" in text and "'prometheus_client>=0.21'" in text
    assert "pylimiter-pulsar" not in text
