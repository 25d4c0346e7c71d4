"""One source for every speed figure: README.md's table is the copy of
benchmarks/results/headline.md that `make bench-table` writes (between the
README's headline markers), and the docs' Performance page includes the
same file, so the two places cannot disagree."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEADLINE = ROOT / "benchmarks" / "results" / "headline.md"
README = ROOT / "README.md"

pytestmark = pytest.mark.skipif(not (README.exists() and HEADLINE.exists()),
                                reason="README.md and the benchmark results are not "
                                       "beside the tests")


def _block(text: str) -> str:
    from benchmarks.table import HEADLINE_END, HEADLINE_START

    start, end = text.index(HEADLINE_START), text.index(HEADLINE_END)
    return text[start + len(HEADLINE_START):end].strip("\n")


def test_readme_shows_the_headline_file_as_written():
    assert _block(README.read_text(encoding="utf-8")) == HEADLINE.read_text(
        encoding="utf-8").strip("\n")


def test_the_docs_include_the_same_file():
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert '--8<-- "benchmarks/results/headline.md"' in page


def test_the_headline_has_every_figure_it_lists():
    from benchmarks.table import HEADLINE as ROWS

    text = HEADLINE.read_text(encoding="utf-8")
    for _, label in ROWS:
        assert f"| {label} |" in text


def test_sync_replaces_only_the_block(tmp_path):
    from benchmarks.table import HEADLINE_END, HEADLINE_START, sync_readme

    readme = tmp_path / "README.md"
    readme.write_text(f"top\n{HEADLINE_START}\nold\n{HEADLINE_END}\nbottom\n")
    assert sync_readme("| new |\n", readme)
    assert readme.read_text() == f"top\n{HEADLINE_START}\n| new |\n{HEADLINE_END}\nbottom\n"
    assert not sync_readme("x", tmp_path / "missing.md")
