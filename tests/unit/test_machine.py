"""The int8 probe of :mod:`cyto.runtime.machine`: its graph, kept serialized."""

from __future__ import annotations

import base64

import pytest


def test_the_probe_graph_is_what_onnx_helper_builds_and_sums_255_by_127():
    """The probe runs without ``import onnx`` (0.6 s of a small slide's 3.5 s): its bytes are
    the graph ``onnx.helper`` makes of ``PROBE_K`` products of 255 x 127, and ONNX Runtime runs
    them to an int32 (exact here or not: the answer is one of the two the probe tells apart)."""
    pytest.importorskip("onnxruntime")
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, checker, helper

    from cyto.runtime import machine

    k = machine.PROBE_K
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "cyto-int8-probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [helper.make_tensor("b", TensorProto.INT8, [k, 1], [127] * k)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    checker.check_model(model)
    assert base64.b64decode(machine.PROBE_GRAPH) == model.SerializeToString()
    session = ort.InferenceSession(
        base64.b64decode(machine.PROBE_GRAPH), providers=["CPUExecutionProvider"]
    )
    (y,) = session.run(None, {"a": np.full((1, k), 255, np.uint8)})
    assert y.dtype == np.int32 and int(y.ravel()[0]) in (255 * 127 * k, 1_048_544)
    machine.int8_kernels_exact.cache_clear()
    assert machine.int8_kernels_exact() is (int(y.ravel()[0]) == 255 * 127 * k)
