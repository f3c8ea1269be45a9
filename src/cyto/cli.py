"""The ``cyto`` command line: thin commands over the library.

Heavy libraries (torch, onnxruntime, pyvips, numba, numpy-heavy modules) are imported inside the
command bodies, so ``cyto --help`` starts fast. Library errors become one line on stderr and a
non-zero exit code; ``CYTO_DEBUG=1`` shows the full traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from cyto import __version__
from cyto.data.synth.formats import SlideFormat
from cyto.errors import ConfigError, CytoError

app = typer.Typer(
    name="cyto",
    help="Find the few malignant cells among ~10^5 normal ones on a whole-slide cytology image.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
synth_app = typer.Typer(
    help="Draw synthetic cytology data (the built-in demo data).", no_args_is_help=True
)
data_app = typer.Typer(help="Inspect cell-patch datasets.", no_args_is_help=True)
app.add_typer(synth_app, name="synth")
app.add_typer(data_app, name="data")
eval_app = typer.Typer(help="Evaluate rankings: top-K metrics.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
bench_app = typer.Typer(
    help="Measure throughput: engine backends, scoring kernels, whole-slide scoring.",
    no_args_is_help=True,
)
app.add_typer(bench_app, name="bench")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cyto {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """cyto: one-class models rank every cell of a slide by how abnormal it looks."""


# cyto score and cyto predict: the one switch that scores without the check on golden cells
SkipVerify = Annotated[
    bool,
    typer.Option(
        "--skip-verify",
        help="Score without first running the graph on the bundle's golden cells here and "
        "comparing with their reference scores (recorded).",
    ),
]


def _ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"{what} expects comma-separated integers, got {text!r}") from exc
    if not values or min(values) < 1:
        raise ConfigError(f"{what} expects positive integers, got {text!r}")
    return values


ResultsOpt = Annotated[
    Path, typer.Option(help="Folder for the result files (<kind>_<host>_<date>.json and .md).")
]


def _csv(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(s.strip() for s in text.split(",") if s.strip())


@synth_app.command("patches")
def synth_patches(
    out: Annotated[Path, typer.Argument(help="Folder to create (one sub-folder per class).")],
    n_normal: Annotated[int, typer.Option(help="Normal (lymphocyte-like) patches.")] = 600,
    n_abnormal: Annotated[int, typer.Option(help="Patches per abnormal class.")] = 40,
    classes: Annotated[
        str | None,
        typer.Option(help="Abnormal classes to draw, comma-separated (default: all six)."),
    ] = None,
    size: Annotated[int, typer.Option(help="Patch side in pixels.")] = 192,
    scale: Annotated[float, typer.Option(help="Cell size (1.5: 100x oil look, 0.12 um/px).")] = 1.5,
    seed: Annotated[int, typer.Option(help="Same seed, same bytes.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace a non-empty OUT.")] = False,
) -> None:
    """Draw a class-folder dataset of stained cells: 'normal' plus abnormal morphologies."""
    from cyto.data.synth.cells import ABNORMAL_CLASSES
    from cyto.data.synth.patches import PatchSynthConfig, write_patches

    config = PatchSynthConfig(
        n_normal=n_normal,
        n_abnormal=n_abnormal,
        abnormal_classes=_csv(classes) or ABNORMAL_CLASSES,
        size=size,
        seed=seed,
        scale=scale,
    )
    counts = write_patches(out, config, overwrite=overwrite)
    total = sum(counts.values())
    typer.echo(
        f"wrote {total} patches to {out}: " + ", ".join(f"{k} {v}" for k, v in counts.items())
    )


@synth_app.command("slide")
def synth_slide(
    out: Annotated[
        Path, typer.Argument(help="Slide file to write: NAME.tif, NAME.tiff or NAME.ndpi.")
    ],
    width: Annotated[
        int, typer.Option(help="Width in px (rounded up to a multiple of 512).")
    ] = 8192,
    height: Annotated[
        int, typer.Option(help="Height in px (rounded up to a multiple of 512).")
    ] = 8192,
    cells: Annotated[
        int | None, typer.Option(help="Nucleated cells (default: one per 140x140 px of smear).")
    ] = None,
    abnormal_fraction: Annotated[
        float, typer.Option(help="Share of planted abnormal cells (witness rate), 0..1.")
    ] = 0.01,
    classes: Annotated[
        str | None, typer.Option(help="Abnormal classes to plant, comma-separated (default: all).")
    ] = None,
    planes: Annotated[
        str, typer.Option(help="Focal planes in um, comma-separated, including 0 (e.g. -1,0,1).")
    ] = "0",
    fmt: Annotated[
        SlideFormat | None,
        typer.Option("--format", help="Container; default: from the file name."),
    ] = None,
    tile: Annotated[
        int, typer.Option(help="Tile size (TIFF) / restart-interval width (NDPI).")
    ] = 256,
    quality: Annotated[int, typer.Option(help="JPEG quality.")] = 85,
    scale: Annotated[float, typer.Option(help="Cell size (1.5: 100x oil look, 0.12 um/px).")] = 1.5,
    seed: Annotated[int, typer.Option(help="Same seed, same bytes.")] = 0,
    workers: Annotated[
        int | None, typer.Option(help="Drawing processes (default: one per CPU, at most 4).")
    ] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing files.")] = False,
) -> None:
    """Draw a whole slide with planted abnormal cells, plus NAME.cells.parquet (ground truth)."""
    from cyto.data.synth.cells import ABNORMAL_CLASSES
    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.errors import ConfigError

    try:
        zs = tuple(float(z) for z in planes.split(",") if z.strip())
    except ValueError as exc:
        raise ConfigError(f"--planes must be numbers separated by commas, got {planes!r}") from exc
    config = SlideSynthConfig(
        width=width,
        height=height,
        n_cells=cells,
        abnormal_fraction=abnormal_fraction,
        abnormal_classes=_csv(classes) or ABNORMAL_CLASSES,
        planes=zs,
        tile=tile,
        quality=quality,
        scale=scale,
        seed=seed,
    )
    res = write_slide(out, config, fmt=fmt, overwrite=overwrite, workers=workers)
    w, h = res.size
    typer.echo(
        f"wrote {', '.join(map(str, res.paths))} ({w}x{h} px, {len(res.levels)} levels, "
        f"{res.n_cells} cells, {res.n_abnormal} abnormal) and {res.ground_truth}"
    )


@data_app.command("info")
def data_info_cmd(
    path: Annotated[
        Path, typer.Argument(help="Folder of class sub-folders, or a CSV/Parquet manifest.")
    ],
    normal: Annotated[
        str | None, typer.Option(help="Normal class(es), comma-separated: also check the split.")
    ] = None,
    abnormal: Annotated[
        str | None, typer.Option(help="Abnormal classes, comma-separated (default: all others).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Classes, counts, image sizes and modes, and every unreadable file."""
    from cyto.data.dataset import data_info, one_class_split

    info = data_info(path)
    split = one_class_split(info.classes, normal, abnormal, path) if normal or abnormal else None
    if as_json:
        import json

        payload = {
            "source": str(info.source),
            "files": info.n_files,
            "classes": info.classes,
            "sizes": info.sizes,
            "modes": info.modes,
            "bags": info.bags,
            "unreadable": [{"path": str(p), "reason": r} for p, r in info.unreadable],
            "split": split,
        }
        typer.echo(json.dumps(payload, indent=2))
        return
    typer.echo(
        f"{info.source}: {info.n_files} files, {len(info.classes)} classes"
        + (f", {info.bags} bags" if info.bags else "")
    )
    width = max(len(c) for c in info.classes)
    for cls, n in info.classes.items():
        typer.echo(f"  {cls:<{width}}  {n:>6}")
    typer.echo("sizes: " + ", ".join(f"{s} ({n})" for s, n in info.sizes.items()))
    typer.echo("modes: " + ", ".join(f"{m} ({n})" for m, n in info.modes.items()))
    if split is not None:
        typer.echo(
            f"one-class split: normal {split['normal']} ({', '.join(split['normal_classes'])}),"
            f" abnormal {split['abnormal']} ({', '.join(split['abnormal_classes'])}),"
            f" left out {split['excluded']}"
        )
    if info.unreadable:
        typer.echo(f"unreadable: {len(info.unreadable)}")
        for p, reason in info.unreadable:
            typer.echo(f"  {p}: {reason}")
    else:
        typer.echo("unreadable: 0")


