"""Shared by the benchmark scripts: machine facts and writing results as JSON and Markdown."""

from __future__ import annotations

import json
import os
import platform
import socket
from datetime import date
from pathlib import Path


def machine(command: str) -> dict[str, object]:
    """Where and how a benchmark ran (recorded with every result file)."""
    import torch

    return {
        "command": command,
        "host": socket.gethostname(),
        "date": str(date.today()),
        "cpu_count": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def write(out: Path, name: str, meta: dict, rows: list[dict], markdown: list[str]) -> Path:
    """``out/<name>_<host>_<date>.json`` and ``.md``; returns the JSON path."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{name}_{meta['host']}_{meta['date']}"
    stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": rows}, indent=2))
    stem.with_suffix(".md").write_text("\n".join(markdown) + "\n")
    print(f"wrote {stem}.json and .md")
    return stem.with_suffix(".json")
