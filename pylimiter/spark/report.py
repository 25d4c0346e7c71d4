"""Static HTML reports: matplotlib without a display, figure saving, and one
page layout (title, environment block, verdict, figures, tables) that every
pipeline's ``reports/<name>/index.html`` shares.

Pages are plain HTML with PNGs beside them: they open from disk, need no
server and no JavaScript, and fit a 1400 px wide window.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import html
import math
import numbers
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Optional, Sequence

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
    alive until it is closed)."""
    plt = pyplot()
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
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
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


def _cell(v, floats: str) -> str:
    if v is None:
        return ""
    # Spark's decimals and numpy's scalars print as their Python kin
    if isinstance(v, numbers.Integral) and not isinstance(v, (int, bool)):
        v = int(v)
    elif isinstance(v, (decimal.Decimal, numbers.Real)) and not isinstance(v, (int, float)):
        v = float(v)
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        if math.isinf(v):
            return "∞" if v > 0 else "-∞"
        return floats.format(v) if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def html_table(rows, columns: Optional[Sequence[str]] = None, floats: str = "{:.2f}") -> str:
    """An HTML table from a pandas DataFrame or from row tuples with
    ``columns``; floats rounded (large ones as integers), NaN blank."""
    if hasattr(rows, "itertuples"):
        columns = list(rows.columns) if columns is None else list(columns)
        body = list(rows[columns].itertuples(index=False)) if len(rows) else []
    else:
        body = [tuple(r) for r in rows]
        columns = list(columns or [])
    if not body:
        return "<p class='none'>(none)</p>"
    # long snake_case names may break after an underscore, so wide tables
    # fit the page instead of scrolling
    left = " class='l'"   # text columns: header aligned with its cells
    head = "".join(
        f"<th{left if isinstance(first, str) else ''}>"
        f"{html.escape(str(c)).replace('_', '_<wbr>')}</th>"
        for c, first in zip(columns, body[0]))
    out = []
    for r in body:
        cells = []
        for v in r:
            klass = " class='l'" if isinstance(v, str) else ""
            cells.append(f"<td{klass}>{html.escape(_cell(v, floats))}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<div class='scroll'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(out)}</tbody></table></div>")


_CSS = f"""
body{{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;
max-width:{PAGE_WIDTH_PX - 48}px;padding:0 24px;color:#222;line-height:1.45}}
h1{{margin-bottom:4px}} h2{{margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}}
.sub{{color:#555;margin-top:0}}
.env{{font-size:13px;background:#f6f8fa;border:1px solid #e1e4e8;padding:8px 12px;border-radius:6px}}
.env td{{border:none;padding:1px 12px 1px 0;text-align:left;white-space:normal;
overflow-wrap:anywhere}} .env td:first-child{{white-space:nowrap}} .env td:first-child{{color:#555;vertical-align:top}}
.verdict{{background:#eef6ee;border-left:4px solid #3a7d44;padding:10px 14px;margin:16px 0}}
code,pre{{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}}
pre{{background:#f6f8fa;padding:8px 12px;overflow-x:auto;white-space:pre-wrap}}
.scroll{{overflow-x:auto;max-width:100%}}
table{{border-collapse:collapse;font-size:12px;margin:8px 0}}
td,th{{border:1px solid #ccc;padding:2px 5px;text-align:right;white-space:nowrap}}
th{{background:#eee;white-space:normal;vertical-align:bottom;min-width:3em}} td.l,th.l{{text-align:left}}
figure{{margin:12px 0}} img{{max-width:100%;height:auto;border:1px solid #eee}}
figcaption{{color:#555;font-size:13px}}
"""


class ReportPage:
    """ReportPage collects the parts of one report and writes ``index.html``.

    Parts appear in the order they are added, after the title, the command
    that produced the page, the environment block and the verdict."""

    def __init__(self, title: str, *, subtitle: Optional[str] = None,
                 command: Optional[str] = None, env: Optional[dict] = None):
        self.title, self.subtitle, self.command = title, subtitle, command
        self.env = env
        self._verdict: Optional[str] = None
        self._parts: list[str] = []

    def verdict(self, text: str) -> "ReportPage":
        """The one paragraph a reader should take away (plain text)."""
        self._verdict = text
        return self

    def heading(self, text: str) -> "ReportPage":
        self._parts.append(f"<h2>{html.escape(text)}</h2>")
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

    def table(self, rows, columns: Optional[Sequence[str]] = None, title: Optional[str] = None,
              floats: str = "{:.2f}") -> "ReportPage":
        if title:
            self.heading(title)
        self._parts.append(html_table(rows, columns, floats))
        return self

    def files(self, names: Iterable[str], note: str = "Data beside this page") -> "ReportPage":
        items = ", ".join(f"<code>{html.escape(n)}</code>" for n in names)
        self._parts.append(f"<p>{html.escape(note)}: {items}</p>")
        return self

    def render(self) -> str:
        e = html.escape
        head = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
                f"<meta name='viewport' content='width=device-width'>"
                f"<title>{e(self.title)}</title><style>{_CSS}</style></head><body>",
                f"<h1>{e(self.title)}</h1>"]
        if self.subtitle:
            head.append(f"<p class='sub'>{e(self.subtitle)}</p>")
        if self.env:
            rows = "".join(f"<tr><td>{e(k)}</td><td>{e(str(v))}</td></tr>"
                           for k, v in self.env.items())
            if self.command:
                rows += f"<tr><td>command</td><td><code>{e(self.command)}</code></td></tr>"
            head.append(f"<div class='env'><table>{rows}</table></div>")
        elif self.command:
            head.append(f"<pre>{e(self.command)}</pre>")
        if self._verdict:
            head.append(f"<div class='verdict'><b>Verdict.</b> {e(self._verdict)}</div>")
        return "\n".join(head + self._parts + ["</body></html>"])

    def write(self, out: Path) -> Path:
        """Write ``out/index.html`` (creating ``out``) and return its path."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        index = out / "index.html"
        index.write_text(self.render(), encoding="utf-8")
        return index


def command_line(prog: str, argv: Optional[Sequence[str]] = None) -> str:
    """The command as a user would type it again."""
    import shlex

    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join([prog, *map(shlex.quote, args)])
