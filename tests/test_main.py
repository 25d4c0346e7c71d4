"""`python -m pylimiter` lists the commands, one line each, and the
`pylimiter` console script runs each as its `python -m pylimiter.<...>`
entry point does; an unknown command is the usage and status 2.  The
dispatcher in this process first, then the two commands as a user runs them
(child processes: slow, by tests/_quick.py)."""

from __future__ import annotations

import importlib.util
import os
import pkgutil
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pylimiter
from pylimiter.__main__ import COMMANDS, main

ROOT = Path(__file__).resolve().parent.parent


def test_no_arguments_list_every_command_in_one_line_each(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: pylimiter COMMAND")
    for name, (_, text) in COMMANDS.items():
        lines = [ln for ln in out.splitlines() if ln.split()[:1] == [name]]
        assert len(lines) == 1 and text in lines[0]


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_is_the_list(flag, capsys):
    assert main([flag]) == 0
    assert "commands:" in capsys.readouterr().out


def test_version(capsys):
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == (f"pylimiter (pylimiter-pulsar {pylimiter.__version__}, "
                   f"{pylimiter.IMPLEMENTATION} implementation)\n")


def test_an_unknown_command_is_the_usage_and_status_2(capsys):
    assert main(["simulate"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("usage: pylimiter COMMAND")
    assert captured.err.rstrip().endswith(
        "pylimiter: error: unknown command 'simulate' (choose from "
        + ", ".join(COMMANDS) + ")")


def test_every_command_is_a_python_dash_m_entry_point():
    for package, _ in COMMANDS.values():
        assert importlib.util.find_spec(package + ".__main__") is not None, package


def test_every_entry_point_of_the_package_is_a_command():
    """A new `python -m pylimiter.<x>` is listed here too."""
    found = set()
    for info in pkgutil.walk_packages(pylimiter.__path__, "pylimiter.",
                                      onerror=lambda name: None):
        if info.ispkg and (Path(pylimiter.__file__).parent.parent / info.name.replace(
                ".", os.sep) / "__main__.py").is_file():
            found.add(info.name)
    assert found == {package for package, _ in COMMANDS.values()}


def test_a_command_gets_its_arguments_and_its_status(capsys):
    # topiclist's own --version: the entry point ran with our arguments.
    assert main(["topiclist", "--version"]) == 0
    assert "pylimiter.pulsar.topiclist" in capsys.readouterr().out
    # argparse's usage error inside the command: its status comes back.
    assert main(["topiclist", "broker", "--no-such-flag"]) == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
    assert sys.argv[0] != "pylimiter topiclist"   # put back


def _script() -> Path | None:
    """The console script installed beside this interpreter."""
    found = shutil.which("pylimiter", path=str(Path(sys.executable).parent))
    return Path(found) if found else None


def _run(*argv, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "PYLIMITER_NO_EXTENSIONS"}
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def test_python_dash_m_pylimiter_lists_the_commands():
    r = _run(sys.executable, "-m", "pylimiter")
    assert r.returncode == 0, r.stderr
    assert all(f"  {name} " in r.stdout for name in COMMANDS)


@pytest.mark.parametrize("argv, expect", [
    (["bench", "--help"], "usage: python -m pylimiter.bench"),
    (["balance", "simulate", "--help"], "--brokers"),
    (["topiclist", "--help"], "broker"),
    (["cache", "--version"], "pylimiter.pulsar.cache"),
    (["cursor", "--version"], "pylimiter.pulsar.cursor"),
])
def test_the_console_script_runs_each_command(argv, expect):
    script = _script()
    if script is None:
        pytest.skip("no `pylimiter` script beside this interpreter (install the package: "
                    "pip install . or make build)")
    r = _run(str(script), *argv)
    assert r.returncode == 0, r.stderr
    assert expect in r.stdout


def test_the_console_script_refuses_an_unknown_command():
    script = _script()
    if script is None:
        pytest.skip("no `pylimiter` script beside this interpreter")
    r = _run(str(script), "nope")
    assert r.returncode == 2
    assert "unknown command 'nope'" in r.stderr and "Traceback" not in r.stderr
