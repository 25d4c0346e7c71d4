"""The documentation site (docs/, mkdocs.yml, `make docs`) stays honest.

- every page is in the navigation, and every navigation entry is a page;
- no page uses the project's internal references ("issue 18", "seed 003"):
  a reader from a search engine cannot follow them;
- the Performance page includes the table of benchmarks/results/figures.md
  (the file `make bench-table` writes), not a copy of it; so do the
  host-wide limiter's and the frameworks' pages with their benchmarks'
  tables (results/shared_bench.md; a marked section of benchmarks/README.md);
- the simulator pages' flag tables agree with the commands' own --help: every
  flag exists, every broker.conf key is the one the flag names, every
  default is the command's, and every flag of the command is listed;
- every complete example (a block fenced ```python; a fragment is fenced
  ```py and not run) runs as written, from a directory outside the checkout;
- `mkdocs build --strict` passes (a broken link or anchor, a page outside
  the navigation, an API name that does not resolve is a failure), and every
  public name of pylimiter has an entry in the API reference.

A page documenting code that is not merged yet carries a `<!-- pending: ...
-->` comment; its examples that import a pylimiter name that does not exist
yet are reported as xfail, and run as soon as the name exists.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import html
import importlib
import importlib.util
import io
import re
import runpy
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MKDOCS_YML = ROOT / "mkdocs.yml"

if not (DOCS.is_dir() and MKDOCS_YML.exists()):   # an installed wheel's test run
    pytest.skip("docs/ is not next to the tests", allow_module_level=True)

#: The pages: Markdown under docs/, but not docs/_ext (the build's own code).
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.relative_to(DOCS).parts)

#: References to the project's internal tracker and source documents.
JARGON = re.compile(r"\bissues?\s+#?\d+|\bseeds?\s+0\d\d\b|\bsource\s+documents?\s+0\d\d\b",
                    re.IGNORECASE)
SNIPPET = re.compile(r'^--8<-- "([^"]+)"\s*$', re.MULTILINE)
PENDING = "<!-- pending:"
BLOCK = re.compile(r"^```python(?:[ \t][^\n]*)?\n(.*?)^```", re.MULTILINE | re.DOTALL)
CLI = re.compile(r"<!-- cli: (.+?) -->")
SECTION_NAME = re.compile(r"[A-Za-z][\w-]*")


def _rel(page: Path) -> str:
    return page.relative_to(DOCS).as_posix()


def _snippet(target: str) -> tuple[Path, str]:
    """A `--8<--` include, resolved as pymdownx.snippets does it (paths from
    the repository root; `path:3:4,7:` selects lines 3-4 and 7 to the end,
    `path:name` the lines between the markers `--8<-- [start:name]` and
    `--8<-- [end:name]`)."""
    path, _, spec = target.partition(":")
    file = ROOT / path
    lines = file.read_text(encoding="utf-8").splitlines(keepends=True)
    if not spec:
        return file, "".join(lines)
    if SECTION_NAME.fullmatch(spec):
        start = [i for i, line in enumerate(lines) if f"--8<-- [start:{spec}]" in line]
        end = [i for i, line in enumerate(lines) if f"--8<-- [end:{spec}]" in line]
        if len(start) != 1 or len(end) != 1 or end[0] < start[0]:
            return file, ""   # pymdownx would include nothing: a failure below
        return file, "".join(lines[start[0] + 1:end[0]])
    out = []
    for part in spec.split(","):
        start, _, end = part.partition(":")
        lo = int(start) - 1 if start else 0
        hi = int(end) if end else len(lines)
        out += lines[lo:hi]
    return file, "".join(out)


def _page_text(page: Path, *, skip: tuple[str, ...] = ()) -> str:
    """The page as the site shows it: its snippets included, except the
    files named in `skip`."""
    text = page.read_text(encoding="utf-8")

    def include(m: re.Match) -> str:
        if m.group(1).partition(":")[0] in skip:
            return ""
        return _snippet(m.group(1))[1]

    return SNIPPET.sub(include, text)


def _nav_pages(nav) -> list[str]:
    out = []
    if isinstance(nav, str):
        out.append(nav)
    elif isinstance(nav, list):
        for item in nav:
            out += _nav_pages(item)
    elif isinstance(nav, dict):
        for value in nav.values():
            out += _nav_pages(value)
    return out


# ---- structure ----------------------------------------------------------------------


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load(MKDOCS_YML.read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is in the nav twice"
    pages = {_rel(p) for p in PAGES}
    assert pages - set(nav) == set(), "pages nobody can reach from the nav"
    assert set(nav) - pages == set(), "nav entries without a page"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_page_has_no_internal_references(page):
    # CHANGES.md is included by the changelog page; it is checked below.
    text = _page_text(page, skip=("CHANGES.md",))
    found = sorted({m.group(0) for m in JARGON.finditer(text)})
    assert found == [], f"{_rel(page)} says {found}: explain it, or leave it out"


def test_changelog_has_no_internal_references():
    text = (ROOT / "CHANGES.md").read_text(encoding="utf-8")
    assert JARGON.findall(text) == []


def test_performance_page_includes_the_figures_table():
    page = DOCS / "performance.md"
    targets = SNIPPET.findall(page.read_text(encoding="utf-8"))
    figures = [t for t in targets if t.startswith("benchmarks/results/figures.md")]
    assert len(figures) == 1, "the table is included from figures.md, once"
    _, text = _snippet(figures[0])
    assert text.startswith("Command: `make bench-table`"), text[:200]
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table and table[0].startswith("| figure |"), "the lines included no longer hold " \
        "the table: adjust the line ranges in docs/performance.md"
    assert len(table) >= 10
    assert JARGON.findall(text) == []


@pytest.mark.parametrize("page, target, first_column", [
    ("many-processes.md", "benchmarks/results/shared_bench.md", "figure"),
    ("frameworks.md", "benchmarks/README.md:http-bench", "in process, thread CPU time"),
])
def test_guide_pages_include_their_benchmark_tables(page, target, first_column):
    # Included from the files a benchmark run writes (or between section
    # markers there), never copied: a new run updates the page.
    assert target in SNIPPET.findall((DOCS / page).read_text(encoding="utf-8"))
    table = [line for line in _snippet(target)[1].splitlines() if line.startswith("|")]
    assert table and table[0].startswith(f"| {first_column} |"), table[:1]
    assert len(table) >= 6


def test_snippets_resolve():
    for page in PAGES:
        for target in SNIPPET.findall(page.read_text(encoding="utf-8")):
            file, text = _snippet(target)
            assert file.exists() and text.strip(), f"{_rel(page)}: {target}"


# ---- the simulators' flag tables against their --help --------------------------------


def _parser(command: str) -> argparse.ArgumentParser:
    """The argparse parser that answers `python -m <command> --help`,
    captured in this process (the command's own entry point, not a copy)."""
    module, *argv = command.split()
    seen: list[argparse.ArgumentParser] = []

    def capture(self, file=None):
        seen.append(self)

    with mock.patch.object(argparse.ArgumentParser, "print_help", capture), \
            mock.patch.object(sys, "argv", [module, *argv, "--help"]), \
            contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit):
        runpy.run_module(module, run_name="__main__")
    assert seen, f"{command} --help printed nothing"
    return seen[-1]


