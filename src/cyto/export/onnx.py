"""Export a bundle's network to ONNX (preprocessing inside the graph) and run it with ONNX Runtime.

The graph takes raw uint8 cell patches, NHWC (``patches``: N x H x W x 3, any N, H and W), and
casts, resizes (bilinear) and normalizes inside, so a caller sends 4x fewer bytes than float32. The
graph ends where the numba kernel takes over (see :mod:`cyto.export.graphs`). Exported with the
dynamo exporter at opset 18 into one file; ``onnx.checker`` validates it and the exporter's
optimizer folds constants.
"""

from __future__ import annotations

import tempfile
import time
import warnings
from pathlib import Path

import torch

from cyto.bundle import add_files, load_bundle
from cyto.export.graphs import GRAPHS
from cyto.export.runtime import (  # noqa: F401 - OnnxScorer is re-exported
    ONNX_FILE,
    OUTPUTS,
    OnnxScorer,
    available_providers,
)
from cyto.models.from_bundle import load_scorer

OPSET = 18


def export_onnx(path: Path, opset: int = OPSET, example_size: int | None = None) -> dict:
    """Write ``encoder.onnx`` into the bundle and record it in the manifest; returns its entry."""
    import onnx

    bundle = load_bundle(Path(path))
    kind = bundle.manifest["scorer_kind"]
    scorer = load_scorer(bundle, "cpu")
    module = GRAPHS[kind](scorer).eval()
    size = (
        example_size or bundle.manifest["config"].get("load_size") or bundle.manifest["input_size"]
    )
    x = torch.zeros((2, size, size, 3), dtype=torch.uint8)
    dims = {
        0: torch.export.Dim("batch", min=1, max=65536),
        1: torch.export.Dim("height", min=8, max=4096),
        2: torch.export.Dim("width", min=8, max=4096),
    }
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=bundle.path.parent) as tmp:
        target = Path(tmp) / ONNX_FILE
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                (x,),
                dynamo=True,
                external_data=False,
                opset_version=opset,
                input_names=["patches"],
                output_names=[OUTPUTS[kind]],
                dynamic_shapes=(dims,),
                optimize=True,
                verbose=False,
            )
        program.save(str(target))
        model = onnx.load(str(target))
        onnx.checker.check_model(model, full_check=True)
        entry = {
            "file": ONNX_FILE,
            "opset": opset,
            "exporter": f"torch.onnx dynamo {torch.__version__}",
            "input": {
                "name": "patches",
                "dtype": "uint8",
                "layout": "NHWC",
                "shape": ["N", "H", "W", 3],
            },
            "output": {"name": OUTPUTS[kind], "kind": kind},
            "nodes": len(model.graph.node),
            "export_seconds": round(time.perf_counter() - t0, 1),
        }
        add_files(bundle.path, {ONNX_FILE: target}, {"onnx": entry})
    return entry
