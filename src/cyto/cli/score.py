"""``cyto predict`` and ``cyto score``: scoring patches and whole slides (``cyto calibrate``
is in :mod:`cyto.cli.calibrate`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import (
    BACKEND,
    BUNDLE,
    Download,
    LocalPath,
    PredictData,
    RankBy,
    SkipVerify,
    StorageOption,
    app,
)


@app.command("predict", short_help="Score every patch of a folder or manifest with a bundle.")
def predict_cmd(
    model: Annotated[
        Path, typer.Argument(parser=BUNDLE, help="A model bundle folder (NAME.cyto).")
    ],
    data: PredictData,
    out: Annotated[
        Path,
        typer.Option(
            parser=LocalPath("out", "the table to write: cyto predict writes a local file"),
            help="Parquet score table to write.",
        ),
    ] = Path("scores.parquet"),
    normal: Annotated[
        str | None,
        typer.Option(
            help="Normal class(es): adds labels, AUROC and Recall@K (K: the abnormal cells)."
        ),
    ] = None,
    abnormal: Annotated[str | None, typer.Option(help="Abnormal classes.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    batch_size: Annotated[int, typer.Option(help="Patches per batch.")] = 128,
    backend: Annotated[str, BACKEND] = "auto",
    precision: Annotated[
        str,
        typer.Option(
            help="fp32, fp16, bf16 (OpenVINO), int8, or auto: the fastest that passes "
            "verification on the golden cells here (fp32 keeps exact fp32)."
        ),
    ] = "auto",
    zoom: Annotated[
        str | None,
        typer.Option(
            help="Bring patches of another scanner to the training scale: a factor (1.7: the "
            "cells look 1.7x smaller than at training), or auto (from the median nucleus size "
            "of the patches against the training normals'; of the --normal class where given, "
            "else of every patch)."
        ),
    ] = None,
    patch_mpp: Annotated[
        float | None,
        typer.Option(
            help="um per pixel of these patches: zoom by their field (side x um per pixel) "
            "over the model's training patches' (200 px at 0.129 on a model of 100 px at 0.258: "
            "zoom 1)."
        ),
    ] = None,
    skip_verify: SkipVerify = False,
    skip_unreadable: Annotated[
        bool,
        typer.Option(
            help="Skip (and count) unreadable images instead of failing; the table's metadata "
            "lists them (cyto.skipped)."
        ),
    ] = False,
    rank_by: RankBy = "auto",
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue a stopped run into this --out after its last finished chunk (the "
            "same model, images and options; else it starts over)."
        ),
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out table.")] = False,
) -> None:
    """Score every patch of a folder or manifest with a bundle.

    By default the fastest engine verified here scores (the exported graph when there is
    one, else the trained PyTorch network) and the console says which.

    The images stream through in chunks of 512, so memory does not grow with the folder.
    Each finished chunk is kept beside --out until the table is written: Ctrl-C, or a file
    that cannot be read, keeps them, and --resume continues from there. Images the model
    was trained on (the same file bytes, or the same pixels saved again losslessly) are warned
    and flagged (column trained_on)."""
    from cyto.predict import predict
    from cyto.runtime.verify import line_of

    res = predict(
        model,
        data,
        out,
        normal=normal,
        abnormal=abnormal,
        device=device,
        batch_size=batch_size,
        backend=backend,
        precision=precision,
        zoom=zoom,
        patch_mpp=patch_mpp,
        verify=not skip_verify,
        skip_unreadable=skip_unreadable,
        rank_by=rank_by,
        resume=resume,
        overwrite=overwrite,
        echo=typer.echo,
    )
    for path, why in res.get("skipped", [])[:5]:
        typer.echo(f"skipped unreadable {path}: {why}")
    if len(res.get("skipped", [])) > 5:
        typer.echo(f"... and {len(res['skipped']) - 5} more unreadable file(s) skipped")
    for note in res.get("notes", []):
        typer.echo(f"backend choice: {note}")
    typer.echo(f"verification: {line_of(res['verification'])}")
    if res["zoom"] != 1.0 or res["zoom_from"] != "none":
        typer.echo(f"zoom {res['zoom']:.3g}x, from {res['zoom_from']}")
    caution = res.get("rank_by_caution")
    if res["rank_by"] != "model" or caution:
        typer.echo(
            f"ranked by {res['rank_by']} (cyto.data.morphometry; --rank-by)"
            + (f"; warning: {caution}" if caution else "")
        )
    line = f"scored {res['n']} patches -> {res['out']}"
    if "auroc" in res:
        # K: the abnormal cells (R-precision), said (hostile round 33, 10)
        line += (
            f"; AUROC {res['auroc']:.3f}, Recall@{res['k']} {res['recall_at_k']:.3f} (K = the "
            f"{res['k']} abnormal cells)"
        )
        if "auroc_model" in res:
            line += f" (the model alone: AUROC {res['auroc_model']:.3f})"
    typer.echo(line)
    if "ties" in res:
        typer.echo(res["ties"])
    if "few_abnormal" in res:
        typer.echo(f"note: {res['few_abnormal']}")


@app.command("score", short_help="Score every cell of each slide: score tables, top-K, mosaics.")
def score_cmd(
    slides: Annotated[
        list[str],
        typer.Argument(
            help="Whole-slide images (NDPI, SVS, TIFF...), folders of them, or a DICOM slide's "
            "folder (its .dcm files); or URLs: s3://BUCKET/KEY, gs://..., https://... (a "
            "prefix ending in / is the slides under it), or a slide in a DICOM archive: "
            # short enough for the help's column: longer, it was cut "PRE FIX" (round 52)
            "dicomweb+https://SERVER/studies/UID/series/UID, SERVER with its DICOMweb root."
        ),
    ],
    model: Annotated[
        Path,
        typer.Option(
            parser=LocalPath("model", BUNDLE.what), help="Model bundle (exported: cyto export)."
        ),
    ],
    out: Annotated[
        str, typer.Option(help="Output folder, a sub-folder per slide; or a prefix s3://BUCKET/P/.")
    ],
    backend: Annotated[str, BACKEND] = "auto",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    precision: Annotated[
        str,
        typer.Option(
            help="fp32, fp16, bf16 (OpenVINO), int8, or auto: the fastest verified on the golden "
            "cells here: bf16 on a CPU with AMX or AVX512-BF16 whatever the export, a quantized "
            "graph only when its recorded parity passed. fp32: one table on every machine."
        ),
    ] = "auto",
    batch_size: Annotated[int, typer.Option(help="Cells per engine batch.")] = 64,
    nuclei: Annotated[
        Path | None,
        typer.Option(
            help="Nucleus centres (CSV/Parquet x,y or GeoJSON) instead "
            "of detection; level-0 pixels."
        ),
    ] = None,
    detection: Annotated[
        str,
        typer.Option(
            help="Nucleus detection for: smear (MGG cytology, cells apart), pap (Papanicolaou: "
            "glass, stained cytoplasm and nuclei), tissue (sections, nuclei packed; no crowding "
            "warning), or auto: the one of the stain the model was trained on."
        ),
    ] = "auto",
    detector: Annotated[
        str,
        typer.Option(
            help="Nucleus detector implementation: scipy, or torch (the same steps as tensor "
            "operations; the same detections, slower on a CPU)."
        ),
    ] = "scipy",
    decode: Annotated[
        str,
        typer.Option(
            help="Tile decoding: cpu (the slide readers) or torch (JPEG tiles of TIFF/SVS "
            "decoded by torchvision, the same pixels; other slides fall back to cpu and say so)."
        ),
    ] = "cpu",
    overlap: Annotated[
        str,
        typer.Option(
            help="Run the engine in a thread of its own, on a CUDA stream of its own, while the "
            "next cells are decoded and cut (two batches at most in flight): auto (on a GPU), "
            "on or off. The scores are the same."
        ),
    ] = "auto",
    patch_size: Annotated[
        int | None,
        typer.Option(
            help="Cell crop size, level-0 px at the model's mpp (default: the side of the "
            "training patches the bundle records; 192 for a bundle that records none)."
        ),
    ] = None,
    tile: Annotated[int, typer.Option(help="Tile size read and decoded at once, px.")] = 1024,
    top_k: Annotated[int, typer.Option(help="Cells in topk.parquet.")] = 400,
    mosaic: Annotated[int, typer.Option(help="Cells in the review mosaic (0: none).")] = 100,
    qupath: Annotated[
        str,
        typer.Option(
            help="QuPath outputs to write: cells (cells.geojson: every cell as a detection with "
            "its measurements; about 0.8 kB a cell), map (abnormality.ome.tif: the abnormality "
            "map as a pyramidal OME-TIFF), comma-separated, all or none.",
        ),
    ] = "cells,map",
    map_um: Annotated[
        float,
        typer.Option(help="Side of the abnormality map's windows (one map pixel), um."),
    ] = 50.0,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Decode/detect/crop processes (0: in the main process). Default: one per "
            "spare core, at most 4; none for a local slide of up to 4 tiles (size over --tile)."
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue an interrupted run (skips finished tiles and slides).")
    ] = False,
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Score again a slide whose finished results are in --out (not with --resume)."
        ),
    ] = False,
    planes: Annotated[
        str,
        typer.Option(
            help="Focal planes: auto (sibling files NAME_z+1.00um.ext), none, or "
            "comma-separated files. The sharpest plane is chosen per cell."
        ),
    ] = "auto",
    rescale: Annotated[
        bool, typer.Option(help="Resample crops when the slide's mpp differs from the model's.")
    ] = False,
    mpp: Annotated[
        float | None,
        typer.Option(help="The slides' um/px, when their metadata lacks or misstates it."),
    ] = None,
    model_mpp: Annotated[
        float | None,
        typer.Option(help="The training patches' um/px, for a bundle trained without --set mpp."),
    ] = None,
    truth: Annotated[
        Path | None, typer.Option(help="Ground-truth cells (x, y, label) to report Recall@K.")
    ] = None,
    fdr: Annotated[
        float | None,
        typer.Option(
            help="Calibrated bundles: flag cells at this false discovery rate (Benjamini-Hochberg "
            "on conformal p-values against the slide-negative slides). Default: 0.1.",
            show_default=False,
        ),
    ] = None,
    fdr_confidence: Annotated[
        float | None,
        typer.Option(
            help="Calibrated bundles: hold the --fdr for this calibration with this probability "
            "(e.g. 0.9; calibration-conditional p-values), not only on average over "
            "calibrations. Flags fewer cells; needs more calibration cells."
        ),
    ] = None,
    triage_level: Annotated[
        float | None,
        typer.Option(
            help="Calibrated bundles: a slide whose test 'more high-scoring cells than normal "
            "slides' has p at or below this is triaged 'excess'. Default: 0.05.",
            show_default=False,
        ),
    ] = None,
    ray: Annotated[
        str | None,
        typer.Option(
            help="Score the cohort on a Ray cluster (pip install 'cyto[ray]'): auto (the running "
            "cluster, else a local one), local, or a cluster address HOST:PORT. One engine per "
            "GPU (or per node without one); slides and --out on a path every node sees, or URLs.",
        ),
    ] = None,
    skip_verify: SkipVerify = False,
    ray_part_tiles: Annotated[
        int,
        typer.Option(
            help="With --ray: a slide with more tiles than this is scored in parts of this many "
            "tiles by several engines at once (0: whole slides only).",
        ),
    ] = 256,
    rank_by: RankBy = "auto",
    adequacy: Annotated[
        str,
        typer.Option(
            help="Specimen-adequacy rule: general (no cell-count minimum: no evaluable cell, "
            "most cells out of focus or crowded, cells off scale), lbc-cervical (5,000 "
            "evaluable cells, Bethesda), smear-conventional (8,000-12,000, Bethesda), "
            "bone-marrow (500, ICSH 2008), none (no rule), or a RULE.toml. An unsatisfactory "
            "slide is never triaged 'no excess'.",
        ),
    ] = "general",
    burden_cells: Annotated[
        str | None,
        typer.Option(
            help="Calibrated bundles: the cells the burden and slide test count: evaluable (in "
            "focus, not crowded, at the model's scale; against the calibration slides' "
            "evaluable cells) or all. Every cell keeps its p-value and flag either way. "
            "Default: evaluable.",
            show_default=False,
        ),
    ] = None,
    watch: Annotated[
        bool,
        typer.Option(
            help="Keep watching the folders given and score each new slide once its files "
            "have stopped changing (a scanner's output folder); Ctrl-C stops.",
        ),
    ] = False,
    poll: Annotated[
        float, typer.Option(help="With --watch: seconds between looks at the folders.")
    ] = 10.0,
    settle: Annotated[
        float,
        typer.Option(
            help="With --watch: seconds a slide's files must stay unchanged before it is scored."
        ),
    ] = 30.0,
    storage_option: StorageOption = None,
    download: Download = False,
) -> None:
    """Score every cell of each slide: scores.parquet, topk.parquet, mosaics and summary.json.

    The model is loaded once; slides are scored one after another, and a slide that fails is
    reported while the next one goes on; OUT/cohort.csv holds one row per slide. Ctrl-C keeps
    the finished part: rerun with --resume. With --ray, slides are scored in parallel on a Ray
    cluster into the same files; a slide whose worker dies is resumed by another. With --watch,
    the folders are watched and each slide is scored once the scanner has finished writing it.

    With a bundle calibrated on slide-negative slides (cyto calibrate), every cell gets a
    conformal p-value, cells are flagged at the --fdr rate, and each slide gets an abnormal
    burden with a 95% interval and a triage label. The FDR holds on average over calibrations;
    --fdr-confidence 0.9 holds it for this calibration with probability 0.9.
    """

    from cyto.cohort.local import REUSED
    from cyto.cohort.run import as_found, refuse_resume_and_overwrite, run_cohort, slide_line
    from cyto.cohort.table import failure_words
    from cyto.infer import ScoreOptions
    from cyto.infer.options import check_rank_by, detection_for
    from cyto.infer.qupath import qupath_words
    from cyto.location import output_location
    from cyto.slides import slide_files
    from cyto.slides.remote import is_url, parse_options, slide_ref
    from cyto.view.folder import replaced_words, view_words

    refuse_resume_and_overwrite(resume, overwrite)  # before the model is read; a watch too
    opts = ScoreOptions(
        detection=detection_for(detection, model, detector),
        decode=decode,
        overlap=overlap,
        patch_size=patch_size,
        tile=tile,
        batch_size=batch_size,
        top_k=top_k,
        mosaic=mosaic,
        qupath=qupath,
        map_um=map_um,
        backend=backend,
        device=device,
        precision=precision,
        workers=workers,
        nuclei=nuclei,
        truth=truth,
        planes=planes,
        rescale=rescale,
        slide_mpp=mpp,
        model_mpp=model_mpp,
        resume=resume,
        fdr_alpha=fdr,
        triage_level=triage_level,
        fdr_confidence=fdr_confidence,
        verify=not skip_verify,
        rank_by=rank_by,
        adequacy=adequacy,
        burden_cells=burden_cells,
    )
    caution = check_rank_by(model, rank_by)
    if caution is not None:
        typer.echo(f"warning: {caution}")
    from cyto.eval.metrics import truth_metrics

    metrics = truth_metrics(truth)
    if watch:
        from cyto.cohort.watch import watch_cohort
        from cyto.errors import ConfigError

        if ray is not None:
            raise ConfigError("--watch scores on this machine; it does not take --ray")
        if any(is_url(s) for s in [*slides, out]):
            raise ConfigError("--watch reads and writes local folders; give URLs without --watch")
        if overwrite:  # it was taken and not done: "already scored ... skipping" (round 76, 5)
            raise ConfigError(
                "--watch keeps the slides already scored (as --resume does); --overwrite would "
                "score them all again at each start: score them again with cyto score FOLDER "
                "--out OUT --overwrite, then watch"
            )
        watch_cohort(
            [Path(s) for s in slides],
            model,
            Path(out),
            opts,
            typer.echo,
            metrics,
            poll=poll,
            settle=settle,
        )
        # it ends only when stopped: the stop's code (130, SIGTERM 143), mid-slide too, whatever
        raise KeyboardInterrupt  # failed on the way (0 or 1 before: hostile round 41, 1-2)
    options = parse_options(storage_option)
    out = output_location(out, options)  # a folder, or a prefix in object storage
    slides = [slide_ref(s, options, download) for s in slides]
    slides = slide_files(slides)  # a folder: the slides in it; a prefix: the slides under it
    if ray is None and not any(s.exists() for s in slides):
        # before the model loads and verifies: a mistyped path or a glob that matched nothing.
        # (One missing slide among others is reported while the rest are scored; a Ray
        # cluster's nodes may see paths this machine does not.)
        from cyto.errors import InputPathError

        names = ", ".join(str(s) for s in slides[:3]) + (" ..." if len(slides) > 3 else "")
        raise InputPathError(f"no slide to score: {names}: no such file")
    if overwrite:  # a review cut from the results about to be replaced: said
        from cyto.cohort.local import output_folders
        from cyto.location import output_location
        from cyto.view.folder import rescoring_words

        here = output_location(out)
        present = [s for s in slides if not is_url(s)]
        if not here.is_remote:
            for line in rescoring_words([f for _, f in output_folders(present, here.local)]):
                typer.echo(f"warning: {line}")
    done, failed = run_cohort(
        slides,
        model,
        out,
        opts,
        ray,
        typer.echo,
        metrics,
        part_tiles=ray_part_tiles,
        overwrite=overwrite,
    )
    done = [as_found(s, out) for s in done]  # a reused slide's: where it is now
    for s in done:
        typer.echo(slide_line(s, out))
    written = [Path(s["output"]) for s in done if not s.get(REUSED) and "://" not in s["output"]]
    for line in [] if overwrite else replaced_words(written):  # --overwrite said it before
        typer.echo(f"warning: {line}")
    opened = qupath_words(done)
    if opened:
        typer.echo(opened)
    shown = None if out.is_remote else view_words(done, out.local)  # cyto view reads folders
    if shown:
        typer.echo(shown)
    for slide, exc in failed:
        typer.secho(f"failed: {failure_words(slide, exc)}", err=True, fg=typer.colors.RED)
    if failed:  # the most serious failure's code: 2 for bad input, 3 for a busy folder, else 1
        raise typer.Exit(max(exc.exit_code for _, exc in failed))
