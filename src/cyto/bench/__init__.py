"""``cyto bench``: throughput of the engine backends, the scoring kernels and the whole slide
pipeline, with the machine recorded next to every number."""
