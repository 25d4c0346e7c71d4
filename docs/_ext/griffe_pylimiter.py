"""A griffe extension for the API reference (mkdocs.yml loads it).

The reference is read statically from the pure-Python twin, whose
docstrings are held identical to the C twin's.  One idiom there is not
static: a class that shares another's docstring with
``__doc__ = Other.__doc__`` (``AsyncDualMemoryLimiter``).  This extension
gives such a class the other's docstring and drops the ``__doc__``
attribute, so the page shows the text instead of an attribute named
``__doc__``.
"""

from __future__ import annotations

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


def _classes(obj: griffe.Object):
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            yield member
            yield from _classes(member)
        elif member.is_module:
            yield from _classes(member)
