"""fp16 and int8 (Q/DQ) graphs: they conform to TensorRT's import rules, their ranking parity
against fp32 is measured on held-out cells and stored, the gate refuses a graph that loses the
ranking (a deliberately broken calibration), and `auto` only runs a graph that passed."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest

from cyto.bundle import load_bundle, verify_bundle
from cyto.errors import ConfigError
from cyto.export.quantize import export_variant, load_cells
from cyto.runtime import load_scorer
from tests.cli_runner import run_cyto


@pytest.fixture
def bundle(exported_bundles, tmp_path):
    copy = tmp_path / "f.cyto"
    shutil.copytree(exported_bundles["fs-sil"], copy)
    return copy


@pytest.mark.parametrize("name", ["fs-sil", "dsvdd"])
def test_int8_and_fp16_graphs_keep_the_ranking_or_are_refused(
    exported_bundles, synth_patches, tmp_path, name
):
    """Every quantized form either passes the gate on held-out cells and is added with its
    parity, or is refused with the numbers and never added. The gate judges the quantization's
    own numbers (Q/DQ unfused), not this CPU's int8 kernels, so it says the same on every x86
    CPU (tests/integration/test_isa_mask.py runs it as a CPU without VNNI); the 7-bit x86 form
    keeps the ranking."""
    from cyto.errors import ParityError
    from cyto.export.golden import write_golden

    path = tmp_path / f"{name}.cyto"
    shutil.copytree(exported_bundles[name], path)
    write_golden(path, synth_patches, normal="normal", n=96)
    size = load_bundle(path, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, classes="normal", limit=64)
    held = load_cells(synth_patches, size, normal="normal")
    added = []
    ranges = tmp_path / "ranges"  # one calibration pass for the three int8 forms, as in export
    ranges.mkdir()
    references: dict = {}  # encoder.onnx's scores of the held-out cells, run once as in export
    for key in ("int8-cpu", "int8-cpu7", "int8", "fp16"):
        files = (path / "manifest.json").read_bytes()
        try:
            entry = export_variant(
                path, key, calib, held, "percentile", echo=lambda m: None, calib_cache=ranges,
                references=references,
            )  # fmt: skip
        except ParityError as exc:
            # the gate runs Q/DQ unfused, the same on every CPU: only the forms with 8-bit
            # weights may lose what the fixture's 7-bit form keeps (test_isa_mask: the same gate
            # on a CPU without VNNI)
            assert key in ("int8-cpu", "int8"), exc
            assert "Spearman" in str(exc) and "top-10% overlap" in str(exc)
            assert (path / "manifest.json").read_bytes() == files
            assert not (path / f"encoder-{key}.onnx").exists()
            continue
        added.append(key)
        assert entry["gate"]["passed"], entry
        # the TensorRT forms conform; the x86 forms have uint8 activations, which TensorRT lacks
        conf = entry["tensorrt_conformance"]
        assert conf["ok"] == (not key.startswith("int8-cpu")), entry
        # an x86 form breaks one rule at each uint8 zero point: a few are kept, the rest counted
        assert len(conf["problems"]) <= 20 and conf.get("more_problems", 0) >= 0
        par = entry["parity_vs_fp32"]
        assert par["spearman"] >= 0.99 and par["top10_overlap"] >= 0.90
        assert par["cells"] == len(held.images)
        assert {"auroc_delta", "recall_at_k_delta"} <= set(par)
        assert entry["measured_on"]  # the CPU (and its flags) the parity was measured on
        # fp16 is not calibrated: its cells are no "held out from calibration" (round 60, 7)
        assert par.get("uncalibrated", False) == (key == "fp16"), par
    assert {"int8-cpu7", "fp16"} <= set(added)
    verify_bundle(path)
    assert (path / "manifest.json").stat().st_size < 64_000  # a file people read
    b = load_bundle(path, weights=False)
    q = b.manifest["onnx_variants"]["int8-cpu7"]["quantization"]
    assert q["method"] == "percentile" and q["cells"] == 64 and "(normal)" in q["source"]
    assert "7-bit weights" in q["format"]
    x = held.images[:20]
    ref = load_scorer(path, "onnx", "cpu").score(x)
    for precision in ("int8", "fp16"):
        s = load_scorer(path, "onnx", "cpu", precision)
        assert s.precision == precision and s.verification.passed
        np.testing.assert_allclose(s.score(x), ref, rtol=0.2, atol=0.05)
    auto = load_scorer(path, "auto", "cpu", "auto")
    assert auto.precision == "int8" and auto.verification.passed
    # the fastest verified int8 here: OpenVINO's or ONNX Runtime's (the measured CPU order)
    chosen = f"chose {auto.backend.name} on cpu (int8, {auto.graph_file})"
    assert auto.backend.name in ("onnx", "openvino")
    assert any(chosen in n for n in auto.notes), auto.notes
    assert load_scorer(path, "torch", "cpu", "auto").precision == "fp32"


def test_a_broken_calibration_is_refused_with_the_numbers(bundle, synth_patches, tmp_path):
    """Activation ranges calibrated on black squares cannot hold real cells: the gate refuses
    the graph and the bundle is left as it was; accepting the loss keeps it, recorded, and
    `auto` never runs it."""
    from PIL import Image

    from cyto.export.golden import write_golden

    write_golden(bundle, synth_patches, normal="normal", n=64)
    black = tmp_path / "black" / "normal"
    black.mkdir(parents=True)
    for i in range(16):
        Image.new("RGB", (40, 40), (i % 3, 0, 0)).save(black / f"b{i}.png")
    size = load_bundle(bundle, weights=False).spec.crop_size
    calib = load_cells(black.parent, size)
    held = load_cells(synth_patches, size, normal="normal")
    manifest = (bundle / "manifest.json").read_bytes()
    with pytest.raises(ConfigError, match=r"does not keep the ranking .*Spearman"):
        export_variant(bundle, "int8", calib, held, "minmax", echo=lambda m: None)
    assert (bundle / "manifest.json").read_bytes() == manifest
    assert not (bundle / "encoder-int8.onnx").exists()
    entry = export_variant(
        bundle, "int8", calib, held, "minmax", accept_loss=True, echo=lambda m: None
    )
    assert entry["gate"] == {**entry["gate"], "passed": False, "accepted_loss": True}
    auto = load_scorer(bundle, "onnx", "cpu", "auto")
    assert auto.precision == "fp32"
    assert any("below the parity gate" in n for n in auto.notes), auto.notes
    asked = load_scorer(bundle, "onnx", "cpu", "int8")  # asked for: runs, and says so
    assert asked.precision == "int8"
    assert any("as accepted at export" in n for n in asked.notes), asked.notes


def test_int8_needs_real_cells_named_by_the_user(bundle):
    proc = run_cyto("export", str(bundle), "--no-onnx", "--precision", "int8")
    assert proc.returncode == 2 and "--precision int8 needs --calib" in proc.stderr
    with pytest.raises(ConfigError, match="int8 needs calibration cells"):
        export_variant(bundle, "int8", None, None, echo=lambda m: None)


def test_bad_cells_are_refused_before_the_export_rewrites_anything(
    exported_dsvdd, synth_patches, tmp_path
):
    """`cyto export --precision int8 --calib /mistyped` wrote encoder.onnx and the golden cells
    again, checked their parity, and only then failed on the cells (a new user's walk). Every
    --calib, --cells or --parity-cells, and a class they lack, is refused in one line first."""
    import shutil

    model = tmp_path / "m.cyto"
    shutil.copytree(exported_dsvdd, model)
    before = {f.name: f.read_bytes() for f in model.iterdir() if f.is_file()}
    cases = [
        (("--precision", "int8", "--calib", str(tmp_path / "nope")), "does not exist"),
        (("--precision", "int8", "--calib", str(synth_patches), "--calib-class", "LYT"),
         "has no class LYT"),
        (("--cells", str(tmp_path / "nope")), "does not exist"),
        (("--parity-cells", str(tmp_path)), "no images found"),
    ]  # fmt: skip
    for args, words in cases:
        proc = run_cyto("export", str(model), *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "parity" not in proc.stdout and "wrote" not in proc.stdout, proc.stdout
    assert {f.name: f.read_bytes() for f in model.iterdir() if f.is_file()} == before


def test_the_export_cli_and_info(bundle, synth_patches):
    proc = run_cyto(
        "export",
        str(bundle),
        "--no-onnx",
        "--precision",
        "fp32,int8",
        "--calib",
        str(synth_patches),
        "--calib-class",
        "normal",
        "--calib-method",
        "minmax",
        "--parity-cells",
        str(synth_patches),
        "--parity-normal",
        "normal",
        "--int8-keep-float",
        "Gemm",
        "--accept-parity-loss",  # TensorRT's form in ORT depends on the CPU's int8 kernels
        env={"CYTO_PROGRESS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "int8 vs fp32 on" in proc.stdout and "int8-cpu vs fp32 on" in proc.stdout
    # each top's size beside its overlap: "top-1% 1.00" of 128 cells was one cell (round 60, 9)
    n = int(re.search(r"int8 vs fp32 on (\d+) cells", proc.stdout).group(1))
    assert f"(of {max(1, round(n / 10))}), top-1% " in proc.stdout, proc.stdout
    assert f"(of {max(1, round(n / 100))}), max score difference" in proc.stdout, proc.stdout
    # the activation ranges are measured once, with a progress line, for the three forms
    assert proc.stderr.count("int8 calibration: ") == 1, proc.stderr
    assert "Number of histogram" not in proc.stdout
    info = run_cyto("info", str(bundle))
    assert "int8: encoder-int8.onnx, minmax calibration on" in info.stdout
    assert "int8-cpu: encoder-int8-cpu.onnx" in info.stdout
    assert "Gemm kept in float" in info.stdout
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["onnx_variants"]["int8-cpu7"]["gate"]["passed"]
    assert m["onnx_variants"]["int8-cpu"]["quantization"]["form"] == "ONNX Runtime on x86 CPUs"
    assert m["onnx_variants"]["int8"]["quantization"]["kept_float"] == ["Gemm"]
    # what auto takes first on most CPUs is listed; an x86 form below the gate on the
    # exporting CPU's own kernels (an AVX2-only one: the 8-bit form) is said by info too, as
    # export said it, not "(passed)" alone (hostile round 60, 8)
    assert "openvino: ready on the CPU" in info.stdout, info.stdout
    from cyto.runtime.verify import passes

    here = m["onnx_variants"]["int8-cpu"].get("parity_here")
    below = here if here is not None and not passes(here) else None
    assert (below is not None) == ("int8-cpu on this CPU's own int8 kernels" in proc.stdout)
    if below is not None:
        [line] = [x for x in info.stdout.splitlines() if x.strip().startswith("int8-cpu:")]
        assert "below the gate on the CPU it was exported on" in line, line


def test_score_says_which_graph_scored(bundle, synth_patches, tmp_path):
    import pyarrow.parquet as pq

    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.export.golden import write_golden
    from cyto.infer import ScoreOptions, score_slide

    write_golden(bundle, synth_patches, normal="normal", n=64)
    size = load_bundle(bundle, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, classes="normal", limit=48)
    held = load_cells(synth_patches, size, normal="normal")
    export_variant(bundle, "int8-cpu7", calib, held, "minmax", echo=lambda m: None)
    slide = write_slide(tmp_path / "s.tif", SlideSynthConfig(width=768, height=768)).paths[0]
    opts = ScoreOptions(mosaic=0, workers=0, precision="auto", backend="onnx", device="cpu")
    s = score_slide(slide, bundle, tmp_path / "o", opts, lambda m: None)
    assert (s["precision"], s["graph"]) == ("int8", "encoder-int8-cpu7.onnx")
    assert s["verification"]["status"] == "passed" and s["verification"]["cells"] == 64
    meta = pq.read_schema(tmp_path / "o" / "scores.parquet").metadata
    assert meta[b"cyto.precision"] == b"int8" and meta[b"cyto.graph"] == b"encoder-int8-cpu7.onnx"


def test_layers_kept_in_float_by_op_type(exported_bundles, synth_patches, tmp_path):
    """``exclude`` names op types (or nodes) that stay float: no Gemm of the graph reads a
    DequantizeLinear output, and a name that matches nothing is an error, not a silent no-op."""
    import onnx

    path = tmp_path / "d.cyto"
    shutil.copytree(exported_bundles["dsvdd"], path)
    size = load_bundle(path, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, classes="normal", limit=32)
    held = load_cells(synth_patches, size, normal="normal")
    with pytest.raises(ConfigError, match="no node or op type Gemmm"):
        export_variant(path, "int8", calib, held, exclude=("Gemmm",), echo=lambda m: None)
    # (the graph's layout is under test, not its CPU parity, which depends on the CPU's kernels)
    entry = export_variant(
        path, "int8", calib, held, exclude=("Gemm",), accept_loss=True, echo=lambda m: None
    )
    assert entry["quantization"]["kept_float"] == ["Gemm"]
    assert entry["quantization"]["excluded_nodes"]
    g = onnx.load(str(path / entry["file"])).graph
    made_by = {o: n.op_type for n in g.node for o in n.output}
    gemms = [n for n in g.node if n.op_type == "Gemm"]
    assert gemms and all(made_by.get(i) != "DequantizeLinear" for n in gemms for i in n.input)
    assert any(n.op_type == "QuantizeLinear" for n in g.node)  # the convolutions still are int8


def test_deep_svdd_keeps_its_embedding_in_float_by_default(
    exported_bundles, synth_patches, tmp_path
):
    from cyto.export.api import export_bundle

    path = tmp_path / "d.cyto"
    shutil.copytree(exported_bundles["dsvdd"], path)
    report = export_bundle(
        path,
        onnx=False,
        precisions=("int8",),
        calib=synth_patches,
        calib_class="normal",
        calib_limit=32,
        accept_parity_loss=True,  # what is kept in float is under test, not the CPU's parity
        echo=lambda m: None,
    )
    assert report["int8"]["quantization"]["kept_float"] == ["Gemm"]
    assert report["int8-cpu7"]["quantization"]["kept_float"] == ["Gemm"]
    assert "7-bit input" in report["int8-cpu7"]["quantization"]["first_conv"]
    if "int8-cpu" in report:  # (refused on a CPU whose 8-bit kernels saturate)
        assert report["int8-cpu"]["quantization"]["kept_float"] == ["Gemm"]


def test_an_int8_export_measures_the_activation_ranges_once_for_its_three_forms(
    bundle, synth_patches, tmp_path, monkeypatch
):
    """Calibration is most of an int8 export: the three forms share one pass of the cells
    through the graph (where ONNX Runtime can keep its ranges), and each graph is the same,
    byte for byte, as one calibrated on its own. The three measure their parity against one run
    of encoder.onnx on the held-out cells (it ran once a form)."""
    import importlib
    import inspect

    from cyto.export import quantize
    from cyto.export.api import export_bundle
    from cyto.export.quantize import int8_graph, variant_file

    references = []
    scores = quantize._scores
    monkeypatch.setattr(
        quantize,
        "_scores",
        lambda b, graph, *a, **k: (
            references.append(graph) if graph.name == "encoder.onnx" else None,
            scores(b, graph, *a, **k),
        )[1],
    )

    ort_quantize = importlib.import_module(
        "onnxruntime.quantization.quantize"
    )  # (not the function)
    calls = []
    real = ort_quantize.create_calibrator
    monkeypatch.setattr(
        ort_quantize, "create_calibrator", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    kw = dict(calib=synth_patches, calib_class="normal", calib_limit=32, accept_parity_loss=True)
    report = export_bundle(bundle, onnx=False, precisions=("int8",), echo=lambda m: None, **kw)
    shared = "calibration_cache_path" in inspect.signature(ort_quantize.quantize_static).parameters
    assert len(calls) == (1 if shared else 3)
    assert len(references) == 1
    size = load_bundle(bundle, weights=False).spec.crop_size
    calib, _ = load_cells(synth_patches, size, classes="normal", limit=32).split(0.25)
    for form in ("int8", "int8-cpu", "int8-cpu7"):
        alone = tmp_path / f"{form}.onnx"
        int8_graph(bundle / "encoder.onnx", alone, calib.images, form=form)
        assert alone.read_bytes() == (bundle / variant_file(form)).read_bytes(), form
        assert report[form]["file"] == variant_file(form)


def test_the_command_a_missing_fp16_graph_suggests_works(bundle, synth_patches):
    """`cyto predict --precision fp16` on a bundle without the graph said to run
    `cyto export M --no-onnx --precision fp16`, which then failed for want of --parity-cells
    (QA). An fp16 graph (nothing calibrated) measures its parity on the bundle's golden cells;
    with made-up golden cells the hint names --parity-cells."""
    import shlex

    from cyto.errors import CytoError
    from cyto.export.golden import write_golden
    from cyto.runtime.verify import export_hint

    # without golden cells (an older export) the hint names cells to measure the parity on
    hint = export_hint(load_bundle(bundle, weights=False), "fp16")
    assert hint.endswith("--precision fp16 --parity-cells CELLS"), hint
    write_golden(bundle, synth_patches, normal="normal", n=64)  # as cyto export keeps them
    with pytest.raises(CytoError, match="has no fp16 graph") as missing:
        load_scorer(bundle, "onnx", "cpu", "fp16")
    command = str(missing.value).split("make one with ")[1]
    assert command == f"cyto export {bundle} --no-onnx --precision fp16", command
    proc = run_cyto(*shlex.split(command)[1:])
    assert proc.returncode == 0, proc.stderr
    assert "fp16 vs fp32 on 64 golden cells: Spearman" in proc.stdout, proc.stdout
    assert load_scorer(bundle, "onnx", "cpu", "fp16").precision == "fp16"
    made_up = bundle.parent / "made-up.cyto"
    shutil.copytree(bundle, made_up)
    write_golden(made_up, None, n=16)  # no cells given: seeded random patches
    m = json.loads((made_up / "manifest.json").read_text())
    assert m["golden"]["kind"] == "random"
    hint = export_hint(load_bundle(made_up, weights=False), "fp16")
    assert hint.endswith("--precision fp16 --parity-cells CELLS"), hint
    proc = run_cyto("export", str(made_up), "--no-onnx", "--precision", "fp16")
    assert proc.returncode == 2 and "pass --parity-cells with cells" in proc.stderr, proc.stderr


def test_two_exports_of_one_bundle_at_once_keep_both_graphs(bundle, synth_patches, monkeypatch):
    """``cyto export --precision int8`` in one terminal and ``--precision fp16`` in another: the
    int8 export, begun first and finishing last, keeps the fp16 graph added meanwhile (it used
    to write back the list of graphs it had read when it began)."""
    import cyto.export.quantize as quantize

    size = load_bundle(bundle, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, classes="normal", limit=32)
    held = load_cells(synth_patches, size, normal="normal")
    real, started = quantize._scores, []

    def meanwhile(*args, **kwargs):
        if not started:  # the int8 graph is built; the other terminal's fp16 export ends now
            started.append(True)
            export_variant(bundle, "fp16", None, held, echo=lambda m: None)
        return real(*args, **kwargs)

    monkeypatch.setattr(quantize, "_scores", meanwhile)
    export_variant(bundle, "int8-cpu7", calib, held, echo=lambda m: None, accept_loss=True)
    assert set(load_bundle(bundle, weights=False).manifest["onnx_variants"]) == {
        "fp16",
        "int8-cpu7",
    }


def test_the_fp16_graph_keeps_gridsample_in_float32(exported_bundles, tmp_path):
    """ONNX Runtime's CUDA provider has no fp16 GridSample (the test-time views' rotations): in an
    fp16 graph it ran on the CPU with copies both ways, 13 % of the graph's time on an H200. The
    fp16 graph keeps GridSample in float32 and everything else in fp16."""
    import onnx

    from cyto.export.quantize import fp16_graph

    src = exported_bundles["dsvdd"] / "encoder.onnx"
    assert any(n.op_type == "GridSample" for n in onnx.load(str(src)).graph.node)
    dst = tmp_path / "fp16.onnx"
    record = fp16_graph(src, dst)
    assert record["float32_ops"] == ["GridSample"] and record["float32_nodes"] >= 1
    onnx.checker.check_model(onnx.load(str(dst)))  # nodes in order: the casts it added too
    model = onnx.shape_inference.infer_shapes(onnx.load(str(dst)))
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.input, *g.output)}
    types.update({t.name: t.data_type for t in g.initializer})
    grid = [n for n in g.node if n.op_type == "GridSample"]
    assert grid and all(types[n.input[0]] == onnx.TensorProto.FLOAT for n in grid)
    assert all(types[n.input[1]] == onnx.TensorProto.FLOAT for n in grid)
    convs = [n for n in g.node if n.op_type == "Conv"]
    assert convs and all(types[n.input[1]] == onnx.TensorProto.FLOAT16 for n in convs)
    # and it runs, with the fp32 graph's ranking
    from cyto.runtime.backends.onnxruntime import require_onnxruntime

    ort = require_onnxruntime()
    x = np.random.default_rng(0).integers(0, 256, (32, 40, 40, 3), dtype=np.uint8)
    outs = [
        ort.InferenceSession(str(f), providers=["CPUExecutionProvider"]).run(
            None, {g.input[0].name: x}
        )[0]
        for f in (src, dst)
    ]
    np.testing.assert_allclose(outs[1], outs[0], rtol=0.05, atol=0.05)


def test_an_int8_export_records_the_cells_it_calibrated_on(exported_dsvdd, synth_patches, tmp_path):
    """Hostile round 7 (H24): calibration takes equal batches and left the last partial one
    out (312 of 315 cells), yet the manifest and `cyto info` said 315. What is recorded is the
    number the ranges were measured on, the one the progress bar counts."""
    from cyto.export.quantize import int8_graph

    size = load_bundle(exported_dsvdd, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, classes="normal", limit=11)  # 8 in batches of 4
    record = int8_graph(exported_dsvdd / "encoder.onnx", tmp_path / "q.onnx", calib.images)
    assert record["cells"] == 8 and record["cells_left_out"] == 3
    path = tmp_path / "d.cyto"
    shutil.copytree(exported_dsvdd, path)
    proc = run_cyto(
        "export", str(path), "--no-onnx", "--precision", "int8", "--calib", str(synth_patches),
        "--calib-class", "normal", "--accept-parity-loss",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((path / "manifest.json").read_text())
    given = len(load_cells(synth_patches, size, classes="normal").split(0.25)[0].images)
    used = given - given % 4
    assert used != given  # the case under test: a partial last batch
    for entry in manifest["onnx_variants"].values():
        assert entry["quantization"]["cells"] == used
    info = run_cyto("info", str(path))
    assert f"percentile calibration on {used} cells" in info.stdout, info.stdout
    assert f"calibration on {given} cells" not in info.stdout


def test_info_says_the_cells_an_fp16_parity_was_measured_on(bundle, synth_patches):
    """Hostile round 11 (N29): after `cyto export M --precision fp16`, `cyto info M` said "vs fp32
    on 256 held-out cells" while the parity record says the bundle's golden cells measured it
    (cells the model trained on). Info says the cells as the record does."""
    from cyto.export.golden import write_golden

    write_golden(bundle, synth_patches, normal="normal", n=64)  # as cyto export keeps them
    proc = run_cyto("export", str(bundle), "--no-onnx", "--precision", "fp16")
    assert proc.returncode == 0, proc.stderr
    m = json.loads((bundle / "manifest.json").read_text())
    source = m["onnx_variants"]["fp16"]["parity_vs_fp32"]["cells_source"]
    assert source.startswith("the bundle's golden cells ("), source
    info = run_cyto("info", str(bundle))
    assert info.returncode == 0, info.stderr
    [line] = [x.strip() for x in info.stdout.splitlines() if x.strip().startswith("fp16:")]
    assert "; vs fp32 on 64 golden cells: Spearman " in line, line


def test_auto_runs_openvinos_int8_where_only_onnx_runtimes_form_is_below_its_gate(
    bundle, synth_patches, monkeypatch
):
    """Each CPU backend runs its own int8 form: ONNX Runtime the one made for this CPU's
    instruction set, OpenVINO the first of INT8_ORDER. auto judged int8 by ONNX Runtime's form
    alone, so one below its gate left OpenVINO's verified int8 untried (it chose bf16). The
    gate's verdicts are set here, whatever this CPU's numerics give."""
    import dataclasses

    pytest.importorskip("openvino", reason="OpenVINO's int8 form needs openvino")
    from cyto.export.golden import read_golden, write_golden
    from cyto.runtime.machine import graph_for
    from cyto.runtime.scorer import attempt_plan

    write_golden(bundle, synth_patches, normal="normal", n=64)
    size = load_bundle(bundle, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, normal="normal")
    for key in ("int8", "int8-cpu", "int8-cpu7"):
        export_variant(bundle, key, calib, None, "minmax", accept_loss=True, echo=lambda m: None)
    from cyto.runtime import machine

    # a VNNI CPU's order, where OpenVINO takes TensorRT's form first (on an AVX2-only CPU it
    # takes the 7-bit form first, below its gate here: no int8 for auto, rightly)
    monkeypatch.setattr(machine, "int8_dot_here", lambda: True)
    b = load_bundle(bundle, weights=False)
    ort_form = graph_for(b.spec, "int8", "cpu").file  # ONNX Runtime's, on this CPU
    below = {"encoder-int8-cpu.onnx", "encoder-int8-cpu7.onnx"}  # both: whichever ORT runs
    graphs = {
        k: dataclasses.replace(g, parity_passed=g.file not in below)
        for k, g in b.spec.graphs.items()
    }
    b._spec = dataclasses.replace(b.spec, graphs=graphs)
    notes: list[str] = []
    plan = [(n, p) for n, p, _ in attempt_plan(b, "auto", "cpu", "auto", read_golden(b), notes)]
    assert ("openvino", "int8") in plan, (plan, notes)
    assert ("onnx", "int8") not in plan, plan
    assert f"int8 ({ort_form}) is below the parity gate (accepted at export): not used" in notes


def test_parity_cells_are_said_held_out_from_calibration_not_from_training():
    """Hostile round 46, 4: `cyto export --calib p`, p the model's own training folder, said its
    parity was "on 240 held-out cells": held out from the calibration, which the line now says,
    not from training (cells the model trained on measure a parity as well as any)."""
    from cyto.export.quantize import GOLDEN_SOURCE, parity_cells_words

    given = {"cells": 240, "cells_source": "p (the cells calibration did not use)"}
    assert parity_cells_words(given) == "240 cells held out from calibration"
    golden = {"cells": 64, "cells_source": f"{GOLDEN_SOURCE} (synthetic patches)"}
    assert parity_cells_words(golden) == "64 golden cells"
    # an fp16 graph is not calibrated: its cells are not "held out" of anything (round 60, 7)
    fp16 = {**given, "uncalibrated": True}
    assert parity_cells_words(fp16) == (
        "240 cells of p (the cells calibration did not use) (fp16 is not calibrated)"
    )


def test_parity_normal_without_parity_cells_is_refused_and_one_class_is_said(
    exported_dsvdd, synth_patches, tmp_path
):
    """``cyto export --parity-normal LYT`` without ``--parity-cells`` was accepted and did
    nothing; parity cells all of one class gave no AUROC or Recall@K delta, unsaid (hostile
    round 60, 6)."""
    from cyto.export.api import export_bundle

    bundle = tmp_path / "d.cyto"
    shutil.copytree(exported_dsvdd, bundle)
    with pytest.raises(ConfigError, match=r"^--parity-normal names the normal classes of "):
        export_bundle(bundle, onnx=False, precisions=("fp16",), parity_normal="normal")
    normals = tmp_path / "normals"
    (normals / "normal").mkdir(parents=True)
    for f in sorted((synth_patches / "normal").iterdir())[:40]:
        os.symlink(f, normals / "normal" / f.name)
    said: list[str] = []
    export_bundle(
        bundle,
        onnx=False,
        precisions=("fp16",),
        parity_cells=normals,
        parity_normal="normal",
        echo=said.append,
    )
    assert any(
        m.startswith("warning: every cell of --parity-cells is of the normal class") for m in said
    ), said
