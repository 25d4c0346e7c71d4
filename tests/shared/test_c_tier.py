"""The host-wide limiter's C core alone (tests/c/test_shm_stress.c): several
processes with threads in each over one segment file, with kills, a death
holding the lock and hostile bytes, built warning-free with -std=c11 -Wall
-Wextra -Wconversion -Werror and run plain (gcc, clang), under
ThreadSanitizer and under AddressSanitizer+UBSan; cross-built for aarch64
and run there under qemu when qemu-aarch64 is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
CSRC = ROOT / "csrc"
CTESTS = ROOT / "tests" / "c"

# An installed wheel's test run (wheels/check_wheels.py) has the tests but
# not the C sources.
if not (CSRC / "plim_shm.c").exists():
    pytest.skip("the C sources are not next to the tests", allow_module_level=True)
WARN = ["-std=c11", "-Wall", "-Wextra", "-Wconversion", "-Werror", "-g"]
DEBUG = ["-DPLIM_DEBUG=1", "-UNDEBUG"]
VARIANTS = {
    "gcc": ("gcc", ["-O2"]),
    "clang": ("clang", ["-O2"]),
    "tsan": ("gcc", ["-O1", "-fsanitize=thread", *DEBUG]),
    "asan": ("gcc", ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                     "-fno-omit-frame-pointer", *DEBUG]),
}
ENV = {
    "TSAN_OPTIONS": "halt_on_error=1 exitcode=66",
    "ASAN_OPTIONS": "detect_leaks=1 halt_on_error=1",
    "UBSAN_OPTIONS": "halt_on_error=1 print_stacktrace=1",
}
SOURCES = [str(CTESTS / "test_shm_stress.c"), str(CSRC / "plim_shm.c")]

pytestmark = [pytest.mark.c_core, pytest.mark.slow]


def _check(out: subprocess.CompletedProcess) -> None:
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING: ThreadSanitizer" not in out.stderr
    assert "ERROR: AddressSanitizer" not in out.stderr
    assert "runtime error" not in out.stderr
    assert " 0 failed" in out.stdout and "hammer:" in out.stdout and "kills:" in out.stdout


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_shm_stress(tmp_path, variant):
    cc, flags = VARIANTS[variant]
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} is not installed")
    exe = tmp_path / f"shm_stress_{variant}"
    subprocess.run([cc, *WARN, *flags, f"-I{CSRC}", f"-I{CTESTS}", *SOURCES, "-o", str(exe),
                    "-lpthread"], check=True)
    out = subprocess.run([str(exe)], env={**os.environ, **ENV}, capture_output=True, text=True,
                         timeout=600)
    _check(out)
    print(out.stdout)


def test_shm_stress_on_aarch64(tmp_path):
    cc = "aarch64-linux-gnu-gcc"
    if shutil.which(cc) is None:
        pytest.skip("gcc-aarch64-linux-gnu is not installed")
    exe = tmp_path / "shm_stress_aarch64"
    subprocess.run([cc, *WARN, "-O2", "-static", f"-I{CSRC}", f"-I{CTESTS}", *SOURCES, "-o",
                    str(exe), "-lpthread"], check=True)
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if qemu is None:
        pytest.skip("built for aarch64 warning-free; qemu-user is not installed to run it")
    out = subprocess.run([qemu, str(exe)], capture_output=True, text=True, timeout=900)
    _check(out)
    print(out.stdout)
