"""Check built wheels and the sdist the way a user meets them.

For every wheel in the dist folder that this machine can run: a fresh venv
with the matching CPython, `pip install <wheel>` (never the source tree),
then check that the C extension is what loads and run the test suite from a
scratch folder holding only a copy of tests/ (so `import pylimiter` cannot
resolve to the checkout), twice: as installed (the C extension, and the pure
twin beside it where a test asks for both), then with
PYLIMITER_NO_EXTENSIONS=1 (the pure twin alone, as `make test`'s second
pass).  The sdist must hold csrc/ and the .pyx but no Cython-generated C; it
is then built into a wheel by pip and checked the same way.

    python wheels/check_wheels.py [DIST] [--python 3.11 ...] [--no-sdist] [--emulated]

Interpreters: this one, pyenv's (/root/.pyenv/versions), or pythonX.Y on
PATH (inside a Debian sid root, wheels/in_sid.sh).  --emulated (under
qemu-user): the `slow` tests (command lines in subprocesses, which the
native runs cover) are left out and hypothesis's timing health check and
deadline are off.

Exits non-zero on the first failure, naming the artefact.
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYENV = Path(os.environ.get("PYENV_VERSIONS", "/root/.pyenv/versions"))
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100"]
WHEEL_RE = re.compile(r"^pylimiter_pulsar-[^-]+-cp(\d)(\d+)-cp\d+-(?P<plat>.+)\.whl$")


class CheckFailed(Exception):
    pass


def run(cmd, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise CheckFailed(
            f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc.stdout


#: Each suite run's output, kept (and readable while it runs).
LOGS = ROOT / "wheels" / "work" / "check-logs"


def run_logged(cmd, log: Path, **kw) -> str:
    """run(), its output streamed into ``log`` as it comes."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        proc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT,
                              text=True, **kw)
    out = log.read_text()
    if proc.returncode != 0:
        raise CheckFailed(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                          f"{out[-6000:]}\n(log: {log})")
    return out


def find_python(version: str) -> Path | None:
    if sys.version_info[:2] == tuple(map(int, version.split("."))):
        return Path(sys.executable)
    found = sorted(PYENV.glob(f"{version}.*/bin/python{version}"))
    if found:
        return found[-1]
    on_path = shutil.which(f"python{version}")
    return Path(on_path) if on_path else None


#: Files every wheel must carry: the extension's package, each subpackage
#: (found by pyproject's packages.find, so a new one cannot be forgotten)
#: and the generated protobuf module the topic-list service imports.
#: Every C extension setup.py builds: a wheel without one of them is broken
#: (the pure twins are fallbacks only under PYLIMITER_NO_EXTENSIONS).
def _extensions() -> list[str]:
    """The compiled modules, from their one list (TWINS in
    pylimiter/_impls.py), read without importing the package: this script
    runs under interpreters that have none installed."""
    src = Path(__file__).resolve().parent.parent / "pylimiter" / "_impls.py"
    for node in ast.parse(src.read_text()).body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and node.target.id == "TWINS"):
            return [c for c, _ in ast.literal_eval(node.value).values()]
    raise SystemExit(f"{src}: no TWINS table")


EXTENSIONS = _extensions()
#: Built on Linux only (setup.py): the host-wide limiter's segment protocol
#: needs futexes and OFD locks; elsewhere its pure twin refuses to construct.
LINUX_ONLY = ("pylimiter._shared_c",)
WHEEL_MUST = ["pylimiter/__init__.py", "pylimiter/py.typed", "pylimiter/spark/session.py",
              "pylimiter/bench/pipeline.py", "pylimiter/pulsar/__init__.py",
              "pylimiter/pulsar/topiclist/pulsar_topiclist_pb2.py",
              "pylimiter/pulsar/balance/__init__.py",
              "pylimiter/pulsar/cache/__init__.py", "pylimiter/pulsar/cursor/__init__.py",
              "pylimiter/prometheus.py"]


