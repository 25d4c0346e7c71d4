"""PYLIMITER_NO_EXTENSIONS, read once (pylimiter/_compat.py) by the import
and by setup.py: 1/true/yes/on select the pure twins, unset/empty/0/false/
no/off the C ones, anything else is refused; an unbuilt source tree says
how to build it or how to ask for pure Python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pylimiter

# The package under test, a checkout or an installed wheel: its Python files.
PACKAGE = Path(pylimiter.__file__).resolve().parent
PROBE = ("import pylimiter, pylimiter.pulsar.cache as c; "
         "print(pylimiter.IMPLEMENTATION, c.IMPLEMENTATION)")


def _run(value: str | None, cwd: Path | None = None, path: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"}
    if value is not None:
        env["PYLIMITER_NO_EXTENSIONS"] = value
    args = [sys.executable]
    if path is not None:
        # -S: no site-packages, so an installed or editable pylimiter
        # cannot answer instead of the tree under test.
        args.append("-S")
        env["PYTHONPATH"] = str(path)
    return subprocess.run([*args, "-c", PROBE], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.mark.c_extension
@pytest.mark.parametrize("value", [None, "", "0", "false", "FALSE", "no", "off", " Off "])
def test_unset_or_a_no_selects_the_c_twins(value):
    r = _run(value)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["c", "c"]


@pytest.mark.parametrize("value", ["1", "true", "True", "yes", "on"])
def test_a_yes_selects_the_pure_twins(value):
    r = _run(value)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["python", "python"]


@pytest.mark.parametrize("value", ["2", "maybe", "pure"])
def test_any_other_value_is_refused_in_one_line(value):
    r = _run(value)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pylimiter: PYLIMITER_NO_EXTENSIONS=")
    assert repr(value) in last and "PYLIMITER_NO_EXTENSIONS=1" in last


@pytest.fixture(scope="module")
def unbuilt_tree(tmp_path_factory):
    """A copy of the package's sources with no compiled module."""
    root = tmp_path_factory.mktemp("unbuilt")
    shutil.copytree(PACKAGE, root / "pylimiter",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.c", "__pycache__"))
    return root


def test_an_unbuilt_tree_names_both_fixes(unbuilt_tree):
    r = _run(None, cwd=unbuilt_tree, path=unbuilt_tree)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pylimiter: the C extension pylimiter._limiter_c "
                           "is not built")
    assert "pip install ." in last and "PYLIMITER_NO_EXTENSIONS=1" in last


def test_an_unbuilt_tree_runs_pure_when_asked(unbuilt_tree):
    r = _run("1", cwd=unbuilt_tree, path=unbuilt_tree)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["python", "python"]
