"""Shared by the benchmark scripts: machine facts and result files, from :mod:`cyto.bench`."""

from __future__ import annotations

from pathlib import Path

from cyto.bench.device import machine  # noqa: F401 - re-exported for the scripts
from cyto.bench.results import write_results


def write(out: Path, name: str, meta: dict, rows: list[dict], markdown: list[str]) -> Path:
    """``out/<name>_<host>_<date>.json`` and ``.md``; returns the JSON path."""
    path = write_results(out, name, meta, rows, markdown)
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return path
