"""A griffe extension for the API reference (mkdocs.yml loads it).

The reference is read statically from the pure-Python twin, whose
docstrings are held identical to the C twin's.  One idiom there is not
static: a class that shares another's docstring with
``__doc__ = Other.__doc__`` (``AsyncDualMemoryLimiter``).  This extension
gives such a class the other's docstring and drops the ``__doc__``
attribute, so the page shows the text instead of an attribute named
``__doc__``.

A second idiom: a function of another module made a static method with
``unlink = staticmethod(unlink_segment)`` (``SharedSemaphore.unlink``).
Statically that is an attribute whose value is a call; ``StaticMethods``
turns it into the function it names, so the page shows its signature and
docstring under the method's name.

A third: the docstrings introduce an indented example with reST's ``::``.
Markdown shows the indented block as code already, and would print the
``::`` as text; ``LiteralMarkers`` drops a ``::`` line (and turns a
paragraph's closing ``text::`` into ``text:``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe


class SharedDocstrings(griffe.Extension):
    """Resolve ``__doc__ = Other.__doc__`` in class bodies."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for cls in _classes(pkg):
            member = cls.members.get("__doc__")
            if not isinstance(member, griffe.Attribute):
                continue
            value = member.value
            if not (isinstance(value, griffe.ExprAttribute)
                    and str(value).endswith(".__doc__")):
                continue
            source_path = str(value)[: -len(".__doc__")]
            try:
                source = cls.parent.get_member(source_path)  # type: ignore[union-attr]
            except (KeyError, AttributeError):
                source = cls.parent.modules_collection.get_member(  # type: ignore[union-attr]
                    cls.parent.resolve(source_path))
            if source.docstring is None:
                continue
            cls.docstring = griffe.Docstring(source.docstring.value, parent=cls,
                                             lineno=source.docstring.lineno,
                                             endlineno=source.docstring.endlineno)
            del cls.members["__doc__"]


class StaticMethods(griffe.Extension):
    """Resolve ``name = staticmethod(function)`` in class bodies."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for cls in _classes(pkg):
            for name, member in list(cls.members.items()):
                if member.is_alias or not isinstance(member, griffe.Attribute):
                    continue
                value = member.value
                if not (isinstance(value, griffe.ExprCall)
                        and str(value.function) == "staticmethod"
                        and len(value.arguments) == 1
                        and isinstance(value.arguments[0], griffe.ExprName)):
                    continue
                target = cls.parent.members.get(str(value.arguments[0]))  # type: ignore[union-attr]
                if target is None:
                    continue
                if target.is_alias:
                    target = target.final_target
                if not isinstance(target, griffe.Function):
                    continue
                function = griffe.Function(
                    name, parameters=target.parameters, returns=target.returns,
                    lineno=member.lineno, endlineno=member.endlineno,
                    docstring=(None if target.docstring is None else griffe.Docstring(
                        target.docstring.value, lineno=target.docstring.lineno,
                        endlineno=target.docstring.endlineno)))
                function.labels.add("staticmethod")
                cls.set_member(name, function)
                if function.docstring is not None:
                    function.docstring.parent = function


class LiteralMarkers(griffe.Extension):
    """Drop reST's ``::`` literal-block markers from docstrings."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in _objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = _LITERAL.sub(_literal, obj.docstring.value)


_LITERAL = re.compile(r"^([ \t]*)(.*?)::[ \t]*$", re.MULTILINE)


def _literal(m: re.Match) -> str:
    return f"{m.group(1)}{m.group(2)}:" if m.group(2).strip() else ""


def _objects(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _objects(member)


def _classes(obj: griffe.Object):
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            yield member
            yield from _classes(member)
        elif member.is_module:
            yield from _classes(member)
