"""Static HTML reports: matplotlib without a display, figure saving, and one
page layout that every pipeline's ``reports/<name>/index.html`` shares:
title, a verdict table (claim, measured, holds?) a reader takes in at a
glance, a table of contents, the environment block, then figures and tables.

Pages are plain HTML with PNGs beside them: they open from disk, need no
server and no JavaScript, and fit a 1400 px wide window.  Numbers in a table
column share one format (fixed decimals), right-aligned.  A verdict's colour
says whether the outcome is good or bad for an operator, not whether the
claim holds (a confirmed bug is red).  A page written to ``reports/<name>``
also refreshes ``reports/index.html``, one page that links every report
there with its verdicts (``update_reports_index``).  What a page is drawn
from is one ``RunResult``, whatever the pipeline.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import html
import json
import math
import numbers
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union


@dataclass
class RunResult:
    """What one run of a pipeline produced, for its page (every pipeline's
    ``report.write_report(out, result, *, spark_version, command)``), its
    tables and its lines on the terminal.

    ``tables``: each result table by its name (the name of its Parquet and
    CSV files): a pandas frame, or a list of rows (dicts, or tuples in the
    order of the table's declared fields).  ``settings``: the Settings the
    run used (Pulsar's keys), if any.  ``params``: what else describes the
    run, by name (what was swept, where it ran, what it replayed).
    ``timings``: seconds by phase, keys ending in ``_s`` (counts the run
    made along the way may sit beside them)."""

    tables: dict[str, Any] = field(default_factory=dict)
    settings: Any = None
    params: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)


PAGE_WIDTH_PX = 1400
#: Figure width that fills the page at the dpi figures are saved with.
FIGURE_DPI = 90
FULL_WIDTH_IN = (PAGE_WIDTH_PX - 80) / FIGURE_DPI


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    """Write a finished figure as PNG and free it (pyplot keeps every figure
    alive until it is closed).  A figure made with a layout engine (e.g.
    ``layout="constrained"`` for a legend outside the axes) keeps it."""
    plt = pyplot()
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    fig.savefig(path, dpi=FIGURE_DPI)
    plt.close(fig)
    return Path(path)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "cpu model", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> Optional[str]:
    """The commit of the checkout pylimiter runs from, if it is one."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                            "--untracked-files=no"],
                           capture_output=True, text=True, timeout=5).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def environment(spark_version: Optional[str] = None, **extra) -> dict:
    """What a reader needs to judge the numbers: machine, interpreter,
    pylimiter version and commit, Spark version and the date."""
    from pylimiter import IMPLEMENTATION, __version__

    env = {
        "CPU": f"{_cpu_model()} ({os.cpu_count()} logical cores)",
        "OS": f"{platform.system()} {platform.release()} {platform.machine()}",
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "pylimiter": f"{__version__} ({IMPLEMENTATION} implementation"
                     + (f", commit {c}" if (c := _git_commit()) else "") + ")",
    }
    if spark_version:
        env["Spark"] = spark_version
    env["date"] = _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def plural(n, word: str, words: Optional[str] = None) -> str:
    """``plural(1, "seed")`` -> '1 seed', ``plural(3, "seed")`` -> '3 seeds'
    (``words``: an irregular plural)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def _scalar(v):
    # Spark's decimals and numpy's scalars print as their Python kin
    if isinstance(v, numbers.Integral) and not isinstance(v, (int, bool)):
        return int(v)
    if isinstance(v, (decimal.Decimal, numbers.Real)) and not isinstance(v, (int, float)):
        return float(v)
    return v


Format = Union[str, Callable[[object], str]]


def _cell(v, fmt: Optional[Format]) -> str:
    v = _scalar(v)
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
    if fmt is not None and isinstance(v, (int, float)) and not isinstance(v, bool):
        return fmt(v) if callable(fmt) else fmt.format(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def _column_format(values, floats: str) -> Optional[str]:
    """One format for a whole column, so its numbers line up: integers with
    thousands separators; floats with ``floats``, or without decimals when
    the column reaches 100 (decimals there are noise)."""
    finite = [v for v in map(_scalar, values)
              if isinstance(v, float) and math.isfinite(v)]
    if not finite:
        return None
    return "{:,.0f}" if max(abs(v) for v in finite) >= 100 else floats


_NUMBER_TEXT = re.compile(r"^[-−]?\d[\d,.]*(x|%)?( \[.*\])?$")


def _is_text(v) -> bool:
    """Left-aligned: words; a number already written out ("2.67x [2.66-2.72]")
    stays right-aligned with the other numbers."""
    return isinstance(v, str) and not _NUMBER_TEXT.match(v)


def _header(columns, first_row) -> str:
    """One header row; two when some columns are (group, name) pairs, the
    group spanning its columns."""
    left = " class='l'"   # text columns: header aligned with its cells

    def th(c, first, extra=""):
        klass = left if _is_text(first) else ""
        # long snake_case names may break after an underscore, so wide
        # tables fit the page instead of scrolling
        return f"<th{klass}{extra}>{html.escape(str(c)).replace('_', '_<wbr>')}</th>"

    if not any(isinstance(c, tuple) for c in columns):
        return "<tr>" + "".join(th(c, f) for c, f in zip(columns, first_row)) + "</tr>"
    top, bottom, i = [], [], 0
    while i < len(columns):
        c = columns[i]
        if not isinstance(c, tuple):
            top.append(th(c, first_row[i], " rowspan='2'"))
            i += 1
            continue
        j = i
        while j < len(columns) and isinstance(columns[j], tuple) and columns[j][0] == c[0]:
            bottom.append(th(columns[j][1], first_row[j]))
            j += 1
        top.append(f"<th class='group' colspan='{j - i}'>{html.escape(str(c[0]))}</th>")
        i = j
    return f"<tr>{''.join(top)}</tr><tr>{''.join(bottom)}</tr>"


def html_table(rows, columns: Optional[Sequence] = None, floats: str = "{:.2f}",
               formats: Optional[Mapping[object, Format]] = None,
               caption: Optional[str] = None,
               headers: Optional[Mapping[object, object]] = None) -> str:
    """An HTML table from a pandas DataFrame or from row tuples with
    ``columns``; NaN blank.  Each numeric column has one format:
    ``formats[column]`` (a format string or a function) when given, else
    ``floats`` for a float column (no decimals once it reaches 100) and
    thousands separators for integers.  ``headers[column]``: the header to
    show (words and units for a data column's name); a header (group, name)
    goes under a header cell ``group`` shared with its neighbours."""
    if hasattr(rows, "itertuples"):
        columns = list(rows.columns) if columns is None else list(columns)
        body = list(rows[columns].itertuples(index=False)) if len(rows) else []
    else:
        body = [tuple(r) for r in rows]
        columns = list(columns or [])
    if not body:
        return "<p class='none'>(none)</p>"
    formats = dict(formats or {})
    fmts = [formats[c] if c in formats else _column_format([r[k] for r in body], floats)
            for k, c in enumerate(columns)]
    # a column is text (left) when any of its cells is: a settings column
    # of "4 bundles" and "0.9" lines up on one side
    text = [any(_is_text(r[k]) for r in body) for k in range(len(columns))]
    out = []
    for r in body:
        cells = []
        for v, fmt, left in zip(r, fmts, text):
            klass = " class='l'" if left else ""
            cells.append(f"<td{klass}>{html.escape(_cell(v, fmt))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    shown = [(headers or {}).get(c, c) for c in columns]
    first = ["text" if t else 0 for t in text]     # aligns each header with its column
    return (f"<div class='scroll'><table>{cap}<thead>{_header(shown, first)}</thead>"
            f"<tbody>{''.join(out)}</tbody></table></div>")


@dataclass(frozen=True)
class Verdict:
    """One row of a page's verdict table: the claim in words, what this run
    measured, and whether the claim holds (True, False, None for not
    measured, or a word such as "cost" for a row that is not a claim).

    ``good``: whether the outcome is good for an operator, which sets the
    row's colour (green, red; grey for None).  By default it is ``holds``
    when that is True or False: a claim the project wants to be true.  A
    claim that states a problem ("Pulsar's TTL expires delayed messages
    early") passes ``good=not holds``: confirmed, it is red."""

    claim: str
    measured: str
    holds: Union[bool, None, str]
    good: Optional[bool] = None

    def __post_init__(self):
        # numpy's bools (a comparison of two table cells) are not True/False
        for name in ("holds", "good"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (bool, str)):
                object.__setattr__(self, name, bool(v))
        if isinstance(self.good, str):
            raise TypeError("Verdict.good is True, False or None")
        if self.good is None and isinstance(self.holds, bool):
            object.__setattr__(self, "good", self.holds)

    def holds_text(self) -> str:
        if self.holds is True:
            return "yes"
        if self.holds is False:
            return "no"
        if self.holds is None:
            return "not measured"
        return str(self.holds)


#: The line under every verdict table.
VERDICT_COLOURS = ("Colours: green = good for an operator, red = bad for an operator (a "
                   "confirmed problem is red although its claim holds), grey = not a yes/no "
                   "claim or not measured.")


def verdict_table(rows: Sequence[Verdict]) -> str:
    """The verdict rows as the compact table a page opens with, coloured by
    ``Verdict.good``."""
    body = []
    for v in rows:
        klass = "good" if v.good is True else "bad" if v.good is False else "na"
        body.append(f"<tr><td class='l'>{html.escape(v.claim)}</td>"
                    f"<td class='l'>{html.escape(v.measured)}</td>"
                    f"<td class='{klass}'>{html.escape(v.holds_text())}</td></tr>")
    return ("<table class='verdict'><thead><tr><th class='l'>claim</th>"
            "<th class='l'>measured in this run</th><th class='l'>holds?</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>")


_CSS = f"""
body{{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:{PAGE_WIDTH_PX - 48}px;padding:0 24px;color:#222;line-height:1.45}}
h1{{margin-bottom:4px}} h2{{margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}}
.sub{{color:#555;margin-top:0}}
.env{{font-size:13px;background:#f6f8fa;border:1px solid #e1e4e8;padding:8px 12px;
border-radius:6px}}
.env td{{border:none;padding:1px 12px 1px 0;text-align:left;white-space:normal;
overflow-wrap:anywhere}} .env td:first-child{{white-space:nowrap}}
.env td:first-child{{color:#555;vertical-align:top}}
table.verdict{{font-size:14px;margin:12px 0 8px;width:100%}}
table.verdict td{{white-space:normal;vertical-align:top;padding:4px 8px}}
table.verdict td:first-child{{width:32%;font-weight:600}} table.verdict th{{padding:4px 8px}}
table.verdict td.good{{background:#e3f2e5;color:#1e6b2b;font-weight:700}}
table.verdict td.bad{{background:#fbe5e3;color:#a12a1f;font-weight:700}}
.colours{{color:#666;font-size:12px;margin:0 0 8px}}
table.verdict td.na{{background:#f3f3f3;color:#555}}
table.verdict td:last-child{{width:7em;white-space:nowrap;text-align:center}}
.note{{color:#444;font-size:14px;margin:4px 0 12px}}
nav.toc{{font-size:14px;margin:8px 0 16px;padding:6px 10px;background:#f6f8fa;
border:1px solid #e1e4e8;border-radius:6px}} nav.toc a{{margin-right:4px}}
.tables{{display:flex;flex-wrap:wrap;gap:8px 28px;align-items:flex-start}}
caption{{text-align:left;font-weight:600;font-size:14px;padding:2px 0}}
th.group{{text-align:center}}
code,pre{{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}}
pre{{background:#f6f8fa;padding:8px 12px;overflow-x:auto;white-space:pre-wrap}}
.scroll{{overflow-x:auto;max-width:100%}}
table{{border-collapse:collapse;font-size:12px;margin:8px 0}}
td,th{{border:1px solid #ccc;padding:2px 4px;text-align:right;white-space:nowrap;
font-variant-numeric:tabular-nums}}
th{{background:#eee;white-space:normal;vertical-align:bottom;min-width:2.5em}}
td.l,th.l{{text-align:left}}
figure{{margin:12px 0}} img{{max-width:100%;height:auto;border:1px solid #eee}}
figcaption{{color:#555;font-size:13px}}
"""


class ReportPage:
    """ReportPage collects the parts of one report and writes ``index.html``.

    The page opens with the title and the verdict table (``verdicts``),
    then a table of contents when the page has ``TOC_MIN_SECTIONS``
    sections or more (longer than two screens), then the environment block
    and the command; the parts follow in the order they are added."""

    #: Sections from which a page gets a table of contents.
    TOC_MIN_SECTIONS = 3

    def __init__(self, title: str, *, subtitle: Optional[str] = None,
                 command: Optional[str] = None, env: Optional[dict] = None):
        self.title, self.subtitle, self.command = title, subtitle, command
        self.env = env
        self._verdicts: list[Verdict] = []
        self._note: Optional[str] = None
        # HTML, or a function of the page's folder (None: not known) to HTML
        self._parts: list = []
        self._sections: list[tuple[str, str]] = []

    def verdicts(self, rows: Iterable[Verdict], note: Optional[str] = None) -> "ReportPage":
        """The claims and what this run measured, computed from its data
        (``note``: one line under the table, plain text)."""
        self._verdicts = list(rows)
        self._note = note
        return self

    def heading(self, text: str) -> "ReportPage":
        """A section: an ``h2`` with an anchor, listed in the contents."""
        slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
        taken = {a for a, _ in self._sections}
        anchor, n = slug, 2
        while anchor in taken:
            anchor, n = f"{slug}-{n}", n + 1
        self._sections.append((anchor, text))
        self._parts.append(f"<h2 id='{anchor}'>{html.escape(text)}</h2>")
        return self

    def paragraph(self, text: str) -> "ReportPage":
        self._parts.append(f"<p>{html.escape(text)}</p>")
        return self

    def raw(self, markup: str) -> "ReportPage":
        """Trusted HTML written by the pipeline itself (never user data)."""
        self._parts.append(markup)
        return self

    def figure(self, png: str | Path, caption: Optional[str] = None,
               title: Optional[str] = None) -> "ReportPage":
        """A PNG that lies in the report folder, by file name."""
        name = Path(png).name
        if title:
            self.heading(title)
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self._parts.append(f"<figure><img src='{html.escape(name)}' "
                           f"alt='{html.escape(title or caption or name)}'>{cap}</figure>")
        return self

    def table(self, rows, columns: Optional[Sequence] = None, title: Optional[str] = None,
              floats: str = "{:.2f}", formats: Optional[Mapping[object, Format]] = None,
              caption: Optional[str] = None,
              headers: Optional[Mapping[object, object]] = None) -> "ReportPage":
        """A table (``html_table``) under an optional section title."""
        if title:
            self.heading(title)
        self._parts.append(html_table(rows, columns, floats, formats, caption, headers))
        return self

    def tables(self, tables: Iterable[str], title: Optional[str] = None) -> "ReportPage":
        """Small tables (``html_table`` output, each with a caption) side by
        side, wrapping to the next line when the page is full."""
        if title:
            self.heading(title)
        self._parts.append(f"<div class='tables'>{''.join(tables)}</div>")
        return self

    def files(self, names: Iterable[str], note: str = "Data beside this page") -> "ReportPage":
        """Links to files written beside the page (single files: a table's
        ``.csv`` opens in a spreadsheet as it is).  ``write`` links those
        that are there and names any that are not, so the page never
        promises a file it does not have."""
        names = list(names)
        e = html.escape

        def part(out: Optional[Path]) -> str:
            there = [n for n in names if out is None or (Path(out) / n).is_file()]
            items = ", ".join(f"<a href='{e(n)}'><code>{e(n)}</code></a>" for n in there)
            text = f"<p class='files'>{e(note)}: {items or '(none)'}"
            missing = [n for n in names if n not in there]
            if missing:
                text += f" <span class='missing'>(not written: {e(', '.join(missing))})</span>"
            return text + "</p>"
        self._parts.append(part)
        return self

    def render(self, out: Optional[Path] = None) -> str:
        """The page's HTML; ``out``: the folder it goes to (files beside it
        are looked for there)."""
        e = html.escape
        head = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
                f"<meta name='viewport' content='width=device-width'>"
                f"<title>{e(self.title)}</title><style>{_CSS}</style></head><body>",
                f"<h1>{e(self.title)}</h1>"]
        if self.subtitle:
            head.append(f"<p class='sub'>{e(self.subtitle)}</p>")
        if self._verdicts:
            head.append(verdict_table(self._verdicts))
            head.append(f"<p class='colours'>{e(VERDICT_COLOURS)}</p>")
        if self._note:
            head.append(f"<p class='note'>{e(self._note)}</p>")
        if len(self._sections) >= self.TOC_MIN_SECTIONS:
            links = " · ".join(f"<a href='#{a}'>{e(t)}</a>" for a, t in self._sections)
            head.append(f"<nav class='toc'><b>Contents:</b> {links}</nav>")
        if self.env:
            rows = "".join(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>"
                           for k, v in self.env.items())
            if self.command:
                rows += f"<tr><td>command</td><td><code>{e(self.command)}</code></td></tr>"
            head.append(f"<div class='env'><table>{rows}</table></div>")
        elif self.command:
            head.append(f"<pre>{e(self.command)}</pre>")
        parts = [p(out) if callable(p) else p for p in self._parts]
        return "\n".join(head + parts + ["</body></html>"])

    def write(self, out: Path) -> Path:
        """Write ``out/index.html`` (creating ``out``) and ``out/report.json``
        (title and verdicts, for the run's index) and return the page's path.
        When ``out`` lies in a folder named ``reports``, that folder's
        ``index.html`` is refreshed (``update_reports_index``)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        index = out / "index.html"
        _write_text(index, self.render(out))
        _write_text(out / SUMMARY_FILE, json.dumps({
            "title": self.title, "subtitle": self.subtitle,
            "written": _dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
            "verdicts": [{"claim": v.claim, "measured": v.measured, "holds": v.holds,
                          "good": v.good} for v in self._verdicts]}, indent=1))
        if out.resolve().parent.name == REPORTS_FOLDER:
            update_reports_index(out.resolve().parent)
        return index


#: What ``ReportPage.write`` leaves beside a page for the run's index.
SUMMARY_FILE = "report.json"
#: Pages written in a folder of this name are listed in its index.html.
REPORTS_FOLDER = "reports"


def _write_text(path: Path, text: str) -> None:
    """Write a whole file or nothing (a reader never sees half a page)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _page_title(index: Path) -> str:
    m = re.search(r"<title>(.*?)</title>", index.read_text(encoding="utf-8", errors="replace"),
                  re.S)
    return html.unescape(m.group(1)) if m else index.parent.name


def update_reports_index(folder: Path) -> Path:
    """Write ``folder/index.html``: a link to every report in a subfolder
    of ``folder`` (one with an ``index.html``), in name order, with when it
    was written and its verdict table (from its ``report.json``; a page
    without one is listed by its title).  Returns the index's path."""
    folder = Path(folder)
    e = html.escape
    parts, links = [], []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        page = sub / "index.html"
        if not page.is_file():
            continue
        info: dict = {}
        try:
            info = json.loads((sub / SUMMARY_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            pass
        title = info.get("title") or _page_title(page)
        href = f"{sub.name}/index.html"
        rows = [Verdict(v["claim"], v["measured"], v["holds"], v.get("good"))
                for v in info.get("verdicts", []) if isinstance(v, dict)]
        good = sum(v.good is True for v in rows)
        bad = sum(v.good is False for v in rows)
        tally = (f"{plural(good, 'good outcome')}, {plural(bad, 'bad outcome')}, "
                 f"{len(rows) - good - bad} other" if rows else "no verdicts")
        links.append(f"<li><a href='{e(href)}'>{e(title)}</a> "
                     f"<span class='sub'>({e(sub.name)}, {e(tally)})</span></li>")
        parts.append(f"<h2 id='{e(sub.name)}'><a href='{e(href)}'>{e(title)}</a></h2>")
        when = info.get("written") or _dt.datetime.fromtimestamp(
            page.stat().st_mtime).astimezone().strftime("%Y-%m-%d %H:%M %Z")
        parts.append(f"<p class='sub'>{e(sub.name)}/ &middot; written {e(when)}"
                     + (f" &middot; {e(info['subtitle'])}" if info.get("subtitle") else "")
                     + "</p>")
        if rows:
            parts.append(verdict_table(rows))
    body = ([f"<ul>{''.join(links)}</ul>", f"<p class='colours'>{e(VERDICT_COLOURS)}</p>"]
            + parts) if links else ["<p class='none'>No reports yet.</p>"]
    text = "\n".join(
        [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
         f"<meta name='viewport' content='width=device-width'><title>pylimiter reports</title>"
         f"<style>{_CSS}</style></head><body>",
         "<h1>pylimiter reports</h1>",
         f"<p class='sub'>Every report in this folder ({e(folder.name)}/), with the verdicts "
         "it opens with. Each line links to the full page.</p>", *body, "</body></html>"])
    index = folder / "index.html"
    _write_text(index, text)
    return index


def command_line(prog: str, argv: Optional[Sequence[str]] = None) -> str:
    """The command as a user would type it again."""
    import shlex

    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join([prog, *map(shlex.quote, args)])
