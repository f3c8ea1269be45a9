"""Backends run the exported network on a batch of uint8 NHWC patches and return its output.

One vocabulary everywhere (``cyto score``, ``cyto bench``, the library):

| name       | what runs the graph                                              | devices   |
|------------|------------------------------------------------------------------|-----------|
| ``onnx``   | ``encoder.onnx`` in ONNX Runtime (CPU, or its CUDA provider)      | cpu, cuda |
| ``onnx-trt`` | ``encoder.onnx`` in ONNX Runtime's TensorRT provider             | cuda      |
| ``openvino`` | ``encoder.onnx`` (fp32, bf16) or an int8 graph in OpenVINO       | cpu       |
| ``trt``    | a TensorRT engine of the bundle (``cyto export --trt``)          | cuda      |
| ``torch``  | the PyTorch network rebuilt from the bundle's safetensors        | cpu, cuda |

Every backend's output goes through the same scorer head (:mod:`cyto.runtime.heads`).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

BACKENDS = ("onnx", "onnx-trt", "openvino", "trt", "torch")
CHOICES = ("auto", *BACKENDS)

#: the backends that run each precision (PyTorch's fp16 is autocast, on CUDA only; OpenVINO's
#: bf16 needs a CPU with AMX or AVX512-BF16, said where it loads)
RUN_BY = {
    "fp32": BACKENDS,
    "fp16": ("onnx", "onnx-trt", "trt", "torch"),
    "int8": ("onnx", "onnx-trt", "openvino", "trt"),
    "bf16": ("openvino",),
}
_RUN_BY_WORDS = {
    "fp16": "ONNX Runtime and TensorRT (and PyTorch on CUDA)",
    "int8": "ONNX Runtime, OpenVINO and TensorRT",
    "bf16": "OpenVINO, on the CPU",
}
_NAMES = {
    "onnx": "ONNX Runtime",
    "onnx-trt": "ONNX Runtime's TensorRT provider",
    "openvino": "OpenVINO",
    "trt": "TensorRT",
    "torch": "PyTorch",
}


def precision_refused(name: str, precision: str, device: str) -> str | None:
    """Why backend ``name`` does not run ``precision`` on ``device``, in one line naming the
    backends that do, or None where it runs it: one rule for the scorer, ``cyto bench`` and each
    backend (``--precision bf16 --backend onnx`` ran fp32 unrefused, while ``--backend torch``
    was refused; bench said OpenVINO's fp16 was a missing graph: hostile round 60, 1-2)."""
    from cyto.flags import passing

    runs = RUN_BY.get(precision, BACKENDS)
    if name == "torch" and precision == "fp16" and not str(device).startswith("cuda"):
        return (
            f"PyTorch runs {passing('precision', 'fp16')} on CUDA only (autocast); on the CPU "
            f"{passing('precision', 'fp16')} runs in ONNX Runtime: use {passing('backend', 'onnx')}"
            f" (or {passing('backend', 'auto')})"
        )
    if name in runs:
        return None
    use = next(b for b in runs if b != "onnx-trt")
    return (
        f"{passing('precision', precision)} runs in {_RUN_BY_WORDS[precision]}, not in "
        f"{_NAMES.get(name, name)}: use {passing('backend', use)} (or {passing('backend', 'auto')})"
    )


class Backend(Protocol):
    """One batch in, the graph's output for it out (float32 numpy, cells on the head's axis)."""

    name: str
    device: str
    precision: str
    #: the most cells per call worth sending (None: whatever the caller sends)
    max_batch: int | None

    def run(self, batch: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...
