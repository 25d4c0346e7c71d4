"""The async API is typed: `mypy --strict` accepts a typed usage sample and
rejects a misuse sample on exactly its marked lines (tests/typing/), and the
pure twin, the type source of `import pylimiter`, passes `--strict` itself.
Needs mypy (the `test` dependency group)."""

from __future__ import annotations

import contextlib
import io
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


@contextlib.contextmanager
def sources_on_mypy_path():
    """In a checkout (editable install), point mypy at the sources, whose
    py.typed and .pyi it then reads as an installed package's."""
    old = os.environ.get("MYPYPATH")
    root = PACKAGE.parent
    if "site-packages" not in root.parts:
        os.environ["MYPYPATH"] = str(root)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("MYPYPATH", None)
        else:
            os.environ["MYPYPATH"] = old


def mypy(tmp_path: Path, *targets: Path) -> tuple[int, list[str]]:
    with sources_on_mypy_path():
        out, err, status = api.run([
            "--strict", "--no-error-summary", "--cache-dir", str(tmp_path / "cache"),
            "--python-version", "3.10", *map(str, targets)])
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


@pytest.mark.c_extension
def test_compiled_stub_matches_the_module(tmp_path):
    """mypy's stubtest: every name and signature of _limiter_c.pyi exists at
    run time with the same shape (the stub cannot drift from the module)."""
    stubtest = pytest.importorskip("mypy.stubtest")
    args = ["pylimiter._limiter_c", "--mypy-config-file", os.devnull]
    try:   # PEP 800 markers would need a newer typing_extensions than users have
        options = stubtest.parse_options([*args, "--ignore-disjoint-bases"])
    except SystemExit:   # a stubtest from before PEP 800
        options = stubtest.parse_options(args)
    out = io.StringIO()
    with sources_on_mypy_path(), contextlib.redirect_stdout(out):
        status = stubtest.test_stubs(options)
    assert status == 0, out.getvalue()