def _options(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.Action, str]]:
    formatter = parser._get_formatter()
    out = {}
    for action in parser._actions:
        text = formatter._expand_help(action) if action.help else ""
        for option in action.option_strings:
            out[option] = (action, " ".join(text.split()))
    return out


def _tables(text: str) -> list[list[list[str]]]:
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return [t for t in tables if len(t) > 2]


def _default_matches(token: str, action: argparse.Action, help_text: str) -> bool:
    shown = help_text.rpartition("(default")[2]
    if token in shown:
        return True
    default = action.default
    if isinstance(default, (list, tuple)):
        default = ",".join(map(str, default))
    return token == str(default)


CLI_PAGES = [p for p in PAGES if CLI.search(p.read_text(encoding="utf-8"))]


def test_the_simulator_pages_declare_their_commands():
    assert {_rel(p) for p in CLI_PAGES} >= {"pulsar/topiclist.md", "pulsar/balance.md",
                                            "pulsar/cache.md", "pulsar/cursor.md"}


@pytest.mark.parametrize("page", CLI_PAGES, ids=_rel)
def test_flag_tables_agree_with_the_commands(page):
    text = page.read_text(encoding="utf-8")
    sections = CLI.split(text)[1:]
    problems = []
    for spec, body in zip(sections[::2], sections[1::2]):
        commands = [c.strip() for c in spec.split(",")]
        parsers = {c: _options(_parser(c)) for c in commands}
        documented: set[str] = set()
        for table in _tables(body):
            header = [h.lower() for h in table[0]]
            if "flag" not in header:
                continue
            col = {name: header.index(name) for name in header}
            for row in table[2:]:
                flags = re.findall(r"`(-{1,2}[a-z][a-z0-9-]*)`", row[col["flag"]])
                documented |= set(flags)
                for flag in flags:
                    if not any(flag in opts for opts in parsers.values()):
                        problems.append(f"{flag}: no such flag in {', '.join(commands)}")
                if len(flags) != 1:
                    continue
                owner = next((o for o in parsers.values() if flags[0] in o), None)
                if owner is None:
                    continue
                action, help_text = owner[flags[0]]
                if "broker.conf key" in col:
                    key = re.search(r"`([A-Za-z*]+)`", row[col["broker.conf key"]])
                    if key and key.group(1) not in help_text:
                        problems.append(f"{flags[0]}: help does not name {key.group(1)}: "
                                        f"{help_text!r}")
                if "default" in col and row[col["default"]]:
                    m = re.search(r"`([^`]+)`|(\d[\d.,]*\d|\d)|\b(true|false)\b",
                                  row[col["default"]])
                    token = m and next(g for g in m.groups() if g)
                    if token and not _default_matches(token, action, help_text):
                        problems.append(f"{flags[0]}: default {token} is not the command's: "
                                        f"{help_text!r} (default {action.default!r})")
        for command, options in parsers.items():
            for option, (action, _) in options.items():
                if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                    continue
                if not set(action.option_strings) & documented:
                    problems.append(f"{command}: {option} is not in the page's tables")
    assert problems == [], f"{_rel(page)}:\n" + "\n".join(sorted(set(problems)))


