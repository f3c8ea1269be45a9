"""TensorRT backend: a serialized engine of the bundle, run on a CUDA GPU.

Written for the TensorRT 10.x and 11.x Python API (checked call by call against NVIDIA/TensorRT
v10.0.0, v10.16 and v11.1 and Polygraphy 0.49): precision comes from the ONNX graph (strongly
typed networks), never from builder flags or calibrators, which TensorRT 11 removed.

The runner follows the API's contract at every step: ``set_input_shape``,
``set_tensor_address`` and ``execute_async_v3`` return False on failure and each is checked;
the output buffer has the engine's dtype and the shape the context reports; a batch below the
profile's minimum is padded (the padding rows are dropped), one above its maximum is split;
device buffers are allocated once, for the profile's maximum, and reused; everything runs on
the ``cuda:N`` the scorer was given.
"""

from __future__ import annotations

import importlib.util
import re

import numpy as np

from cyto.bundle import Bundle, GraphSpec
from cyto.errors import ConfigError, DeviceError, MissingDependencyError, as_arg
from cyto.runtime import devices
from cyto.runtime.derived import EngineFile
from cyto.runtime.engines import EngineEntry, EngineIndex, EngineWant, plan_batches

#: the TensorRT cyto builds and runs engines with (graphs conform to every 10.0 to 11.x)
REQUIREMENT = "TensorRT 10.12 or newer, below 12"
INSTALL = f"pip install 'cyto[gpu]' ({REQUIREMENT}) on a machine with an NVIDIA GPU and driver"
SUPPORTED_MAJORS = (10, 11)
#: strongly typed networks, which every cyto engine is, are complete from TensorRT 10.12 on
#: (earlier 10.x minors lack strongly typed forms of some layers and int8 Q/DQ patterns)
MINIMUM = (10, 12)


def trt_version(text: str) -> tuple[int, ...]:
    """``"10.16.0.72"`` -> (10, 16, 0, 72); suffixes such as ``.post1`` are ignored."""
    out = []
    for part in str(text).split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def require_tensorrt():
    """Import tensorrt (10.x or 11.x), or raise the one error a user needs to see."""
    if importlib.util.find_spec("tensorrt") is None:
        raise MissingDependencyError("tensorrt", "A TensorRT engine", INSTALL)
    try:
        import tensorrt as trt
    except ImportError as exc:  # a tensorrt wheel installed without its libraries fails here
        raise MissingDependencyError("tensorrt", "A TensorRT engine", INSTALL) from exc
    version = trt_version(getattr(trt, "__version__", ""))
    if not version or version[0] not in SUPPORTED_MAJORS or version[:2] < MINIMUM:
        raise MissingDependencyError(
            REQUIREMENT,
            f"TensorRT engines (found TensorRT {getattr(trt, '__version__', '?')})",
            INSTALL,
        )
    return trt


def engine_want(trt, gpu: devices.GpuIdentity, graph: GraphSpec, crop: int) -> EngineWant:
    return EngineWant(
        onnx_sha256=graph.sha256,
        gpu=gpu.name,
        capability=gpu.capability,
        tensorrt=trt.__version__,
        precision=graph.precision,
        input_hw=(crop, crop),
    )


def find_engine_for(
    bundle: Bundle, device: str, precision: str = "fp32", batch: int | None = None
) -> tuple[EngineEntry | None, str]:
    """The bundle's engine for this GPU, TensorRT version, graph and precision, or None and why."""
    graph = bundle.spec.graph(precision)
    if graph is None:
        return None, f"the bundle has no {precision} ONNX graph"
    if not EngineIndex(bundle.path).entries():
        return None, "the bundle has no TensorRT engines"
    try:
        trt = require_tensorrt()
    except MissingDependencyError as exc:
        return None, str(exc)
    want = engine_want(trt, devices.gpu_identity(device), graph, bundle.spec.crop_size)
    entry, reasons = EngineIndex(bundle.path).find(want, batch)
    return entry, "; ".join(reasons)


def torch_dtype(trt, dtype):
    """The torch dtype of a TensorRT ``DataType`` (reduced-precision outputs are fp16/bf16)."""
    import torch

    table = {
        "FLOAT": torch.float32,
        "HALF": torch.float16,
        "BF16": torch.bfloat16,
        "INT32": torch.int32,
        "INT64": torch.int64,
        "INT8": torch.int8,
        "UINT8": torch.uint8,
        "BOOL": torch.bool,
    }
    for name, td in table.items():
        if hasattr(trt.DataType, name) and dtype == getattr(trt.DataType, name):
            return td
    raise DeviceError(f"TensorRT output dtype {dtype} has no torch equivalent here")


