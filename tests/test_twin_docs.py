"""The twins are listed once (pylimiter._impls.TWINS), and what they share
is written alike: every public class, method and property both twins of a
pair define carries the same docstring (Cython's embedded signature line
aside), so help() reads the same whichever implementation is active."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import pylimiter
from pylimiter import _impls
from pylimiter._impls import PY, TWINS, C

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.c_extension


def _doc(obj: object) -> str | None:
    doc = inspect.getdoc(obj)
    if doc is None:
        return None
    # Cython's embedsignature: "Cls.name(self, ...)\n\n" before the text
    return re.sub(r"\A[\w.]+\(.*?\)(?: -> [^\n]+)?\n\n", "", doc, flags=re.S)


def _shared(twin: str):
    c, py = C.module_of(twin), PY.module_of(twin)
    names = sorted(n for n in py.__all__ if hasattr(c, n))
    for name in names:
        a, b = getattr(c, name), getattr(py, name)
        yield name, a, b
        if isinstance(a, type):
            for m in sorted(set(vars(b)) & set(dir(a))):
                if m.startswith("_"):
                    continue
                yield f"{name}.{m}", getattr(a, m), getattr(b, m)


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_shared_docstrings_are_identical(twin):
    checked, differ = 0, []
    for name, a, b in _shared(twin):
        da, db = _doc(a), _doc(b)
        if da is None and db is None:
            continue
        checked += 1
        if da != db:
            differ.append(name)
    assert differ == [], f"{twin}: the twins' docstrings differ for {differ}"
    assert checked >= 20   # the walk found the shared API


def test_every_extension_setup_builds_is_a_listed_twin():
    if not (ROOT / "setup.py").exists():
        pytest.skip("setup.py is not next to the tests (an installed wheel's run)")
    tree = ast.parse((ROOT / "setup.py").read_text())
    built = {node.args[0].value for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Extension"}
    assert built == set(_impls.EXTENSIONS)


def test_active_modules_follow_the_table():
    from pylimiter.pulsar import cache

    assert pylimiter.AsyncSemaphore.__module__ == TWINS["limiter"][0]
    assert cache.EntryCache.__module__ == TWINS["cache"][0]
    assert pylimiter.IMPLEMENTATION == cache.IMPLEMENTATION == "c"
