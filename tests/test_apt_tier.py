""".ci/apt_tier.sh, what `make test` runs before installing a tier's Debian
packages: it says what it will install and why before any apt-get, asks apt
first (a simulation), installs nothing else (--no-install-recommends,
--no-upgrade), and skips the tier with one line, installing nothing, when
the install would upgrade or remove installed packages, when not root, or
with PYLIMITER_NO_APT=1.  Run against stand-ins for apt-get, dpkg-query and
id on PATH: the real ones are never called."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".ci" / "apt_tier.sh"
if not SCRIPT.is_file():
    pytest.skip(".ci/ is not next to the tests (an installed wheel's run)",
                allow_module_level=True)

UPGRADING = """\
Reading package lists...
The following packages will be upgraded:
  libpython3.11-stdlib python3.11
Inst libpython3.11-stdlib [3.11.2-6] (3.11.2-6+deb12u6 Debian:12.11/stable [amd64])
Inst python3.11 [3.11.2-6] (3.11.2-6+deb12u6 Debian:12.11/stable [amd64])
Inst libpython3.11-dbg (3.11.2-6+deb12u6 Debian:12.11/stable [amd64])
Inst python3.11-dbg (3.11.2-6+deb12u6 Debian:12.11/stable [amd64])
Conf python3.11-dbg (3.11.2-6+deb12u6 Debian:12.11/stable [amd64])
"""
CLEAN = """\
Reading package lists...
0 upgraded, 2 newly installed, 0 to remove and 115 not upgraded.
Inst relacy-dev (0.0~git20230629-1 Debian:12.15/oldstable [all])
Inst g++ (4:12.2.0-3 Debian:12.15/oldstable [amd64])
Conf relacy-dev (0.0~git20230629-1 Debian:12.15/oldstable [all])
"""

FAKES = {
    "dpkg-query": """#!/bin/sh
for p in $FAKE_INSTALLED; do [ "$p" = "$3" ] && { printf 'install ok installed'; exit 0; }; done
exit 1
""",
    "id": """#!/bin/sh
echo "$FAKE_UID"
""",
    "apt-get": """#!/bin/sh
echo "apt-get $*" >>"$FAKE_LOG"
echo "APT-GET-RAN" >>"$FAKE_OUT"
case " $* " in
  *" -s "*) cat "$FAKE_SIM" ;;
esac
exit 0
""",
}


@pytest.fixture
def apt(tmp_path):
    """Run the script with the stand-ins: ``apt(*packages, sim=..., **env)``
    -> (completed process, the apt-get calls made)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in FAKES.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "apt.log"

    def run(*packages, sim=CLEAN, installed="", uid="0", **env):
        (tmp_path / "sim.txt").write_text(sim)
        log.write_text("")
        full = {k: v for k, v in os.environ.items()
                if k not in ("PYLIMITER_NO_APT", "PYLIMITER_APT_UPGRADE")}
        out = tmp_path / "out.txt"
        out.write_text("")
        full.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_LOG=str(log),
                    FAKE_SIM=str(tmp_path / "sim.txt"), FAKE_INSTALLED=installed,
                    FAKE_UID=uid, FAKE_OUT=str(out), **env)
        # The script's output and the stand-in's "I ran" marker in one file,
        # in the order they happened.
        with open(out, "a") as sink:
            r = subprocess.run(["bash", str(SCRIPT), "the test tier", "why it needs them",
                                *packages], stdout=sink, stderr=subprocess.PIPE, text=True,
                               env=full, timeout=60)
        r.stdout = out.read_text()
        return r, log.read_text().splitlines()

    return run


def test_nothing_to_do_when_installed(apt):
    r, calls = apt("relacy-dev", "g++", installed="relacy-dev g++")
    assert (r.returncode, r.stdout, calls) == (0, "", [])


def test_says_what_and_why_before_any_apt_get_then_installs_only_those(apt):
    r, calls = apt("relacy-dev", "g++", installed="")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "== the test tier needs relacy-dev g++ (why it needs them), not installed"
    assert lines.index("APT-GET-RAN") > 0
    assert "   installing 2 new package(s): relacy-dev g++" in lines
    assert calls == [
        "apt-get update -qq",
        "apt-get -s install --no-install-recommends --no-upgrade relacy-dev g++",
        "apt-get install -y -qq --no-install-recommends --no-upgrade relacy-dev g++",
    ]


def test_only_the_missing_ones_are_asked_for(apt):
    r, calls = apt("relacy-dev", "g++", installed="g++")
    assert r.returncode == 0
    assert calls[-1] == "apt-get install -y -qq --no-install-recommends --no-upgrade relacy-dev"


def test_an_install_that_upgrades_the_system_is_skipped_in_one_line(apt):
    r, calls = apt("python3.11-dbg", "python3.11-venv", sim=UPGRADING)
    assert r.returncode == 1
    skip = [ln for ln in r.stdout.splitlines() if "NOT run" in ln]
    assert skip == [
        "== the test tier NOT run: installing python3.11-dbg python3.11-venv would also "
        "upgrade or remove 2 installed package(s): libpython3.11-stdlib 3.11.2-6 -> "
        "3.11.2-6+deb12u6, python3.11 3.11.2-6 -> 3.11.2-6+deb12u6.  "
        "PYLIMITER_APT_UPGRADE=1 allows it, or run: apt-get install --no-install-recommends "
        "python3.11-dbg python3.11-venv"]
    assert not any(c.startswith("apt-get install") for c in calls)


def test_upgrades_only_when_allowed(apt):
    r, calls = apt("python3.11-dbg", sim=UPGRADING, PYLIMITER_APT_UPGRADE="1")
    assert r.returncode == 0
    assert "   installing 2 new package(s): libpython3.11-dbg python3.11-dbg" in r.stdout
    assert "and changing (PYLIMITER_APT_UPGRADE=1): libpython3.11-stdlib" in r.stdout
    assert calls[-1].startswith("apt-get install -y -qq")


def test_no_apt_opts_out(apt):
    r, calls = apt("relacy-dev", PYLIMITER_NO_APT="1")
    assert r.returncode == 1 and calls == []
    assert r.stdout.splitlines()[-1] == (
        "== the test tier NOT run: PYLIMITER_NO_APT=1 (install them yourself: "
        "apt-get install --no-install-recommends relacy-dev)")


def test_not_root_is_skipped(apt):
    r, calls = apt("relacy-dev", uid="1000")
    assert r.returncode == 1 and calls == []
    assert r.stdout.splitlines()[-1] == (
        "== the test tier NOT run: installing them needs root "
        "(sudo apt-get install --no-install-recommends relacy-dev)")
