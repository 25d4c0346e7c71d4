"""The drawing of pylimiter's imports: no cycle, and no arrow running back up.

Every import of every module under pylimiter/ counts, those inside functions
too (a cycle hidden by a function-level import is still a cycle at run
time), read with ast from the sources (the .pyx by its import lines), so the
test needs nothing built and nothing imported.  A twin loaded by name
(``_impls.active_module("cache")``) is an import of both modules the twin
table (``pylimiter._impls.TWINS``) names for it, by the module that loads it.

Up and down: the limiter core (``pylimiter``, ``pylimiter._*``,
``pylimiter.prometheus``) at the bottom; the one shared command kit
(``pylimiter.spark``: settings, progress, reports, timing) and the
``pylimiter.pulsar`` package above it; the command packages
(``pylimiter.bench``, each ``pylimiter.pulsar.<x>``, and ``pylimiter``'s own
``__main__``, the ``pylimiter`` command) on top, never importing each other.
Inside a command package the driver (``pipeline``, ``cli``) and its
``report`` are the top: only ``__main__`` imports the driver, and only the
driver imports the report.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pylimiter"
DRIVERS = ("pipeline", "cli")

# An installed wheel's test run (wheels/check_wheels.py) has the tests but
# not the sources: an empty graph would pass every check vacuously.
if not (PACKAGE / "_limiter_c.pyx").exists():
    pytest.skip("the package's sources are not next to the tests", allow_module_level=True)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources() -> dict[str, Path]:
    files = [p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".pyx")]
    return {module_name(p): p for p in sorted(files)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _raw_imports(path: Path):
    """(module, names, level, type_only) for every import statement."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".pyx":
        for m in re.finditer(r"^\s*from\s+(\.*)([\w.]*)\s+import\s+(?!\*)([\w\s,()]+)", text,
                             re.M):
            names = [n.strip() for n in m.group(3).replace("(", "").replace(")", "").split(",")]
            yield m.group(2), [n.split()[0] for n in names if n], len(m.group(1)), False
        for m in re.finditer(r"^\s*import\s+([\w.]+)", text, re.M):
            yield m.group(1), [], 0, False
        return
    tree = ast.parse(text, str(path))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for inner in node.body:
                type_only.update(id(n) for n in ast.walk(inner))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            yield node.module or "", [a.name for a in node.names], node.level, \
                id(node) in type_only
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], 0, id(node) in type_only


#: The functions of pylimiter._impls that import a twin named by a string.
TWIN_LOADERS = ("active_module", "module_of")


def twins() -> dict[str, tuple[str, str]]:
    """pylimiter._impls.TWINS (twin -> compiled and pure module), read from
    the source: it is a literal table (wheels/check_wheels.py reads it so
    too)."""
    tree = ast.parse((PACKAGE / "_impls.py").read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "TWINS" for t in targets):
            return ast.literal_eval(node.value)
    raise AssertionError("pylimiter/_impls.py: no TWINS table")


def twin_loads(path: Path):
    """(twin, line) for every call of a twin loader in a .py file; twin is
    None where the name is not a string literal (the graph cannot read it)."""
    text = path.read_text(encoding="utf-8") if path.suffix == ".py" else ""
    if not any(name in text for name in TWIN_LOADERS):
        return
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else None
        if called not in TWIN_LOADERS:
            continue
        arg = node.args[0] if node.args else None
        literal = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
        yield (arg.value if literal else None), node.lineno


def edges(with_type_only: bool) -> dict[str, set[str]]:
    """module -> the pylimiter modules it imports."""
    mods = sources()
    table = twins()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        for twin, _ in twin_loads(path):
            if twin in table:
                graph[name].update(m for m in table[twin] if m in mods and m != name)
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for module, names, level, type_only in _raw_imports(path):
            if type_only and not with_type_only:
                continue
            if level:
                base = package.split(".")
                base = base[:len(base) - (level - 1)]
                module = ".".join(base + ([module] if module else []))
            if not module.startswith("pylimiter"):
                continue
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in mods]
            if len(targets) < len(names) or not names:
                targets.append(module)
            graph[name].update(t for t in targets if t in mods and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def tier(module: str) -> int:
    """0: the limiter core; 1: the shared kit; 2: a command package (and
    ``pylimiter.__main__``, the front door that runs them)."""
    parts = module.split(".")
    if module == "pylimiter.__main__":
        return 2
    if len(parts) == 1 or parts[1].startswith("_") or parts[1] == "prometheus":
        return 0
    if parts[1] == "spark" or module == "pylimiter.pulsar":
        return 1
    return 2


def command_package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:3] if parts[1] == "pulsar" else parts[:2])


