"""TensorRT engines from the exported ONNX graph (TensorRT 10 Python API).

TensorRT is optional (``pip install 'cyto[gpu]'``) and imported lazily: without it, or without an
NVIDIA GPU, every entry point raises one clear error. An engine only runs on the GPU model and
TensorRT version it was built with, so its file name says both, with the precision and the batch
profile: ``engine-<gpu>-sm<cc>-trt<version>-<precision>-b<min>-<opt>-<max>-<H>x<W>.plan``. A timing
cache is kept next to the bundle's engines so rebuilds are fast.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cyto.errors import ConfigError, DeviceError, MissingDependencyError

INSTALL = "pip install 'cyto[gpu]' on a machine with an NVIDIA GPU and driver"
TIMING_CACHE = "trt-timing.cache"


def require_tensorrt():
    """Import tensorrt, or raise the one error a user needs to see."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise MissingDependencyError("tensorrt", "TensorRT engines", INSTALL) from exc
    return trt


def require_cuda() -> dict[str, object]:
    """Name and compute capability of the current GPU; an error when there is none."""
    import torch

    if not torch.cuda.is_available():
        raise DeviceError(
            f"TensorRT needs an NVIDIA GPU with CUDA, and none is visible here; {INSTALL}"
        )
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": props.name, "capability": (props.major, props.minor)}


