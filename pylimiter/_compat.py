"""Which implementation to use.

PYLIMITER_NO_EXTENSIONS=1 (or true/yes/on) selects pure Python, 0 (or
false/no/off) the C extensions; unset or empty leaves the choice to the
build: a package installed with PYLIMITER_NO_EXTENSIONS=1 recorded that it is
pure (pylimiter/_build_config.py, which setup.py writes into the build, never
into a checkout) and imports as pure, anything else uses the C extensions.
Any other value is refused at import (a typo must not silently change what
runs), and so is 0 on a pure build, which has no C extension to use.  Off
CPython the pure twins are the only ones."""

import importlib
import os
import sys
from pathlib import Path
from typing import Optional

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_choice(name: str) -> Optional[bool]:
    """True or False when the environment variable ``name`` is set to a yes
    or a no word, None when it is unset or empty."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImportError(
        f"pylimiter: {name}={raw!r} is neither a yes ({', '.join(TRUE_WORDS)}) "
        f"nor a no (0, false, no, off, empty); set {name}=1 for the pure-Python "
        f"implementation or unset it for the C one")


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to a yes word."""
    return bool(env_choice(name))


def _built_pure() -> bool:
    """What the build recorded; False in a checkout (no record) and when
    setup.py loads this file by path, before anything is built."""
    if not __package__:
        return False
    name = f"{__package__}._build_config"
    try:
        config = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name != name:
            raise
        return False
    return bool(getattr(config, "PURE", False))


PACKAGE_DIR = Path(__file__).resolve().parent
NO_EXTENSIONS_ENV = env_choice("PYLIMITER_NO_EXTENSIONS")
BUILT_PURE = _built_pure()
IS_CPYTHON = sys.implementation.name == "cpython"
if NO_EXTENSIONS_ENV is False and BUILT_PURE:
    raise ImportError(
        f"pylimiter: PYLIMITER_NO_EXTENSIONS=0 asks for the C extensions, but the "
        f"pylimiter at {PACKAGE_DIR} was built without them (installed with "
        f"PYLIMITER_NO_EXTENSIONS=1).  Unset the variable to use this pure-Python "
        f"build, or reinstall with the extensions: pip install . (from a checkout)")
NO_EXTENSIONS = BUILT_PURE if NO_EXTENSIONS_ENV is None else NO_EXTENSIONS_ENV
USE_EXTENSIONS = not NO_EXTENSIONS and IS_CPYTHON


def _installed_elsewhere() -> list[tuple[Path, bool]]:
    """Other pylimiter packages on sys.path than this one: (directory,
    whether its build recorded pure)."""
    found: list[tuple[Path, bool]] = []
    for entry in sys.path:
        cand = Path(entry or os.getcwd()) / "pylimiter"
        try:
            if not (cand / "__init__.py").is_file() or cand.resolve() == PACKAGE_DIR:
                continue
            config = cand / "_build_config.py"
            pure = config.is_file() and "PURE = True" in config.read_text(encoding="utf-8")
        except OSError:
            continue
        if all(d != cand.resolve() for d, _ in found):
            found.append((cand.resolve(), pure))
    return found


def not_built_message(c_name: str) -> str:
    """What an ImportError of the missing compiled module ``c_name`` says:
    which pylimiter was imported, which one it hides, and what to run."""
    here = PACKAGE_DIR
    checkout = (here.parent / "setup.py").is_file()
    others = _installed_elsewhere()
    text = f"pylimiter: the C extension {c_name} is not built in {here}"
    if checkout and others:
        other, pure = others[0]
        via = ("the current directory" if here.parent == Path(os.getcwd()).resolve()
               else str(here.parent))
        kind = "a pure-Python build" if pure else "built"
        return (f"{text}, a source checkout that Python imported first (through {via} "
                f"on sys.path) instead of the pylimiter installed at {other} ({kind}).  "
                f"Run from another directory to use the installed one; or build this "
                f"checkout in place: pip install . (or make build) in {here.parent}; or use "
                f"the pure-Python implementation: PYLIMITER_NO_EXTENSIONS=1")
    where = " (a source checkout)" if checkout else ""
    return (f"{text}{where}.  Build it: pip install . (or make build in a checkout), "
            f"or use the pure-Python implementation: PYLIMITER_NO_EXTENSIONS=1")
