"""Which implementation to use: PYLIMITER_NO_EXTENSIONS=1 (or true/yes/on)
selects pure Python; unset, empty, 0, false, no and off do not, and any
other value is refused at import (a typo must not silently change what
runs).  Off CPython the pure twins are the only ones."""

import os
import sys

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to a true word."""
    raw = os.environ.get(name)
    if raw is None:
        return False
    word = raw.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImportError(
        f"pylimiter: {name}={raw!r} is neither a yes ({', '.join(TRUE_WORDS)}) "
        f"nor a no (0, false, no, off, empty); set {name}=1 for the pure-Python "
        f"implementation or unset it for the C one")


NO_EXTENSIONS = env_flag("PYLIMITER_NO_EXTENSIONS")
IS_CPYTHON = sys.implementation.name == "cpython"
USE_EXTENSIONS = not NO_EXTENSIONS and IS_CPYTHON
