"""The async API is typed: `mypy --strict` accepts a typed usage sample and
rejects a misuse sample on exactly its marked lines (tests/typing/), and the
pure twin, the type source of `import pylimiter`, passes `--strict` itself.
Needs mypy (the `test` dependency group)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import pylimiter

api = pytest.importorskip("mypy.api")

pytestmark = pytest.mark.slow   # a whole type check: seconds, not milliseconds

SAMPLES = Path(__file__).resolve().parent / "typing"
PACKAGE = Path(pylimiter.__file__).resolve().parent
TWIN = ["__init__.py", "_common.py", "_compat.py", "_dual.py", "_errors.py",
        "_limiter_py.py"]


def mypy(tmp_path: Path, *targets: Path) -> tuple[int, list[str]]:
    env = dict(os.environ)
    root = PACKAGE.parent
    if "site-packages" not in root.parts:
        # A checkout (editable install): point mypy at the sources, whose
        # py.typed and .pyi it then reads as an installed package's.
        env["MYPYPATH"] = str(root)
    old = os.environ.copy()
    os.environ.clear()
    os.environ.update(env)
    try:
        out, err, status = api.run([
            "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
            "--python-version", "3.10", *map(str, targets)])
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert not err, err
    return status, [line for line in out.splitlines() if ": error:" in line]


def test_typed_usage_passes_strict(tmp_path):
    status, errors = mypy(tmp_path, SAMPLES / "good_usage.py")
    assert status == 0 and errors == []


def test_misuse_fails_on_every_marked_line(tmp_path):
    sample = SAMPLES / "misuse.py"
    expected = {}
    for n, line in enumerate(sample.read_text().splitlines(), 1):
        m = re.search(r"# E: ([\w-]+)$", line)
        if m:
            expected[n] = m.group(1)
    assert len(expected) >= 8
    status, errors = mypy(tmp_path, sample)
    assert status == 1
    got = {}
    for e in errors:
        m = re.match(r".*misuse\.py:(\d+): error: .*\[([\w-]+)\]$", e)
        assert m, e
        got[int(m.group(1))] = m.group(2)
    assert got == expected


def test_pure_twin_is_strictly_typed(tmp_path):
    if not (PACKAGE / "_limiter_py.py").exists():
        pytest.skip("sources not available")
    status, errors = mypy(tmp_path, *(PACKAGE / f for f in TWIN))
    assert status == 0 and errors == []
