"""Checks on a written report page shared by the pipelines' end-to-end
tests (issue 32 item 13): every file the page lists beside it is there as
one file (a table's CSV one a spreadsheet opens, not a Spark folder of
part files), and the page names no file it did not write."""

from __future__ import annotations

import csv
import re
from pathlib import Path


def files_beside(index: Path) -> list[str]:
    """The files the page at ``index`` links beside it, each checked: a
    regular file, a CSV with a header row and rows of its width."""
    html = Path(index).read_text(encoding="utf-8")
    para = re.search(r"<p class='files'>(.*?)</p>", html, re.S)
    assert para, "the page lists no files beside it"
    assert "not written" not in para.group(1), para.group(1)
    names = re.findall(r"<a href='([^']+)'>", para.group(1))
    assert names
    for name in names:
        path = Path(index).parent / name
        assert path.is_file(), f"{path} is not a file"
        if name.endswith(".csv"):
            with path.open(encoding="utf-8", newline="") as f:
                assert f.read(1) != "\ufeff"
                f.seek(0)
                rows = list(csv.reader(f))
            assert rows and all(len(r) == len(rows[0]) for r in rows), name
    return names
