"""Shared by the benchmark scripts: machine facts and result files, from :mod:`cyto.bench`."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from cyto.bench.device import machine  # noqa: F401 - re-exported for the scripts
from cyto.bench.results import write_results


def write(out: Path, name: str, meta: dict, rows: list[dict], markdown: list[str]) -> Path:
    """``out/<name>_<host>_<date>.json`` and ``.md``; returns the JSON path."""
    path = write_results(out, name, meta, rows, markdown)
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return path


def where(command: str, meta: dict, device: object) -> str:
    """The Markdown line that says what ran where: the command, the host, its CPU and GPU."""
    gpu = meta.get("gpu") or {}
    on = f"{gpu['name']}, " if gpu and str(device).startswith("cuda") else ""
    return (
        f"`{command}` on {meta['host']} ({on}{meta['cpu_count']} CPUs, {meta['cpu']}), "
        f"device {device}"
    )


def score_summary(slide: Path, model: Path, out: Path, *extra: str) -> dict:
    """``cyto score`` in a process of its own (its peak memory is the scoring's alone); returns
    the slide's summary.json."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cyto",
            "score",
            str(slide),
            "--model",
            str(model),
            "--out",
            str(out),
            "--mosaic",
            "0",
            *extra,
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "CYTO_PROGRESS": "0"},
    )
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads((Path(out) / Path(slide).stem / "summary.json").read_text())


def mean_sd(values, fmt: str = "{:.4f}") -> str:
    """``mean ± sd`` of a benchmark column over seeds (the mean alone for one value)."""
    v = list(values)
    sd = f" ± {fmt.format(statistics.stdev(v))}" if len(v) > 1 else ""
    return fmt.format(statistics.mean(v)) + sd


def paired_gain(diffs) -> dict:
    """Paired gains over seeds (one difference per seed): ``gain`` (mean), ``sd``, the one-sample
    ``t`` (+-inf when every seed gained or lost the same, 0 when none moved), ``better`` (seeds
    above 0) and ``n``."""
    d = list(diffs)
    mean = statistics.mean(d)
    sd = statistics.stdev(d) if len(d) > 1 else 0.0
    flat = math.copysign(math.inf, mean) if mean else 0.0
    t = mean / (sd / math.sqrt(len(d))) if sd > 0 else flat
    return {"gain": mean, "sd": sd, "t": t, "better": sum(x > 0 for x in d), "n": len(d)}
