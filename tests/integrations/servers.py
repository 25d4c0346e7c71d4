"""Real servers in subprocesses for the integration tests: started on
127.0.0.1 on a free port, waited for (bounded), stopped by PID (SIGTERM to
the process group they lead, then SIGKILL) and reaped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


class Server:
    """One server process (and the workers it forks, in its own session)."""

    def __init__(self, argv: list[str], port: int, log: Path, env: dict[str, str],
                 ready_path: str = "/stats"):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        full_env = {k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"}
        full_env.update(env)
        # The checkout, for tests.integrations.server_app; an inherited
        # PYTHONPATH keeps its place in front.
        full_env["PYTHONPATH"] = os.pathsep.join(
            [p for p in [os.environ.get("PYTHONPATH")] if p] + [str(ROOT)])
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=log.parent, env=full_env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._wait_ready(ready_path)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, path: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            try:
                get(self.base + path, timeout=2)
                return
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server not ready in {START_TIMEOUT} s:\n"
                                       f"{self.output()}") from None
                time.sleep(0.1)

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-4000:]
        return ""

    def stop(self) -> None:
        """SIGTERM to the process group the server leads (its workers too),
        SIGKILL if it lingers; the server is reaped either way."""
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, sig)
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        else:
            # The leader is gone; its workers must not outlive the test.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def uvicorn(app: str, log: Path, env: dict[str, str], *factory_args: str) -> Server:
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "--factory", app, "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning", *factory_args]
    return Server(argv, port, log, env)
