"""Benchmark results as JSON plus a Markdown table, in a folder, named by kind, host and date."""

from __future__ import annotations

import itertools
import os
import re
import uuid
from pathlib import Path

from cyto.tables import json_text


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def write_results(out: Path, kind: str, meta: dict, rows: list[dict], markdown: list[str]) -> Path:
    """``out/<kind>_<host>_<date>.json`` and ``.md``; returns the JSON path. Another run of the
    same benchmark on the same day (before and after a change, two at once) gets ``-2``, ``-3``
    and so on: a result is never written over. Each file is whole or absent: a run stopped
    while it writes (Ctrl-C, a full disk) leaves no truncated JSON under a result's name."""
    from cyto.bundle import atomic_write

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = f"{kind}_{_slug(str(meta['host']))}_{meta['date']}"
    text = json_text({"kind": kind, "meta": meta, "results": rows}, indent=2, default=str)
    tmp = out / f".{base}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "x") as fh:  # the mode a plain open gives (others may read results)
            fh.write(text)
        for n in itertools.count(1):
            path = out / (f"{base}.json" if n == 1 else f"{base}-{n}.json")
            if _claim(tmp, path, text):
                break
    finally:
        tmp.unlink(missing_ok=True)
    atomic_write(path.with_suffix(".md"), ("\n".join(markdown) + "\n").encode())
    return path


def _claim(tmp: Path, path: Path, text: str) -> bool:
    """Give the whole file ``tmp`` the name ``path`` unless it is taken: a hard link, so a run
    at the same time never gets the name too. Where links are not allowed (some network and
    FUSE file systems) the name is claimed by creating it, then written."""
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        pass
    try:
        with open(path, "x") as fh:
            fh.write(text)
        return True
    except FileExistsError:
        return False


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
    # what picks the engines' kernels (VNNI, AMX, BF16) and how many threads ran them
    flags = " ".join(meta.get("cpu_flags") or []) or "unknown"
    threads = f"; {meta['affinity']} cores this process may use" if meta.get("affinity") else ""
    if meta.get("torch_threads"):
        threads += f", torch threads {meta['torch_threads']}"
    return [
        f"# {title}",
        "",
        f"Host `{meta['host']}`, {meta['date']}: {where}.",
        "",
        f"CPU instruction sets: {flags}{threads}.",
        "",
        f"Libraries: {libs}.",
        "",
        f"Command: `{meta['command']}`",
        "",
    ]
