"""TensorRT's ONNX import rules, checked on every graph cyto exports (TensorRT itself cannot be
installed here): the check passes on today's graphs, fails on the graph the old preprocessing
made (uint8 transposed before its cast), and fails on each rule broken on purpose."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from cyto.export.conformance import check_graph_file, check_model


@pytest.fixture(scope="module")
def paper_dsvdd(tmp_path_factory):
    """The paper's Deep SVDD graph: ResNet18 with the four test-time views (GridSample), one
    seed (the small Deep SVDD of ``exported_bundles`` has the seed axis: two seeds)."""
    from cyto.bench.models import architecture_bundle

    return architecture_bundle(
        tmp_path_factory.mktemp("paper") / "p.cyto",
        "resnet18",
        64,
        embedding_dim=16,
        seeds=1,
        views=("orig", "hflip", "rot+10", "rot-10"),
    )


def test_every_exported_graph_conforms(exported_bundles, paper_dsvdd):
    from cyto.bundle import load_bundle

    for name, path in {**exported_bundles, "dsvdd-paper": paper_dsvdd}.items():
        assert check_graph_file(path / "encoder.onnx", {"patches"}) == [], name
        conf = load_bundle(path, weights=False).manifest["onnx"]["tensorrt_conformance"]
        assert conf["ok"] and conf["targets"] == "TensorRT 10.0 to 11.x", name
        model = onnx.load(str(path / "encoder.onnx"))
        readers = [n.op_type for n in model.graph.node if "patches" in n.input]
        assert readers == ["Cast"], (name, readers)


def test_paper_graph_with_views_scores_as_pytorch(paper_dsvdd):
    from cyto.runtime import load_scorer

    x = np.random.default_rng(1).integers(0, 256, (5, 64, 64, 3), dtype=np.uint8)
    ort = load_scorer(paper_dsvdd, "onnx", "cpu").score(x, 3)
    ref = load_scorer(paper_dsvdd, "torch", "cpu").score(x, 3)
    np.testing.assert_allclose(ort, ref, rtol=1e-4)


class _LegacyPreprocess(torch.nn.Module):
    """The preprocessing cyto exported before: permute the uint8 input, then cast."""

    def forward(self, x):
        return x.permute(0, 3, 1, 2).float() / 255.0


class _CastFirst(torch.nn.Module):
    def forward(self, x):
        return x.float().permute(0, 3, 1, 2) / 255.0


def _export(module, path):
    x = torch.zeros((2, 16, 16, 3), dtype=torch.uint8)
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.onnx.export(
        module.eval(),
        (x,),
        dynamo=True,
        external_data=False,
        opset_version=18,
        input_names=["patches"],
        output_names=["out"],
        dynamic_shapes=({0: batch},),
    )
    program.save(str(path))
    return onnx.load(str(path))


def test_the_old_uint8_transpose_is_refused(tmp_path):
    legacy = check_model(_export(_LegacyPreprocess(), tmp_path / "old.onnx"), {"patches"})
    assert any("reads the UINT8 tensor 'patches'" in p and "(Transpose)" in p for p in legacy)
    assert any("intermediate UINT8" in p for p in legacy), legacy
    assert check_model(_export(_CastFirst(), tmp_path / "new.onnx"), {"patches"}) == []


def _graph(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _t(name, elem=TensorProto.FLOAT, shape=("N", 3, 8, 8)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def test_each_rule_fails_on_its_own():
    x = _t("x")
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    assert check_model(_graph([relu], [x], [_t("y")]), {"x"}) == []
    # dynamic dimensions that no profile covers
    assert any("no optimization profile" in p for p in check_model(_graph([relu], [x], [_t("y")])))
    # an operator onnx-tensorrt has no importer for, and a custom domain
    uniq = helper.make_node("Unique", ["x"], ["y"], name="u")
    assert any("not supported" in p for p in check_model(_graph([uniq], [x], [_t("y")]), {"x"}))
    custom = helper.make_node("Foo", ["x"], ["y"], name="c", domain="com.example")
    model = _graph([custom], [x], [_t("y")])
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    assert any("custom domain" in p for p in check_model(model, {"x"}))
    # a double tensor
    dbl = helper.make_node("Cast", ["x"], ["y"], name="c", to=TensorProto.DOUBLE)
    out = _t("y", TensorProto.DOUBLE)
    assert any("DOUBLE" in p for p in check_model(_graph([dbl], [x], [out]), {"x"}))
    # Resize: cubic, and antialiasing
    sizes = helper.make_tensor("sizes", TensorProto.INT64, [4], [1, 3, 16, 16])
    for attrs, what in (({"mode": "cubic"}, "mode"), ({"antialias": 1}, "antialias")):
        rs = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], name="r", **attrs)
        found = check_model(_graph([rs], [x], [_t("y")], [sizes]), {"x"})
        assert any(what in p for p in found), (attrs, found)
    # reduction axes computed at run time
    axes_in = _t("axes", TensorProto.INT64, (1,))
    red = helper.make_node("ReduceMean", ["x", "axes"], ["y"], name="m")
    found = check_model(_graph([red], [x, axes_in], [_t("y")]), {"x", "axes"})
    assert any("must be a constant" in p for p in found), found
    # uint8 weights, and an opset TensorRT 10.0 does not read
    w = helper.make_tensor("w", TensorProto.UINT8, [1], [3])
    cast = helper.make_node("Cast", ["w"], ["wf"], name="cw", to=TensorProto.FLOAT)
    add = helper.make_node("Add", ["x", "wf"], ["y"], name="a")
    found = check_model(_graph([cast, add], [x], [_t("y")], [w]), {"x"})
    assert any("initializer 'w' is UINT8" in p for p in found), found
    found = check_model(_graph([relu], [x], [_t("y")], opset=21), {"x"})
    assert any("opset 21" in p for p in found), found
    # an op reading a type its importer rejects (Conv on int32)
    xi = _t("xi", TensorProto.INT32)
    wt = helper.make_tensor("k", TensorProto.INT32, [1, 3, 1, 1], [1, 1, 1])
    conv = helper.make_node("Conv", ["xi", "k"], ["y"], name="conv")
    found = check_model(_graph([conv], [xi], [_t("y", TensorProto.INT32)], [wt]), {"xi"})
    assert any("does not take INT32" in p for p in found), found


def test_export_records_the_check(exported_bundles):
    from cyto.bundle import load_bundle

    entry = load_bundle(exported_bundles["fs-sil"], weights=False).manifest["onnx"]
    assert entry["tensorrt_conformance"]["problems"] == []
    assert "Cast" in entry["ops"] and "GridSample" not in entry["ops"]
