"""The C tier, the one runner for every core in csrc/: tests/c/*.c compiled
against csrc/ with no Python, plain and under ThreadSanitizer and
AddressSanitizer+UBSan, for the limiter's core (plim_sem.c, plim_waitq.c)
and the entry cache's (plim_cacheq.c; single-threaded by contract, its TSAN
build keeps it buildable and clean under the same flags).  A sanitizer
report fails the test (halt_on_error / exitcode)."""

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

# The sanitizer builds also turn on the core's own assertions (PLIM_DEBUG:
# a stray second unlink, a queue length gone negative), so a broken
# invariant stops the run even where no sanitizer would notice it.
DEBUG = ["-DPLIM_DEBUG=1", "-UNDEBUG"]
VARIANTS = {
    "plain": ["-O2"],
    "tsan": ["-O1", "-fsanitize=thread", *DEBUG],
    "asan": ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer", *DEBUG],
}
ENV = {
    "TSAN_OPTIONS": "halt_on_error=1 exitcode=66",
    "ASAN_OPTIONS": "detect_leaks=1 halt_on_error=1",
    "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1",
}

#: Each C test and the core sources it links.
TESTS = {
    "test_sem": ["plim_sem.c", "plim_waitq.c"],
    "test_stress": ["plim_sem.c", "plim_waitq.c"],
    "test_cacheq": ["plim_cacheq.c"],
}

pytestmark = [pytest.mark.c_core, pytest.mark.slow, pytest.mark.skipif(
    not CSRC.exists() or shutil.which(CC) is None,
    reason="C sources or a C compiler are not available",
)]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("test", sorted(TESTS))
def test_c_tier(tmp_path, variant, test):
    exe = tmp_path / f"{test}_{variant}"
    cmd = [CC, "-std=c11", "-Wall", "-Wextra", "-Wconversion", "-Werror", "-g",
           *VARIANTS[variant], f"-I{CSRC}", str(CTESTS / f"{test}.c"),
           *(str(CSRC / src) for src in TESTS[test]), "-o", str(exe), "-lpthread"]
    subprocess.run(cmd, check=True)
    out = subprocess.run([str(exe)], env={**os.environ, **ENV}, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING: ThreadSanitizer" not in out.stderr
    assert "ERROR: AddressSanitizer" not in out.stderr
    assert "runtime error" not in out.stderr
    assert " 0 failed" in out.stdout and not out.stdout.startswith("0 passed")


@pytest.mark.parametrize("variant", ["tsan", "asan"])
def test_sanitizer_builds_run_the_core_assertions(tmp_path, variant):
    """The debug flags reach the core: unlinking a waiter that is not queued
    trips PLIM_ASSERT in the sanitizer builds (a plain build would not
    notice)."""
    src = tmp_path / "stray_unlink.c"
    src.write_text(
        '#include "plim_waitq.h"\n'
        "int main(void) {\n"
        "    plim_sem_t s; plim_waiter_t w;\n"
        "    plim_sem_init(&s, 1, 0); plim_waiter_init(&w, 0);\n"
        "    plim_mutex_lock(&s.mu);\n"
        "    plim_waitq_unlink(&s, &w);   /* never linked */\n"
        "    return 0;\n"
        "}\n")
    exe = tmp_path / f"stray_{variant}"
    subprocess.run([CC, "-std=c11", "-g", *VARIANTS[variant], f"-I{CSRC}", str(src),
                    str(CSRC / "plim_sem.c"), str(CSRC / "plim_waitq.c"), "-o", str(exe),
                    "-lpthread"], check=True)
    out = subprocess.run([str(exe)], env={**os.environ, **ENV}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0
    assert "plim_waitq_linked" in out.stderr, out.stderr[-2000:]
