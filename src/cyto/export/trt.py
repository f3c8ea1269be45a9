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

from cyto.bundle import atomic_write, load_bundle
from cyto.errors import ConfigError, DeviceError
from cyto.runtime import devices
from cyto.runtime.backends.tensorrt import require_tensorrt
from cyto.runtime.engines import BatchProfile, EngineEntry, EngineIndex, EngineKey


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
    from cyto.export.conformance import check_graph_bytes

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
    data = bundle.graph_bytes(graph)  # the engine is keyed by this sha256: build from these bytes
    problems = check_graph_bytes(data, profile_inputs={graph.input})
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
        if not parser.parse(data, path=str(onnx_path)):
            raise ConfigError(
                f"TensorRT cannot parse {onnx_path}: {'; '.join(parser_errors(parser))}"
            )
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
        tf32 = _tf32_off(trt, config, precision)
        cache = _timing_cache(config, cache_path, echo)
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
        seconds = round(time.perf_counter() - t0, 1)
        if cache is not None:
            _save_timing_cache(index, config, cache_path, echo)
    entry = index.add(
        key,
        plan,
        {
            "build_seconds": seconds,
            "workspace_gb": workspace_gb,
            "strongly_typed": True,
            "tf32": tf32,
            "timing_cache": cache is not None,
            "graph": graph.file,
        },
    )
    echo(f"built {index.plan_path(entry)} in {seconds} s ({gpu.name}, {gpu.sm}, {precision})")
    return entry


def _tf32_off(trt, config, precision: str) -> bool:
    """Turn TF32 off for an fp32 engine (on by default in TensorRT 10 and 11: convolutions and
    matrix products with 10 mantissa bits would make "fp32" engines disagree with fp32
    ONNX Runtime and PyTorch, whose TF32 cyto turns off too). Returns whether TF32 stays on."""
    flag = getattr(trt.BuilderFlag, "TF32", None)
    if flag is None:
        return False
    if precision == "fp32":
        config.clear_flag(flag)
    return bool(config.get_flag(flag))


def _timing_cache(config, cache_path: Path, echo):
    """The timing cache to build with: the one kept for this GPU and TensorRT version, else a
    fresh one, else none (a build without one only takes longer). Never raises: a cache that
    cannot be made must not cost the engine."""
    old = b""
    try:
        old = cache_path.read_bytes() if cache_path.is_file() else b""
    except OSError as exc:
        echo(f"note: cannot read {cache_path.name} ({exc}); timing from scratch")
    for data in (old, b"") if old else (b"",):
        try:
            cache = config.create_timing_cache(data)
        except Exception as exc:  # noqa: BLE001 - TensorRT raises its own untyped errors
            echo(f"note: TensorRT could not make a timing cache ({exc})")
            continue
        if cache is None:
            continue
        if config.set_timing_cache(cache, ignore_mismatch=False):
            return cache
        echo(f"note: {cache_path.name} does not fit this GPU; timing from scratch")
    echo("note: building without a timing cache (slower builds, the same engine)")
    return None


def _save_timing_cache(index: EngineIndex, config, cache_path: Path, echo) -> None:
    """Keep the build's timings for the next build (merged with timings another build added
    meanwhile). A failure here is a note: the engine was built and is kept."""
    try:
        timing = config.get_timing_cache()
        if timing is None:
            return
        with index.locked():
            if cache_path.is_file():
                other = config.create_timing_cache(cache_path.read_bytes())
                if other is not None:
                    timing.combine(other, ignore_mismatch=False)
            data = timing.serialize()
            if data is not None:
                atomic_write(cache_path, bytes(data))
    except Exception as exc:  # noqa: BLE001 - the engine matters more than its timings
        echo(f"note: the timing cache was not saved ({type(exc).__name__}: {exc}); the engine is")