@data_app.command("mosaic")
def data_mosaic_cmd(
    path: Annotated[Path, typer.Argument(help="Folder of class sub-folders, or a manifest.")],
    out: Annotated[Path, typer.Option(help="PNG to write.")] = Path("mosaic.png"),
    per_class: Annotated[int, typer.Option(help="Images per class (one row each).")] = 8,
    tile: Annotated[int, typer.Option(help="Side of each image in the mosaic, px.")] = 128,
    seed: Annotated[int, typer.Option(help="Which images are picked.")] = 0,
) -> None:
    """A PNG with one labelled row of sample images per class, for a first look at a dataset."""
    from cyto.data.mosaic import class_mosaic

    class_mosaic(path, out, per_class=per_class, tile=tile, seed=seed)
    typer.echo(f"wrote {out}")


@data_app.command("cells")
def data_cells_cmd(
    scored: Annotated[
        list[Path],
        typer.Argument(
            help="Output folders of cyto score (a slide's, or a cohort's) of slides "
            "known to be negative."
        ),
    ],
    out: Annotated[Path, typer.Option(help="Dataset folder: OUT/LABEL/ and OUT/cells-LABEL.csv.")],
    label: Annotated[str, typer.Option(help="Class folder the cells go to.")] = "normal",
    per_slide: Annotated[
        int | None, typer.Option(help="At most this many cells per slide, drawn at random.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Which cells --per-slide draws.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace OUT/LABEL if it exists.")] = False,
) -> None:
    """Training cells from negative slides: every cell cyto score found, cut at the area the
    model saw, into a class folder for cyto train (the paper trains on such cells)."""
    from cyto.review.cells import harvest_cells

    res = harvest_cells(
        scored,
        out,
        label=label,
        per_slide=per_slide,
        seed=seed,
        overwrite=overwrite,
        echo=typer.echo,
    )
    typer.echo(
        f"wrote {res['cells']} cells of {res['slides']} slide(s) to {res['folder']} "
        f"and {res['manifest']}"
    )


METHOD_NAMES = ("fs-sil", "ws-sil", "dsvdd", "droc", "its2clr")


