"""A standalone Spark master and one worker on 127.0.0.1 (pyspark's bundled
``spark-class``), stopped by PID (their process groups) whatever happens.
Used by the cluster test tier (conftest) and benchmarks/cluster_times.py.

The worker stands for a separate machine: its Python (``python3`` on its
PATH, and PYSPARK_PYTHON) is a bare venv without pylimiter, it runs in a
folder of its own with no PYTHONPATH, so nothing of this clone or its venvs
is importable there.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

START_TIMEOUT = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group the daemon leads (its executors and
    their Python workers included), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@dataclass
class Cluster:
    master: str
    ui: str
    bare_python: Path
    tmp: Path

    def state(self) -> dict:
        try:
            with urllib.request.urlopen(f"{self.ui}/json/", timeout=5) as r:
                return json.load(r)
        except urllib.error.HTTPError as e:
            # The master's UI answers 404 while it starts, and the error
            # holds that response open: closed here, not by the collector,
            # which on 3.14 warns (ResourceWarning, an error under the
            # suite's filters, raised in whatever test runs next).
            e.close()
            raise

    def driver_env(self) -> dict:
        """The drivers' environment: no PYSPARK_PYTHON (the executors'
        Python is what the pipeline chooses), every Spark port on
        127.0.0.1."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYLIMITER_NO_EXTENSIONS", "PYSPARK_PYTHON", "PYTHONPATH")}
        env["SPARK_LOCAL_IP"] = "127.0.0.1"
        return env

    def flags(self) -> list[str]:
        return ["--master", self.master, "--conf", "spark.driver.host=127.0.0.1",
                "--conf", "spark.driver.bindAddress=127.0.0.1"]


def _logs(tmp: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(tmp.glob("*.log")))


@contextlib.contextmanager
def standalone(tmp: Path, cores: int = 2, memory: str = "3g") -> Iterator[Cluster]:
    """A master and one worker (``cores``, ``memory``) under ``tmp``, up
    until the block ends."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    bare = tmp / "bare-python"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(bare)],
                   check=True, timeout=120)
    bare_python = bare / "bin" / "python"
    probe = subprocess.run([str(bare_python), "-c", "import pylimiter"], cwd=tmp,
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert probe.returncode != 0 and "No module named 'pylimiter'" in probe.stderr, \
        "the worker's Python must not see pylimiter"
    port, ui, worker_ui = _free_port(), _free_port(), _free_port()
    base_env = {"PATH": f"{bare / 'bin'}:/usr/local/bin:/usr/bin:/bin",
                "HOME": str(tmp), "SPARK_HOME": str(spark_home),
                "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp / "logs"),
                "SPARK_NO_DAEMONIZE": "1", "PYSPARK_PYTHON": str(bare_python)}
    if os.environ.get("JAVA_HOME"):
        base_env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    spark_class = str(spark_home / "bin" / "spark-class")
    procs = []

    def start(name, *args):
        log = open(tmp / f"{name}.log", "wb")
        proc = subprocess.Popen([spark_class, *args], cwd=tmp, env=base_env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        procs.append((proc, log))
        return proc

    master = f"spark://127.0.0.1:{port}"
    c = Cluster(master, f"http://127.0.0.1:{ui}", bare_python, tmp)
    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
              "--port", str(port), "--webui-port", str(ui))
        (tmp / "work").mkdir(exist_ok=True)
        start("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
              "--webui-port", str(worker_ui), "--cores", str(cores), "--memory", memory,
              "--work-dir", str(tmp / "work"), master)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            for proc, _ in procs:
                assert proc.poll() is None, _logs(tmp)
            try:
                if c.state().get("aliveworkers", 0) >= 1:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "no worker registered\n" + _logs(tmp)
            time.sleep(1)
        yield c
    finally:
        for proc, log in reversed(procs):
            _stop(proc)
            log.close()
