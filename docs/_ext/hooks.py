"""MkDocs hooks (mkdocs.yml ``hooks:``).

The figures the pages show are the committed images in benchmarks/results/,
the same files the README shows: published here under ``results/`` rather
than copied into docs/, so a new benchmark run updates both at once.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def on_files(files: Files, config) -> Files:
    for image in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"results/{image.name}", abs_src_path=str(image)))
    return files
