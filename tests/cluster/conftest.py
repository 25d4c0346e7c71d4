"""A real Spark cluster for the pipelines' tests (tests/cluster/standalone.py):
a standalone master and one worker on 127.0.0.1 whose Python has no
pylimiter; pipelines reach pylimiter on the executors only through
``--executor-env`` (``make cluster-env``'s archive)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT / "build" / "cluster-env" / "pylimiter-env.tar.gz"


@pytest.fixture(scope="session")
def archive() -> Path:
    """make cluster-env's archive (built here if missing)."""
    if not ARCHIVE.is_file():
        subprocess.run(["make", "-s", "cluster-env"], cwd=ROOT, check=True, timeout=600,
                       stdout=subprocess.DEVNULL)
    return ARCHIVE


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    pytest.importorskip("pyspark")
    from tests.cluster.standalone import standalone

    with standalone(tmp_path_factory.mktemp("standalone")) as c:
        yield c
