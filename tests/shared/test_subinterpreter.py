"""pylimiter._shared_c in a subinterpreter: the import fails with a clear
ImportError, and a later import in the main interpreter still works (Cython
alone would have remembered the subinterpreter as the one interpreter
allowed).  In a fresh interpreter process: the order of first imports is
what is tested."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.c_extension

SCRIPT = textwrap.dedent(r'''
    import importlib.machinery, importlib.util, os, sys, tempfile
    try:
        import _testcapi
    except ImportError:
        print("SKIP no _testcapi"); sys.exit(0)
    if not hasattr(_testcapi, "run_in_subinterp"):
        print("SKIP no run_in_subinterp"); sys.exit(0)
    so = sys.argv[1]
    out = tempfile.mktemp()
    code = f"""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pylimiter._shared_c", {so!r})
    try:
        importlib.util.module_from_spec(spec)
        msg = "imported"
    except ImportError as exc:
        msg = "ImportError: " + str(exc)
    with open({out!r}, "w") as f:
        f.write(msg)
    """
    _testcapi.run_in_subinterp(code)
    print("SUB", open(out).read())
    os.unlink(out)
    import pylimiter._shared_c as m
    print("MAIN", m.SharedSemaphore.__name__)
''')


def test_subinterpreter_import_is_refused_and_main_still_imports(tmp_path):
    import pylimiter._shared_c as mod
    out = subprocess.run([sys.executable, "-c", SCRIPT, mod.__file__], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    if out.stdout.startswith("SKIP"):
        pytest.skip(out.stdout.strip())
    lines = out.stdout.splitlines()
    assert lines[0].startswith("SUB ImportError: pylimiter: the C extension "
                               "pylimiter._shared_c can only be imported in the main "
                               "interpreter"), out.stdout
    assert lines[1] == "MAIN SharedSemaphore", out.stdout
