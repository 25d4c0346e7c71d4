"""A real Spark cluster for the pipelines' tests (tests/cluster/standalone.py):
a standalone master and one worker on 127.0.0.1 whose Python has no
pylimiter; pipelines reach pylimiter on the executors only through
``--executor-env`` (``make cluster-env``'s archive)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT / "build" / "cluster-env" / "pylimiter-env.tar.gz"


@pytest.fixture(scope="session")
def archive() -> Path:
    """make cluster-env's archive for the interpreter running the tests
    (built here if missing).  Executors must run the driver's Python
    version, so under another venv than the checkout's .venv (`make
    test-pythons`: .venv-3.X) the archive is that venv's own, in
    build/cluster-env-3.X, not the default one another version built."""
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():
        where, make_vars = ARCHIVE, []
    else:
        env = ROOT / "build" / f"cluster-env-{sys.version_info[0]}.{sys.version_info[1]}"
        where = env / ARCHIVE.name
        make_vars = [f"VENV={sys.prefix}", f"PYTHON={sys._base_executable}",
                     f"CLUSTER_ENV={env.relative_to(ROOT)}"]
    if not where.is_file():
        subprocess.run(["make", "-s", "cluster-env", *make_vars], cwd=ROOT, check=True,
                       timeout=600, stdout=subprocess.DEVNULL)
    return where


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    pytest.importorskip("pyspark")
    from tests.cluster.standalone import standalone

    with standalone(tmp_path_factory.mktemp("standalone")) as c:
        yield c
