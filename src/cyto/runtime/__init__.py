"""What scoring needs at run time, importable without PyTorch.

- :class:`~cyto.runtime.scorer.Scorer`: uint8 NHWC patches in, one float64 score per cell out;
  :func:`~cyto.runtime.scorer.load_scorer` builds one from a bundle.
- :mod:`cyto.runtime.backends`: ONNX Runtime, TensorRT and PyTorch, as small adapters.
- :mod:`cyto.runtime.heads`: one module per scorer head (Deep SVDD, OC-SVM, softmax, logit).
- :mod:`cyto.runtime.engines`: the TensorRT engines of a bundle, keyed and indexed.
- :mod:`cyto.runtime.devices`: ``cpu`` / ``cuda:N`` and the GPU's identity.
"""

from __future__ import annotations

from cyto.runtime.backends import BACKENDS, CHOICES
from cyto.runtime.scorer import Scorer, load_scorer

__all__ = ["BACKENDS", "CHOICES", "Scorer", "load_scorer"]