# ---- the examples run ------------------------------------------------------------------


def _examples() -> list:
    params = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            params.append(pytest.param(page, line, m.group(1), id=f"{_rel(page)}:{line}"))
    return params


def _missing(code: str) -> tuple[list[str], list[str]]:
    """What the block imports that is not there: pylimiter names (not merged
    yet) and other modules (an extra not installed)."""
    pylimiter_missing, modules_missing = [], []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, attr in names:
            if module.split(".")[0] == "pylimiter":
                if importlib.util.find_spec(module) is None:
                    pylimiter_missing.append(module)
                elif attr and module == "pylimiter" and not hasattr(
                        importlib.import_module(module), attr):
                    pylimiter_missing.append(f"pylimiter.{attr}")
            else:
                try:
                    found = importlib.util.find_spec(module) is not None
                except ModuleNotFoundError:
                    found = False
                if not found:
                    modules_missing.append(module)
    return pylimiter_missing, modules_missing


def test_there_are_examples():
    assert len(_examples()) >= 20


@pytest.mark.slow
@pytest.mark.parametrize("page, line, code", _examples())
def test_example_runs_as_written(tmp_path, page, line, code):
    not_merged, not_installed = _missing(code)
    if not_merged:
        assert PENDING in page.read_text(encoding="utf-8"), \
            f"{_rel(page)}:{line} imports {not_merged}, which do not exist"
        pytest.xfail(f"pending: {', '.join(not_merged)} not merged yet")
    if not_installed:
        pytest.skip(f"needs {', '.join(not_installed)}")
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, "-W", "default", str(script)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{_rel(page)}:{line}\n{proc.stdout}\n{proc.stderr}"
    assert "Warning" not in proc.stderr, f"{_rel(page)}:{line}\n{proc.stderr}"


# ---- the strict build ---------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    return out


#: The public modules whose every name (their __all__) the reference documents.
#: The framework integrations (each needs its extra, which the dev
#: environment installs): each has a page of its own, headed by its module.
INTEGRATION_MODULES = ("pylimiter.asgi", "pylimiter.aiohttp", "pylimiter.grpc",
                       "pylimiter.httpx", "pylimiter.otel")
PUBLIC_MODULES = ("pylimiter", "pylimiter.prometheus", "pylimiter.pulsar.balance",
                  "pylimiter.pulsar.cache", "pylimiter.pulsar.cursor", *INTEGRATION_MODULES)


def _public_names() -> list[str]:
    """Every name of every public module's __all__, and each integration
    module itself."""
    return [*INTEGRATION_MODULES, *(f"{name}.{attr}" for name in PUBLIC_MODULES
                                    for attr in importlib.import_module(name).__all__)]



@pytest.mark.slow
def test_strict_build_documents_every_public_name(site):
    ids = set()
    for page in (site / "api").rglob("index.html"):
        ids |= set(re.findall(r'\bid="([^"]+)"', page.read_text(encoding="utf-8")))
    missing = [name for name in _public_names() if name not in ids]
    assert missing == [], f"no API reference entry for {missing}"


@pytest.mark.slow
def test_built_pages_have_no_internal_references(site):
    found = {}
    for page in site.rglob("index.html"):
        if page.parent.name == "changelog":
            continue   # CHANGES.md: see test_changelog_has_no_internal_references
        text = page.read_text(encoding="utf-8")
        article = text[text.find("<article"):text.find("</article>")]
        words = html.unescape(re.sub(r"<[^>]+>", " ", article))
        hits = sorted({m.group(0) for m in JARGON.finditer(words)})
        if hits:
            found[str(page.relative_to(site))] = hits
    assert found == {}
