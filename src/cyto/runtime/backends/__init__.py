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


class Backend(Protocol):
    """One batch in, the graph's output for it out (float32 numpy, cells on the head's axis)."""

    name: str
    device: str
    precision: str
    #: the most cells per call worth sending (None: whatever the caller sends)
    max_batch: int | None

    def run(self, batch: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...
