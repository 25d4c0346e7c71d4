"""A first hour without surprises: what `pip install .` leaves behind.

- In a checkout, `pip install .` also places the built extensions in the
  tree (setup.py's build_ext), so the Quick start's next line,
  `python -c "import pylimiter"` run in the same directory (which imports
  the tree, the current directory being first on sys.path), works.
- A pure build records that it is pure (pylimiter/_build_config.py, written
  into the build, never into the tree): it imports as pure without
  PYLIMITER_NO_EXTENSIONS, and PYLIMITER_NO_EXTENSIONS=0 is an ImportError
  in one line.
- A checkout without its extensions, imported instead of an installed
  pylimiter, says which one hides which and what to run.

The real installs (a copy of this checkout, a fresh venv, pip) come last;
the rules themselves are tested in this process first.
"""

from __future__ import annotations

import faulthandler
import importlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pylimiter import _compat

ROOT = Path(__file__).resolve().parent.parent
COMPAT = Path(_compat.__file__)


# ---- the rules, in this process ---------------------------------------------------


@pytest.mark.parametrize("raw, want", [
    (None, None), ("", None), ("  ", None), ("1", True), ("Yes", True), (" on ", True),
    ("0", False), ("off", False), ("FALSE", False), ("no", False),
])
def test_env_choice(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("PYLIMITER_X", raising=False)
    else:
        monkeypatch.setenv("PYLIMITER_X", raw)
    assert _compat.env_choice("PYLIMITER_X") is want
    assert _compat.env_flag("PYLIMITER_X") is bool(want)


def test_env_choice_refuses_anything_else(monkeypatch):
    monkeypatch.setenv("PYLIMITER_X", "pure")
    with pytest.raises(ImportError, match=r"^pylimiter: PYLIMITER_X='pure' is neither"):
        _compat.env_choice("PYLIMITER_X")


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """_compat.py in a package of its own beside a _build_config.py saying
    PURE (or none): imported fresh by ``load(env)``."""
    made = []

    def load(pure, env):
        name = f"fakebuild{len(made)}"
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        shutil.copy(COMPAT, pkg / "_compat.py")
        if pure is not None:
            (pkg / "_build_config.py").write_text(f"PURE = {pure!r}\n")
        made.append(name)
        if env is None:
            monkeypatch.delenv("PYLIMITER_NO_EXTENSIONS", raising=False)
        else:
            monkeypatch.setenv("PYLIMITER_NO_EXTENSIONS", env)
        return importlib.import_module(f"{name}._compat")

    monkeypatch.syspath_prepend(str(tmp_path))
    yield load
    for name in made:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]


@pytest.mark.parametrize("pure, env, no_ext", [
    (True, None, True), (True, "", True), (True, "1", True),
    (False, None, False), (False, "1", True), (False, "0", False),
    (None, None, False), (None, "1", True), (None, "0", False),
])
def test_the_build_decides_unless_the_variable_says(fake_build, pure, env, no_ext):
    compat = fake_build(pure, env)
    assert compat.BUILT_PURE is bool(pure)
    assert compat.NO_EXTENSIONS is no_ext


def test_zero_on_a_pure_build_is_an_import_error(fake_build):
    with pytest.raises(ImportError) as err:
        fake_build(True, "0")
    text = str(err.value)
    assert text.startswith("pylimiter: PYLIMITER_NO_EXTENSIONS=0 asks for the C extensions, "
                           "but the pylimiter at ")
    assert "built without them" in text and "\n" not in text


def test_a_checkout_hiding_an_install_says_so(tmp_path, monkeypatch):
    checkout, site = tmp_path / "clone", tmp_path / "site"
    (checkout / "pylimiter").mkdir(parents=True)
    (checkout / "setup.py").write_text("")
    (site / "pylimiter").mkdir(parents=True)
    (site / "pylimiter" / "__init__.py").write_text("")
    (site / "pylimiter" / "_build_config.py").write_text("PURE = True\n")
    (checkout / "pylimiter" / "__init__.py").write_text("")
    monkeypatch.setattr(_compat, "PACKAGE_DIR", (checkout / "pylimiter").resolve())
    monkeypatch.setattr(sys, "path", ["", str(site)])
    monkeypatch.chdir(checkout)
    text = _compat.not_built_message("pylimiter._limiter_c")
    assert text.startswith(f"pylimiter: the C extension pylimiter._limiter_c is not built in "
                           f"{(checkout / 'pylimiter').resolve()}, a source checkout that Python "
                           f"imported first (through the current directory on sys.path) "
                           f"instead of the pylimiter installed at "
                           f"{(site / 'pylimiter').resolve()} (a pure-Python build).")
    assert "Run from another directory" in text and "pip install ." in text
    assert "PYLIMITER_NO_EXTENSIONS=1" in text