@dataclass(frozen=True)
class BatchProfile:
    """The optimization profile of the batch dimension."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise ConfigError(
                f"batch profile must satisfy 1 <= min <= opt <= max, got "
                f"{self.min},{self.opt},{self.max}"
            )

    @classmethod
    def parse(cls, text: str) -> BatchProfile:
        try:
            parts = [int(p) for p in text.split(",")]
        except ValueError as exc:
            raise ConfigError(f"--batch expects min,opt,max (e.g. 1,64,256), got {text!r}") from exc
        if len(parts) != 3:
            raise ConfigError(f"--batch expects three numbers min,opt,max, got {text!r}")
        return cls(*parts)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def engine_name(
    gpu: str,
    capability: tuple[int, int],
    trt_version: str,
    precision: str,
    profile: BatchProfile,
    hw: tuple[int, int],
) -> str:
    if precision not in ("fp32", "fp16", "int8"):
        raise ConfigError(f"precision must be fp32, fp16 or int8, got {precision!r}")
    return (
        f"engine-{_slug(gpu)}-sm{capability[0]}{capability[1]}-trt{trt_version}-"
        f"{precision}-b{profile.min}-{profile.opt}-{profile.max}-{hw[0]}x{hw[1]}.plan"
    )


def calibration_batches(images: np.ndarray, batch: int) -> list[np.ndarray]:
    """Full batches of uint8 patches for INT8 calibration (the last partial batch is dropped)."""
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ConfigError("calibration patches must be uint8 (N, H, W, 3)")
    n = len(images) // batch
    if n == 0:
        raise ConfigError(f"INT8 calibration needs at least {batch} patches, got {len(images)}")
    return [np.ascontiguousarray(images[i * batch : (i + 1) * batch]) for i in range(n)]


def build_engine(
    onnx_path: Path,
    out_dir: Path,
    profile: BatchProfile,
    hw: tuple[int, int],
    fp16: bool = True,
    int8: bool = False,
    calib: np.ndarray | None = None,
    workspace_gb: float = 4.0,
) -> Path:
    """Build and serialize an engine; returns its path (named by GPU, version and profile)."""
    trt = require_tensorrt()
    gpu = require_cuda()
    import torch

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(Path(onnx_path).read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ConfigError(f"TensorRT cannot parse {onnx_path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * (1 << 30)))
    cache_path = Path(out_dir) / TIMING_CACHE
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.exists() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    opt_profile = builder.create_optimization_profile()
    h, w = hw
    opt_profile.set_shape(
        "patches", (profile.min, h, w, 3), (profile.opt, h, w, 3), (profile.max, h, w, 3)
    )
    config.add_optimization_profile(opt_profile)
    precision = "fp32"
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
        precision = "fp16"
    if int8:
        if calib is None:
            raise ConfigError("INT8 needs calibration patches: pass --calib DIR")
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = _entropy_calibrator(
            trt,
            torch,
            calibration_batches(calib, profile.opt),
            Path(out_dir) / "int8-calibration.cache",
        )
        config.set_calibration_profile(opt_profile)
        precision = "int8"
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise ConfigError(f"TensorRT failed to build an engine from {onnx_path} (see its log)")
    name = engine_name(gpu["name"], gpu["capability"], trt.__version__, precision, profile, hw)
    out = Path(out_dir) / name
    out.write_bytes(bytes(serialized))
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    return out


def _entropy_calibrator(trt, torch, batches: list[np.ndarray], cache_file: Path):
    class EntropyCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            super().__init__()
            self.batches = batches
            self.index = 0
            self.device = None

        def get_batch_size(self) -> int:
            return int(self.batches[0].shape[0])

        def get_batch(self, names):
            if self.index >= len(self.batches):
                return None
            self.device = torch.from_numpy(self.batches[self.index]).cuda()
            self.index += 1
            return [int(self.device.data_ptr())]

        def read_calibration_cache(self):
            return cache_file.read_bytes() if cache_file.exists() else None

        def write_calibration_cache(self, cache) -> None:
            cache_file.write_bytes(bytes(cache))

    return EntropyCalibrator()


class TrtRunner:
    """Runs an engine on CUDA memory with an async stream; checks its I/O against the manifest."""

    def __init__(self, engine_path: Path, onnx_entry: dict) -> None:
        trt = require_tensorrt()
        require_cuda()
        import torch

        self.torch = torch
        logger = trt.Logger(trt.Logger.WARNING)
        self.engine = trt.Runtime(logger).deserialize_cuda_engine(Path(engine_path).read_bytes())
        if self.engine is None:
            raise DeviceError(
                f"{engine_path} does not load here: engines only run on the GPU "
                "and TensorRT version they were built with; rebuild it"
            )
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        want_in, want_out = onnx_entry["input"]["name"], onnx_entry["output"]["name"]
        if names != [want_in, want_out]:
            raise DeviceError(
                f"{engine_path}: tensors {names} do not match the bundle "
                f"({want_in} -> {want_out}); rebuild the engine"
            )
        if self.engine.get_tensor_dtype(want_in) != trt.DataType.UINT8:
            raise DeviceError(f"{engine_path}: input is not uint8; rebuild the engine")
        self.input, self.output = want_in, want_out
        self.context = self.engine.create_execution_context()
        self.stream = torch.cuda.Stream()

    def run(self, images: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.cuda.stream(self.stream):
            x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.uint8)).cuda(
                non_blocking=True
            )
            self.context.set_input_shape(self.input, tuple(x.shape))
            shape = tuple(self.context.get_tensor_shape(self.output))
            y = torch.empty(shape, dtype=torch.float32, device="cuda")
            self.context.set_tensor_address(self.input, x.data_ptr())
            self.context.set_tensor_address(self.output, y.data_ptr())
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise DeviceError("TensorRT execution failed")
            out = y.cpu()
        self.stream.synchronize()
        return out.numpy()


def parity_report(
    reference: np.ndarray, candidate: np.ndarray, ref_scores: np.ndarray, cand_scores: np.ndarray
) -> dict[str, float]:
    """Max abs difference of raw outputs and Spearman rank correlation of final scores."""
    from scipy.stats import spearmanr

    return {
        "max_abs_diff": float(np.abs(reference.astype(np.float64) - candidate).max()),
        "spearman": float(spearmanr(ref_scores, cand_scores).statistic),
        "n": int(len(ref_scores)),
    }
