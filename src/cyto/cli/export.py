"""``cyto info``, ``cyto doctor`` and ``cyto export``: model bundles, what this machine runs, and
the graphs and engines built for inference."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cyto.cli._app import BUNDLE, LocalPath, _csv, app, used_words
from cyto.errors import as_arg
from cyto.tables import json_text


def _cells(field: str) -> LocalPath:
    """Cells read from this machine (a URL refused by name)."""
    return LocalPath(field, "cells: a folder of class folders or a manifest: copy it here first")


def _share(value) -> str:
    """A recorded nucleus share as the scale warnings print it (``none``: not recorded)."""
    return "none" if value is None else f"{value:.3f}"


@app.command("info")
def info_cmd(
    model: Annotated[
        Path, typer.Argument(parser=BUNDLE, help="A model bundle folder (NAME.cyto).")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")] = False,
    seal: Annotated[
        bool,
        typer.Option(
            "--seal",
            help="Seal an older unsealed bundle as it reads now (after checking it is yours): "
            "later edits to its manifest are then refused.",
        ),
    ] = False,
    drop_graph: Annotated[
        str | None,
        typer.Option(
            help="Leave these fp16 / int8 graphs out of the bundle for good (comma-separated: "
            "fp16, int8, or one int8 form such as int8-cpu), for a copy made without them, and "
            "say what was left out (no description).",
        ),
    ] = None,
) -> None:
    """Describe a model bundle (verifying every checksum)."""

    from cyto.bundle import drop_graphs, seal_bundle, verify_bundle

    if seal:
        typer.echo(f"{model}: {'sealed' if seal_bundle(model) else 'already sealed'}")
    if drop_graph is not None:
        # an action, said alone: the description waits for a bundle whose other damage (a
        # second graph missing) would refuse it after a drop that worked (round 55, 2)
        typer.echo(drop_graphs(model, _csv(drop_graph, "--drop-graph") or ()).words(model))
        return
    m = verify_bundle(model)
    if as_json:
        typer.echo(json_text(m, indent=2, sort_keys=True))
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
    # a bundle saved through the library (Method.fit, save_bundle) records fewer of these than
    # one from cyto train: say what is known, never "from None"
    known = [
        f"normal {td['normal']}" if td.get("normal") else "",
        f"fingerprint {str(td['fingerprint'])[:12]}" if td.get("fingerprint") else "",
    ]
    typer.echo(
        f"  trained on {used_words(td.get('n_used', td.get('n_images')), td.get('n_images'))}"
        + (f" from {td['source']}" if td.get("source") else "")
        + (f" ({', '.join(k for k in known if k)})" if any(known) else "")
        + (f" in {m['training_seconds']} s" if m.get("training_seconds") is not None else "")
        + (f" on {m['device']}" if m.get("device") else "")
    )
    typer.echo(f"  epochs {cfg.get('epochs')}, batch {cfg.get('batch_size')}, lr {cfg.get('lr')}")
    typer.echo(
        f"  training resolution: {cfg['mpp']} um/px; cyto score checks each slide's scale by it"
        if cfg.get("mpp")
        else "  training resolution: not recorded (trained without --set mpp); cyto score cannot "
        "check a slide's scale unless given --model-mpp"
    )
    if (td.get("centre_nucleus_fraction") or td.get("nucleus_fraction")) and cfg.get(
        "stain", "mgg"
    ) == "mgg":
        # what each scale warning says its cells' share is "against" (hostile round 25, 13)
        typer.echo(
            "  scale checks: a slide's cells against a median nucleus share of "
            f"{_share(td.get('centre_nucleus_fraction'))} (cyto score: the centre nucleus), a "
            f"folder's against {_share(td.get('nucleus_fraction'))} (cyto predict: every "
            "nucleus of a crop, at the model's crop size, as --zoom auto measures it)"
        )
    elif td.get("centre_nucleus_fraction"):  # one measure for both (ModelSpec's reference)
        typer.echo(
            "  scale checks: a slide's or a folder's cells against a median centre-nucleus "
            f"share of {_share(td.get('centre_nucleus_fraction'))} (cyto score, cyto predict "
            "and --zoom auto: at the model's crop size and pixel size)"
        )
    from cyto.data.morphometry import Morphometric, ranking_said

    morph = Morphometric.from_record(td.get("morphometry"), td.get("nucleus_size"))
    if morph is not None:
        features = "; ".join(f.words() for f in morph.features)
        typer.echo(f"  stain {morph.stain}; morphometry of the training normals: {features}")
    ranking = ranking_said(m)
    typer.echo(f"  --rank-by auto ranks by {ranking['rank_by_auto']}: {ranking['rank_by_reason']}")
    for line in ranking["warnings"]:  # what training could not fit, as it said then
        typer.echo(f"  warning: {line}")
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
            from cyto.export.conformance import problem_words

            typer.echo(
                f"    graph vs TensorRT import rules ({conf['targets']}): "
                + ("conforms" if conf["ok"] else problem_words(conf))
            )
        from cyto.export.quantize import parity_cells_words
        from cyto.runtime.verify import passes

        for p, v in sorted((m.get("onnx_variants") or {}).items()):
            par, gate = v["parity_vs_fp32"], v["gate"]
            verdict = "passed" if gate["passed"] else "BELOW the gate, accepted by the user"
            q = v.get("quantization", {})
            how = f", {q['method']} calibration on {q['cells']} cells" if "cells" in q else ""
            if q.get("kept_float"):
                how += f", {'/'.join(q['kept_float'])} kept in float"
            here = v.get("parity_here")  # the exporting CPU's own int8 kernels (round 60, 8)
            if gate["passed"] and here and not passes(here):
                verdict += (
                    f"; below the gate on the CPU it was exported on, {v.get('measured_on')}: "
                    f"Spearman {here['spearman']:.4f}, checked on its golden cells wherever it "
                    "scores"
                )
            typer.echo(
                f"    {p}: {v['file']}{how}; vs fp32 on {parity_cells_words(par)}: Spearman "
                f"{par['spearman']:.4f}, top-10% overlap {par['top10_overlap']:.2f} ({verdict})"
            )
        # what auto takes first on most CPUs was left out of the list (hostile round 60, 8)
        typer.echo(
            "    openvino: ready on the CPU (encoder.onnx in fp32, and bf16 where the CPU offers "
            "it; the int8 graphs; needs 'cyto[cpu]')"
        )
    else:
        typer.echo(f"    onnxruntime: run cyto export {as_arg(model)} first")
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
            f"    tensorrt: run cyto export {as_arg(model)} --trt on an NVIDIA GPU (needs "
            "'cyto[gpu]')"
        )
    cal = m.get("calibration") or {}
    if cal.get("kind") == "slides":
        from cyto.stats.calibrate import held_words

        v = cal.get("valid_for", {})
        marked = cal.get("evaluable_cells")
        typer.echo(
            f"  calibration: {cal['source']}, {cal['normalization']} normalization, scored with "
            f"{v.get('graph')} ({v.get('precision')}): p-values, FDR flags and burden in cyto score"
            f", of {held_words(cal)}"
            + (
                f"; {marked:,} evaluable cells for the burden"
                if marked is not None
                else "; no evaluable cells marked (the burden counts every cell: calibrate again "
                "from tables scored with an adequacy rule)"
            )
        )
    else:
        typer.echo(
            f"  calibration: none on slide-negative slides (cyto calibrate {as_arg(model)} "
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
        typer.echo(f"  golden cells: none (cyto export {as_arg(model)} adds them)")
    typer.echo(f"  what runs on this machine: cyto doctor {as_arg(model)}")


@app.command(
    "doctor", short_help="What this machine can run, and each model's graphs verified here."
)
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
        typer.Option(
            help="Check only this precision (fp32, fp16, bf16, int8); failing it exits 1."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """What this machine can run: slide readers, ONNX Runtime, CUDA, TensorRT, numba, the CPU's
    instruction sets; for each model, every graph and engine verified here on its golden cells,
    with its speed. Exits 1 when something asked for cannot run here."""

    from cyto.doctor import diagnose, render

    report = diagnose(list(models or []), device, precision)
    typer.echo(json_text(report.as_json(), indent=2) if as_json else render(report))
    if report.exit_code:
        raise typer.Exit(report.exit_code)


@app.command("export", short_help="Export a bundle for inference: ONNX, fp16 and int8, TensorRT.")
def export_cmd(
    model: Annotated[
        Path, typer.Argument(parser=BUNDLE, help="A model bundle folder (NAME.cyto).")
    ],
    onnx: Annotated[bool, typer.Option(help="Export encoder.onnx (uint8 NHWC in).")] = True,
    precision: Annotated[
        str,
        typer.Option(
            help="Comma-separated graphs to make: fp32 (encoder.onnx), fp16, int8 (Q/DQ, "
            "calibrated on --calib); bf16 makes no file (OpenVINO's run-time precision), only "
            "its ranking against fp32. With --trt, one engine per precision, from its graph."
        ),
    ] = "fp32",
    calib: Annotated[
        Path | None,
        typer.Option(
            parser=_cells("calib"),
            help="int8: real cells to calibrate on (folder of class folders or manifest).",
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
            parser=_cells("parity_cells"),
            help="Held-out cells to measure fp16/int8 ranking parity on (default: a quarter of "
            "--calib that calibration does not use; for fp16 without --calib, the bundle's "
            "golden cells).",
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
            parser=_cells("cells"),
            help="Real cells to keep as the bundle's golden cells (256 drawn, with their fp32 "
            "PyTorch scores), which every graph and engine must reproduce on each machine that "
            "loads it. Default: --parity-cells, --calib, else the training folder if present.",
        ),
    ] = None,
    batch: Annotated[str, typer.Option(help="TensorRT batch profile min,opt,max.")] = "1,64,256",
    device: Annotated[str, typer.Option(help="TensorRT: the GPU, cuda or cuda:N.")] = "cuda",
    opset: Annotated[
        int,
        typer.Option(
            help="ONNX opset: 18 (default) to 20 for TensorRT 10-11, newer for ONNX Runtime."
        ),
    ] = 18,
) -> None:
    """Export a bundle for inference: ONNX (+ fp16 / int8 graphs, + TensorRT), each checked.

    ONNX Runtime must match PyTorch; a quantized graph must keep the fp32 ranking on held-out
    cells (Spearman >= 0.99, top-10% overlap >= 0.90) or it is not added. TensorRT engines go to
    MODEL/engines/, outside the bundle's sealed files: building or deleting one never
    invalidates the bundle.
    """
    from cyto.export.api import export_bundle, stopped_words

    with stopped_words(model, typer.echo):
        export_bundle(
            model,
            onnx=onnx,
            trt=trt,
            precisions=tuple(_csv(precision, "--precision") or ("fp32",)),
            cells=cells,
            calib=calib,
            calib_class=calib_class,
            calib_method=calib_method,
            parity_cells=parity_cells,
            parity_normal=parity_normal,
            accept_parity_loss=accept_parity_loss,
            int8_keep_float=_csv(int8_keep_float, "--int8-keep-float"),
            batch=batch,
            device=device,
            opset=opset,
            echo=typer.echo,
        )