def arrows_back_up(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        for dst in sorted(targets):
            if tier(dst) > tier(src):
                bad.append(f"{src} -> {dst}: tier {tier(src)} imports tier {tier(dst)}")
                continue
            if tier(src) < 2 or tier(dst) < 2:
                continue
            if command_package(src) != command_package(dst):
                bad.append(f"{src} -> {dst}: one command package imports another")
                continue
            role, src_role = dst.rpartition(".")[2], src.rpartition(".")[2]
            if role in DRIVERS and src_role != "__main__":
                bad.append(f"{src} -> {dst}: only __main__ imports the driver")
            if role == "report" and src_role not in DRIVERS:
                bad.append(f"{src} -> {dst}: only the driver imports its report")
    return bad


def test_the_graph_sees_imports_inside_functions_and_the_pyx():
    graph = edges(with_type_only=True)
    # imported inside a function only (spark.report.environment)
    assert "pylimiter" in graph["pylimiter.spark.report"]
    # from a .pyx
    assert "pylimiter.pulsar.cache._common" in graph["pylimiter.pulsar.cache._cache_c"]
    # twins loaded by name through pylimiter._impls
    assert {"pylimiter._limiter_c", "pylimiter._limiter_py"} <= graph["pylimiter"]
    assert {"pylimiter.pulsar.cache._cache_c",
            "pylimiter.pulsar.cache._cache_py"} <= graph["pylimiter.pulsar.cache"]
    assert "pylimiter.spark.cli" in graph["pylimiter.pulsar.balance.pipeline"]


def test_the_checks_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert arrows_back_up({
        "pylimiter._common": {"pylimiter.spark.session"},
        "pylimiter.pulsar.cache.replay": {"pylimiter.pulsar.cursor.cursor"},
        "pylimiter.pulsar.balance.report": {"pylimiter.pulsar.balance.pipeline"},
        "pylimiter.pulsar.balance.replay": {"pylimiter.pulsar.balance.report"},
        "pylimiter.bench.__main__": {"pylimiter.bench.pipeline"},
    }) == [
        "pylimiter._common -> pylimiter.spark.session: tier 0 imports tier 1",
        "pylimiter.pulsar.balance.replay -> pylimiter.pulsar.balance.report: "
        "only the driver imports its report",
        "pylimiter.pulsar.balance.report -> pylimiter.pulsar.balance.pipeline: "
        "only __main__ imports the driver",
        "pylimiter.pulsar.cache.replay -> pylimiter.pulsar.cursor.cursor: "
        "one command package imports another",
    ]


def test_no_import_cycle_at_run_time():
    assert cycles(edges(with_type_only=False)) == []


def test_no_import_cycle_counting_type_only_imports():
    assert cycles(edges(with_type_only=True)) == []


def test_no_arrow_runs_back_up():
    assert arrows_back_up(edges(with_type_only=True)) == []


def test_every_twin_is_loaded_by_a_name_the_graph_can_read():
    table, mods = twins(), sources()
    problems = [f"TWINS[{twin!r}] names {m}, which is not a module under pylimiter/"
                for twin, pair in table.items() for m in pair if m not in mods]
    loaded = set()
    for name, path in mods.items():
        for twin, line in twin_loads(path):
            if twin is not None:
                loaded.add(twin)
                if twin not in table:
                    problems.append(f"{path.name}:{line}: no twin {twin!r} in TWINS")
            elif name != "pylimiter._impls":
                problems.append(f"{path.name}:{line}: a twin loaded by a computed name "
                                "(the import graph cannot see that import)")
    assert problems == []
    assert "cache" in loaded and "limiter" in loaded


def test_twin_loads_reads_literal_names_and_flags_computed_ones(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from pylimiter import _impls\n"
                   "a = _impls.active_module('cache')\n"
                   "b = _impls.ACTIVE.module_of(name)\n"
                   "c = active_module(\"limiter\")\n")
    assert list(twin_loads(src)) == [("cache", 2), (None, 3), ("limiter", 4)]
