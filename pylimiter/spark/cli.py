"""What every ``python -m pylimiter...`` command keeps to.

- ``--version``; every option's default shown in ``--help``;
- exit status 2 for usage errors (bad flags, bad input files, a missing
  extra), 1 for runtime errors, 130 when interrupted, each reported in one
  line on stderr, never a traceback (``PYLIMITER_TRACEBACK=1`` shows it);
  Ctrl-C prints ``PROG: interrupted`` once, however many times it is
  pressed and whatever was running;
- an ``--out`` folder that cannot be written is a usage error, said before
  any work starts;
- numbers printed rounded, with their units (``fmt_*``).

Needs the standard library only (the topic-list service, which has no
Spark, builds its command on it too).  ``pylimiter.spark.UsageError`` is
this module's UsageError.
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .._extras import missing

DISTRIBUTION = "pylimiter-pulsar"


class UsageError(Exception):
    """Bad input from the command line or an input file: the CLI prints one
    line and exits with status 2."""


class Failure(Exception):
    """A runtime failure whose message already says what went wrong and what
    to do, in one line: the CLI prints it as is (no exception name) and
    exits with status 1."""


_announced: set = set()


def announce_interrupt(prog: str) -> None:
    """announce_interrupt prints ``PROG: interrupted`` on stderr the first
    time it is called for ``prog`` and never again: a signal handler says
    it at once, ``run`` only if nobody did."""
    if prog in _announced:
        return
    _announced.add(prog)
    print(f"{prog}: interrupted", file=sys.stderr, flush=True)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (when it has one worth showing) and keeps
    the description's line breaks."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            default = action.default
            if isinstance(default, (list, tuple)):
                default = ",".join(map(str, default))
            text = f"{text} (default: {str(default).replace('%', '%%')})".strip()
        return text


def make_parser(prog: str, description: str, **kw) -> argparse.ArgumentParser:
    """make_parser builds an ArgumentParser that shows defaults and answers
    ``--version``."""
    from pylimiter import IMPLEMENTATION, __version__

    ap = argparse.ArgumentParser(prog=prog, description=description,
                                 formatter_class=_Formatter, **kw)
    ap.add_argument("--version", action="version",
                    version=f"{prog} ({DISTRIBUTION} {__version__}, "
                            f"{IMPLEMENTATION} implementation)")
    return ap


class _SubcommandParser(argparse.ArgumentParser):
    """A sub-command's parser that refuses its own unknown flags: argparse
    leaves them to the top parser, whose usage line then names the wrong
    command (``usage: PROG [-h] [--version] COMMAND ...``)."""

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def subparsers(ap: argparse.ArgumentParser, **kw):
    """Sub-commands whose parsers keep the same formatter and report their
    own unknown flags with their own (short) usage."""
    kw.setdefault("parser_class", _SubcommandParser)
    sub = ap.add_subparsers(**kw)
    original = sub.add_parser

    def add_parser(name, **pkw):
        pkw.setdefault("formatter_class", _Formatter)
        return original(name, **pkw)

    sub.add_parser = add_parser
    return sub


def writable_dir(text: str) -> Path:
    """argparse type for ``--out``: the folder is created if needed and must
    be writable, else the command stops at once with a one-line usage error."""
    path = Path(text)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(
            f"cannot write to {text}: {exc.strerror or exc}") from None
    return path


def _parse(text: str, kind: Callable[[str], Any], what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _parse(text, int, "an integer")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _parse(text, int, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _parse(text, float, "a number")
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _parse(text, float, "a number")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    """A number between 0 and 1, both included."""
    value = non_negative_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def port(text: str) -> int:
    """A TCP port, 0 meaning any free one."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"must be a port number 0..65535, got {value}")
    return value


def name_list(choices: Sequence[str]) -> Callable[[str], list]:
    """argparse type: a comma-separated, non-empty list of names out of
    ``choices``."""
    def parse(text: str) -> list:
        vals = [x.strip() for x in text.split(",") if x.strip()]
        bad = [v for v in vals if v not in choices]
        if bad or not vals:
            raise argparse.ArgumentTypeError(
                f"unknown {bad[0] if bad else '(empty)'!r}; choose from {', '.join(choices)}")
        return vals
    return parse


def number_list(kind: Callable[[str], float], minimum: float, what: str = "numbers",
                maximum: Optional[float] = None) -> Callable[[str], list]:
    """argparse type: a comma-separated, non-empty list of ``kind`` values,
    each >= ``minimum`` (and <= ``maximum`` when given)."""
    def parse(text: str) -> list:
        try:
            vals = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r}") from None
        if not vals or any(not math.isfinite(v) or v < minimum for v in vals):
            raise argparse.ArgumentTypeError(f"expected {what} >= {minimum}, got {text!r}")
        if maximum is not None and any(v > maximum for v in vals):
            raise argparse.ArgumentTypeError(
                f"expected {what} between {minimum} and {maximum}, got {text!r}")
        return vals
    return parse


def require(modules: Sequence[str], extra: str) -> None:
    """UsageError when one of ``modules`` cannot be imported: which module
    is missing, which package provides it, and the install that works today
    (``pip install '.[extra]'`` from a checkout, or the extra's packages:
    pylimiter._extras, a copy of pyproject.toml's extras)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise UsageError(missing(name, extra, cause=exc.name, error=str(exc))) from None


def one_line(exc: BaseException) -> str:
    """The first line of ``exc``, after its type's name (a Failure's message
    alone)."""
    text = str(exc).strip()
    if isinstance(exc, Failure) and text:
        return text.splitlines()[0]
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def run(main: Callable[[Optional[Sequence[str]]], int], prog: str,
        argv: Optional[Sequence[str]] = None) -> int:
    """run calls ``main(argv)`` and turns what escapes it into the exit
    statuses above (argparse's own errors already exit 2)."""
    _announced.discard(prog)
    try:
        return main(argv)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        announce_interrupt(prog)
        return 130
    except Exception as exc:
        if os.environ.get("PYLIMITER_TRACEBACK"):
            raise
        print(f"{prog}: error: {one_line(exc)}", file=sys.stderr)
        return 1


# ---- numbers with units ---------------------------------------------------------


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def fmt_seconds(s: float) -> str:
    """0.000123 -> '123 µs', 75 -> '1 min 15 s'."""
    s = float(s)
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 60:
        return f"{s:.1f} s"
    m, rest = divmod(round(s), 60)
    return f"{m} min {rest} s"


def fmt_rate(x: float, unit: str) -> str:
    """1234567, 'rows' -> '1.23 M rows/s'."""
    x = float(x)
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {prefix} {unit}/s"
    return f"{x:.1f} {unit}/s"
