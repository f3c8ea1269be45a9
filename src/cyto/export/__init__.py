"""Export: ONNX graphs, TensorRT engines and numba scoring kernels (no training code)."""
