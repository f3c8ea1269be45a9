"""TensorRT engines from the bundle's exported ONNX graphs (TensorRT 10.x and 11.x).

Every engine is built as a strongly typed network: its precision is the graph's (fp32
``encoder.onnx``, or an fp16 / int8 Q/DQ variant). No precision builder flag and no implicit INT8
calibrator is used (both deprecated in 10.x and removed in 11.0), so the same code builds on
TensorRT 10.0 through 11.x. Before TensorRT sees a graph, cyto checks it against TensorRT's ONNX
import rules (:mod:`cyto.export.conformance`), so an unparseable graph fails with the rule it
breaks rather than a parser trace.

Each call below was checked against NVIDIA/TensorRT's Python bindings and docstrings at v10.0.0,
v10.16 and v11.1 (``python/src/infer/pyCore.cpp``, ``pyCoreDoc.h``, ``parsers/pyOnnx.cpp``) and
against Polygraphy's loader: ``create_network`` with the ``STRONGLY_TYPED`` flag (required on
10.x, accepted and ignored on 11.x); ``OnnxParser.parse`` returns a bool, errors through
``num_errors`` / ``get_error(i).desc()``; ``set_timing_cache(cache, ignore_mismatch)`` returns a
bool; ``get_timing_cache()`` may return None; ``add_optimization_profile`` returns -1 on a bad
profile; ``build_serialized_network`` returns None on failure. The GPU is chosen by making
``cuda:N`` current before the builder is created (TensorRT has no device argument).
"""

from __future__ import annotations

import time
from pathlib import Path

from cyto.bundle import load_bundle
from cyto.errors import ConfigError, DeviceError
from cyto.runtime import devices
from cyto.runtime.backends.tensorrt import require_tensorrt
from cyto.runtime.engines import BatchProfile, EngineEntry, EngineIndex, EngineKey, atomic_write


def parser_errors(parser) -> list[str]:
    out = []
    for i in range(parser.num_errors):
        err = parser.get_error(i)
        try:
            out.append(f"{err.desc()} (node {err.node()})")
        except AttributeError:  # an older binding: its str() is the formatted message
            out.append(str(err))
    return out


def build_engine(
    bundle_path: Path,
    precision: str = "fp32",
    profile: BatchProfile = BatchProfile(1, 64, 256),
    device: str = "cuda",
    workspace_gb: float = 4.0,
    echo=print,
) -> EngineEntry:
    """Build (or rebuild) the engine of the bundle's ``precision`` graph for the GPU ``device``
    names, store it in ``BUNDLE/engines/`` and return its index entry. The sealed bundle files
    are never touched."""
    from cyto.export.conformance import check_graph_file

    trt = require_tensorrt()
    bundle = load_bundle(Path(bundle_path), weights=False)
    graph = bundle.spec.graph(precision)
    if graph is None:
        raise ConfigError(
            f"{bundle.path} has no {precision} ONNX graph to build a TensorRT engine from "
            f"(exported: {', '.join(sorted(bundle.spec.graphs)) or 'none'}); the engine's "
            "precision is the graph's"
        )
    onnx_path = bundle.path / graph.file
    problems = check_graph_file(onnx_path, profile_inputs={graph.input})
    if problems:
        raise ConfigError(
            f"{onnx_path} breaks TensorRT's ONNX import rules: " + "; ".join(problems[:5])
        )
    device = devices.resolve_device(device)
    gpu = devices.gpu_identity(device)
    size = bundle.spec.crop_size
    key = EngineKey(
        graph.sha256, gpu.name, gpu.capability, trt.__version__, precision, profile, (size, size)
    )
    index = EngineIndex(bundle.path)
    cache_path = index.timing_cache_path(gpu.name, gpu.capability, trt.__version__)
    t0 = time.perf_counter()
    with devices.on_device(device):
        logger = trt.Logger(trt.Logger.WARNING)
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        if network is None:
            raise DeviceError("TensorRT could not create a network definition")
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(onnx_path.read_bytes(), path=str(onnx_path)):
            raise ConfigError(
                f"TensorRT cannot parse {onnx_path}: {'; '.join(parser_errors(parser))}"
            )
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
        old = cache_path.read_bytes() if cache_path.is_file() else b""
        cache = config.create_timing_cache(old)
        if not config.set_timing_cache(cache, ignore_mismatch=False):
            echo(f"note: {cache_path.name} does not fit this GPU; timing from scratch")
            cache = config.create_timing_cache(b"")
            if not config.set_timing_cache(cache, ignore_mismatch=False):
                raise DeviceError("TensorRT refused a fresh timing cache")
        opt = builder.create_optimization_profile()
        opt.set_shape(
            graph.input,
            (profile.min, size, size, 3),
            (profile.opt, size, size, 3),
            (profile.max, size, size, 3),
        )
        if config.add_optimization_profile(opt) < 0:
            raise ConfigError(f"TensorRT refused the batch profile {profile.as_list()}")
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise DeviceError(f"TensorRT failed to build an engine from {onnx_path} (see its log)")
        plan = bytes(serialized)
        timing = config.get_timing_cache()
        seconds = round(time.perf_counter() - t0, 1)
        with index.locked():  # another build may have added timings meanwhile: keep both
            if timing is not None:
                if cache_path.is_file():
                    timing.combine(
                        config.create_timing_cache(cache_path.read_bytes()), ignore_mismatch=False
                    )
                atomic_write(cache_path, bytes(timing.serialize()))
    entry = index.add(
        key,
        plan,
        {
            "build_seconds": seconds,
            "workspace_gb": workspace_gb,
            "strongly_typed": True,
            "graph": graph.file,
        },
    )
    echo(f"built {index.plan_path(entry)} in {seconds} s ({gpu.name}, {gpu.sm}, {precision})")
    return entry
