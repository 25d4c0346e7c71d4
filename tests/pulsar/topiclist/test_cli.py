"""The command line: start-up, --version and --help, usage and runtime errors
in one line, SIGTERM.

Servers bind 127.0.0.1 on free ports.  The service uses pylimiter's public
AsyncDualMemoryLimiter, so `make test` runs these tests against the C
implementation and again, under PYLIMITER_NO_EXTENSIONS=1, the pure-Python one."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from pylimiter.pulsar.topiclist.cli import NEEDS  # noqa: E402  (the extra's modules)

for _module in NEEDS:
    pytest.importorskip(_module)

from pylimiter.pulsar.topiclist import protocol  # noqa: E402
from pylimiter.pulsar.topiclist.cli import PROG, describe_load, main  # noqa: E402
from pylimiter.pulsar.topiclist.protocol import CommandType  # noqa: E402
from pylimiter.spark.cli import run  # noqa: E402

from .kit import (  # noqa: E402
    get_topics_cmd,
    http,
)


@pytest.mark.slow
def test_cli_broker_starts_with_no_arguments():
    proc = subprocess.Popen([sys.executable, "-m", "pylimiter.pulsar.topiclist", "broker"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        m = re.search(r"broker: pulsar://127\.0\.0\.1:(\d+)\s+admin: http://127\.0\.0\.1:(\d+)",
                      lines[1])
        assert m, lines
        assert "public/default (1000 topics)" in lines[0]
        assert lines[2].startswith("limits: heap_mb 100 MB, direct_mb 100 MB"), lines
        status, body = http("GET", f"http://127.0.0.1:{m[2]}/admin/namespaces/public/default/topics")
        assert status == 200 and len(json.loads(body)) == 1000
    finally:
        proc.terminate()
        proc.communicate(timeout=10)   # also closes the pipes


def test_cli_version_and_defaults_in_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and "pylimiter-pulsar" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["load", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "client connections (default: 10)" in text and "seconds (default: 10.0)" in text
    with pytest.raises(SystemExit):
        main(["broker", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default 100 MB)" in text and "(default 5242880 bytes)" in text
    assert "how many topics to generate (default: 1000)" in text


@pytest.mark.parametrize("argv, needle", [
    (["broker", "--direct-mb", "1e13"], "direct_mb must be a number from 0 to"),
    (["broker", "--heap-timeout-ms", "inf"], "must be an integer"),
    (["broker", "--heap-queue", "2.9"], "must be an integer"),
    (["broker", "--topics", "-1"], "must be >= 0"),
    (["broker", "--port", "70000"], "0..65535"),
    (["load", "--url", "pulsar://127.0.0.1:1", "--connections", "0"], "at least 1"),
    (["load", "--url", "pulsar://127.0.0.1:1", "--read-delay", "-1"], "finite number >= 0"),
    (["proxy", "--broker", "http://x"], "expected pulsar://host:port"),
    (["load", "--url", "nope"], "expected pulsar://host:port"),
])
def test_bad_flags_are_one_line_usage_errors(capsys, argv, needle):
    try:
        status = run(main, PROG, argv)
    except SystemExit as exc:          # argparse's own usage errors
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    assert run(main, PROG, ["broker", "--config", str(tmp_path / "none.conf")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_cli_without_the_topiclist_extra_names_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "re2", None)          # as if google-re2 were missing
    assert run(main, PROG, ["broker"]) == 2
    err = capsys.readouterr().err
    assert "re2 is missing (it comes from the google-re2 package)" in err
    assert "pip install '.[topiclist]'" in err and "Traceback" not in err
    assert "pylimiter-pulsar[" not in err


def test_cli_runtime_errors_exit_1_in_one_line(capsys):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        assert run(main, PROG, ["broker", "--topics", "1", "--port", str(port)]) == 1
    finally:
        taken.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "address already in use" in err[0].lower()
    assert run(main, PROG, ["load", "--url", f"pulsar://127.0.0.1:{port}", "--duration",
                            "1"]) == 1
    assert "Connect" in capsys.readouterr().err


def test_load_summary_has_units():
    text = describe_load({"connections": 2, "duration_s": 1.5, "requests": 4, "responses": 3,
                          "rps": 2.0, "bytes": 3 * 1024 * 1024, "too_many_requests": 1,
                          "other_errors": 0, "p50_ms": 12.5, "p99_ms": 250.0, "max_ms": 1500.0,
                          "server": {"heap_memory_peak_bytes": 2048.0}})
    assert text["duration"] == "1.5 s" and text["received"] == "3.0 MiB"
    assert text["responses"] == "3 (2.0 resp/s)"
    assert text["latency p50"] == "12.5 ms" and text["latency max"] == "1.5 s"
    assert text["server heap_memory_peak_bytes"] == "2.0 KiB"


@pytest.mark.slow
def test_sigterm_with_requests_in_flight_stops_without_a_traceback():
    """Clients that never read (a 4 KiB receive buffer) keep the broker's
    4 MB writes, and the requests queued behind them, in flight; SIGTERM
    then stops it with status 0 and nothing on stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pylimiter.pulsar.topiclist", "broker", "--topics", "100000",
         "--heap-mb", "0.5", "--direct-mb", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients = []
    try:
        proc.stdout.readline()
        m = re.search(r"pulsar://127\.0\.0\.1:(\d+)\s+admin: (http://\S+)",
                      proc.stdout.readline())
        assert m
        for _ in range(4):
            s_ = socket.socket()
            s_.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s_.connect(("127.0.0.1", int(m[1])))
            s_.sendall(protocol.encode(protocol.cmd(CommandType.CONNECT, "connect",
                                                    client_version="t")))
            s_.sendall(b"".join(protocol.encode(get_topics_cmd(i)) for i in range(1, 4)))
            clients.append(s_)
        deadline, in_flight = time.monotonic() + 30, 0
        while time.monotonic() < deadline and in_flight < 6:
            with urllib.request.urlopen(f"{m[2]}/admin/stats", timeout=10) as r:
                in_flight = json.loads(r.read())["in_flight"]
            time.sleep(0.05)
        assert in_flight >= 6
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        for s_ in clients:
            s_.close()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert err == "", err
    assert "stopping (4 connections, " in out