class EngineRunner:
    """One deserialized engine with its execution context and reusable device buffers."""

    def __init__(
        self, trt, plan: bytes, device: str, graph: GraphSpec, batch_axis: int, where: str = ""
    ) -> None:
        import torch

        self.torch = torch
        self.trt = trt
        self.device = device
        self.dev = torch.device(device)
        self.batch_axis = batch_axis
        self.where = where or "engine"
        self.input, self.output = graph.input, graph.output
        with devices.on_device(device):
            self.logger = trt.Logger(trt.Logger.WARNING)
            self.runtime = trt.Runtime(self.logger)
            engine = self.runtime.deserialize_cuda_engine(plan)
            if engine is None:
                raise DeviceError(
                    f"{self.where} does not deserialize here: engines only run on the GPU and "
                    "TensorRT version they were built with; rebuild it with 'cyto export --trt'"
                )
            self.engine = engine
            self._check_io()
            lo, _, hi = engine.get_tensor_profile_shape(self.input, 0)
            lo, hi = tuple(lo), tuple(hi)
            if lo[1:] != hi[1:] or min(lo) < 1:
                raise DeviceError(
                    f"{self.where}: its profile {lo}..{hi} varies more than the batch size"
                )
            self.lo, self.hi, self.item_shape = int(lo[0]), int(hi[0]), lo[1:]
            self.context = engine.create_execution_context()
            if self.context is None:
                raise DeviceError(f"{self.where}: TensorRT could not create an execution context")
            self.out_dtype = torch_dtype(trt, engine.get_tensor_dtype(self.output))
            self._set_shape(self.hi)
            most = int(np.prod(self._out_shape()))
            cuda = self.dev.type == "cuda"
            self.stream = torch.cuda.Stream(device=self.dev) if cuda else None
            # allocated on the runner's stream, where they are written and read: the caching
            # allocator ties a block to the stream it was allocated on
            with _stream(torch, self.stream):
                self.inp = torch.empty(
                    (self.hi, *self.item_shape), dtype=torch.uint8, device=self.dev
                )
                self.out = torch.empty(most, dtype=self.out_dtype, device=self.dev)
            self.staging = torch.empty(self.inp.shape, dtype=torch.uint8, pin_memory=cuda)
            self._device_s = 0.0
            self._pending: list = []  # (start, end) CUDA events not yet added up

    def _check_io(self) -> None:
        trt, e = self.trt, self.engine
        names = [e.get_tensor_name(i) for i in range(e.num_io_tensors)]
        inputs = [n for n in names if e.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if e.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if inputs != [self.input] or outputs != [self.output]:
            raise DeviceError(
                f"{self.where}: tensors {inputs} -> {outputs} do not match the bundle's graph "
                f"({self.input} -> {self.output}); rebuild the engine"
            )
        if e.get_tensor_dtype(self.input) != trt.DataType.UINT8:
            raise DeviceError(f"{self.where}: its input is not uint8; rebuild the engine")

    def _set_shape(self, n: int) -> None:
        shape = (n, *self.item_shape)
        if not self.context.set_input_shape(self.input, shape):
            raise DeviceError(
                f"{self.where}: TensorRT refused the input shape {shape} (profile batch "
                f"{self.lo}..{self.hi})"
            )

    def _out_shape(self) -> tuple[int, ...]:
        shape = tuple(int(d) for d in self.context.get_tensor_shape(self.output))
        if any(d < 0 for d in shape):
            raise DeviceError(f"{self.where}: output shape {shape} is not fully specified")
        return shape

    def run(self, images: np.ndarray) -> np.ndarray:
        """Graph output (float32 numpy) for uint8 (N, H, W, 3) patches, any N."""
        images = np.asarray(images)
        if images.dtype != np.uint8 or tuple(images.shape[1:]) != tuple(self.item_shape):
            want = ", ".join(map(str, self.item_shape))
            raise ConfigError(
                f"{self.where} takes uint8 patches of shape (N, {want}), "
                f"got {images.dtype} {images.shape}"
            )
        parts = [
            self._call(images[a:b], size)
            for a, b, size in plan_batches(len(images), self.hi, self.lo, self.hi)
        ]
        if not parts:
            return np.empty((0,), dtype=np.float32)
        return np.concatenate(parts, axis=self.batch_axis)

    def _call(self, chunk: np.ndarray, size: int) -> np.ndarray:
        torch, n = self.torch, len(chunk)
        host = self.staging.numpy()
        host[:n] = chunk
        if size > n:  # below the profile's minimum: pad, and drop the padding rows below
            host[n:size] = 0
        devices.count_h2d(chunk.nbytes, self.dev)
        with devices.on_device(self.device), _stream(torch, self.stream):
            self.inp[:size].copy_(self.staging[:size], non_blocking=True)
            timer = self._timer()
            # a copy: the device buffer is reused by the next call
            result = self._execute(n, size).to("cpu", copy=True)
            self._timed(timer)
        return result.float().numpy()

    def _timer(self):
        """A CUDA event recorded on the runner's stream now (None off CUDA)."""
        if self.stream is None:
            return None
        start = self.torch.cuda.Event(enable_timing=True)
        start.record(self.stream)
        return start

    def _timed(self, start):
        """An event recorded on the runner's stream now, paired with ``start`` for
        :attr:`device_s` (None off CUDA)."""
        if self.stream is None:
            return None
        end = self.torch.cuda.Event(enable_timing=True)
        end.record(self.stream)
        self._pending.append((start, end))
        return end

    @property
    def device_s(self) -> float:
        """CUDA event time of the engine's work on its own stream so far (0 off CUDA); reading
        it waits for the work timed so far."""
        for start, end in self._pending:
            end.synchronize()
            self._device_s += start.elapsed_time(end) / 1000.0
        self._pending.clear()
        return self._device_s

    def _execute(self, n: int, size: int):
        """Run the engine on the first ``size`` rows of the input buffer; the output view of
        the first ``n`` cells (on the runner's stream, valid until the next call)."""
        ctx = self.context
        self._set_shape(size)
        shape = self._out_shape()
        out = self.out[: int(np.prod(shape))].view(shape)
        for name, ptr in ((self.input, self.inp.data_ptr()), (self.output, out.data_ptr())):
            if not ctx.set_tensor_address(name, ptr):
                raise DeviceError(f"{self.where}: TensorRT refused the address of {name!r}")
        handle = self.stream.cuda_stream if self.stream is not None else 0
        if not ctx.execute_async_v3(handle):
            raise DeviceError(f"{self.where}: TensorRT execution failed (see its log)")
        return out.narrow(self.batch_axis, 0, n)

    def run_tensor(self, x):
        """The graph output (a float tensor on the device) for a uint8 (N, H, W, 3) tensor
        already on the device: copied device to device into the engine's input, no host trip.
        The caller's stream is waited for first, and waits for the result."""
        torch = self.torch
        if tuple(x.shape[1:]) != tuple(self.item_shape) or x.dtype != torch.uint8:
            want = ", ".join(map(str, self.item_shape))
            raise ConfigError(
                f"{self.where} takes uint8 patches of shape (N, {want}), "
                f"got {x.dtype} {tuple(x.shape)}"
            )
        caller = torch.cuda.current_stream(self.dev) if self.stream is not None else None
        parts = []
        with devices.on_device(self.device), _stream(torch, self.stream):
            if caller is not None:
                self.stream.wait_stream(caller)  # the crops are written on the caller's stream
                x.record_stream(self.stream)
            timer = self._timer()
            for a, b, size in plan_batches(len(x), self.hi, self.lo, self.hi):
                self.inp[: b - a].copy_(x[a:b], non_blocking=True)
                if size > b - a:
                    self.inp[b - a : size].zero_()
                parts.append(self._execute(b - a, size).float().clone())
            # joined here, on the runner's stream that wrote the parts; the result is then
            # marked as used on the caller's stream, which waits for the runner's
            result = (
                torch.cat(parts, dim=self.batch_axis)
                if parts
                else torch.empty((0,), dtype=torch.float32, device=self.dev)
            )
            end = self._timed(timer)
            if caller is not None:
                caller.wait_event(end)
                result.record_stream(caller)
        return result

    def close(self) -> None:
        """Wait for the work on the runner's stream, then let the engine and buffers go."""
        if self.stream is not None and self.context is not None:
            self.stream.synchronize()
        self.context = self.engine = self.runtime = None
        self.inp = self.out = self.staging = None


def _stream(torch, stream):
    import contextlib

    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


class TensorRTBackend:
    """The bundle's engine for this GPU (see :mod:`cyto.runtime.engines` for the keys)."""

    name = "trt"
    max_batch = None  # the runner splits by the engine's profile

    def __init__(self, bundle: Bundle, device: str, precision: str = "fp32") -> None:
        from cyto.runtime.heads import head_class

        trt = require_tensorrt()
        graph = bundle.spec.graph(precision)
        if graph is None:
            raise ConfigError(
                f"{bundle.path} has no {precision} ONNX graph to run in TensorRT "
                f"(exported: {', '.join(sorted(bundle.spec.graphs)) or 'none'})"
            )
        gpu = devices.gpu_identity(device)
        want = engine_want(trt, gpu, graph, bundle.spec.crop_size)
        index = EngineIndex(bundle.path)
        entry, reasons = index.find(want)
        if entry is None:
            why = "; ".join(reasons) or "it has none"
            raise ConfigError(
                f"{bundle.path} has no {precision} TensorRT engine for this {gpu.name} "
                f"({gpu.sm}) and TensorRT {trt.__version__} ({why}): run "
                f"cyto export {as_arg(bundle.path)} --trt --device {device} here"
            )
        self.entry = entry
        self.graph = graph
        self.device = device
        self.precision = precision
        # the plan's bytes, read once and checked against its index entry; the runtime gets
        # these bytes and the verification key their sha256 and size (cyto.runtime.derived)
        plan = index.plan_bytes(entry)
        self.engine_file = EngineFile.of(index.plan_path(entry), plan)
        self.runner = EngineRunner(
            trt,
            plan,
            device,
            graph,
            head_class(bundle.spec.head).batch_axis,
            where=str(index.plan_path(entry)),
        )

    def run(self, batch: np.ndarray) -> np.ndarray:
        return self.runner.run(batch)

    @property
    def dev(self):
        return self.runner.dev

    def run_tensor(self, x):
        return self.runner.run_tensor(x)

    @property
    def device_s(self) -> float:
        """CUDA event time of the engine on its own stream (the lane reads this, since the
        engine does not run on the lane's stream)."""
        return self.runner.device_s

    def close(self) -> None:
        self.runner.close()
