"""Benchmark results as JSON plus a Markdown table, in a folder, named by kind, host and date."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def write_results(out: Path, kind: str, meta: dict, rows: list[dict], markdown: list[str]) -> Path:
    """``out/<kind>_<host>_<date>.json`` and ``.md``; returns the JSON path. Another run of the
    same benchmark on the same day (before and after a change, two at once) gets ``-2``, ``-3``
    and so on: a result is never written over."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = f"{kind}_{_slug(str(meta['host']))}_{meta['date']}"
    text = json.dumps({"kind": kind, "meta": meta, "results": rows}, indent=2, default=str)
    for n in itertools.count(1):
        path = out / (f"{base}.json" if n == 1 else f"{base}-{n}.json")
        try:
            with open(path, "x") as fh:  # claims the name, also against a run at the same time
                fh.write(text)
            break
        except FileExistsError:
            continue
    path.with_suffix(".md").write_text("\n".join(markdown) + "\n")
    return path


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    """Rows as a Markdown table: ``columns`` are (key, header); missing values print as '-'."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        cells = []
        for key, _ in columns:
            v = r.get(key)
            if v is None:
                cells.append("-")
            elif isinstance(v, float):
                cells.append(f"{v:,.3g}" if abs(v) < 100 else f"{v:,.0f}")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def header(title: str, meta: dict) -> list[str]:
    gpu = meta.get("gpu") or {}
    where = f"{meta['cpu']}, {meta['cpu_count']} CPUs"
    if gpu:
        where += (
            f"; GPU {gpu['name']} ({gpu['memory_gib']} GiB, driver {gpu.get('driver')}, "
            f"CUDA {gpu.get('cuda_runtime')})"
        )
    libs = ", ".join(f"{k} {v}" for k, v in meta.get("libraries", {}).items())
    return [
        f"# {title}",
        "",
        f"Host `{meta['host']}`, {meta['date']}: {where}.",
        "",
        f"Libraries: {libs}.",
        "",
        f"Command: `{meta['command']}`",
        "",
    ]