@pytest.mark.parametrize("argv, needle", [
    (["load"], "give --url pulsar://host:port"),
    (["load", "--preset", "limits", "--url", "pulsar://127.0.0.1:1"], "drop --url"),
    (["load", "--url", "pulsar://127.0.0.1:1", "--topics", "5"], "--topics goes with --preset"),
    (["load", "--preset", "nope"], "invalid choice"),
    (["load", "--preset", "limits", "--namespace", "nope"], "is not tenant/namespace"),
])
def test_load_preset_usage_errors_are_one_line(capsys, argv, needle):
    try:
        status = run(main, PROG, argv)
    except SystemExit as exc:          # argparse's own usage errors
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_load_help_names_the_presets(capsys):
    with pytest.raises(SystemExit):
        main(["load", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--preset {limits}" in text
    assert "limits: start a broker with small pools" in text
    assert "--read-delay, when given, override the preset's" in text


@pytest.mark.slow
def test_cli_load_preset_prints_waits_refusals_and_peaks_against_the_limits():
    """The demo, small: `load --preset limits` with 1,000 topics, 8
    connections for 1 s prints one row per pool and the broker's memory,
    and --json the same figures."""
    cmd = [sys.executable, "-m", "pylimiter.pulsar.topiclist", "load", "--preset", "limits",
           "--topics", "1000", "--connections", "8", "--duration", "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert re.match(r"pool +limit +peak held +grants +waited +mean wait +p99 wait +timed out "
                    r"+queue full$", next(ln for ln in lines if ln.startswith("pool")))
    for pool_ in ("heap", "direct"):
        row = next(ln for ln in lines if ln.startswith(pool_ + " "))
        assert re.search(r"\((\d+)%\)", row) and int(re.search(r"\((\d+)%\)", row)[1]) <= 100
    assert re.search(r"clients: \d+ requests: \d+ answered .* \d+ refused with TooManyRequests",
                     out.stdout)
    assert "broker memory: RSS" in out.stdout and "heap + direct limits" in out.stdout
    assert "Traceback" not in out.stderr
    js = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120)
    assert js.returncode == 0, js.stderr
    r = json.loads(js.stdout)
    assert r["preset"] == "limits" and r["topics"] == 1000 and r["connections"] == 8
    assert set(r["pools"]) == {"heap", "direct"}
    assert all(p["peak"] <= p["limit"] for p in r["pools"].values())
