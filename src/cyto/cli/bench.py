"""``cyto bench engine|scorer|slide|cohort``: throughput of every backend and of the pipeline."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import BACKEND, RankBy, ResultsOpt, _csv, _ints, bench_app, ranged_option
from cyto.errors import ConfigError
from cyto.flags import Range


@bench_app.command(
    "engine", short_help="Patches/s and batch latency of every backend and precision."
)
def bench_engine_cmd(
    model: Annotated[Path, typer.Option(help="Model bundle (exported, for ONNX/TensorRT).")],
    devices: Annotated[str, typer.Option(help="Comma-separated: cpu, cuda, or auto.")] = "auto",
    backends: Annotated[
        str,
        typer.Option(
            help="Comma-separated among torch, torch-channels-last, torch-compile, onnx, "
            "openvino (CPU), onnx-trt (ONNX Runtime's TensorRT provider) and trt (cyto's "
            "TensorRT engines)."
        ),
    ] = "torch,torch-channels-last,torch-compile,onnx,openvino,onnx-trt,trt",
    precisions: Annotated[
        str, typer.Option(help="Comma-separated: fp32, fp16, bf16 (OpenVINO), int8.")
    ] = "fp32,fp16,bf16,int8",
    batches: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "1,8,32,128",
    sizes: Annotated[
        str | None,
        typer.Option(
            help="Patch sides in px (default: the model's crop size, the side of the cells it "
            "takes; its graph resizes them to the network's input size).",
        ),
    ] = None,
    repeats: Annotated[
        int, ranged_option("Timed calls per configuration (median).", Range(1))
    ] = 10,
    budget: Annotated[
        float, ranged_option("Seconds per configuration at most.", Range(0, open_lo=True))
    ] = 5.0,
    results: ResultsOpt = Path("bench-results"),
) -> None:
    """Patches/s and p50/p99 batch latency of every backend, precision and batch size."""
    from cyto.bench.device import machine
    from cyto.bench.engine import BACKENDS, PRECISIONS, bench_engine, canonical_backend, ratios
    from cyto.bench.results import header, markdown_table, write_results

    chosen = [canonical_backend(b) for b in _csv(backends, "--backends") or ()]
    bad = [b for b in chosen if b not in BACKENDS]
    if bad:
        raise ConfigError(f"unknown backend(s) {', '.join(bad)}; known: {', '.join(BACKENDS)}")
    precs = list(_csv(precisions, "--precisions") or ())
    if any(p not in PRECISIONS for p in precs):
        raise ConfigError(f"precisions must be among {', '.join(PRECISIONS)}, got {precisions!r}")
    devs = list(_csv(devices, "--devices") or ())
    if devs == ["auto"]:
        from cyto.runtime.devices import cuda_available

        devs = ["cpu", "cuda"] if cuda_available() else ["cpu"]
    rows = ratios(
        bench_engine(
            model,
            devs,
            chosen,
            precs,
            _ints(batches, "--batches"),
            _ints(sizes, "--sizes") if sizes else None,
            repeats=repeats,
            budget=budget,
            echo=typer.echo,
        )
    )
    meta = machine(" ".join(["cyto bench engine", *sys.argv[3:]]))
    meta["model"] = str(model)
    ok = [r for r in rows if r.get("available")]
    for r in ok:  # how many timed calls a row rests on: the budget may have cut them
        asked = r.get("repeats_asked") or r["repeats"]
        r["calls"] = str(r["repeats"]) if r["repeats"] >= asked else f"{r['repeats']} of {asked}"
    missing = [r for r in rows if not r.get("available")]
    lines = header("cyto bench engine", meta)
    lines += markdown_table(
        ok,
        [
            ("device", "device"),
            ("backend", "backend"),
            ("precision", "precision"),
            ("size", "px"),
            ("batch", "batch"),
            ("patches_per_s", "patches/s"),
            ("p50_ms", "p50 ms"),
            ("p99_ms", "p99 ms"),
            ("calls", "timed calls"),
            ("spread_pct", "spread %"),
            ("vs_torch_eager_fp32", "vs eager fp32"),
            ("gpu_used_mb", "GPU MB held"),
            ("gpu_peak_mb", "torch peak MB"),
            ("host_rss_mb", "host RSS MB"),
        ],
    )
    lines += [
        "",
        "Each row: the median of its timed calls (after warm-up calls); p99 of fewer than 100 "
        "calls is about the slowest; spread: (slowest - fastest) / median. Rows closer than "
        "their spread are not told apart; a row of fewer calls than asked was cut by --budget.",
    ]
    if missing:
        lines += ["", "Not measured here:", ""]
        lines += markdown_table(
            missing,
            [
                ("device", "device"),
                ("backend", "backend"),
                ("precision", "precision"),
                ("batch", "batch"),
                ("reason", "reason"),
            ],
        )
    path = write_results(results, "engine", meta, rows, lines)
    typer.echo(f"wrote {path} and {path.with_suffix('.md')}")


@bench_app.command("scorer")
def bench_scorer_cmd(
    queries: Annotated[str, typer.Option(help="Query counts, comma-separated.")] = (
        "1000,10000,100000"
    ),
    support_vectors: Annotated[
        str, typer.Option(help="OC-SVM support-vector counts, comma-separated.")
    ] = "100,1000,2000",
    dims: Annotated[int, ranged_option("Embedding dimension.", Range(1))] = 512,
    repeats: Annotated[
        int, ranged_option("Timed calls of the numba kernels (median).", Range(1))
    ] = 3,
    results: ResultsOpt = Path("bench-results"),
) -> None:
    """The numba scoring kernels vs sklearn vs a plain numpy reference."""
    from cyto.bench.device import machine
    from cyto.bench.results import header, markdown_table, write_results
    from cyto.bench.scorer import OCSVM_COLUMNS, bench_scorer

    rows = bench_scorer(
        _ints(queries, "--queries"),
        _ints(support_vectors, "--support-vectors"),
        dims=dims,
        repeats=repeats,
        echo=typer.echo,
    )
    meta = machine(" ".join(["cyto bench scorer", *sys.argv[3:]]))
    lines = header("cyto bench scorer", meta) + ["OC-SVM (RBF) decision function:", ""]
    lines += markdown_table(
        [r for r in rows if r["scorer"] == "ocsvm"],
        [*OCSVM_COLUMNS, ("max_abs_diff_vs_sklearn", "max diff")],
    )
    lines += ["", "Deep SVDD (5 seeds x 4 TTA views, blend + ensemble mean):", ""]
    lines += markdown_table(
        [r for r in rows if r["scorer"] == "dsvdd"],
        [
            ("queries", "queries"),
            ("numba_per_s", "numba /s"),
            ("numpy_ref_per_s", "numpy /s"),
            ("numba_vs_numpy_ref", "numba vs numpy"),
            ("max_abs_diff_vs_ref", "max diff"),
        ],
    )
    path = write_results(results, "scorer", meta, rows, lines)
    typer.echo(f"wrote {path} and {path.with_suffix('.md')}")


@bench_app.command(
    "slide", short_help="End-to-end scoring of one slide: stages, efficiency, baseline."
)
def bench_slide_cmd(
    slide: Annotated[Path, typer.Argument(help="Whole-slide image to score.")],
    model: Annotated[Path, typer.Option(help="Model bundle (exported).")],
    backend: Annotated[str, BACKEND] = "auto",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    precision: Annotated[
        str, typer.Option(help="fp32, fp16, bf16 (OpenVINO), int8, or auto (as for cyto score).")
    ] = "fp32",
    workers: Annotated[int | None, typer.Option(help="Decode/detect/crop processes.")] = None,
    batch_size: Annotated[int, typer.Option(help="Cells per engine batch.")] = 64,
    patch_size: Annotated[
        int | None,
        typer.Option(
            help="Cell crop size, level-0 px at the model's mpp (default: the side of the "
            "training patches the bundle records, as for cyto score)."
        ),
    ] = None,
    decode: Annotated[
        str, typer.Option(help="cpu, or torch (JPEG tiles decoded on the engine's device).")
    ] = "cpu",
    overlap: Annotated[
        str, typer.Option(help="The engine in a thread of its own: auto (on a GPU), on, off.")
    ] = "auto",
    detector: Annotated[str, typer.Option(help="Nucleus detector: scipy or torch.")] = "scipy",
    naive_cells: Annotated[
        int, ranged_option("Cells for the naive baseline (0: skip it).", Range(0))
    ] = 2000,
    truth: Annotated[
        Path | None, typer.Option(help="Ground-truth cells, to report Recall@K too.")
    ] = None,
    work: Annotated[
        Path | None, typer.Option(help="Where the score outputs go (default: a temp folder).")
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(help="Score again a slide whose finished results are in --work."),
    ] = False,
    results: ResultsOpt = Path("bench-results"),
    rank_by: RankBy = "auto",
) -> None:
    """End-to-end scoring of one slide: stages, pipeline efficiency, naive baseline."""
    import tempfile
    from dataclasses import replace

    from cyto.bench.device import machine
    from cyto.bench.results import header, write_results
    from cyto.bench.slide import bench_slide, slide_markdown
    from cyto.detect import NucleusParams
    from cyto.infer import ScoreOptions

    opts = ScoreOptions(
        patch_size=patch_size,
        batch_size=batch_size,
        backend=backend,
        device=device,
        precision=precision,
        workers=workers,
        truth=truth,
        top_k=400,
        mosaic=0,
        decode=decode,
        overlap=overlap,
        detection=replace(NucleusParams(), detector=detector),
        rank_by=rank_by,
    )
    with tempfile.TemporaryDirectory() as tmp:
        row = bench_slide(
            slide, model, work or Path(tmp) / "out", opts, naive_cells, typer.echo, overwrite
        )
    meta = machine(" ".join(["cyto bench slide", *sys.argv[3:]]))
    meta["model"] = str(model)
    lines = header("cyto bench slide", meta) + slide_markdown([row])
    path = write_results(results, "slide", meta, [row], lines)
    typer.echo(f"wrote {path} and {path.with_suffix('.md')}")


@bench_app.command(
    "cohort", short_help="A cohort in one process, then on Ray: speed and equal tables."
)
def bench_cohort_cmd(
    slides: Annotated[
        list[Path] | None, typer.Argument(help="Slides to score (or --synthetic N).")
    ] = None,
    model: Annotated[Path, typer.Option(help="Model bundle (exported).")] = Path("model.cyto"),
    ray: Annotated[
        str, typer.Option(help="The Ray cluster: auto, local or HOST:PORT (as for cyto score).")
    ] = "local",
    synthetic: Annotated[
        int, ranged_option("Score N synthetic slides made here instead of SLIDES.", Range(0))
    ] = 0,
    size: Annotated[int, typer.Option(help="Side of each synthetic slide, px.")] = 4096,
    workers: Annotated[int | None, typer.Option(help="Decode/detect/crop processes.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    tile: Annotated[int, typer.Option(help="Tile size, px.")] = 1024,
    ray_part_tiles: Annotated[
        int, ranged_option("Parts of this many tiles for larger slides (0: never).", Range(0))
    ] = 256,
    work: Annotated[
        Path | None, typer.Option(help="Where the score outputs go (default: a temp folder).")
    ] = None,
    results: ResultsOpt = Path("bench-results"),
) -> None:
    """A cohort scored by one process, then on a Ray cluster: cells/s, slides/h, speed-up, and
    whether the tables are identical."""
    import tempfile

    from cyto.bench.cohort import bench_cohort, cohort_markdown
    from cyto.bench.device import machine
    from cyto.bench.results import header, write_results
    from cyto.infer import ScoreOptions

    if bool(slides) == bool(synthetic):
        raise ConfigError("give SLIDES or --synthetic N (one of the two)")
    opts = ScoreOptions(mosaic=0, workers=workers, device=device, tile=tile)
    with tempfile.TemporaryDirectory() as tmp:
        root = work or Path(tmp)
        if synthetic:
            from cyto.data.synth.slide import SlideSynthConfig, write_slide

            (root / "slides").mkdir(parents=True, exist_ok=True)
            slides = [
                write_slide(
                    root / "slides" / f"synth{i:03d}.tif",
                    SlideSynthConfig(width=size, height=size, seed=i),
                ).paths[0]
                for i in range(synthetic)
            ]
        rows = bench_cohort(slides, model, root, opts, ray, ray_part_tiles or None, echo=typer.echo)
    meta = machine(" ".join(["cyto bench cohort", *sys.argv[3:]]))
    meta["model"] = str(model)
    lines = header("cyto bench cohort", meta) + cohort_markdown(rows)
    path = write_results(results, "cohort", meta, rows, lines)
    typer.echo("\n".join(cohort_markdown(rows)))
    typer.echo(f"wrote {path} and {path.with_suffix('.md')}")
