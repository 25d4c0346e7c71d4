"""Small result tables written by the driver as single files: Parquet and
CSV, each appearing whole or not at all.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
from pathlib import Path

from .progress import job_description

__all__ = ["write_table"]

def _csv_value(v) -> str:
    # Spark's CSV spellings, so the tables read the same as before.
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)
    return str(v)


def write_table(df, out: Path, name: str, formats: tuple[str, ...] = ("parquet", "csv")) -> None:
    """write_table writes a (small) DataFrame as the single files
    ``out/name.parquet`` and ``out/name.csv`` (a header row, UTF-8), which a
    spreadsheet, pandas or Spark opens as they are, replacing what was there
    (the part-file folders of older runs included).  The rows are collected
    and written by the driver: executors of a cluster do not see the
    driver's disk (Spark's own writer would leave the part files in
    ``_temporary`` on the nodes and report success).  Each file appears
    whole or not at all (written beside it, then renamed)."""
    for fmt in formats:
        if fmt not in ("parquet", "csv"):
            raise ValueError(f"unknown table format {fmt!r} (parquet or csv)")
    sc = df.sparkSession.sparkContext
    with job_description(sc, f"write {name}.{'/'.join(formats)}"):
        rows = df.collect()
    fields = df.schema.fieldNames()
    for fmt in formats:
        path = Path(out) / f"{name}.{fmt}"
        tmp = path.with_name(f".{path.name}.tmp")
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq
            from pyspark.sql.pandas.types import to_arrow_schema

            schema = to_arrow_schema(df.schema)
            cols = [pa.array([r[i] for r in rows], type=f.type) for i, f in enumerate(schema)]
            pq.write_table(pa.Table.from_arrays(cols, schema=schema), tmp)
        else:
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                w = csv.writer(f)
                w.writerow(fields)
                w.writerows([_csv_value(v) for v in r] for r in rows)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        os.replace(tmp, path)
