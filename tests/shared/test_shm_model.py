"""The spin model of the host-wide limiter's cross-process protocol
(tests/model/plim_shm.pml): every interleaving of three processes, any of
which may die after any step (between a lock-free CAS on the counter word
and its ledger store too), with repairs that run while a live process is
inside a lock-free path.  The faithful model passes (about 21 million
states, a few minutes); each deliberately broken one fails with its own
verdict, which shows the check can fail (as tests/test_memory_model.py does
for the Relacy model of the in-process core).  `make test` installs spin
when it can (`make spin`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

MODEL = Path(__file__).resolve().parent.parent / "model" / "plim_shm.pml"
CC = os.environ.get("CC", "cc")

pytestmark = [pytest.mark.c_core, pytest.mark.slow, pytest.mark.skipif(
    not MODEL.exists() or shutil.which("spin") is None or shutil.which(CC) is None,
    reason="needs spin (apt-get install spin) and a C compiler",
)]


def check(tmp_path: Path, weaken: int) -> subprocess.CompletedProcess:
    """spin -a, compile the verifier (safety: assertions and invalid end
    states, states stored compressed), run the exhaustive search."""
    src = tmp_path / "plim_shm.pml"
    shutil.copy(MODEL, src)
    subprocess.run(["spin", f"-DWEAKEN={weaken}", "-a", src.name], cwd=tmp_path, check=True,
                   capture_output=True, timeout=120)
    subprocess.run([CC, "-O2", "-DSAFETY", "-DCOLLAPSE", "-w", "-o", "pan", "pan.c"],
                   cwd=tmp_path, check=True, timeout=300)
    return subprocess.run(["./pan", "-m200000", "-w22"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=1200)


def test_model_passes(tmp_path):
    out = check(tmp_path, 0)
    assert "errors: 0" in out.stdout, out.stdout[-3000:]
    assert "Search not completed" not in out.stdout, out.stdout[-3000:]
    assert "invalid end states\t+" in out.stdout and "assertion violations\t+" in out.stdout
    stored = int(next(line.split()[0] for line in out.stdout.splitlines()
                      if "states, stored" in line))
    assert stored > 1_000_000   # the whole space, not a trivial run
    print(f"spin: {stored} states, no error")


@pytest.mark.parametrize("weaken, verdict", [
    (1, "assertion violated ((avail==2)&&(qn==0))"),
    (2, "assertion violated (got==need)"),
    (3, "assertion violated (((("),
    (4, "invalid end state"),
    (5, "assertion violated (((("),
    (6, "assertion violated (((("),
], ids=["no-repair", "grant-stores-swapped", "repair-forgets-grants", "no-takeover",
        "repair-without-in-flight-wait", "grant-commits-before-the-word"])
def test_weakened_model_fails(tmp_path, weaken, verdict):
    out = check(tmp_path, weaken)
    assert "errors: 1" in out.stdout, out.stdout[-3000:]
    assert verdict in out.stdout, out.stdout[-3000:]