def check_contents(whl: Path) -> None:
    """The wheel ships the package and its compiled extension, and no tests,
    sources of the extension or Cython output."""
    import zipfile

    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
    missing = [m for m in WHEEL_MUST if m not in names]
    if not any(re.match(r"pylimiter_pulsar-[^/]+\.dist-info/licenses/LICENSE$", n) for n in names):
        missing.append("*.dist-info/licenses/LICENSE")
    if missing:
        raise CheckFailed(f"{whl.name} lacks {missing}")
    for ext in EXTENSIONS:
        if ext in LINUX_ONLY and "linux" not in whl.name:
            continue
        if not any(re.match(rf"{ext.replace('.', '/')}\..*\.(so|pyd)$", n) for n in names):
            raise CheckFailed(f"{whl.name} has no compiled {ext}")
    leaked = [n for n in names if n.startswith(("tests/", "benchmarks/"))
              or re.search(r"(^|/)test_[^/]*\.py$|\.(pyx|c|h)$", n)]
    if leaked:
        raise CheckFailed(f"{whl.name} ships files that are not the package: {leaked[:5]}")


#: Under emulation: hypothesis's too_slow health check times input
#: generation, which there includes the first translation of every code path
#: (a single draw took 57 s once): a health check of the host, not the wheel.
QEMU_PROFILE = """\
from hypothesis import HealthCheck, settings

settings.register_profile("qemu", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("qemu")
"""


def _pytest_summary(out: str, what: str) -> str:
    summary = out.strip().splitlines()[-1]
    if " passed" not in summary or "failed" in summary or "error" in summary:
        raise CheckFailed(f"{what}: {summary}")
    return summary


