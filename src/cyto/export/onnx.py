"""Export a bundle's network to ONNX, preprocessing inside the graph.

The graph takes raw uint8 cell patches, NHWC (``patches``: N x H x W x 3, any N, H and W), and
casts, resizes (bilinear) and normalizes inside, so a caller sends 4x fewer bytes than float32.
The graph ends where the scorer head (:mod:`cyto.runtime.heads`) takes over. Exported with the
dynamo exporter at opset 18 into one file; ``onnx.checker`` validates it, the exporter's optimizer
folds constants, and the TensorRT import rules are checked (:mod:`cyto.export.conformance`).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from pathlib import Path

from cyto.bundle import ONNX_FILE, Staged, load_bundle, staged_files
from cyto.errors import ConfigError
from cyto.flags import passing

OPSET = 18
INPUT = "patches"


def cast_uint8_first(model) -> int:
    """Let every Shape node that reads a uint8 graph input read that input's Cast instead.

    The dynamo exporter takes a symbolic batch size from the first tensor that carries it, the
    uint8 input, even when the graph only uses it after the Cast. TensorRT accepts a uint8
    network input only into a Cast; the Cast keeps the shape, so the rewired graph computes the
    same. Casts of the input are moved to the front so the graph stays topologically sorted.
    Returns how many Shape nodes were rewired.
    """
    import onnx

    g = model.graph
    uint8 = {i.name for i in g.input if i.type.tensor_type.elem_type == onnx.TensorProto.UINT8}
    cast_of: dict[str, str] = {}
    first: list[int] = []
    for idx, node in enumerate(g.node):
        if node.op_type == "Cast" and node.input[0] in uint8 and node.input[0] not in cast_of:
            cast_of[node.input[0]] = node.output[0]
            first.append(idx)
    rewired = 0
    for node in g.node:
        if node.op_type == "Shape" and node.input[0] in cast_of:
            node.input[0] = cast_of[node.input[0]]
            rewired += 1
    if rewired:
        nodes = [g.node[i] for i in first] + [n for i, n in enumerate(g.node) if i not in first]
        nodes = [type(n).FromString(n.SerializeToString()) for n in nodes]
        del g.node[:]
        g.node.extend(nodes)
    return rewired


def drop_stack_traces(model) -> int:
    """Remove the exporter's per-node Python stack traces (``pkg.torch.onnx.stack_trace``).

    They name the files of the checkout that exported the graph, so the same network exported
    from two folders gave two different files (and sha256s); the other node metadata (module
    names, scopes) stays. Returns how many entries were removed."""
    key = "pkg.torch.onnx.stack_trace"
    removed = 0
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    for node in nodes:
        for i in reversed(range(len(node.metadata_props))):
            if node.metadata_props[i].key == key:
                del node.metadata_props[i]
                removed += 1
    return removed


def check_opset(opset: int) -> None:
    """The opsets an export can write: torch's dynamo exporter implements opset 18 and newer
    (below, its version converter fails on this graph and keeps 18), up to what onnx knows."""
    import onnx.defs

    from cyto.export.conformance import OPSET_RANGE

    newest = onnx.defs.onnx_opset_version()
    if not OPSET <= opset <= newest:
        raise ConfigError(
            f"{passing('opset', opset)}: the exporter writes opsets {OPSET} to {newest}; "
            f"TensorRT 10 and 11 read up to {OPSET_RANGE[1]} (default {OPSET})"
        )


def export_onnx(
    path: Path, opset: int = OPSET, example_size: int | None = None, stage: Staged | None = None
) -> dict:
    """Write ``encoder.onnx`` into the bundle and record it in the manifest; returns its entry.
    With ``stage`` it is only staged, and sealed with whatever else the stage holds (the golden
    cells that verify it) when the stage ends."""
    import onnx
    import torch

    from cyto.export.conformance import check_model, conformance_record
    from cyto.models.from_bundle import build_graph
    from cyto.runtime.heads import head_class

    check_opset(opset)
    bundle = load_bundle(Path(path))
    kind = bundle.spec.head
    output = head_class(kind, bundle.path).output
    module = build_graph(bundle)
    size = example_size or bundle.spec.crop_size
    x = torch.zeros((2, size, size, 3), dtype=torch.uint8)
    dims = {
        0: torch.export.Dim("batch", min=1, max=65536),
        1: torch.export.Dim("height", min=8, max=4096),
        2: torch.export.Dim("width", min=8, max=4096),
    }
    t0 = time.perf_counter()
    with contextlib.ExitStack() as scope:
        if stage is None:  # alone: added to the bundle at the end of this call
            stage = scope.enter_context(staged_files(bundle.path))
        target = stage.file(ONNX_FILE)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                (x,),
                dynamo=True,
                external_data=False,
                opset_version=opset,
                input_names=[INPUT],
                output_names=[output],
                dynamic_shapes=(dims,),
                optimize=True,
                verbose=False,
            )
        program.save(str(target))
        model = onnx.load(str(target))
        if cast_uint8_first(model) + drop_stack_traces(model):
            onnx.save(model, str(target))
        onnx.checker.check_model(model, full_check=True)
        problems = check_model(model, profile_inputs={INPUT})
        entry = {
            "file": ONNX_FILE,
            # what the file declares (the exporter may not give what was asked)
            "opset": next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
            "precision": "fp32",
            "exporter": f"torch.onnx dynamo {torch.__version__}",
            "input": {
                "name": INPUT,
                "dtype": "uint8",
                "layout": "NHWC",
                "shape": ["N", "H", "W", 3],
            },
            "output": {"name": output, "kind": kind},
            "nodes": len(model.graph.node),
            "ops": sorted({n.op_type for n in model.graph.node}),
            "tensorrt_conformance": conformance_record(problems),
            "export_seconds": round(time.perf_counter() - t0, 1),
        }
        stage.add(ONNX_FILE, {"onnx": entry})
    return entry
