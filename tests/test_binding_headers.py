"""The bindings' C headers (pylimiter/_binding/): one per concern, each
opening with what it is for and its rules, each compiling on its own (it
includes what it uses, so the .pyx can list them in any order), and each
reached from a .pyx.  The extensions' build and the suite show that the
headers work together; these tests keep the folder's shape."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BINDING = ROOT / "pylimiter" / "_binding"
HEADERS = sorted(BINDING.glob("*.h"))

# An installed wheel's test run (wheels/check_wheels.py) has the tests but
# not the sources: a wheel carries no binding header.
if not (ROOT / "pylimiter" / "_limiter_c.pyx").exists():
    pytest.skip("the package's sources are not next to the tests", allow_module_level=True)
CC = os.environ.get("CC", "cc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _python_includes() -> dict[str, Path]:
    """This interpreter's headers, and those of the other CPythons 3.10+
    installed beside it (pyenv's versions folder), by version: the headers
    switch on PY_VERSION_HEX (the StopIteration cache on 3.12-3.14, the
    special-method wrappers before 3.14)."""
    found = {f"{sys.version_info[0]}.{sys.version_info[1]}":
             Path(sysconfig.get_paths()["include"])}
    for inc in sorted(Path(sys.base_prefix).parent.glob("3.*/include/python3.*")):
        m = re.fullmatch(r"python3\.(\d+)", inc.name)
        if m and int(m.group(1)) >= 10 and (inc / "Python.h").exists():
            found.setdefault(f"3.{m.group(1)}", inc)
    return found


def test_the_folder_holds_the_headers():
    names = {h.name for h in HEADERS}
    # The concerns the limiter's binding and main_only.h's rule need.
    assert {"main_only.h", "await.h", "stop_cache.h", "dealloc.h", "permit_alloc.h",
            "no_new.h", "specials.h"} <= names, names


@pytest.mark.parametrize("header", HEADERS, ids=lambda h: h.name)
def test_each_header_opens_with_its_purpose_and_guard(header):
    text = header.read_text()
    assert text.startswith(f"/* {header.name}: "), "the first line names the file and its purpose"
    comment = text[:text.index("*/")]
    assert len(comment.splitlines()) >= 4, "the opening comment says what it is for and its rules"
    guard = f"PLIM_BINDING_{header.stem.upper()}_H"
    assert f"#ifndef {guard}\n#define {guard}\n" in text
    assert text.rstrip().endswith(f"#endif /* {guard} */")
    assert "#include <Python.h>" in text, "binding code: Python.h first, as the .pyx has it"


def test_every_header_is_reached_from_a_pyx():
    reached, todo = set(), []
    for pyx in (ROOT / "pylimiter").rglob("*.pyx"):
        text = pyx.read_text()
        todo += re.findall(r'cdef extern from "_binding/([^"]+)"', text)
        todo += re.findall(r'#include "_binding/([^"]+)"', text)
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        todo += [n for n in INCLUDE.findall((BINDING / name).read_text()) if (BINDING / n).exists()]
    assert reached == {h.name for h in HEADERS}


@pytest.mark.skipif(shutil.which(CC) is None, reason="no C compiler")
@pytest.mark.parametrize("version", sorted(_python_includes()))
def test_each_header_compiles_on_its_own(tmp_path, version):
    """Each header first in its own translation unit, twice (its include
    guard), with the build's warnings as errors; unused static functions
    are expected (a unit uses none)."""
    units = []
    for h in HEADERS:
        unit = tmp_path / f"{h.stem}.c"
        unit.write_text(f'#include "{h.name}"\n#include "{h.name}"\n')
        units.append(str(unit))
    cmd = [CC, "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function",
           "-fsyntax-only", f"-I{BINDING}", f"-I{_python_includes()[version]}", *units]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
