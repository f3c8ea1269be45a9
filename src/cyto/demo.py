"""``make demo``: the main job on built-in synthetic data, end to end, on 2 CPU cores.

It draws a synthetic patch dataset, trains Deep SVDD (fast preset) on normal cells only, exports
it to ONNX (checking that ONNX Runtime gives PyTorch's scores), ranks held-out normal and abnormal
cells with the exported graph, draws a synthetic whole slide with planted abnormal cells, scores
every cell of it and reports how many planted cells reach the top of the ranking. Before that it
scores three slide-negative slides and calibrates the bundle on them, so the scored slide also
gets conformal p-values, cells flagged at a false discovery rate and an abnormal-burden estimate
with its interval, to compare with the planted cells.
Each step is a library call that a user can run alone through the CLI.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from cyto.errors import as_arg

#: what :func:`run_demo` writes in its folder (its record says so once it is done; these names
#: know a demo stopped half-way as cyto's too), and the hidden temporaries of its steps
DEMO_NAMES = (
    "patches/*",
    "train.csv",
    "test.csv",
    "dsvdd.cyto/*",
    "dsvdd.cyto.train-state/*",
    "test_scores.parquet",
    "patches_mosaic.png",
    "slide.ndpi",
    "slide.cells.parquet",
    "negative[0-9].ndpi",
    "negative[0-9].cells.parquet",
    "negative_scores/*",
    "scores/*",
    ".*",
)


def run_demo(
    out: Path, seed: int = 0, echo: Callable[[str], None] = print, overwrite: bool = False
) -> dict[str, object]:
    """Run every demo step into ``out``; returns what was made. A non-empty ``out`` is
    replaced only with ``overwrite`` (the demo rewrites every file it makes there)."""
    from cyto.data.dataset import PatchDataset, data_info
    from cyto.data.mosaic import class_mosaic
    from cyto.data.synth.cells import DEFAULT_SCALE, MPP_AT_SCALE_1
    from cyto.data.synth.patches import PatchSynthConfig, write_patches
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.eval.metrics import all_metrics
    from cyto.export.api import export_bundle
    from cyto.flags import check_seed
    from cyto.infer import ScoreOptions, score_slide
    from cyto.outputs_check import record_outputs, refuse_to_replace
    from cyto.predict import predict
    from cyto.stats.adequacy import adequacy_words
    from cyto.stats.calibrate import calibrate_from_tables
    from cyto.train.api import train

    out = Path(out)
    seed = check_seed(seed)
    refuse_to_replace(out, overwrite, known=DEMO_NAMES)
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, object] = {}
    t0 = time.perf_counter()

    echo("[1/8] synthetic cell patches (normal lymphocyte-like + six abnormal morphologies)")
    patches = out / "patches"
    counts = write_patches(
        patches, PatchSynthConfig(n_normal=300, n_abnormal=20, seed=seed), overwrite=True
    )
    info = data_info(patches)
    echo(
        f"      {info.n_files} images, classes: "
        + ", ".join(f"{k} {v}" for k, v in info.classes.items())
    )
    made["patches"] = patches
    made["counts"] = counts

    echo("[2/8] split: train on normal cells only, hold out normal + abnormal cells")
    ds = PatchDataset.from_path(patches, normal="normal")
    rng = np.random.default_rng(seed)
    normals = rng.permutation(np.flatnonzero(ds.labels == 0))
    train_idx, test_idx = (
        normals[:200],
        np.concatenate([normals[200:], np.flatnonzero(ds.labels == 1)]),
    )
    for name, idx in (("train", train_idx), ("test", test_idx)):
        rows = "".join(f"{ds.records[i].path.relative_to(out)},{ds.records[i].cls}\n" for i in idx)
        (out / f"{name}.csv").write_text("path,label\n" + rows)
    echo(
        f"      {out / 'train.csv'}: {len(train_idx)} normal; {out / 'test.csv'}: "
        f"{len(test_idx)} cells, {int(ds.labels[test_idx].sum())} abnormal"
    )

    echo("[3/8] train Deep SVDD (fast preset) -> model bundle")
    synth_mpp = round(MPP_AT_SCALE_1 / DEFAULT_SCALE, 4)
    res = train(
        "dsvdd",
        out / "train.csv",
        out / "dsvdd.cyto",
        normal="normal",
        preset="fast",
        overrides={"seed": seed, "mpp": synth_mpp},  # the patches' resolution, for cyto score
        device="cpu",
        overwrite=True,
    )
    echo(f"      {res.bundle} in {res.seconds:.0f} s")
    made["bundle"] = res.bundle

    echo("[4/8] export to ONNX (uint8 patches in) and check ONNX Runtime against PyTorch")
    report = export_bundle(res.bundle, echo=lambda line: echo(f"      {line}"))
    made["onnx_parity_max_rel"] = report["onnx_parity_max_rel"]

    echo("[5/8] rank the held-out cells with the exported graph (higher = more abnormal)")
    summary = predict(
        res.bundle, out / "test.csv", out / "test_scores.parquet", normal="normal", overwrite=True
    )
    alone = f", the model alone {summary['auroc_model']:.3f}" if "auroc_model" in summary else ""
    echo(
        f"      AUROC {summary['auroc']:.3f}, Recall@{summary['k']} {summary['recall_at_k']:.3f}"
        f" (chance {summary['k'] / summary['n']:.3f}); ranked by {summary['rank_by']}{alone};"
        f" scored by {summary['backend']} ({summary['precision']});"
        f" scores in {summary['out']}"
    )
    made["auroc"] = summary["auroc"]
    mosaic = class_mosaic(
        patches, out / "patches_mosaic.png", per_class=8, seed=seed, overwrite=True
    )
    made["mosaic"] = mosaic

    echo("[6/8] synthetic whole slide (NDPI) with planted abnormal cells and ground truth")
    res = write_slide(
        out / "slide.ndpi",
        SlideSynthConfig(width=4096, height=4096, abnormal_fraction=0.02, seed=seed),
        overwrite=True,
    )
    echo(
        f"      {res.paths[0]}: {res.size[0]}x{res.size[1]} px, {len(res.levels)} levels, "
        f"{res.n_cells} cells, {res.n_abnormal} planted abnormal; truth in {res.ground_truth}"
    )
    made["slide"] = res.paths[0]
    made["ground_truth"] = res.ground_truth
    echo("[7/8] slide-negative (healthy) slides: score them and calibrate on them")
    negatives = [
        write_slide(
            out / f"negative{i}.ndpi",
            SlideSynthConfig(width=2048, height=2048, abnormal_fraction=0.0, seed=seed + 1 + i),
            overwrite=True,
        ).paths[0]
        for i in range(3)
    ]
    tables = []
    for neg in negatives:
        folder = out / "negative_scores" / neg.stem
        score_slide(neg, made["bundle"], folder, ScoreOptions(mosaic=0), echo=lambda _: None)
        tables.append(folder / "scores.parquet")
    cal = calibrate_from_tables(made["bundle"], tables, overwrite=True)
    loso = cal["leave_one_slide_out"]
    echo(
        f"      {cal['source']}; each slide against the other two: cells flagged at FDR "
        f"{loso['alpha']} on {loso['slides_with_false_flags']}/{loso['slides']} (all normal)"
    )
    echo("[8/8] score every cell of the slide (fastest verified engine), rank the planted cells")
    summary = score_slide(
        res.paths[0],
        made["bundle"],
        out / "scores",
        ScoreOptions(top_k=100, mosaic=100, truth=res.ground_truth),
        echo=echo,
        metrics=all_metrics,
    )
    t = summary["truth"]
    echo(
        f"      {summary['cells_scored']} cells at {summary['cells_per_s']} cells/s; planted "
        f"abnormal cells found in the top {t['k']}: {t['planted_found_in_top_k']}/"
        f"{t['planted_abnormal']} (Recall@{t['k']} {t['planted_recall_at_k']:.2f}, chance "
        f"{t['k'] / max(summary['cells_scored'], 1):.2f}); review mosaic {summary['mosaic']}"
    )
    b = summary["burden"]
    if b["status"] == "ok":
        import pyarrow.parquet as pq

        table = pq.read_table(out / "scores" / "scores.parquet", columns=["flagged_bh", "label"])
        flagged = np.asarray(table["flagged_bh"])
        true_flags = int(np.sum(flagged & (np.asarray(table["label"]) == 1)))
        from cyto.stats.calibrate import above_words

        lo, hi = b["abnormal_fraction_interval"]
        counted = "evaluable cells" if b.get("counted") == "evaluable" else "cells"
        echo(
            f"      abnormal burden {100 * b['abnormal_fraction']:.1f}% of {b['cells']} {counted} "
            f"{above_words(b.get('threshold_quantile_of_normals'))} "
            f"(95% CI {100 * lo:.1f}-{100 * hi:.1f}%; planted "
            f"{100 * t['planted_abnormal'] / max(res.n_cells, 1):.1f}% of the slide's cells); "
            f"{b['flagged_bh']} cells flagged at FDR {b['fdr_alpha']}, {true_flags} of them "
            f"planted abnormal; slide p={b['slide_p_value']:.2g}: {b['triage']}"
        )
    else:
        echo(f"      abnormal burden: {b['status']}: {b.get('reason', '')}")
    if summary.get("adequacy"):  # is the slide adequate (cyto.stats.adequacy)
        echo("      " + adequacy_words(summary["adequacy"]).removeprefix("; "))
    made["burden"] = b
    made["scores"] = out / "scores"
    record_outputs(out, "cyto demo")
    echo(f"done in {time.perf_counter() - t0:.1f} s; everything is in {out}/")
    echo(
        f"next: review the top cells blinded in your browser: cyto review {as_arg(out / 'scores')} "
        "--reviewer YOUR_NAME"
    )
    return made
