"""benchmarks.ab_builds works: two builds of the extension (here the same
file copied to two directories) load side by side in one interpreter and
every part prints its B/A ratio.  No assertion on speed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pylimiter._impls import C

pytestmark = pytest.mark.c_extension
ROOT = Path(__file__).resolve().parent.parent
if not (ROOT / "benchmarks" / "ab_builds.py").exists():
    pytest.skip("benchmarks/ is not next to the tests (an installed wheel's run)",
                allow_module_level=True)


def test_two_builds_in_one_process(tmp_path):
    so = Path(C.module.__file__)
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        shutil.copy(so, tmp_path / side / so.name)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.ab_builds", str(tmp_path / "a"), str(tmp_path / "b"),
         "--rounds", "3", "--ops", "200"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "B/A" in ln and ln.startswith("  ")]
    assert [ln.split()[0] for ln in lines] == ["await", "with", "sem", "blocking", "cancel",
                                              "tasks"]


def test_bad_arguments_and_a_missing_build_fail_with_one_line(tmp_path):
    bad = subprocess.run([sys.executable, "-m", "benchmarks.ab_builds", str(tmp_path),
                          str(tmp_path), "--parts", "nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "parts are" in bad.stderr
    missing = subprocess.run([sys.executable, "-m", "benchmarks.ab_builds", str(tmp_path),
                              str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode != 0 and "no _limiter_c" in missing.stderr


def test_two_cache_builds_in_one_process(tmp_path):
    from pylimiter.pulsar.cache import _cache_c
    so = Path(_cache_c.__file__)
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
        shutil.copy(so, tmp_path / side / so.name)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.ab_cache_builds", str(tmp_path / "a"),
         str(tmp_path / "b"), "--rounds", "2", "--ops", "50", "--parts", "get_range-10,get,insert"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if "B/A" in ln and ln.startswith("  ")]
    assert [ln.split()[0] for ln in lines] == ["get_range-10", "get", "insert"]
    missing = subprocess.run([sys.executable, "-m", "benchmarks.ab_cache_builds", str(tmp_path),
                              str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode != 0 and "no _cache_c" in missing.stderr
