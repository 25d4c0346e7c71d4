"""Each integration is an optional extra: without its framework, importing
it names the packages and an install that works from a checkout; the core
imports none of them; the extras in pyproject.toml list what the modules
import."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from . import CHECKOUT

ROOT = Path(__file__).resolve().parents[2]
#: module -> (extra, the top-level packages it imports, the distributions)
INTEGRATIONS = {
    "aiohttp": ("aiohttp", {"aiohttp"}, {"aiohttp"}),
    "grpc": ("grpc", {"grpc"}, {"grpcio", "protobuf"}),
    "httpx": ("httpx", {"httpx"}, {"httpx"}),
    "otel": ("otel", {"opentelemetry"}, {"opentelemetry_api"}),
}


@pytest.mark.parametrize("module", sorted(INTEGRATIONS))
def test_a_missing_framework_names_what_to_install(monkeypatch, module):
    extra, packages, dists = INTEGRATIONS[module]
    for p in packages:   # as if it were not installed (its submodules too)
        for name in [m for m in sys.modules if m == p or m.startswith(p + ".")] + [p]:
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, f"pylimiter.{module}", raising=False)
    with pytest.raises(ImportError) as info:
        importlib.import_module(f"pylimiter.{module}")
    text = str(info.value)
    assert text.startswith(f"pylimiter.{module} needs ")
    assert f"pip install '.[{extra}]'" in text
    for d in dists:
        assert d.replace("_", "-") in text


def test_the_asgi_middleware_needs_no_package():
    tree = ast.parse((ROOT / "pylimiter" / "asgi.py").read_text()) if CHECKOUT else None
    if tree is None:
        pytest.skip("the package's sources are not next to the tests")
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names)


def test_the_extras_list_what_the_integrations_import():
    tomllib = pytest.importorskip("tomllib")   # 3.11+
    if not CHECKOUT:
        pytest.skip("pyproject.toml is not next to the tests")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["asgi"] == []
    for module, (extra, _, dists) in INTEGRATIONS.items():
        names = {req.split(">")[0].split("=")[0].split("<")[0].strip().lower().replace("-", "_")
                 for req in extras[extra]}
        assert dists <= names, (extra, names)


def test_importing_pylimiter_imports_no_framework():
    code = ("import sys, pylimiter; bad = {'aiohttp', 'grpc', 'httpx', 'opentelemetry', "
            "'starlette', 'fastapi'} & set(sys.modules); assert not bad, bad")
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