def test_a_lone_checkout_says_how_to_build(tmp_path, monkeypatch):
    (tmp_path / "pylimiter").mkdir()
    (tmp_path / "setup.py").write_text("")
    monkeypatch.setattr(_compat, "PACKAGE_DIR", (tmp_path / "pylimiter").resolve())
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    text = _compat.not_built_message("pylimiter._limiter_c")
    assert text == (f"pylimiter: the C extension pylimiter._limiter_c is not built in "
                    f"{(tmp_path / 'pylimiter').resolve()} (a source checkout).  Build it: "
                    f"pip install . (or make build in a checkout), or use the pure-Python "
                    f"implementation: PYLIMITER_NO_EXTENSIONS=1")


# ---- real installs: a copy of this checkout, a fresh venv, pip --------------------

needs_checkout = pytest.mark.skipif(
    not (ROOT / "setup.py").is_file() or shutil.which("git") is None,
    reason="needs the source checkout and git (an installed wheel's run has neither)")


def _clone(dest: Path) -> Path:
    """This checkout's files as a fresh clone has them (tracked and new,
    nothing ignored: no built extension, no venv), with a .git of its own."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    return dest


def _venv(path: Path) -> Path:
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(path)], check=True, timeout=300)
    return path / "bin" / "python"


def _env(**kw):
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYLIMITER_NO_EXTENSIONS", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(kw)
    return env


def _py(python: Path, code: str, cwd: Path, **env):
    return subprocess.run([str(python), "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=120, env=_env(**env))


def _pip_install(python: Path, clone: Path, **env):
    # A C build takes over a minute on a loaded machine: pip's own timeout
    # bounds it, not pytest's faulthandler dump at 60 s (pyproject).
    faulthandler.cancel_dump_traceback_later()
    r = subprocess.run([str(python), "-m", "pip", "install", "-q", "."], cwd=clone,
                       capture_output=True, text=True, timeout=900, env=_env(**env))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


PROBE = ("import pylimiter, pylimiter.pulsar.cache as c; "
         "print(pylimiter.IMPLEMENTATION, c.IMPLEMENTATION, pylimiter.__file__)")


@needs_checkout
def test_the_quick_start_works_in_the_clone(tmp_path):
    clone = _clone(tmp_path / "clone")
    (tmp_path / "elsewhere").mkdir()
    python = _venv(tmp_path / "venv")
    _pip_install(python, clone)
    # The Quick start's next line, in the clone: the tree, now built.
    here = _py(python, PROBE, clone)
    assert here.returncode == 0, here.stderr
    impl, cache_impl, where = here.stdout.split()
    assert (impl, cache_impl) == ("c", "c")
    assert Path(where).resolve().parent == (clone / "pylimiter").resolve()
    # Anywhere else: the install.
    away = _py(python, PROBE, tmp_path / "elsewhere")
    assert away.returncode == 0, away.stderr
    impl, cache_impl, where = away.stdout.split()
    assert (impl, cache_impl) == ("c", "c") and "site-packages" in where
    installed = Path(where).parent
    assert (installed / "_build_config.py").read_text().count("PURE = False") == 1
    assert not (clone / "pylimiter" / "_build_config.py").exists()
    # The console script came with it.
    r = subprocess.run([str(python.parent / "pylimiter")], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path / "elsewhere", env=_env())
    assert r.returncode == 0 and "commands:" in r.stdout, r.stderr


@needs_checkout
def test_a_pure_install_imports_as_pure_and_a_clone_says_what_hides_it(tmp_path):
    clone = _clone(tmp_path / "clone")
    (tmp_path / "elsewhere").mkdir()
    python = _venv(tmp_path / "venv")
    _pip_install(python, clone, PYLIMITER_NO_EXTENSIONS="1")
    away = tmp_path / "elsewhere"
    for env in ({}, {"PYLIMITER_NO_EXTENSIONS": "1"}):
        r = _py(python, PROBE, away, **env)
        assert r.returncode == 0, r.stderr
        impl, cache_impl, where = r.stdout.split()
        assert (impl, cache_impl) == ("python", "python")
        assert not list(Path(where).parent.rglob("*.so"))
    r = _py(python, "import pylimiter", away, PYLIMITER_NO_EXTENSIONS="0")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: pylimiter: PYLIMITER_NO_EXTENSIONS=0 asks for the "
                           "C extensions, but the pylimiter at ")
    # In the clone, the unbuilt tree comes first: it says so, and what to run.
    assert not list((clone / "pylimiter").rglob("*.so"))
    r = _py(python, "import pylimiter", clone)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: pylimiter: the C extension pylimiter._limiter_c is not "
                           f"built in {(clone / 'pylimiter').resolve()}, a source checkout that "
                           f"Python imported first (through the current directory on sys.path) "
                           f"instead of the pylimiter installed at ")
    assert "(a pure-Python build)" in last and "Run from another directory" in last