def check_installed(python_version: str, artefact: Path, scratch: Path,
                    emulated: bool = False) -> str:
    check_contents(artefact)
    py = find_python(python_version)
    if py is None:
        raise CheckFailed(f"{artefact.name}: no Python {python_version} here")
    venv = scratch / "venv"
    run([py, "-m", "venv", venv])
    vpy = venv / "bin" / "python"
    run([vpy, "-m", "pip", "install", "-q", artefact, *TEST_DEPS])
    # The suite and its config, and nothing else of the checkout.
    suite = scratch / "suite"
    shutil.copytree(ROOT / "tests", suite / "tests",
                    ignore=shutil.ignore_patterns("__pycache__", "c", "model", "build"))
    shutil.copy(ROOT / "pyproject.toml", suite / "pyproject.toml")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYLIMITER_NO_EXTENSIONS")}
    probe = (
        "import pathlib, sys, pylimiter\n"
        "assert pylimiter.IMPLEMENTATION == 'c', pylimiter.IMPLEMENTATION\n"
        "p = pathlib.Path(pylimiter.__file__).resolve()\n"
        f"assert str(p).startswith({str(venv.resolve())!r}), p\n"
        "print(pylimiter.__version__ if hasattr(pylimiter, '__version__') else '', p)\n"
    )
    where = run([vpy, "-c", probe], cwd=suite, env=env).strip()
    pytest = [vpy, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    c_mark, timeout = [], 1800
    if emulated:
        (suite / "qemu_hypothesis.py").write_text(QEMU_PROFILE)
        env["PYTHONPATH"] = str(suite)
        pytest += ["-p", "qemu_hypothesis", "-o", "faulthandler_timeout=600", "--durations=10"]
        c_mark, timeout = ["-m", "not slow"], 7200
    stem = artefact.name.removesuffix(".whl")
    c_run = _pytest_summary(run_logged([*pytest, *c_mark, "tests"], LOGS / f"{stem}.c.log",
                                       cwd=suite, env=env, timeout=timeout), artefact.name)
    # The pure twin alone, as `make test`'s second pass (the Spark pipelines,
    # command lines and the C core alone are implementation-free: run above).
    pure_env = dict(env, PYLIMITER_NO_EXTENSIONS="1")
    pure = run([vpy, "-c", "import pylimiter; print(pylimiter.IMPLEMENTATION)"],
               cwd=suite, env=pure_env).strip()
    if pure != "python":
        raise CheckFailed(f"{artefact.name}: PYLIMITER_NO_EXTENSIONS=1 still loads {pure!r}")
    pure_run = _pytest_summary(
        run_logged([*pytest, "--no-c-extensions", "-m", "not slow and not spark and not c_core",
                    "tests"], LOGS / f"{stem}.pure.log", cwd=suite, env=pure_env,
                   timeout=timeout),
        f"{artefact.name} (pure pass)")
    return f"{where} | {c_run} | pure: {pure_run}"


def check_sdist(sdist: Path, scratch: Path, python_version: str) -> str:
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    must = ["csrc/plim.h", "csrc/plim_sem.c", "csrc/plim_waitq.c",
            "pylimiter/_limiter_c.pyx", "setup.py", "pyproject.toml", "LICENSE",
            "pylimiter/pulsar/topiclist/pulsar_topiclist_pb2.py",
            "csrc/plim_cacheq.c", "csrc/plim_cacheq.h", "pylimiter/pulsar/cache/_cache_c.pyx"]
    # The bindings' headers (pylimiter/_binding/): every one the checkout has.
    must += sorted(p.relative_to(ROOT).as_posix()
                   for p in (ROOT / "pylimiter" / "_binding").glob("*.h"))
    missing = [m for m in must if m not in names]
    if missing:
        raise CheckFailed(f"{sdist.name} lacks {missing}")
    generated = [n for n in names if n.startswith("pylimiter/") and n.endswith(".c")]
    if generated:
        raise CheckFailed(f"{sdist.name} ships Cython output {generated}")
    py = find_python(python_version)
    if py is None:
        raise CheckFailed(f"no Python {python_version} to build {sdist.name}")
    out = scratch / "from-sdist"
    run([py, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w", out, sdist])
    (whl,) = out.glob("*.whl")
    return f"built {whl.name}; " + check_installed(python_version, whl, scratch)


def host_platform_ok(plat: str) -> bool:
    return plat.endswith(platform.machine()) and plat.startswith(("manylinux", "linux"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dist", nargs="?", type=Path, default=ROOT / "wheels" / "dist")
    ap.add_argument("--python", action="append", default=None,
                    help="only wheels for this version (repeatable), e.g. 3.11")
    ap.add_argument("--no-sdist", action="store_true")
    ap.add_argument("--sdist-python", default=f"{sys.version_info[0]}.{sys.version_info[1]}")
    ap.add_argument("--emulated", action="store_true",
                    help="running under qemu-user: leave out the slow tests, relax hypothesis")
    args = ap.parse_args(argv)

    wheels = sorted(args.dist.glob("pylimiter_pulsar-*.whl"))
    sdists = sorted(args.dist.glob("pylimiter_pulsar-*.tar.gz"))
    if not wheels and not sdists:
        print(f"error: nothing to check in {args.dist}", file=sys.stderr)
        return 2
    checked = 0
    try:
        for whl in wheels:
            m = WHEEL_RE.match(whl.name)
            if not m:
                raise CheckFailed(f"unexpected wheel name {whl.name}")
            version = f"{m[1]}.{m[2]}"
            if args.python and version not in args.python:
                continue
            if not host_platform_ok(m["plat"]):
                check_contents(whl)
                print(f"skip {whl.name}: contents ok; not runnable on {platform.machine()} "
                      "(checked where it runs: check_aarch64.sh, or the host)")
                continue
            if "manylinux_2_17" not in m["plat"] and "manylinux2014" not in m["plat"]:
                raise CheckFailed(f"{whl.name} is not tagged manylinux_2_17")
            with tempfile.TemporaryDirectory(prefix="plim-whl-") as tmp:
                print(f"ok   {whl.name}: "
                      f"{check_installed(version, whl, Path(tmp), args.emulated)}", flush=True)
            checked += 1
        if not args.no_sdist:
            for sdist in sdists:
                with tempfile.TemporaryDirectory(prefix="plim-sdist-") as tmp:
                    print(f"ok   {sdist.name}: "
                          f"{check_sdist(sdist, Path(tmp), args.sdist_python)}", flush=True)
                checked += 1
    except CheckFailed as exc:
        print(f"FAIL {exc}", file=sys.stderr)
        return 1
    if checked == 0:
        print("error: no artefact matched", file=sys.stderr)
        return 2
    print(f"{checked} artefact(s) passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