@app.command("train")
def train_cmd(
    method: Annotated[str, typer.Argument(help=f"One of: {', '.join(METHOD_NAMES)}.")],
    data: Annotated[Path, typer.Option(help="Folder of class sub-folders, or a manifest.")],
    out: Annotated[Path, typer.Option(help="Bundle folder to write, e.g. dsvdd.cyto.")],
    normal: Annotated[str, typer.Option(help="Normal class(es), comma-separated.")],
    abnormal: Annotated[
        str | None, typer.Option(help="Abnormal classes (default: every other class).")
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="Named preset, e.g. 'fast' (CPU, minutes).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(help="TOML or YAML (.yaml, .yml) file with the same keys as the config."),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override one setting: key=value.")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    weights: Annotated[
        Path | None, typer.Option(help="Local backbone weights (state dict) to start from.")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue an interrupted run.")] = False,
    skip_unreadable: Annotated[
        bool, typer.Option(help="Skip (and count) unreadable images instead of failing.")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing bundle.")] = False,
    print_config: Annotated[
        bool, typer.Option(help="Print the resolved config as TOML and exit.")
    ] = False,
) -> None:
    """Train one of the paper's five methods and write a model bundle."""
    from cyto.train.config import resolve_config, to_toml
    from cyto.train.registry import get_method

    if print_config:
        cfg = resolve_config(get_method(method).Config, preset, config, set_)
        typer.echo(to_toml(cfg), nl=False)
        return
    from cyto.train.api import train

    res = train(
        method,
        data,
        out,
        normal=normal,
        abnormal=abnormal,
        preset=preset,
        config_file=config,
        overrides=set_,
        device=device,
        resume=resume,
        weights=weights,
        skip_unreadable=skip_unreadable,
        overwrite=overwrite,
    )
    last = {k: round(v[-1], 4) for k, v in res.history.items() if v}
    typer.echo(
        f"trained {res.method} on {_used(res.n_used, res.n_images)} in {res.seconds:.1f} s; "
        f"final losses {last}; wrote {res.bundle}"
    )
    check = res.bag_check
    if check is not None:
        loud = check["status"] != "ok"
        typer.secho(
            ("WARNING: " if loud else "") + check["message"],
            err=loud,
            fg=typer.colors.RED if check["status"] == "failed" else None,
            bold=loud,
        )


def _used(n_used: int | None, n_images: int | None) -> str:
    if n_used is None or n_used == n_images:
        return f"{n_images} images"
    return f"{n_used} normal images (of {n_images})"


@app.command("info")
def info_cmd(
    model: Annotated[Path, typer.Argument(help="A model bundle folder (NAME.cyto).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
) -> None:
    """Describe a model bundle (verifying every checksum)."""
    import json

    from cyto.bundle import verify_bundle

    m = verify_bundle(model)
    if as_json:
        typer.echo(json.dumps(m, indent=2, sort_keys=True))
        return
    cfg = m.get("config", {})
    typer.echo(
        f"{model}: {m['method']} ({m.get('scorer_kind')}), backbone {m['backbone']}, "
        f"input {m['input_size']} px, embedding {m.get('embedding_dim')}"
    )
    typer.echo(f"  score: {m['score_direction']}")
    if m["method"] == "droc":
        oc, wh = m.get("ocsvm", {}), m.get("embedding_whitened")
        typer.echo(
            f"  OC-SVM rbf nu {oc.get('nu')}, gamma {oc.get('gamma'):.4g}; embeddings "
            + (f"whitened (Ledoit-Wolf shrinkage {wh['shrinkage']:.3g})" if wh else "raw")
            + (", unit length" if m.get("embedding_normalized") else "")
        )
    if m["method"] == "dsvdd":
        typer.echo(
            f"  seeds {m['seeds']}, test-time views {m['tta_views']}, "
            f"lambda {m['tta_lambda']}, centre eps {m['centre_eps']}"
        )
    td = m.get("training_data", {})
    typer.echo(
        f"  trained on {_used(td.get('n_used', td.get('n_images')), td.get('n_images'))} from "
        f"{td.get('source')} "
        f"(normal {td.get('normal')}, fingerprint {str(td.get('fingerprint'))[:12]}) "
        f"in {m.get('training_seconds')} s on {m.get('device')}"
    )
    typer.echo(f"  epochs {cfg.get('epochs')}, batch {cfg.get('batch_size')}, lr {cfg.get('lr')}")
    if m.get("bag_check"):
        typer.echo(f"  {m['bag_check']['message']}")
    ref = m.get("refined_from")
    if ref:
        typer.echo(
            f"  refined from {ref['model']} with the review {ref['review']}: "
            f"{len(ref['cases'])} finished case(s), +{ref['hard_normals']} hard normal, "
            f"+{ref['known_abnormal']} known abnormal cell(s) (--agree {ref['agree']})"
        )
    typer.echo("  files (checksums verified):")
    for name in sorted(m["files"]):
        size = (model / name).stat().st_size
        typer.echo(f"    {name}  {size / 1e6:.2f} MB  sha256 {m['files'][name][:12]}")
    typer.echo("  backends:")
    typer.echo("    torch: ready (needs torch, CPU or CUDA)")
    if "onnx" in m:
        o = m["onnx"]
        typer.echo(
            f"    onnxruntime: ready ({o['file']}, opset {o['opset']}, "
            f"{o['input']['dtype']} {o['input']['layout']} in; needs 'cyto[cpu]' or "
            "'cyto[gpu]' for CUDA)"
        )
        conf = o.get("tensorrt_conformance")
        if conf is not None:
            typer.echo(
                f"    graph vs TensorRT import rules ({conf['targets']}): "
                + ("conforms" if conf["ok"] else "; ".join(conf["problems"][:3]))
            )
        for p, v in sorted((m.get("onnx_variants") or {}).items()):
            par, gate = v["parity_vs_fp32"], v["gate"]
            verdict = "passed" if gate["passed"] else "BELOW the gate, accepted by the user"
            q = v.get("quantization", {})
            how = f", {q['method']} calibration on {q['cells']} cells" if "cells" in q else ""
            if q.get("kept_float"):
                how += f", {'/'.join(q['kept_float'])} kept in float"
            typer.echo(
                f"    {p}: {v['file']}{how}; vs fp32 on {par['cells']} held-out cells: Spearman "
                f"{par['spearman']:.4f}, top-10% overlap {par['top10_overlap']:.2f} ({verdict})"
            )
    else:
        typer.echo(f"    onnxruntime: run 'cyto export {model}' first")
    from cyto.runtime.engines import EngineIndex

    engines = EngineIndex(model).entries()
    for e in engines:
        k = e.key
        typer.echo(
            f"    tensorrt: engines/{e.file} ({k.precision}, batch {k.profile.as_list()}, "
            f"{k.input_hw[0]} px; only on a {k.gpu} (sm{k.capability[0]}{k.capability[1]}) with "
            f"TensorRT {k.tensorrt}; needs 'cyto[gpu]')"
        )
    if not engines:
        typer.echo(
            f"    tensorrt: run 'cyto export {model} --trt' on an NVIDIA GPU (needs 'cyto[gpu]')"
        )
    cal = m.get("calibration") or {}
    if cal.get("kind") == "slides":
        v = cal.get("valid_for", {})
        typer.echo(
            f"  calibration: {cal['source']}, {cal['normalization']} normalization, scored with "
            f"{v.get('graph')} ({v.get('precision')}): p-values, FDR flags and burden in cyto score"
        )
    else:
        typer.echo(
            f"  calibration: none on slide-negative slides (cyto calibrate {model} "
            "NEGATIVE/scores.parquet ...); no p-values or burden"
        )
    typer.echo("  libraries: " + ", ".join(f"{k} {v}" for k, v in m.get("libraries", {}).items()))
    g = m.get("golden")
    if g:
        typer.echo(
            f"  golden cells: {g['cells']} {'random patches' if g['kind'] == 'random' else 'cells'}"
            f" from {g['source']}; every graph is verified on them where it runs"
        )
    else:
        typer.echo(f"  golden cells: none (cyto export {model} adds them)")
    typer.echo(f"  what runs on this machine: cyto doctor {model}")


@app.command("doctor")
def doctor_cmd(
    models: Annotated[
        list[Path] | None,
        typer.Argument(help="Model bundles to verify here (every graph and engine)."),
    ] = None,
    device: Annotated[
        str, typer.Option(help="cpu, cuda, cuda:N or auto (the CPU, and the GPU if there is one).")
    ] = "auto",
    precision: Annotated[
        str | None,
        typer.Option(help="Check only this precision (fp32, fp16, int8); failing it exits 1."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """What this machine can run: slide readers, ONNX Runtime, CUDA, TensorRT, numba, the CPU's
    instruction sets; for each model, every graph and engine verified here on its golden cells,
    with its speed. Exits 1 when something asked for cannot run here."""
    import json

    from cyto.doctor import diagnose, render

    report = diagnose(list(models or []), device, precision)
    typer.echo(json.dumps(report.as_json(), indent=2) if as_json else render(report))
    if report.exit_code:
        raise typer.Exit(report.exit_code)


@app.command("export")
def export_cmd(
    model: Annotated[Path, typer.Argument(help="A model bundle folder (NAME.cyto).")],
    onnx: Annotated[bool, typer.Option(help="Export encoder.onnx (uint8 NHWC in).")] = True,
    precision: Annotated[
        str,
        typer.Option(
            help="Comma-separated graphs to make: fp32 (encoder.onnx), fp16, int8 (Q/DQ, "
            "calibrated on --calib). With --trt, one engine per precision, from its graph."
        ),
    ] = "fp32",
    calib: Annotated[
        Path | None,
        typer.Option(
            help="int8: real cells to calibrate on (folder of class folders or manifest)."
        ),
    ] = None,
    calib_class: Annotated[
        str | None,
        typer.Option(help="int8: calibrate on these classes only (e.g. the normal one, LYT)."),
    ] = None,
    calib_method: Annotated[
        str, typer.Option(help="int8 activation ranges: percentile, entropy or minmax.")
    ] = "percentile",
    parity_cells: Annotated[
        Path | None,
        typer.Option(
            help="Held-out cells to measure fp16/int8 ranking parity on (default: a quarter of "
            "--calib that calibration does not use)."
        ),
    ] = None,
    parity_normal: Annotated[
        str | None,
        typer.Option(help="Normal class(es) of --parity-cells: adds AUROC and Recall@K deltas."),
    ] = None,
    accept_parity_loss: Annotated[
        bool,
        typer.Option(help="Keep a quantized graph below the parity gate (recorded in the bundle)."),
    ] = False,
    int8_keep_float: Annotated[
        str | None,
        typer.Option(
            help="int8: op types or node names kept in float, comma-separated (default: Gemm for "
            "Deep SVDD, whose distance moves with every embedding coordinate; none otherwise; "
            "'' quantizes everything)."
        ),
    ] = None,
    trt: Annotated[
        bool, typer.Option(help="Also build TensorRT engines (NVIDIA GPU, TensorRT 10 or 11).")
    ] = False,
    cells: Annotated[
        Path | None,
        typer.Option(
            help="Real cells to keep as the bundle's golden cells (256 drawn, with their fp32 "
            "PyTorch scores), which every graph and engine must reproduce on each machine that "
            "loads it. Default: --parity-cells, --calib, else the training folder if present."
        ),
    ] = None,
    batch: Annotated[str, typer.Option(help="TensorRT batch profile min,opt,max.")] = "1,64,256",
    device: Annotated[str, typer.Option(help="TensorRT: the GPU, cuda or cuda:N.")] = "cuda",
    opset: Annotated[int, typer.Option(help="ONNX opset.")] = 18,
) -> None:
    """Export a bundle for inference: ONNX (+ fp16 / int8 graphs, + TensorRT), each checked.

    ONNX Runtime must match PyTorch; a quantized graph must keep the fp32 ranking on held-out
    cells (Spearman >= 0.99, top-10% overlap >= 0.90) or it is not added. TensorRT engines go to
    MODEL/engines/, outside the bundle's sealed files: building or deleting one never
    invalidates the bundle.
    """
    from cyto.export.api import export_bundle

    export_bundle(
        model,
        onnx=onnx,
        trt=trt,
        precisions=tuple(_csv(precision) or ("fp32",)),
        cells=cells,
        calib=calib,
        calib_class=calib_class,
        calib_method=calib_method,
        parity_cells=parity_cells,
        parity_normal=parity_normal,
        accept_parity_loss=accept_parity_loss,
        int8_keep_float=_csv(int8_keep_float),
        batch=batch,
        device=device,
        opset=opset,
        echo=typer.echo,
    )


@app.command("predict")
def predict_cmd(
    model: Annotated[Path, typer.Argument(help="A model bundle folder (NAME.cyto).")],
    data: Annotated[Path, typer.Option(help="Folder of class sub-folders, or a manifest.")],
    out: Annotated[Path, typer.Option(help="Parquet score table to write.")] = Path(
        "scores.parquet"
    ),
    normal: Annotated[
        str | None, typer.Option(help="Normal class(es): adds labels, AUROC and Recall@K.")
    ] = None,
    abnormal: Annotated[str | None, typer.Option(help="Abnormal classes.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "cpu",
    batch_size: Annotated[int, typer.Option(help="Patches per batch.")] = 128,
    backend: Annotated[
        str, typer.Option(help="torch (the trained network), onnx, onnx-trt, trt or auto.")
    ] = "torch",
    precision: Annotated[
        str, typer.Option(help="The exported graph (onnx/trt): fp32, fp16, int8 or auto.")
    ] = "fp32",
    zoom: Annotated[
        str | None,
        typer.Option(
            help="Bring patches of another scanner to the training scale: a factor (1.7: the "
            "cells look 1.7x smaller than at training), or auto (from the median nucleus size "
            "of the patches against the training normals'; assumes most patches are normal)."
        ),
    ] = None,
    patch_mpp: Annotated[
        float | None,
        typer.Option(
            help="um per pixel of these patches: zoom by it over the model's training mpp."
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
) -> None:
    """Score every patch of a folder or manifest with a bundle (PyTorch by default)."""
    from cyto.predict import predict

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
    )
    for path, why in res.get("skipped", [])[:5]:
        typer.echo(f"skipped unreadable {path}: {why}")
    if len(res.get("skipped", [])) > 5:
        typer.echo(f"... and {len(res['skipped']) - 5} more unreadable file(s) skipped")
    for note in res.get("notes", []):
        typer.echo(f"backend choice: {note}")
    typer.echo(f"verification: {res['verification']}")
    if res["zoom"] != 1.0:
        typer.echo(f"zoom {res['zoom']:.3g}x, from {res['zoom_from']}")
    if res["zoom"] < 1.0:
        typer.echo(
            "warning: a zoom below 1 shrinks the cells and fills the border with plain "
            "background, which the model never saw; measured here it ranked worse than no zoom "
            "(bone marrow by a blood model: AUROC 0.60 against 0.71). Prefer a model trained at "
            "this scale"
        )
    line = f"scored {res['n']} patches -> {res['out']}"
    if "auroc" in res:
        line += f"; AUROC {res['auroc']:.3f}, Recall@{res['k']} {res['recall_at_k']:.3f}"
    typer.echo(line)


@eval_app.command("sweep")
def eval_sweep_cmd(
    data: Annotated[Path, typer.Option(help="Folder of class sub-folders, or a manifest.")],
    normal: Annotated[str, typer.Option(help="Normal class(es), comma-separated.")],
    out: Annotated[Path, typer.Option(help="Folder for results, tables, plots and models.")],
    abnormal: Annotated[
        str | None, typer.Option(help="Abnormal classes (default: every other class).")
    ] = None,
    methods: Annotated[str, typer.Option(help="Comma-separated methods.")] = (
        "dsvdd,droc,fs-sil,ws-sil,its2clr"
    ),
    wr: Annotated[str, typer.Option(help="Witness rates in percent, comma-separated.")] = (
        "9,5,1,0.5,0.1,0.05"
    ),
    trials: Annotated[int, typer.Option(help="Trials per WR (test-pool resamples).")] = 10,
    k: Annotated[int, typer.Option(help="K of the top-K metrics.")] = 400,
    preset: Annotated[
        str,
        typer.Option(
            help="Training preset for every method; 'paper' for the methods' own recipes "
            "(ResNet18 at 224 px: a GPU's work)."
        ),
    ] = "fast",
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Override a setting: key=value for every method, METHOD:key=value for one "
            "(e.g. dsvdd:ae_epochs=2).",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the split, bags and trials.")] = 0,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    train_fraction: Annotated[
        float,
        typer.Option(
            help="Share of the normal cells in the 10 training bags; the rest are held out "
            "(0.7: the paper's 18,369 / 7,873 split)."
        ),
    ] = 0.5,
) -> None:
    """The paper's witness-rate sweep: train, rank held-out cells, tables and log-log plots.

    Interrupt and rerun the same command to continue from the finished (method, WR) cells.
    """
    from cyto.errors import ConfigError
    from cyto.eval.report import plots, tp_table
    from cyto.eval.sweep import SweepSpec, run_sweep

    try:
        wrs = tuple(float(w) for w in wr.split(",") if w.strip())
    except ValueError as exc:
        raise ConfigError(f"--wr must be numbers separated by commas, got {wr!r}") from exc
    spec = SweepSpec(
        data=data,
        normal=normal,
        abnormal=abnormal,
        methods=tuple(m.strip() for m in methods.split(",") if m.strip()),
        wrs=wrs,
        trials=trials,
        k=k,
        preset=preset,
        seed=seed,
        device=device,
        overrides=tuple(set_ or ()),
        train_fraction=train_fraction,
    )
    results = run_sweep(spec, out, echo=typer.echo)
    md, tex = tp_table(results, out, k)
    figs = plots(results, out, k)
    typer.echo(md.read_text())
    typer.echo(f"results {results}; tables {md}, {tex}; plots {len(figs)} files in {out}")


@eval_app.command("scores")
def eval_scores_cmd(
    table: Annotated[Path, typer.Argument(help="Score table (Parquet or CSV), one row per cell.")],
    k: Annotated[list[int] | None, typer.Option("--k", help="K (repeat for several).")] = None,
    score_column: Annotated[str, typer.Option(help="Column with scores (higher = abnormal).")] = (
        "score"
    ),
    label_column: Annotated[str, typer.Option(help="Column with 0/1 labels (1 = abnormal).")] = (
        "label"
    ),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """TP@K, Recall@K, Precision@K, nDCG@K, AUTK@K, normalized AUFROC@K and AUROC."""
    from cyto.eval.scores import evaluate_table

    rows = evaluate_table(table, k or [400], score_column, label_column)
    if as_json:
        import json

        typer.echo(json.dumps(rows, indent=2))
        return
    first = rows[0]
    typer.echo(
        f"{table}: {first['n']} cells, {first['positives']} abnormal, AUROC {first['auroc']:.4f}"
    )
    typer.echo(
        f"{'K':>6} {'TP@K':>6} {'Recall':>8} {'Prec':>8} {'nDCG':>8} {'AUTK':>9} {'AUFROC':>8}"
    )
    for r in rows:
        typer.echo(
            f"{r['k']:>6} {r['tp_at_k']:>6} {r['recall_at_k']:>8.4f} "
            f"{r['precision_at_k']:>8.4f} {r['ndcg_at_k']:>8.4f} {r['autk_at_k']:>9.3f} "
            f"{r['aufroc_at_k']:>8.4f}"
        )


@app.command("score")
def score_cmd(
    slides: Annotated[list[Path], typer.Argument(help="Whole-slide images (NDPI, SVS, TIFF...).")],
    model: Annotated[Path, typer.Option(help="Model bundle (exported: cyto export).")],
    out: Annotated[Path, typer.Option(help="Output folder; one sub-folder per slide.")],
    backend: Annotated[
        str,
        typer.Option(
            help="auto (a TensorRT engine for this GPU, else ONNX Runtime, else PyTorch), onnx, "
            "onnx-trt (ONNX Runtime's TensorRT provider), trt or torch."
        ),
    ] = "auto",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    precision: Annotated[
        str,
        typer.Option(
            help="The exported graph to run: fp32, fp16, int8, or auto (a quantized graph only "
            "when its recorded parity passed)."
        ),
    ] = "fp32",
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
            help="Nucleus detection for: smear (cytology, cells apart) or tissue (sections, "
            "nuclei packed; no crowding warning)."
        ),
    ] = "smear",
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
    patch_size: Annotated[int, typer.Option(help="Cell crop size, level-0 px.")] = 192,
    tile: Annotated[int, typer.Option(help="Tile size read and decoded at once, px.")] = 1024,
    top_k: Annotated[int, typer.Option(help="Cells in topk.parquet.")] = 400,
    mosaic: Annotated[int, typer.Option(help="Cells in the review mosaic (0: none).")] = 100,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Decode/detect/crop processes (0: in the main process). Default: "
            "one per spare core, at most 4."
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(help="Continue an interrupted run (skips finished tiles and slides)."),
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
        float,
        typer.Option(
            help="Calibrated bundles: flag cells at this false discovery rate (Benjamini-Hochberg "
            "on conformal p-values against the slide-negative slides)."
        ),
    ] = 0.1,
    fdr_confidence: Annotated[
        float | None,
        typer.Option(
            help="Calibrated bundles: hold the --fdr for this calibration with this probability "
            "(e.g. 0.9; calibration-conditional p-values), not only on average over "
            "calibrations. Flags fewer cells; needs more calibration cells."
        ),
    ] = None,
    triage_level: Annotated[
        float,
        typer.Option(
            help="Calibrated bundles: a slide whose test 'more high-scoring cells than normal "
            "slides' has p at or below this is triaged 'excess'."
        ),
    ] = 0.05,
    ray: Annotated[
        str | None,
        typer.Option(
            help="Score the cohort on a Ray cluster (pip install 'cyto\\[ray]'): auto (the running "
            "cluster, else a local one), local, or a cluster address HOST:PORT. One engine per "
            "GPU (or per node without one); slides and --out must be on a path every node sees.",
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
) -> None:
    """Score every cell of each slide: scores.parquet, topk.parquet, mosaics and summary.json.

    The model is loaded once; slides are scored one after another, and a slide that fails is
    reported while the next one goes on; OUT/cohort.csv holds one row per slide. Ctrl-C keeps
    the finished part: rerun with --resume. With --ray, slides are scored in parallel on a Ray
    cluster into the same files; a slide whose worker dies is resumed by another.

    With a bundle calibrated on slide-negative slides (cyto calibrate), every cell gets a
    conformal p-value, cells are flagged at the --fdr rate, and each slide gets an abnormal
    burden with a 95% interval and a triage label. The FDR holds on average over calibrations;
    --fdr-confidence 0.9 holds it for this calibration with probability 0.9.
    """
    from dataclasses import replace

    from cyto.detect import detection_preset
    from cyto.cohort import score_cohort
    from cyto.infer import ScoreOptions

    opts = ScoreOptions(
        detection=replace(detection_preset(detection), detector=detector),
        decode=decode,
        overlap=overlap,
        patch_size=patch_size,
        tile=tile,
        batch_size=batch_size,
        top_k=top_k,
        mosaic=mosaic,
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
    )
    metrics = None
    if truth is not None:
        from cyto.eval.metrics import all_metrics as metrics
    if ray is None:
        done, failed = score_cohort(slides, model, out, opts, echo=typer.echo, metrics=metrics)
    else:
        from cyto.cohort.ray import score_cohort_ray

        if ray_part_tiles < 0:
            raise ConfigError(f"--ray-part-tiles must be >= 0, got {ray_part_tiles}")
        done, failed = score_cohort_ray(
            slides, model, out, opts, ray, typer.echo, metrics, ray_part_tiles or None
        )
    for s in done:
        rate = (
            f"{s['cells_per_s']} cells/s, engine {s.get('engine_cells_per_s')} cells/s"
            if s.get("cells_per_s") is not None
            else f"all {s.get('cells_resumed')} from finished chunks"
        )
        line = (
            f"{Path(s['slide']).name}: {s['cells_scored']} cells in {s['seconds']} s ({rate}) "
            f"-> {s.get('output') or out / Path(s['slide']).stem}"
        )
        line += burden_words(s.get("burden"))
        if "truth" in s:
            t = s["truth"]
            line += (
                f"; planted abnormal found in the top {t['k']}: "
                f"{t['planted_found_in_top_k']}/{t['planted_abnormal']}"
            )
        typer.echo(line)
    for slide, exc in failed:
        typer.secho(f"failed: {slide}: {exc}", err=True, fg=typer.colors.RED)
    if failed:  # the most serious failure's code: 2 for bad input, 3 for a busy folder, else 1
        raise typer.Exit(max(exc.exit_code for _, exc in failed))


def burden_words(b: dict | None) -> str:
    """The burden block of a summary as a clause of the one-line report."""
    if not b:
        return ""
    if b.get("status") != "ok":
        return f"; burden: {b.get('status')}"
    lo, hi = b["abnormal_fraction_interval"]
    guarantee = b.get("fdr_guarantee", "")
    given = f" {guarantee}" if guarantee.startswith("for this calibration") else ""
    return (
        f"; abnormal burden {100 * b['abnormal_fraction']:.2f}% (95% CI {100 * lo:.2f}-"
        f"{100 * hi:.2f}%), {b['flagged_bh']} cells flagged at FDR {b['fdr_alpha']}{given}, "
        f"slide p={b['slide_p_value']:.2g} ({b['triage']})"
    )


@app.command("calibrate")
def calibrate_cmd(
    model: Annotated[Path, typer.Argument(help="Model bundle to calibrate.")],
    tables: Annotated[
        list[Path],
        typer.Argument(help="scores.parquet of slide-negative (healthy) slides, one per slide."),
    ],
    normalize: Annotated[
        str,
        typer.Option(
            help="median: centre each slide's scores on its own median (absorbs stain shifts "
            "between slides); median-iqr: also divide by its IQR; none: raw scores."
        ),
    ] = "median",
) -> None:
    """Calibrate a model on slides known to be negative, for p-values, FDR flags and burden.

    Keeps every score of those slides in the bundle (calibration.npz) and records the model,
    graph and scoring options they were made with. cyto score then gives each cell a conformal
    p-value, flags cells at a false discovery rate, and reports the abnormal burden with an
    interval and a slide-level test. Give several slides: the spread between normal slides is
    part of the interval, and each slide is checked against the others (leave one out).
    """
    from cyto.stats.calibrate import calibrate_from_tables

    cal = calibrate_from_tables(model, tables, normalization=normalize)
    q = cal["quantiles"]
    typer.echo(
        f"calibrated {model} on {cal['source']} ({cal['normalization']} normalization): median "
        f"{q['0.5']:.4g}, 99th percentile {q['0.99']:.4g}"
    )
    loso = cal.get("leave_one_slide_out")
    if loso:
        typer.echo(
            f"leave one slide out: BH at {loso['alpha']} flagged cells on "
            f"{loso['slides_with_false_flags']}/{loso['slides']} normal slides (all flags false; "
            f"expected at most {loso['alpha']:.0%} of slides), burden interval held 0 on "
            f"{loso['burden_interval_holds_zero']}/{loso['slides']}"
        )
    typer.echo(f"assumes: {cal['assumes']}")


class _ReviewGroup(TyperGroup):
    """``cyto review SCORED_DIR...`` is short for ``cyto review serve SCORED_DIR...``."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["serve", *args]
        return super().parse_args(ctx, args)


review_app = typer.Typer(
    cls=_ReviewGroup,
    help="Blinded expert review of the top-K cells in the browser, and its report. "
    "'cyto review SCORED_DIR... --reviewer NAME' is short for 'cyto review serve ...'.",
    no_args_is_help=True,
)
app.add_typer(review_app, name="review")


@review_app.command("serve")
def review_serve_cmd(
    scored: Annotated[
        list[Path],
        typer.Argument(
            help="Output folders of cyto score (a slide's folder or a cohort's), or a review "
            "folder made before."
        ),
    ],
    reviewer: Annotated[
        str, typer.Option(help="Your name or initials; marks are kept per reviewer.")
    ],
    session: Annotated[
        Path | None,
        typer.Option(
            help="The review folder (cases, crops, key, marks). Default: SCORED_DIR/review "
            "(with several folders: review/ in their common parent)."
        ),
    ] = None,
    k: Annotated[int, typer.Option("--k", help="Top cells of each model shown per slide.")] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the case ids and cell order.")] = 0,
    merge_um: Annotated[
        float,
        typer.Option(help="Cells of several models closer than this (um) are shown once."),
    ] = 4.0,
    host: Annotated[
        str, typer.Option(help="Address to listen on; the default keeps it on this computer.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free one).")] = 8765,
) -> None:
    """Serve the review page: each slide's top-K cells, shuffled, as a 10x10 grid to mark.

    Slides appear in a random order under anonymized case ids; several models' top-K of the same
    slide are pooled and deduplicated, so nobody can tell which model surfaced a cell. Every mark
    is written at once to REVIEW/marks.sqlite; stop and restart at any time. Each reviewer runs
    their own page (another --reviewer and --port) and sees only their own marks.
    """
    from cyto.review.server import check_reviewer, serve
    from cyto.review.session import KEY_FILE, build_session, open_session

    check_reviewer(reviewer)
    if session is None and len(scored) == 1 and (scored[0] / KEY_FILE).is_file():
        opened = open_session(scored[0])
    else:
        if session is None:
            common = Path(os.path.commonpath([p.resolve() for p in scored]))
            session = common / "review"
        opened = build_session(scored, session, k=k, seed=seed, merge_um=merge_um, echo=typer.echo)
    serve(opened, reviewer, host=host, port=port, echo=typer.echo)


@review_app.command("report")
def review_report_cmd(
    review: Annotated[Path, typer.Argument(help="The review folder (cases, key and marks).")],
    out: Annotated[
        Path | None, typer.Option(help="Where to write the report. Default: REVIEW/report.")
    ] = None,
    reviewers: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated reviewers, in the table's order. Default: all, by name."
        ),
    ] = None,
) -> None:
    """Unblind the marks: the expert table, Cohen's kappa and the review figures.

    Writes REVIEW/report/: expert_table.csv and .md (marks per slide and model, per reviewer,
    both and either), report.json (with kappa and, where the slides were scored with ground
    truth, the precision and recall of the marks) and figures/CASE.png (one stroke per reviewer
    on each cell they marked).
    """
    from cyto.review.report import write_report

    rep = write_report(review, out, list(_csv(reviewers)) if reviewers else None)
    for t in rep["totals"]:
        typer.echo(
            f"{t['model']}: {t['cells_shown']} cells shown over {t['slide']}, marks "
            f"{t['marks']}, both {t['both']}, either {t['either']}"
        )
    for kp in rep["kappa"]:
        v = "undefined" if kp["kappa"] is None else f"{kp['kappa']:.3f}"
        typer.echo(f"Cohen's kappa {kp['reviewers'][0]} vs {kp['reviewers'][1]}: {v}")
    if rep["truth"] and rep["truth"]["overall"]:
        for who, pr in rep["truth"]["overall"].items():
            p = "n/a" if pr["precision"] is None else f"{pr['precision']:.2f}"
            r = "n/a" if pr["recall_of_shown"] is None else f"{pr['recall_of_shown']:.2f}"
            typer.echo(
                f"marks of {who}: {pr['true_abnormal_marked']}/{pr['marked']} truly abnormal "
                f"(precision {p}), recall of abnormal cells shown {r}"
            )
    typer.echo(f"-> {rep['files']['expert_table_md']}, {len(rep['figures'])} figure(s)")


@app.command("refine")
def refine_cmd(
    model: Annotated[Path, typer.Argument(help="The bundle whose top cells were reviewed.")],
    marks: Annotated[Path, typer.Option(help="The review folder (cyto review).")],
    data: Annotated[Path, typer.Option(help="The model's training data (folder or manifest).")],
    out: Annotated[Path, typer.Option(help="The new bundle to write, e.g. dsvdd-r1.cyto.")],
    normal: Annotated[
        str | None, typer.Option(help="Normal class(es) of DATA. Default: the bundle's.")
    ] = None,
    abnormal: Annotated[
        str | None, typer.Option(help="Abnormal classes of DATA (default: every other class).")
    ] = None,
    agree: Annotated[
        str,
        typer.Option(help="A cell is known abnormal when marked by any (or all) reviewers."),
    ] = "any",
    eta: Annotated[
        float, typer.Option(help="Deep SVDD: Deep SAD weight of the known abnormal cells.")
    ] = 1.0,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override one setting of the bundle's config: key=value."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    overwrite: Annotated[bool, typer.Option(help="Replace an existing bundle.")] = False,
    finetune: Annotated[
        bool | None,
        typer.Option(
            "--finetune/--retrain",
            help="--finetune (Deep SVDD's default): continue from the model's encoders and "
            "centres at a tenth of its learning rate; --retrain (the default of the other "
            "methods): train anew.",
            show_default=False,
        ),
    ] = None,
    hard_normals: Annotated[
        bool,
        typer.Option(
            help="Add the reviewed cells nobody marked to the normal training cells "
            "(--no-hard-normals: learn from the marked cells only)."
        ),
    ] = True,
) -> None:
    """Retrain a model with the expert marks: reviewed cells nobody marked become hard normals,
    marked cells known abnormal ones (Deep SVDD learns them as Deep SAD, FS-SIL as labels).

    Only cases marked done count. A Deep SVDD model is fine-tuned, other methods are trained
    anew. The new bundle records what it learned from (refined_from).
    """
    from cyto.review.refine import refine

    res = refine(
        model,
        marks,
        data,
        out,
        normal=normal,
        abnormal=abnormal,
        agree=agree,
        eta=eta,
        overrides=set_,
        device=device,
        overwrite=overwrite,
        echo=typer.echo,
        finetune=finetune,
        hard_normals=hard_normals,
    )
    typer.echo(
        f"wrote {res['bundle']} in {res['seconds']:.0f} s: +{res['hard_normals']} hard normal, "
        f"+{res['known_abnormal']} known abnormal cell(s); export it before cyto score "
        f"(cyto export {res['bundle']})"
    )


@bench_app.command("engine")
def bench_engine_cmd(
    model: Annotated[Path, typer.Option(help="Model bundle (exported, for ONNX/TensorRT).")],
    devices: Annotated[str, typer.Option(help="Comma-separated: cpu, cuda, or auto.")] = "auto",
    backends: Annotated[
        str,
        typer.Option(
            help="Comma-separated among torch, torch-channels-last, torch-compile, onnx, "
            "onnx-trt (ONNX Runtime's TensorRT provider) and trt (cyto's TensorRT engines)."
        ),
    ] = "torch,torch-channels-last,torch-compile,onnx,onnx-trt,trt",
    precisions: Annotated[str, typer.Option(help="Comma-separated: fp32, fp16, int8.")] = (
        "fp32,fp16,int8"
    ),
    batches: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "1,8,32,128",
    sizes: Annotated[
        str | None, typer.Option(help="Patch sides in px (default: the model's input size).")
    ] = None,
    repeats: Annotated[int, typer.Option(help="Timed calls per configuration (median).")] = 10,
    budget: Annotated[float, typer.Option(help="Seconds per configuration at most.")] = 5.0,
    results: ResultsOpt = Path("bench-results"),
) -> None:
    """Patches/s and p50/p99 batch latency of every backend, precision and batch size."""
    from cyto.bench.device import machine
    from cyto.bench.engine import BACKENDS, PRECISIONS, bench_engine, canonical_backend, ratios
    from cyto.bench.results import header, markdown_table, write_results

    chosen = [canonical_backend(b) for b in _csv(backends) or ()]
    bad = [b for b in chosen if b not in BACKENDS]
    if bad:
        raise ConfigError(f"unknown backend(s) {', '.join(bad)}; known: {', '.join(BACKENDS)}")
    precs = list(_csv(precisions) or ())
    if any(p not in PRECISIONS for p in precs):
        raise ConfigError(f"precisions must be among {', '.join(PRECISIONS)}, got {precisions!r}")
    devs = list(_csv(devices) or ())
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
            ("vs_torch_eager_fp32", "vs eager fp32"),
            ("gpu_used_mb", "GPU MB held"),
            ("gpu_peak_mb", "torch peak MB"),
            ("host_rss_mb", "host RSS MB"),
        ],
    )
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
    dims: Annotated[int, typer.Option(help="Embedding dimension.")] = 512,
    repeats: Annotated[int, typer.Option(help="Timed calls of the numba kernels (median).")] = 3,
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


@bench_app.command("slide")
def bench_slide_cmd(
    slide: Annotated[Path, typer.Argument(help="Whole-slide image to score.")],
    model: Annotated[Path, typer.Option(help="Model bundle (exported).")],
    backend: Annotated[
        str, typer.Option(help="auto, onnx, onnx-trt, trt or torch (as for cyto score).")
    ] = "auto",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    precision: Annotated[str, typer.Option(help="The exported graph: fp32, fp16 or int8.")] = (
        "fp32"
    ),
    workers: Annotated[int | None, typer.Option(help="Decode/detect/crop processes.")] = None,
    batch_size: Annotated[int, typer.Option(help="Cells per engine batch.")] = 64,
    patch_size: Annotated[int, typer.Option(help="Cell crop size, level-0 px.")] = 192,
    decode: Annotated[
        str, typer.Option(help="cpu, or torch (JPEG tiles decoded on the engine's device).")
    ] = "cpu",
    overlap: Annotated[
        str, typer.Option(help="The engine in a thread of its own: auto (on a GPU), on, off.")
    ] = "auto",
    detector: Annotated[str, typer.Option(help="Nucleus detector: scipy or torch.")] = "scipy",
    naive_cells: Annotated[
        int, typer.Option(help="Cells for the naive baseline (0: skip it).")
    ] = 2000,
    truth: Annotated[
        Path | None, typer.Option(help="Ground-truth cells, to report Recall@K too.")
    ] = None,
    work: Annotated[
        Path | None, typer.Option(help="Where the score outputs go (default: a temp folder).")
    ] = None,
    results: ResultsOpt = Path("bench-results"),
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
    )
    with tempfile.TemporaryDirectory() as tmp:
        row = bench_slide(slide, model, work or Path(tmp) / "out", opts, naive_cells, typer.echo)
    meta = machine(" ".join(["cyto bench slide", *sys.argv[3:]]))
    meta["model"] = str(model)
    lines = header("cyto bench slide", meta) + slide_markdown([row])
    path = write_results(results, "slide", meta, [row], lines)
    typer.echo(f"wrote {path} and {path.with_suffix('.md')}")


@bench_app.command("cohort")
def bench_cohort_cmd(
    slides: Annotated[
        list[Path] | None, typer.Argument(help="Slides to score (or --synthetic N).")
    ] = None,
    model: Annotated[Path, typer.Option(help="Model bundle (exported).")] = Path("model.cyto"),
    ray: Annotated[
        str, typer.Option(help="The Ray cluster: auto, local or HOST:PORT (as for cyto score).")
    ] = "local",
    synthetic: Annotated[
        int, typer.Option(help="Score N synthetic slides made here instead of SLIDES.")
    ] = 0,
    size: Annotated[int, typer.Option(help="Side of each synthetic slide, px.")] = 4096,
    workers: Annotated[int | None, typer.Option(help="Decode/detect/crop processes.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    tile: Annotated[int, typer.Option(help="Tile size, px.")] = 1024,
    ray_part_tiles: Annotated[
        int, typer.Option(help="Parts of this many tiles for larger slides (0: never).")
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


@app.command("demo")
def demo_cmd(
    out: Annotated[Path, typer.Option(help="Folder for everything the demo makes.")] = Path(
        "demo_out"
    ),
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
) -> None:
    """The main job on built-in synthetic data, end to end, on the CPU."""
    from cyto.demo import run_demo

    run_demo(out, seed=seed, echo=typer.echo)


def main() -> None:
    """Entry point: run the app, turning library errors into one line and an exit code. A Ctrl-C
    exits with 130, also one that something swallowed on its way (:mod:`cyto.interrupts`)."""
    from cyto import interrupts

    interrupts.install()
    try:
        try:
            app()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        interrupts.check()  # the command finished, but a Ctrl-C came and was swallowed
    except CytoError as exc:
        if os.environ.get("CYTO_DEBUG") == "1":
            raise
        typer.secho(f"error: {exc}", err=True, fg=typer.colors.RED)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
