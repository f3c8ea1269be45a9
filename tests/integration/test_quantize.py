"""fp16 and int8 (Q/DQ) graphs: they conform to TensorRT's import rules, their ranking parity
against fp32 is measured on held-out cells and stored, the gate refuses a graph that loses the
ranking (a deliberately broken calibration), and `auto` only runs a graph that passed."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from cyto.bundle import load_bundle, verify_bundle
from cyto.errors import ConfigError
from cyto.export.quantize import export_variant, load_cells
from cyto.runtime import load_scorer
from tests.unit.test_cli import run_cyto


@pytest.fixture
def bundle(exported_bundles, tmp_path):
    copy = tmp_path / "f.cyto"
    shutil.copytree(exported_bundles["fs-sil"], copy)
    return copy


@pytest.mark.parametrize("name", ["fs-sil", "dsvdd"])
def test_int8_and_fp16_graphs_keep_the_ranking(exported_bundles, synth_patches, tmp_path, name):
    path = tmp_path / f"{name}.cyto"
    shutil.copytree(exported_bundles[name], path)
    size = load_bundle(path, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, classes="normal", limit=64)
    held = load_cells(synth_patches, size, normal="normal")
    for key in ("int8", "int8-cpu", "fp16"):
        entry = export_variant(path, key, calib, held, "percentile", echo=lambda m: None)
        assert entry["gate"]["passed"], entry
        # the TensorRT forms conform; the x86 form has uint8 activations, which TensorRT lacks
        assert entry["tensorrt_conformance"]["ok"] == (key != "int8-cpu"), entry
        par = entry["parity_vs_fp32"]
        assert par["spearman"] >= 0.99 and par["cells"] == len(held.images)
        assert {"auroc_delta", "recall_at_k_delta"} <= set(par)
    verify_bundle(path)
    b = load_bundle(path, weights=False)
    q = b.manifest["onnx_variants"]["int8"]["quantization"]
    assert q["method"] == "percentile" and q["cells"] == 64 and "(normal)" in q["source"]
    x = held.images[:20]
    ref = load_scorer(path, "onnx", "cpu").score(x)
    for precision in ("int8", "fp16"):
        s = load_scorer(path, "onnx", "cpu", precision)
        assert s.precision == precision
        np.testing.assert_allclose(s.score(x), ref, rtol=0.2, atol=0.05)
    assert load_scorer(path, "onnx", "cpu", "int8").backend.graph.file == "encoder-int8-cpu.onnx"
    assert load_scorer(path, "auto", "cpu", "auto").precision == "int8"
    assert load_scorer(path, "torch", "cpu", "auto").precision == "fp32"


def test_a_broken_calibration_is_refused_with_the_numbers(bundle, synth_patches, tmp_path):
    """Activation ranges calibrated on black squares cannot hold real cells: the gate refuses
    the graph and the bundle is left as it was; accepting the loss keeps it, recorded, and
    `auto` never runs it."""
    from PIL import Image

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
    assert load_scorer(bundle, "onnx", "cpu", "auto").precision == "fp32"
    assert load_scorer(bundle, "onnx", "cpu", "int8").precision == "int8"  # asked for: runs


def test_int8_needs_real_cells_named_by_the_user(bundle):
    proc = run_cyto("export", str(bundle), "--no-onnx", "--precision", "int8")
    assert proc.returncode == 2 and "--precision int8 needs --calib" in proc.stderr
    with pytest.raises(ConfigError, match="int8 needs calibration cells"):
        export_variant(bundle, "int8", None, None, echo=lambda m: None)


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
    )
    assert proc.returncode == 0, proc.stderr
    assert "int8 vs fp32 on" in proc.stdout and "int8-cpu vs fp32 on" in proc.stdout
    assert "Number of histogram" not in proc.stdout
    info = run_cyto("info", str(bundle))
    assert "int8: encoder-int8.onnx, minmax calibration on" in info.stdout
    assert "int8-cpu: encoder-int8-cpu.onnx" in info.stdout
    assert "Gemm kept in float" in info.stdout
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["onnx_variants"]["int8"]["gate"]["passed"]
    assert m["onnx_variants"]["int8-cpu"]["quantization"]["form"] == "ONNX Runtime on x86 CPUs"
    assert m["onnx_variants"]["int8"]["quantization"]["kept_float"] == ["Gemm"]


def test_score_says_which_graph_scored(bundle, synth_patches, tmp_path):
    import pyarrow.parquet as pq

    from cyto.data.synth.slide import SlideSynthConfig, write_slide
    from cyto.infer.pipeline import ScoreOptions, score_slide

    size = load_bundle(bundle, weights=False).spec.crop_size
    calib = load_cells(synth_patches, size, classes="normal", limit=48)
    held = load_cells(synth_patches, size, normal="normal")
    export_variant(bundle, "int8-cpu", calib, held, "minmax", echo=lambda m: None)
    slide = write_slide(tmp_path / "s.tif", SlideSynthConfig(width=768, height=768)).paths[0]
    opts = ScoreOptions(mosaic=0, workers=0, precision="auto", backend="onnx", device="cpu")
    s = score_slide(slide, bundle, tmp_path / "o", opts, lambda m: None)
    assert (s["precision"], s["graph"]) == ("int8", "encoder-int8-cpu.onnx")
    meta = pq.read_schema(tmp_path / "o" / "scores.parquet").metadata
    assert meta[b"cyto.precision"] == b"int8" and meta[b"cyto.graph"] == b"encoder-int8-cpu.onnx"


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
    entry = export_variant(path, "int8", calib, held, exclude=("Gemm",), echo=lambda m: None)
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
        echo=lambda m: None,
    )
    assert report["int8"]["quantization"]["kept_float"] == ["Gemm"]
    assert report["int8-cpu"]["quantization"]["kept_float"] == ["Gemm"]
