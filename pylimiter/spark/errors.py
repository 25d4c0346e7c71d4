"""A Spark or Py4J failure said in one line: the Python worker's exception
or the deepest Java cause, not the first line of a trace; and what a JVM
that could not start printed before it exited.
"""

from __future__ import annotations

import contextlib
import re
from typing import Optional

from .cli import Failure

__all__ = ["SparkError", "jvm_start_cause", "root_cause", "spark_errors"]

class SparkError(Failure):
    """A Spark or Py4J failure, said in one line: its root cause (the
    Python worker's exception, the deepest Java cause), not the first line
    of a trace.  The original is its ``__cause__`` (PYLIMITER_TRACEBACK=1
    shows it)."""


_JAVA_EXC = re.compile(r"(?:Exception in thread \"[^\"]*\" |Caused by: )?"
                       r"(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error|Throwable))"
                       r"(?::\s*(.*))?")


def _python_cause(text: str) -> Optional[str]:
    """The last exception line of the last Python traceback in ``text``."""
    at = text.rfind("Traceback (most recent call last):")
    if at < 0:
        return None
    found = None
    for line in text[at:].splitlines()[1:]:
        if line.startswith("\tat ") or line.startswith("\t..."):
            break                       # the Java stack after the Python one
        if line.strip() and not line[0].isspace() and not line.startswith(
                ("During handling", "The above exception", "Traceback")):
            found = line.strip()
    return found


_JAVA_NAME = re.compile(r"(?:[a-z_$][\w$]*\.)+([A-Z][\w$]*(?:Exception|Error|Throwable))"
                        r"(?::\s*|$)")


def _java_cause(text: str) -> Optional[str]:
    """The innermost 'pkg.SomeException: message' in the first line of a
    Java exception's text, without the package."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    found = list(_JAVA_NAME.finditer(first))
    if not found:
        return None
    last = found[-1]
    rest = first[last.end():].strip()
    return f"{last.group(1)}: {rest}" if rest else last.group(1)


def root_cause(exc: BaseException) -> str:
    """root_cause says in one line what made a Spark or Py4J call fail: the
    exception a Python worker raised (the last line of its traceback), else
    the deepest cause of the Java exception, else the exception's first
    line."""
    texts = []
    java = getattr(exc, "java_exception", None)     # py4j's Py4JJavaError
    if java is not None:
        with contextlib.suppress(Exception):
            t, seen = java, 0
            while t is not None and seen < 20:
                texts.append(str(t.toString()))
                t, seen = t.getCause(), seen + 1
    texts.append(str(exc))
    for text in texts:
        cause = _python_cause(text)
        if cause:
            return cause
    for text in reversed(texts[:-1] or texts):
        cause = _java_cause(text)
        if cause:
            return cause
    text = str(exc).strip()
    first = re.sub(r"^An error occurred while calling \S+\.\s*", "", text.splitlines()[0]) \
        if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def spark_errors() -> tuple:
    """The exception types that mean "Spark or Py4J failed"."""
    kinds = []
    with contextlib.suppress(ImportError):
        from py4j.protocol import Py4JError
        kinds.append(Py4JError)
    with contextlib.suppress(ImportError):
        from pyspark.errors import PySparkException
        kinds.append(PySparkException)
    return tuple(kinds)


def jvm_start_cause(log: str) -> str:
    """What the JVM printed before it exited at start-up, in one line: its
    last exception (without the package) or, if none, its last line (the
    launcher script's own error, e.g. no Java)."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith("at "):
            continue
        m = _JAVA_EXC.fullmatch(line)
        if m:
            return f"{m.group(1)}: {m.group(2)}" if m.group(2) else m.group(1)
    # The launcher script's own complaint: its first words name the cause
    # (spark-class's "CMD: bad array subscript" only follows from it).
    lines = [re.sub(r"^\S*spark-(?:class|submit)\S*: line \d+: ", "", ln) for ln in lines
             if "bad array subscript" not in ln]
    if not lines:
        return "the JVM exited without a word (is Java 17+ installed?)"
    cause = lines[-1]
    if "java" in cause and ("No such file" in cause or "not found" in cause):
        cause += " (set JAVA_HOME to a Java 17+ installation, or install one)"
    return cause
