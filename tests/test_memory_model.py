"""The Relacy model of the core's acquire/release/wake handoff and of the
live bounded/unbounded switch (tests/model/plim_relacy.cpp): the faithful
model passes, and each deliberately weakened build fails, which shows the
check can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parent / "model" / "plim_relacy.cpp"
CXX = os.environ.get("CXX", "g++")
RELACY = Path("/usr/include/relacy/relacy.hpp")

pytestmark = [pytest.mark.c_core, pytest.mark.slow, pytest.mark.skipif(
    not MODEL.exists() or shutil.which(CXX) is None or not RELACY.exists(),
    reason="needs the model source, a C++ compiler and relacy-dev",
)]


def build(tmp_path: Path, weaken: int) -> Path:
    exe = tmp_path / f"model_w{weaken}"
    subprocess.run([CXX, "-std=c++11", "-O1", "-w", f"-DPLIM_MODEL_WEAKEN={weaken}",
                    str(MODEL), "-o", str(exe)], check=True)
    return exe


def run(exe: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("args", [("300000",), ("1", "bound")], ids=["random", "bound1"])
def test_model_passes(tmp_path, args):
    out = run(build(tmp_path, 0), *args)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "(handoff)" in out.stdout and "(switch)" in out.stdout
    assert "model check: PASSED" in out.stdout


@pytest.mark.parametrize(
    "weaken, verdict",
    [(1, "DATA RACE"), (2, "DATA RACE"), (3, "DATA RACE"), (4, "DEADLOCK"),
     (5, "USER ASSERT FAILED"), (6, "DEADLOCK")],
    ids=["try_acquire-relaxed", "release-relaxed", "grant-relaxed", "release-ignores-queue",
         "mode-beside-the-word", "unbounded-switch-leaves-queue"],
)
def test_weakened_model_fails(tmp_path, weaken, verdict):
    out = run(build(tmp_path, weaken), "300000")
    assert out.returncode == 1, out.stdout[-3000:]
    assert verdict in out.stdout
    assert "model check: FAILED" in out.stdout
