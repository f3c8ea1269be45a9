"""A stand-in for the TensorRT Python API, for the tests of a machine without TensorRT.

It has the calls cyto makes, with the contract NVIDIA/TensorRT documents for them (bindings and
docstrings at v10.0.0, v10.16 and v11.1: ``python/src/infer/pyCore.cpp``, ``pyCoreDoc.h``,
``parsers/pyOnnx.cpp``): ``set_input_shape``, ``set_tensor_address``, ``execute_async_v3``,
``set_timing_cache``, ``parse`` return bools; ``build_serialized_network``,
``deserialize_cuda_engine``, ``get_timing_cache`` may return None; ``set_shape`` raises on an
inconsistent profile; ``add_optimization_profile`` returns -1 on a bad one.
``make_tensorrt("11.1...")`` has nothing TensorRT 11 removed (``BuilderFlag.FP16``/``INT8``,
``IInt8EntropyCalibrator2``, ``int8_calibrator``...), so code that still uses them fails here as
on a real 11.x install.

An engine "plan" is JSON holding the ONNX model; executing it runs the model in ONNX Runtime on
the bytes at the tensor addresses (CPU torch tensors in tests) and writes the output, in the
engine's output dtype, at the output address.
"""

from __future__ import annotations

import base64
import ctypes
import enum
import importlib.machinery
import json
import types

import numpy as np

PLAN_MAGIC = "fake-tensorrt-plan"


class DataType(enum.Enum):
    FLOAT = "float32"
    HALF = "float16"
    BF16 = "bfloat16"
    INT8 = "int8"
    INT32 = "int32"
    INT64 = "int64"
    BOOL = "bool"
    UINT8 = "uint8"


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0


class ParserError:
    def __init__(self, desc: str, node: int = -1) -> None:
        self._desc, self._node = desc, node

    def desc(self) -> str:
        return self._desc

    def node(self) -> int:
        return self._node

    def code(self) -> int:
        return 1


def make_plan(
    onnx_bytes: bytes,
    input_name: str,
    output_name: str,
    profile,
    out_dtype="FLOAT",
    tf32: bool = False,
    noise: float = 0.0,
):
    """A fake serialized engine: ``profile`` is [min, opt, max] shapes of the input. ``tf32``:
    built with TF32 on, so outputs keep TF32's 10 mantissa bits; ``noise``: an engine that
    computes wrong by that much (relative), as a broken kernel would."""
    return json.dumps(
        {
            "magic": PLAN_MAGIC,
            "onnx": base64.b64encode(onnx_bytes).decode(),
            "input": input_name,
            "output": output_name,
            "profile": [list(p) for p in profile],
            "out_dtype": out_dtype,
            "tf32": tf32,
            "noise": noise,
        }
    ).encode()


def tf32_round(y: np.ndarray) -> np.ndarray:
    """float32 values cut to TF32's 10 mantissa bits (what TF32 keeps of a product)."""
    bits = np.ascontiguousarray(y, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(1 << 12)) & np.uint32(0xFFFFE000)).view(np.float32)


