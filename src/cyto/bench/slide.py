"""``cyto bench slide``: end-to-end scoring of one slide, per stage, against a naive baseline.

1. cyto's pipeline (:func:`cyto.infer.score_slide`): cells/s end to end, the time of each
   stage (mask, read/decode, detect, crop, nucleus (the nucleus-size
   ranking's shares), engine, write, finish), and pipeline efficiency =
   end-to-end cells/s / engine-only cells/s, both from this run.
2. A naive baseline in the same run, the way peers' scripts work: one ``read_region`` per nucleus,
   PyTorch eager fp32, a Python loop. It scores a random sample of the same cells (their centres
   come from step 1, so the baseline is not charged for detection) and its scores are compared
   with the pipeline's.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from cyto.data.images import resize_rgb


def naive_baseline(
    slide: Path, model: Path, xs: np.ndarray, ys: np.ndarray, patch: int, batch: int = 64
) -> tuple[np.ndarray, float]:
    """(scores, seconds): one read per cell, PyTorch eager fp32 on the CPU, a Python loop."""
    from cyto.runtime import load_scorer
    from cyto.slides import open_slide

    t0 = time.perf_counter()
    scorer = load_scorer(Path(model), "torch", "cpu")
    size = scorer.spec.crop_size
    reader = open_slide(slide)
    half = patch // 2
    scores, buf = [], []
    for x, y in zip(xs, ys, strict=True):
        crop = reader.read_region(int(round(x)) - half, int(round(y)) - half, patch, patch)
        buf.append(resize_rgb(crop, size))
        if len(buf) == batch:
            scores.append(scorer.score(np.stack(buf), batch))
            buf = []
    if buf:
        scores.append(scorer.score(np.stack(buf), batch))
    reader.close()
    out = np.concatenate(scores) if scores else np.empty(0)
    return out, time.perf_counter() - t0


class NvmlSampler:
    """The GPU's utilization as NVML reports it (percent of time a kernel ran), sampled every
    ``every`` seconds in a thread while the block runs; ``mean()`` is None off CUDA or where
    NVML (the nvidia-ml-py package) is missing."""

    def __init__(self, device: str, every: float = 0.1) -> None:
        self.device, self.every = device, every
        self.samples: list[float] = []
        self._stop = None

    def __enter__(self) -> NvmlSampler:
        if not str(self.device).startswith("cuda"):
            return self
        import threading

        import torch

        try:
            torch.cuda.utilization(torch.device(self.device))
        except Exception:  # noqa: BLE001 (no NVML here: the CUDA-event busy fraction remains)
            return self
        self._stop = threading.Event()

        def sample() -> None:
            while not self._stop.wait(self.every):
                self.samples.append(float(torch.cuda.utilization(torch.device(self.device))))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._stop is not None:
            self._stop.set()
            self._thread.join()

    def mean(self) -> float | None:
        return round(sum(self.samples) / len(self.samples) / 100, 3) if self.samples else None


def bench_slide(
    slide: Path,
    model: Path,
    work: Path,
    opts,
    naive_cells: int = 2000,
    echo=print,
    overwrite: bool = False,
) -> dict:
    """Score ``slide`` into ``work`` and time it (see the module). A ``work`` folder holding
    finished results (a ``cyto score`` output folder, or an earlier bench's) is refused unless
    ``overwrite``, and one holding files cyto did not write even then, by the rule ``cyto score``
    holds its ``--out`` to (:func:`cyto.cohort.run.refuse_finished`): a finished score folder
    given as ``--work`` was scored over in place, its mosaics deleted."""
    import pyarrow.parquet as pq
    from scipy.stats import spearmanr

    from cyto.cohort.run import refuse_finished
    from cyto.eval.metrics import all_metrics
    from cyto.infer import score_slide
    from cyto.infer.plan import ThresholdAhead
    from cyto.infer.tiling import start_workers
    from cyto.runtime import load_scorer

    refuse_finished(Path(work), Path(slide).name, overwrite, field="work", resumable=False)

    # the tile workers start while the model loads, as in `cyto score` (score_slide)
    pool = start_workers(Path(slide).absolute(), opts.n_workers()) if opts.decode == "cpu" else None
    ahead = ThresholdAhead.start(Path(slide).absolute(), opts)  # and the slide's threshold
    t0 = time.perf_counter()
    try:
        engine = load_scorer(model, opts.backend, opts.device, opts.precision, verify=opts.verify)
    except BaseException:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        raise
    load_s = time.perf_counter() - t0
    opts = replace(opts, resume=False)
    with NvmlSampler(engine.device) as nvml:
        summary = score_slide(
            Path(slide),
            engine,
            Path(work),
            opts,
            echo=echo,
            metrics=all_metrics,
            pool=pool,
            ahead=ahead,
        )
    table = pq.read_table(Path(work) / "scores.parquet")
    n = table.num_rows
    row = {
        "slide": str(slide),
        "cells": n,
        "model_load_s": round(load_s, 2),
        "backend": summary["backend"],
        "device": summary["device"],
        # what auto chose and how it verified here
        "precision": summary.get("precision"),
        "graph": summary.get("graph"),
        "verification": summary.get("verification"),
        "workers": summary["workers"],
        "decode": summary.get("decode"),
        "detector": opts.detection.detector,
        "engine_lane": summary["engine_lane"] | {"gpu_utilization_nvml": nvml.mean()},
        "seconds": summary["seconds"],
        "cells_per_s": summary["cells_per_s"],
        "engine_cells_per_s": summary["engine_cells_per_s"],
        "pipeline_efficiency": summary["pipeline_efficiency"],
        "timings_s": summary["timings_s"],
        "stage_share": summary["stage_share"],
        "peak_rss_mb": summary["peak_rss_mb"],
        "peak_rss_workers_mb": summary["peak_rss_workers_mb"],
    }
    if "truth" in summary:
        row["truth"] = summary["truth"]
    if naive_cells and n:
        pick = np.sort(np.random.default_rng(0).choice(n, size=min(naive_cells, n), replace=False))
        xs, ys = np.asarray(table["x"])[pick], np.asarray(table["y"])[pick]
        ref = np.asarray(table["score"])[pick]
        scores, seconds = naive_baseline(
            Path(slide),
            Path(model),
            xs,
            ys,
            summary["resolution"]["crop_px_level0"],
            opts.batch_size,
        )
        naive_rate = len(pick) / seconds
        row["naive"] = {
            "cells": int(len(pick)),
            "seconds": round(seconds, 2),
            "cells_per_s": round(naive_rate, 1),
            "spearman_vs_pipeline": float(spearmanr(scores, ref).statistic)
            if len(pick) > 2
            else None,
            "method": "one read_region per nucleus, PyTorch eager fp32, Python loop",
        }
        row["pipeline_vs_naive"] = round(summary["cells_per_s"] / naive_rate, 2)
        echo(
            f"naive baseline: {naive_rate:.1f} cells/s on {len(pick)} cells; cyto pipeline "
            f"{summary['cells_per_s']} cells/s ({row['pipeline_vs_naive']}x)"
        )
    return row


def flat_row(r: dict, machine: str | None = None) -> dict:
    """One `bench slide` result as a flat table row."""
    naive = r.get("naive") or {}
    truth = r.get("truth") or {}
    lane = r.get("engine_lane") or {}
    recall = truth.get("planted_recall_at_k")
    return {
        "machine": machine,
        "slide": Path(r["slide"]).name,
        "cells": f"{r['cells']:,}",
        "backend": f"{r['backend']} on {r['device']}"
        + (f" ({r['precision']}, {r['graph']})" if r.get("precision") else ""),
        "workers": r["workers"],
        "cells_per_s": r["cells_per_s"],
        "engine_cells_per_s": r["engine_cells_per_s"],
        "pipeline_efficiency": r["pipeline_efficiency"],
        "overlap": lane.get("overlap"),
        "engine_busy": lane.get("engine_busy_fraction"),
        "gpu_busy": lane.get("gpu_busy_fraction"),
        "gpu_nvml": lane.get("gpu_utilization_nvml"),
        "h2d_per_cell": lane.get("h2d_bytes_per_cell"),
        "naive_cells_per_s": naive.get("cells_per_s"),
        "pipeline_vs_naive": r.get("pipeline_vs_naive"),
        "peak_rss": f"{r['peak_rss_mb']} / {r['peak_rss_workers_mb']}",
        "recall": f"{recall:.3f} ({truth['planted_found_in_top_k']}/{truth['planted_abnormal']})"
        if recall is not None
        else None,
    }


SLIDE_COLUMNS = [
    ("slide", "slide"),
    ("cells", "cells"),
    ("backend", "backend"),
    ("workers", "workers"),
    ("cells_per_s", "cells/s"),
    ("engine_cells_per_s", "engine-only cells/s"),
    ("pipeline_efficiency", "efficiency"),
    ("overlap", "engine thread"),
    ("engine_busy", "engine busy (wall)"),
    ("gpu_busy", "GPU busy (CUDA events)"),
    ("gpu_nvml", "GPU busy (NVML)"),
    ("h2d_per_cell", "host->device bytes/cell"),
    ("naive_cells_per_s", "naive cells/s"),
    ("pipeline_vs_naive", "pipeline vs naive"),
    ("peak_rss", "peak RSS MB (main / worker)"),
    ("recall", "Recall@400 of planted cells"),
]


def slide_markdown(rows: list[dict]) -> list[str]:
    """The result table and the time share of each stage."""
    from cyto.bench.results import markdown_table

    lines = markdown_table([flat_row(r) for r in rows], SLIDE_COLUMNS)
    stages = list(rows[0]["stage_share"]) if rows else []
    shares = [
        {"slide": Path(r["slide"]).name} | {s: f"{100 * r['stage_share'][s]:.1f}%" for s in stages}
        for r in rows
    ]
    lines += ["", "Time share of each stage (seconds summed over processes):", ""]
    return lines + markdown_table(shares, [("slide", "slide")] + [(s, s) for s in stages])
