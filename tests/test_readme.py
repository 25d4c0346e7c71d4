"""Every ```python block of README.md runs as written, from a directory that
is not the checkout, with the interpreter the tests run on: what a new user
copies must work once pylimiter is installed.  (Blocks meant as excerpts
are fenced as ```py and not run.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def _blocks() -> list[tuple[int, str]]:
    if not README.exists():   # an installed wheel's test run has no README
        return []
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in BLOCK.finditer(text)]


BLOCKS = _blocks()


def test_readme_has_runnable_examples():
    if not README.exists():
        pytest.skip("README.md is not next to the tests")
    assert len(BLOCKS) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("line, code", BLOCKS, ids=[f"line{n}" for n, _ in BLOCKS])
def test_readme_block_runs_outside_the_checkout(tmp_path, line, code):
    script = tmp_path / f"readme_line{line}.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"README.md line {line}:\n{proc.stdout}\n{proc.stderr}"


def test_each_example_names_an_extra_that_installs_its_imports():
    """A block whose section names an extra (`pip install '.[x]'`) imports
    nothing that extra leaves out (the aiohttp example once named
    [prometheus], which has no aiohttp)."""
    import ast

    tomllib = pytest.importorskip("tomllib")   # 3.11+

    if not README.exists():
        pytest.skip("README.md is not next to the tests")
    pyproject = tomllib.loads((README.parent / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    text = README.read_text(encoding="utf-8")
    checked = 0
    for line, code in BLOCKS:
        start = text.rfind("\n## ", 0, text.index(code))
        lines = re.findall(r"pip install '\.\[\w+\]'[^`\n]*", text[start:text.index(code)])
        named = [n for line in lines for n in re.findall(r"'\.\[(\w+)\]'", line)]
        if not named:
            continue
        wanted = {re.split(r"[<>=;!\[ ]", req, maxsplit=1)[0].lower().replace("-", "_")
                  for extra in named for req in extras[extra]}
        # Packages named beside the extra on the same install line.
        wanted |= {w.lower().replace("-", "_") for line in lines
                   for w in re.sub(r"'\.\[\w+\]'", " ", line).split()[2:]}
        imported = set()
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
        third_party = {m for m in imported if m not in sys.stdlib_module_names} - {"pylimiter"}
        assert third_party <= wanted, \
            f"README.md line {line}: {third_party - wanted} not in {named}"
        checked += 1
    assert checked >= 1