def _array_at(ptr: int, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    buf = (ctypes.c_uint8 * n).from_address(ptr)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


def make_tensorrt(version: str = "11.1.0.106") -> types.ModuleType:
    """A fresh fake ``tensorrt`` module of ``version`` (10.x keeps the flags 11.0 removed)."""
    major = int(version.split(".")[0])
    mod = types.ModuleType("tensorrt")
    mod.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    mod.__version__ = version
    mod.DataType, mod.TensorIOMode, mod.MemoryPoolType = DataType, TensorIOMode, MemoryPoolType
    # 10.x: STRONGLY_TYPED = 1 (opt-in); 11.x: 0, deprecated and ignored (always strongly typed)
    mod.NetworkDefinitionCreationFlag = enum.IntEnum(
        "NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 1 if major < 11 else 0}
    )
    flags = {"TF32": 7} if major >= 11 else {"FP16": 0, "INT8": 1, "TF32": 7}
    mod.BuilderFlag = enum.IntEnum("BuilderFlag", flags)
    mod.calls = []  # what the code under test did, in order
    mod.streams = []  # the stream handle of every execute_async_v3
    mod.behaviour = {}  # switches a test flips: refuse_shapes, execute_fails, parse_fails, ...

    class Logger:
        WARNING = 2

        def __init__(self, min_severity=2) -> None:
            self.min_severity = min_severity

    class OptimizationProfile:
        def __init__(self) -> None:
            self.shapes = {}

        def set_shape(self, name, min, opt, max):  # noqa: A002 - TensorRT's own names
            if not all(a <= b <= c for a, b, c in zip(min, opt, max, strict=True)):
                raise RuntimeError("Shape provided for min is inconsistent with other shapes")
            self.shapes[name] = [tuple(min), tuple(opt), tuple(max)]

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = bytearray(data)

        def serialize(self):
            if mod.behaviour.get("timing_cache") == "serialize-raises":
                raise RuntimeError("serialize failed")
            return bytes(self.data) or b"fake-timing-cache"

        def combine(self, other, ignore_mismatch):
            self.data += other.data
            return True

    class BuilderConfig:
        def __init__(self) -> None:
            # TF32 is on by default in TensorRT 10 and 11, strongly typed networks included
            self.profiles, self.flags, self.cache, self.pools = [], {mod.BuilderFlag.TF32}, None, {}

        def set_memory_pool_limit(self, pool, size) -> None:
            self.pools[pool] = size

        def set_flag(self, flag) -> None:
            self.flags.add(flag)

        def clear_flag(self, flag) -> None:
            self.flags.discard(flag)

        def get_flag(self, flag) -> bool:
            return flag in self.flags

        def create_timing_cache(self, data: bytes):
            how = mod.behaviour.get("timing_cache")
            if how == "none":
                return None
            if how == "raises":
                raise RuntimeError("createTimingCache failed: out of memory")
            return TimingCache(bytes(data))

        def set_timing_cache(self, cache, ignore_mismatch) -> bool:
            if b"other-gpu" in cache.data and not ignore_mismatch:
                return False
            self.cache = cache
            return True

        def get_timing_cache(self):
            return self.cache

        def add_optimization_profile(self, profile) -> int:
            if not profile.shapes:
                return -1
            self.profiles.append(profile)
            return len(self.profiles) - 1

    class Network:
        def __init__(self, flags: int) -> None:
            self.flags = flags
            self.onnx = None

    class OnnxParser:
        def __init__(self, network, logger) -> None:
            self.network, self.errors = network, []

        def parse(self, model, path=None) -> bool:
            mod.calls.append(("parse", path))
            if mod.behaviour.get("parse_fails"):
                self.errors = [ParserError("Assertion failed: unsupported node", 3)]
                return False
            self.network.onnx = bytes(model)
            return True

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, i):
            return self.errors[i]

    class Builder:
        def __init__(self, logger) -> None:
            self.logger = logger

        def create_network(self, flags=0):
            mod.calls.append(("create_network", flags))
            return Network(flags)

        def create_builder_config(self):
            return BuilderConfig()

        def create_optimization_profile(self):
            return OptimizationProfile()

        def build_serialized_network(self, network, config):
            mod.calls.append(("build", sorted(config.flags)))
            if network.onnx is None or not config.profiles or mod.behaviour.get("build_fails"):
                return None
            ((name, shapes),) = config.profiles[0].shapes.items()
            import onnx

            output = onnx.load_from_string(network.onnx).graph.output[0].name
            tf32 = mod.BuilderFlag.TF32 in config.flags
            noise = float(mod.behaviour.get("engine_noise", 0.0))
            return make_plan(network.onnx, name, output, shapes, tf32=tf32, noise=noise)

    class ExecutionContext:
        def __init__(self, engine) -> None:
            self.engine, self.shape, self.addresses = engine, None, {}

        def set_input_shape(self, name, shape) -> bool:
            shape = tuple(int(d) for d in shape)
            mod.calls.append(("set_input_shape", shape))
            lo, _, hi = self.engine.profile
            ok = name == self.engine.input and all(
                a <= s <= b for a, s, b in zip(lo, shape, hi, strict=True)
            )
            if not ok or shape in mod.behaviour.get("refuse_shapes", ()):
                return False
            self.shape = shape
            return True

        def get_tensor_shape(self, name):
            if name == self.engine.input:
                return self.shape or (-1,) * len(self.engine.profile[0])
            if self.shape is None:
                return (-1,)
            return self.engine.output_shape(self.shape)

        def set_tensor_address(self, name, ptr) -> bool:
            if name not in (self.engine.input, self.engine.output):
                return False
            self.addresses[name] = int(ptr)
            return True

        def execute_async_v3(self, stream_handle) -> bool:
            mod.calls.append(("execute", self.shape))
            mod.streams.append(int(stream_handle))
            if mod.behaviour.get("execute_fails") or self.shape is None:
                return False
            e = self.engine
            x = _array_at(self.addresses[e.input], self.shape, np.uint8).copy()
            y = e.session.run([e.output], {e.input: x})[0]
            if e.tf32:
                y = tf32_round(y)
            if e.noise:
                rng = np.random.default_rng(len(mod.streams))
                y = y * (1 + e.noise * rng.standard_normal(y.shape)).astype(y.dtype)
            out = _array_at(self.addresses[e.output], y.shape, e.out_np)
            out[...] = y.astype(e.out_np)
            return True

    class Engine:
        def __init__(self, plan: dict) -> None:
            import onnxruntime as ort

            self.input, self.output = plan["input"], plan["output"]
            self.profile = [tuple(p) for p in plan["profile"]]
            self.out_dtype = getattr(DataType, plan["out_dtype"])
            self.out_np = np.dtype(self.out_dtype.value)
            self.tf32, self.noise = bool(plan.get("tf32")), float(plan.get("noise", 0.0))
            self.session = ort.InferenceSession(
                base64.b64decode(plan["onnx"]), providers=["CPUExecutionProvider"]
            )
            self._shapes = {}

        @property
        def num_io_tensors(self) -> int:
            return 2

        def get_tensor_name(self, i: int) -> str:
            return (self.input, self.output)[i]

        def get_tensor_mode(self, name):
            return TensorIOMode.INPUT if name == self.input else TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name):
            return DataType.UINT8 if name == self.input else self.out_dtype

        def get_tensor_profile_shape(self, name, profile_index):
            if name != self.input or profile_index != 0:
                return [(-1,), (-1,), (-1,)]
            return list(self.profile)

        def output_shape(self, shape):
            if shape not in self._shapes:
                x = np.zeros(shape, np.uint8)
                self._shapes[shape] = self.session.run([self.output], {self.input: x})[0].shape
            return self._shapes[shape]

        def create_execution_context(self):
            return ExecutionContext(self)

    class Runtime:
        def __init__(self, logger) -> None:
            self.logger = logger

        def deserialize_cuda_engine(self, data):
            try:
                plan = json.loads(bytes(data))
            except (ValueError, UnicodeDecodeError):
                return None
            if plan.get("magic") != PLAN_MAGIC:
                return None
            return Engine(plan)

    def nptype(dtype):
        return np.dtype(dtype.value).type

    mod.Logger, mod.Builder, mod.OnnxParser, mod.Runtime = Logger, Builder, OnnxParser, Runtime
    mod.nptype = nptype
    if major < 11:  # removed in 11.0 with implicit quantization

        class IInt8EntropyCalibrator2:
            pass

        mod.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2
    return mod
