"""The entry cache's C core alone (tests/c/test_cacheq.c against
csrc/plim_cacheq.c): plain -O2, AddressSanitizer+UBSan and ThreadSanitizer,
both with the core's assertions on (-DPLIM_DEBUG).  A sanitizer report fails
the test.  (The core is single-threaded by contract; the TSAN build keeps it
buildable and clean under the same flags as the limiter's TSAN tier.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"
CC = os.environ.get("CC", "cc")
VARIANTS = {
    "plain": ["-O2"],
    "asan": ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer", "-DPLIM_DEBUG=1", "-UNDEBUG"],
    "tsan": ["-O1", "-fsanitize=thread", "-fno-omit-frame-pointer", "-DPLIM_DEBUG=1",
             "-UNDEBUG"],
}

pytestmark = [pytest.mark.c_core, pytest.mark.skipif(
    not (CSRC / "plim_cacheq.c").exists() or shutil.which(CC) is None,
    reason="C sources or a C compiler are not available")]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_cacheq_core(tmp_path, variant):
    exe = tmp_path / f"test_cacheq_{variant}"
    subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Wconversion", "-Werror", "-g",
                    *VARIANTS[variant], f"-I{CSRC}", str(ROOT / "tests/c/test_cacheq.c"),
                    str(CSRC / "plim_cacheq.c"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "ASAN_OPTIONS": "detect_leaks=1 halt_on_error=1",
                              "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1",
                              "TSAN_OPTIONS": "halt_on_error=1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "ERROR: AddressSanitizer" not in out.stderr and "runtime error" not in out.stderr
    assert "WARNING: ThreadSanitizer" not in out.stderr
    assert " 0 failed" in out.stdout and not out.stdout.startswith("0 passed")
