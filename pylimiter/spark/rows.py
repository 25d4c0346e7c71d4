"""Result rows: each table's fields declared once, as ``(name, type)`` pairs in
Spark SQL's words (``int``, ``long``, ``double``, ``string``, ``boolean``),
and everything a pipeline derives from them: the Spark schema, rows whose
values have the Python type Spark accepts for each field, and the row of a
task that failed.

Executors run ``typed_row`` and ``failure_row`` (stdlib only); ``schema``
imports pyspark when called.
"""

from __future__ import annotations

import traceback
from typing import Any, Mapping, Sequence

__all__ = ["KINDS", "failure_row", "field_names", "schema", "typed_row"]

Fields = Sequence[tuple[str, str]]

#: Spark SQL type name -> the Python type a value of it must have (an int
#: where a double is declared is a type error in createDataFrame).
KINDS = {"int": int, "long": int, "double": float, "string": str, "boolean": bool}


def _check(fields: Fields) -> None:
    for name, kind in fields:
        if kind not in KINDS:
            raise ValueError(f"field {name!r}: unknown type {kind!r} "
                             f"(one of {', '.join(KINDS)})")


def schema(fields: Fields):
    """schema returns the Spark StructType of ``fields``, every field
    nullable."""
    from pyspark.sql import types as T

    _check(fields)
    spark_types = {"int": T.IntegerType, "long": T.LongType, "double": T.DoubleType,
                   "string": T.StringType, "boolean": T.BooleanType}
    return T.StructType([T.StructField(n, spark_types[k](), True) for n, k in fields])


def field_names(fields: Fields) -> list[str]:
    """The column names of ``fields``, in order."""
    return [n for n, _ in fields]


def typed_row(values: Mapping[str, Any], fields: Fields) -> tuple:
    """typed_row returns ``values`` (by field name) as a tuple in field order,
    each value converted to its field's Python type; a missing or None value
    is None."""
    return tuple(None if values.get(n) is None else KINDS[k](values[n]) for n, k in fields)


def failure_row(base: Mapping[str, Any], exc: BaseException) -> dict:
    """failure_row is the row of a task that raised: what identifies the task
    (``base``) and, under ``failure``, the exception in one line.  A failed
    point is a row, not a failed job: the others still count."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return {**base, "failure": text}
