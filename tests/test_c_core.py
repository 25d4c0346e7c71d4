"""The C tier: tests/c/*.c compiled against csrc/ with no Python, plain and
under ThreadSanitizer and AddressSanitizer+UBSan.  A sanitizer report fails
the test (halt_on_error / exitcode)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CSRC = ROOT / "csrc"
CTESTS = Path(__file__).resolve().parent / "c"
CC = os.environ.get("CC", "cc")

VARIANTS = {
    "plain": ["-O2"],
    "tsan": ["-O1", "-fsanitize=thread"],
    "asan": ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer"],
}
ENV = {
    "TSAN_OPTIONS": "halt_on_error=1 exitcode=66",
    "ASAN_OPTIONS": "detect_leaks=1 halt_on_error=1",
    "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1",
}

pytestmark = pytest.mark.skipif(
    not CSRC.exists() or shutil.which(CC) is None,
    reason="C sources or a C compiler are not available",
)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("test", ["test_sem", "test_stress"])
def test_c_tier(tmp_path, variant, test):
    exe = tmp_path / f"{test}_{variant}"
    cmd = [CC, "-std=c11", "-Wall", "-Wextra", "-Wconversion", "-Werror", "-g",
           *VARIANTS[variant], f"-I{CSRC}", str(CTESTS / f"{test}.c"),
           str(CSRC / "plim_sem.c"), str(CSRC / "plim_waitq.c"), "-o", str(exe),
           "-lpthread"]
    subprocess.run(cmd, check=True)
    out = subprocess.run([str(exe)], env={**os.environ, **ENV}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING: ThreadSanitizer" not in out.stderr
    assert "ERROR: AddressSanitizer" not in out.stderr
    assert "runtime error" not in out.stderr
    assert " 0 failed" in out.stdout
