"""The scorer: one model behind ``score(uint8 NHWC patches) -> float64 scores``.

A scorer is a backend (what runs the network: ONNX Runtime, OpenVINO, TensorRT or PyTorch)
followed by the model's scorer head (what turns the network's output into a score). The whole
model is loaded before the first patch is scored. Higher scores are always more abnormal.

Every scorer is verified on this machine before it is returned: it runs the bundle's golden
cells and must reproduce their reference scores (:mod:`cyto.runtime.verify`). ``auto`` tries, on
a GPU: a TensorRT engine built for this GPU, TensorRT version and the graph's precision; then
ONNX Runtime's CUDA provider; then PyTorch on the GPU. On the CPU, OpenVINO and ONNX Runtime
when the bundle is exported, at each precision in the order measured fastest (:func:`cpu_order`),
else PyTorch. It takes the first that passes, never picks a CPU backend when a GPU was asked
for, and never an int8, fp16 or bf16 network unless that precision (or ``auto``) was asked for.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import numpy as np

from cyto.bundle import (
    CALIBRATION_FILE,
    PRECISIONS,
    Bundle,
    GraphSpec,
    ModelSpec,
    load_bundle,
    of_precision,
)
from cyto.data.images import MIN_CELL_SIDE, resize_rgb
from cyto.errors import ConfigError, CytoError, ScaleWarning, as_arg, warn_caller
from cyto.flags import Range, passing, said
from cyto.runtime.backends import CHOICES, Backend, precision_refused
from cyto.runtime.devices import resolve_device
from cyto.runtime.heads import Head, head_for
from cyto.runtime.machine import graph_for
from cyto.runtime.verify import Golden, Verification, export_hint

if TYPE_CHECKING:  # patches are what np.asarray takes; the method checks them (read as Any)
    from numpy.typing import ArrayLike

#: what a closed scorer answers, whatever its backend
CLOSED = "this scorer was closed: load it again with cyto.load_model"


def _open_method(method: Callable) -> Callable:
    """A public method of a :class:`Scorer`: refused on a closed scorer (one line, whatever its
    backend: each backend let its session go in its own way), and its arguments bound through
    the schema of the public calls (:func:`cyto.flags.bind_call`), so a wrong keyword or type is
    one :class:`ConfigError` line in a Python caller's words, never Python's ``TypeError``."""
    # the method as the caller sees it: named Scorer.score, without self
    view = functools.wraps(method)(lambda *args, **kwargs: None)
    view.__signature__ = inspect.signature(method).replace(
        parameters=list(inspect.signature(method).parameters.values())[1:]
    )
    view.__name__ = f"Scorer.{method.__name__}"

    @functools.wraps(method)
    def call(self: Scorer, *args: Any, **kwargs: Any) -> Any:
        from cyto.flags import bind_call, python_words

        if self._closed:
            raise ConfigError(CLOSED)
        with python_words(view.__name__):  # only the binding: the body keeps its caller's words
            bound = bind_call(view, args, kwargs)
        with self._running():
            return method(self, *bound.args, **bound.kwargs)

    return call


def _what(value: Any) -> str:
    """A value's kind as a refusal names it: ``None``, ``numpy.ndarray``, ``list``."""
    kind = type(value)
    return (
        "None"
        if value is None
        else f"{kind.__module__}.{kind.__qualname__}".removeprefix("builtins.")
    )


def _patches(images: Any, call: str) -> np.ndarray:
    """``images`` of a Scorer method ``call`` as uint8 (N, H, W, 3) patches, or one
    :class:`ConfigError` line naming the argument as the Python caller wrote it (None or a
    tensor was an AttributeError or TypeError from inside the backend)."""
    from cyto.flags import python_words

    with python_words(call):
        want = f"{said('images')} must be uint8 RGB (N, H, W, 3) patches (a numpy array)"
        if images is None or type(images).__module__.startswith("torch"):
            fix = ": score a torch tensor with Scorer.score_tensor" if images is not None else ""
            raise ConfigError(f"{want}, got {_what(images)}{fix}")
        try:
            arr = np.asarray(images)
        except ValueError:  # crops of several sizes: numpy's "inhomogeneous shape" (round 56, 5)
            sides = sorted({np.shape(i)[:2] for i in images})
            shown = ", ".join(f"{h} x {w}" for h, w in sides[:3]) + (", ..." * (len(sides) > 3))
            raise ConfigError(
                f"{want}, got a list of crops of {len(sides)} sizes ({shown} px): give crops "
                "of one size, cut alike"
            ) from None
        if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[-1] != 3:
            got = (
                f"an empty {_what(images)}"
                if arr.size == 0 and not isinstance(images, np.ndarray)
                else f"{arr.dtype} {arr.shape}"
            )
            # one patch, (H, W, 3): the batch of it is images[None] (round 64, 8)
            one = arr.ndim == 3 and arr.shape[-1] == 3 and arr.dtype == np.uint8
            raise ConfigError(f"{want}, got {got}" + (": one patch is images[None]" if one else ""))
    return arr


def _check_tensor(crops: Any) -> None:
    """``crops`` of :meth:`Scorer.score_tensor`: a uint8 (N, H, W, 3) torch tensor, or one
    :class:`ConfigError` line in the Python caller's words (a numpy array or None was an
    AttributeError from inside). Torch is not imported here: a tensor means it already is."""
    import sys

    from cyto.flags import python_words

    torch = sys.modules.get("torch")
    with python_words("Scorer.score_tensor"):
        want = f"{said('crops')} must be a uint8 (N, H, W, 3) torch tensor"
        if torch is None or not isinstance(crops, torch.Tensor):
            fix = ": score a numpy array with Scorer.score" if crops is not None else ""
            raise ConfigError(f"{want}, got {_what(crops)}{fix}")
        if crops.dtype != torch.uint8 or crops.ndim != 4 or crops.shape[-1] != 3:
            raise ConfigError(f"{want}, got {crops.dtype} {tuple(crops.shape)}")


def _at_side(images: np.ndarray, size: int | None) -> np.ndarray:
    """Square patches brought to the side the model's training patches were loaded at
    (``size``: its ``load_size``), as ``cyto predict`` and ``cyto train`` load image files
    (:func:`cyto.data.images.resize_rgb`, an area filter shrinking); ``size`` None: as they are,
    the graph resizing them as it resized the training patches. The graph's own resize
    (bilinear, no antialiasing) scored a model's 192 px training crops up to 0.08 from what cyto
    predict gave their files (hostile round 64, 4)."""
    if size is None or len(images) == 0 or images.shape[1] == size:
        return images
    return np.stack([resize_rgb(im, size) for im in images])


#: a network call's cells (the backend may take fewer at a time)
BatchSize = Annotated[int, Range(1, None)]


@dataclass
class Scorer:
    """A backend followed by a scorer head (see the module docstring)."""

    bundle: Bundle
    head: Head
    backend: Backend
    notes: list[str] = field(default_factory=list)
    #: the check on this machine's golden-cell run (:mod:`cyto.runtime.verify`)
    verification: Verification | None = None
    #: the bundle's golden cells as load_scorer read them (None: none, or not read), so that
    #: a slide's adequacy judges focus by them without reading and unpacking the file again
    golden: Golden | None = None
    #: whether patches of another side than the model's crops were said (once per scorer)
    _said_side: set = field(default_factory=set, repr=False, compare=False)
    #: whether :meth:`close` let the backend go (its methods then refuse: :data:`CLOSED`)
    _closed: bool = field(default=False, repr=False, compare=False)
    #: the calls running now, by thread, and what :meth:`close` waits on for them to end
    _calls_of: dict = field(default_factory=dict, repr=False, compare=False)
    _idle: threading.Condition = field(
        default_factory=threading.Condition, repr=False, compare=False
    )

    @contextlib.contextmanager
    def _running(self):
        """A public method's call, refused on a closed scorer; :meth:`close` waits for it."""
        me = threading.get_ident()
        with self._idle:
            if self._closed:
                raise ConfigError(CLOSED)
            self._calls_of[me] = self._calls_of.get(me, 0) + 1
        try:
            yield
        finally:
            with self._idle:
                self._calls_of[me] -= 1
                if not self._calls_of[me]:
                    del self._calls_of[me]
                self._idle.notify_all()

    @property
    def spec(self) -> ModelSpec:
        return self.bundle.spec

    @property
    def load_size(self) -> int | None:
        """The side the model's training patches were loaded at (its config's ``load_size``),
        where patches of another side are resized to before the graph; None: the patches' own
        size was kept, and the graph resized them (:func:`_at_side`; ``cyto predict`` alike)."""
        size = (self.bundle.manifest.get("config") or {}).get("load_size")
        return int(size) if size else None

    @property
    def device(self) -> str:
        return self.backend.device

    @property
    def precision(self) -> str:
        return self.backend.precision

    @property
    def graph_file(self) -> str | None:
        """The exported graph that scores (None for the PyTorch network)."""
        graph = getattr(self.backend, "graph", None)
        return graph.file if graph is not None else None

    @property
    def graph_ran(self) -> str:
        """What scores, as every record of a run names it: the exported graph's file, or
        ``pytorch`` for the PyTorch network (summary.json said null where the table's metadata
        said ``pytorch``: hostile round 70, 3)."""
        return self.graph_file or "pytorch"

    @property
    def scale_sha256(self) -> str:
        """What a slide's scores, flags and burden depend on in the bundle, as a sha256: its
        trained arrays (:attr:`Bundle.scoring_id`), the graph that scores (its file's sha256)
        at its precision, and the calibration it loaded. Slides of one value are on one
        scale; unlike the manifest's sha256 it stays the same when the bundle is exported
        again into the same graphs (a cohort table then warned of "2 models or versions of
        one": hostile round 69, 10), and changes when it is calibrated again."""
        import hashlib
        import json

        files = self.bundle.manifest.get("files", {})
        text = json.dumps(
            {
                "model": self.bundle.scoring_id,
                "graph": self.graph_ran,
                "graph_sha256": files.get(self.graph_file) if self.graph_file else None,
                "precision": self.precision,
                "calibration": files.get(CALIBRATION_FILE),
            },
            sort_keys=True,
        )
        return hashlib.sha256(text.encode()).hexdigest()

    @_open_method
    def score(
        self, images: ArrayLike, batch_size: BatchSize = 64, progress: str | None = None
    ) -> np.ndarray:
        """(N,) float64 scores of uint8 RGB (N, H, W, 3) patches, ``batch_size`` per network
        call; with ``progress``, a progress bar of that name advances after each call. Patches
        of another side than the model's training patches were loaded at (:attr:`load_size`)
        are brought to it as ``cyto predict`` and ``cyto train`` load their image files (an area
        filter shrinking: :func:`cyto.data.images.resize_rgb`), so an image scores the same by
        every path."""
        images = _patches(images, "Scorer.score")
        self._check_side(images.shape[1], images.shape[2])
        images = _at_side(images, self.load_size)
        if len(images) == 0:
            return np.empty(0, dtype=np.float64)
        calls = self._calls(len(images), batch_size)
        if progress is None:
            parts = [self.head.finish(self.backend.run(images[part])) for part in calls]
        else:
            from cyto.progress import progress as progress_bar

            parts = []
            with progress_bar(progress, len(images), "cells") as bar:
                for part in calls:
                    parts.append(self.head.finish(self.backend.run(images[part])))
                    bar.advance(len(parts[-1]))
        return np.concatenate(parts).astype(np.float64, copy=False)

    def _check_side(self, h: int, w: int) -> None:
        """Patches are the model's crops: square (the graph resizes each to its input, so a
        rectangle would be stretched: refused), and of ``spec.crop_size`` px; another side is
        scored at another scale (resized by crop_size / side), said once per side and scorer (once
        per scorer left a later side unsaid: 200 px, then 64 px crops; hostile round 25)."""
        size = self.spec.crop_size
        # the training crops' own side (resized to crop_size as these are) is no other scale:
        # a model trained on 100 px crops loaded at 64 warned of its own crops (round 21); each
        # line names that side (a rectangle was told 80 px, another side 100: round 25)
        own = getattr(self.spec, "patch_px", None) or size
        if h != w:
            raise ConfigError(
                f"patches must be square crops (the model's training crops are {own} x {own} "
                f"px), got {h} x {w} px: a rectangle would be stretched"
            )
        if h < MIN_PATCH_SIDE:  # 1 x 1 px patches were scored, resized 96x, without a word
            raise ConfigError(
                f"patches of {h} x {w} px hold no cell (the model's training crops are {own} "
                f"px; at least {MIN_PATCH_SIDE} px a side): give crops cut around cells"
            )
        if h not in (size, own) and h not in self._said_side:
            self._said_side.add(h)
            warn_caller(
                f"patches of {h} px are resized to the model's {size} px crops (x{size / h:.2f}): "
                f"give {own} px crops cut at the scale of its training cells, or the scores are "
                "of cells at another scale",
                ScaleWarning,
            )

    def _calls(self, n: int, batch_size: int) -> list[slice]:
        """The network calls for ``n`` cells: ``batch_size`` each, within the backend's limit."""
        step = min(batch_size, self.backend.max_batch or batch_size)
        return [slice(i, i + step) for i in range(0, n, step)]

    @property
    def takes_tensors(self) -> bool:
        """Whether the backend runs on tensors already on its device (PyTorch, TensorRT)."""
        return hasattr(self.backend, "run_tensor")

    @_open_method
    def score_tensor(self, crops, batch_size: BatchSize = 64) -> np.ndarray:
        """(N,) float64 scores of a uint8 (N, H, W, 3) torch tensor. On the backend's device
        the network and the head's torch finish both run there, and only the scores come
        back; a backend that takes host arrays (ONNX Runtime) gets the crops copied to it."""
        _check_tensor(crops)
        self._check_side(int(crops.shape[1]), int(crops.shape[2]))
        # crops of another side are resized on the host, the one way (:func:`_at_side`)
        other_side = self.load_size not in (None, int(crops.shape[1]))
        if not self.takes_tensors or crops.device.type != self.backend.dev.type or other_side:
            return self.score(crops.cpu().numpy(), batch_size)
        if len(crops) == 0:
            return np.empty(0, dtype=np.float64)
        import torch

        parts = [
            self.head.torch_finish(self.backend.run_tensor(crops[part]))
            for part in self._calls(len(crops), batch_size)
        ]
        return torch.cat(parts).to(torch.float64).cpu().numpy()

    @_open_method
    def raw(self, images: ArrayLike, batch_size: BatchSize = 64) -> list[np.ndarray]:
        """The network's output per batch (for parity checks)."""
        images = _patches(images, "Scorer.raw")
        return [
            self.backend.run(images[i : i + batch_size]) for i in range(0, len(images), batch_size)
        ]

    @_open_method
    def warm(self) -> None:
        """Run one blank cell through the backend and the head, so that the first batch of a
        slide pays only for itself. The head's numba kernel loads in its first call (1-2 s in a
        fresh process: numba's start, then the cached machine code), and the backend's first
        call sets up its buffers; a verification on the golden cells does both, but a
        verification read from the cache does neither, and the slide's first batch took them
        and counted them as engine time (``engine_cells_per_s`` read low and the pipeline's
        efficiency high)."""
        from cyto.runtime import kernels

        size = self.spec.crop_size
        self.head.finish(self.backend.run(np.zeros((1, size, size, 3), np.uint8)))
        with contextlib.suppress(OSError):  # a cache that cannot be written keeps no kernels
            kernels.record()  # what numba kept of the kernels just run (cyto.runtime.kernels)

    def __repr__(self) -> str:
        """One line, as a notebook shows it: the bundle, what scores and how it was verified
        (the generated one printed the manifest and the golden cells, about 20,000 characters:
        hostile round 54, 10)."""
        v = self.verification
        state = "closed" if self._closed else (v.status if v is not None else "not verified")
        return (
            f"<Scorer {self.bundle.recorded_path} ({self.bundle.method}): {self.describe()}, "
            f"{state}>"
        )

    def describe(self) -> str:
        """``onnx on cpu``; a quantized graph is named, since a CPU can run either int8 form."""
        text = f"{self.backend.name} on {self.device}"
        if self.precision == "fp32":
            return text
        graph = self.graph_file
        return f"{text} ({self.precision}{f', {graph}' if graph else ''})"

    def close(self) -> None:
        """Let the backend's session and memory go; the scorer's methods then refuse
        (:data:`CLOSED`). A call running in another thread ends first (its backend was let go
        under it: each backend failed in its own raw way, hostile round 64, 6); a call made
        after is refused. Closing twice is closing once."""
        me = threading.get_ident()
        with self._idle:
            if self._closed:
                return
            self._closed = True
            # not this thread's own call (a close from within one would wait for itself)
            self._idle.wait_for(lambda: not set(self._calls_of) - {me})
        self.backend.close()

    def __enter__(self) -> Scorer:
        """``with cyto.load_model(path) as scorer:``: closed when the block ends, however."""
        if self._closed:
            raise ConfigError(CLOSED)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _has_onnxruntime() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None


def make_backend(
    name: str,
    bundle: Bundle,
    device: str,
    precision: str = "fp32",
    threads: int | None = None,
    graph=None,
    anew: str = "",
) -> Backend:
    """The backend ``name`` for ``bundle`` on a resolved ``device`` (no head, no fallback);
    ``graph``: for ONNX Runtime or OpenVINO on the CPU, another form of ``precision`` than this
    CPU's default (:func:`other_cpu_int8`); ``anew``: why OpenVINO's kept compiled model is not
    to be used (it is compiled anew from the graph)."""
    if name in ("trt", "onnx-trt") and device == "cpu":
        from cyto.runtime.devices import cuda_available

        if not cuda_available():  # advice that ends in the next refusal is none (hostile round 6)
            raise ConfigError(
                f"the {name} backend runs on an NVIDIA GPU, and there is none here: leave "
                f"{said('backend')} out (auto picks the fastest backend this machine has)"
            )
        raise ConfigError(f"the {name} backend runs on CUDA only: use {passing('device', 'cuda')}")
    refused = precision_refused(name, precision, device)
    if refused:  # before anything loads; a precision never runs as another (issue 68)
        raise ConfigError(refused)
    if name in ("onnx", "onnx-trt"):
        from cyto.runtime.backends.onnxruntime import OnnxRuntimeBackend

        provider = "tensorrt" if name == "onnx-trt" else "cuda"
        return OnnxRuntimeBackend(
            bundle, device, precision, threads, provider=provider, graph=graph
        )
    if name == "openvino":
        from cyto.runtime.backends.openvino import OpenVinoBackend

        return OpenVinoBackend(bundle, device, precision, threads, graph=graph, not_kept=anew)
    if name == "trt":
        from cyto.runtime.backends.tensorrt import TensorRTBackend

        return TensorRTBackend(bundle, device, precision)
    from cyto.runtime.backends.torch import TorchBackend

    return TorchBackend(bundle, device, precision, threads)


# ONNX Runtime's CUDA provider against PyTorch on one NVIDIA H200, the demo's 80 px Deep SVDD
# with its rotated views (cyto bench engine, patches/s at batch 64, cyto score's default, and 256;
# benchmarks/results/h200/ort-cuda): ORT fp16 11,008 and 14,160; PyTorch fp16 (autocast) 6,149
# and 16,404; ORT fp32 7,280 and 6,717; PyTorch fp32 6,621 and 9,087. That fp16 graph keeps
# GridSample in float32; an fp16 GridSample, which the CUDA provider runs on the CPU, gave ORT
# fp16 1,945 and 2,074. So on a GPU auto takes a TensorRT engine, then ORT fp16, PyTorch fp16,
# then fp32, and never an older export's fp16 graph with its GridSample in fp16.
def ort_cuda_left_out(bundle: Bundle, precision: str, graph: GraphSpec) -> str | None:
    """Why ``auto`` does not give ONNX Runtime's CUDA provider this graph, or None."""
    from cyto.runtime.verify import export_hint

    if precision == "int8":
        return (
            "ONNX Runtime's CUDA provider with the int8 graph (TensorRT's Q/DQ form) was not "
            "measured faster than fp16: auto leaves it out "
            f"({passing('backend', 'onnx')} and {passing('precision', 'int8')} run it)"
        )
    rotated = any(v.startswith("rot") for v in bundle.spec.tta_views)
    if precision == "fp16" and rotated and "GridSample" not in graph.float32_ops:
        return (
            f"{graph.file} runs its rotations (GridSample) in fp16, which ONNX Runtime's CUDA "
            "provider does on the CPU (H200: 2,074 against 14,160 cells/s): auto leaves it out; "
            f"re-export it with this cyto ({export_hint(bundle, 'fp16')})"
        )
    return None


def backend_candidates(bundle: Bundle, device: str, precision: str, notes: list[str]) -> list[str]:
    """The backends ``auto`` tries for ``precision`` on ``device``, fastest first: on a GPU a
    TensorRT engine built for it, then ONNX Runtime's CUDA provider (fp32 and fp16 graphs, see
    :func:`ort_cuda_left_out`), then PyTorch (fp32, and fp16 by autocast); on the CPU ONNX
    Runtime (not bf16) and OpenVINO when the bundle is exported, then PyTorch (fp32), in the
    order :func:`cpu_order` gives them in :func:`attempt_plan`. Why a backend is left out goes
    to ``notes``."""
    graph = graph_for(bundle.spec, precision, device)
    out = []
    if device != "cpu":
        from cyto.runtime.backends.tensorrt import find_engine_for

        entry, why = find_engine_for(bundle, device, precision)
        if entry is not None:
            out.append("trt")
        else:
            notes.append(f"no usable {precision} TensorRT engine: {why}")
        if graph is not None and _has_onnxruntime():
            from cyto.runtime.backends.onnxruntime import CUDA, available_providers

            left_out = ort_cuda_left_out(bundle, precision, graph)
            if CUDA not in available_providers():
                notes.append("ONNX Runtime here has no CUDA provider")
            elif left_out:
                notes.append(left_out)
            else:
                out.append("onnx")
        if precision == "fp16":
            out.append("torch")
    else:
        if graph is not None and precision != "bf16" and _has_onnxruntime():
            out.append("onnx")
        left_out = openvino_left_out(bundle, precision)
        if left_out:
            notes.append(left_out)
        else:
            out.append("openvino")
    if precision == "fp32":
        out.append("torch")
    return out


def openvino_left_out(bundle: Bundle, precision: str) -> str | None:
    """Why ``auto`` does not give OpenVINO ``precision`` on this CPU, or None."""
    from cyto.runtime.backends import openvino

    if not bundle.spec.graphs:  # said once, for every precision (hostile round 57, 5)
        from cyto.flags import export_words

        return (
            "the bundle is not exported (its PyTorch weights only): "
            f"{export_words(bundle.recorded_path)} adds ONNX and OpenVINO graphs, faster here"
        )
    if not openvino.has_openvino():
        return f"OpenVINO is not installed ({openvino.INSTALL})"
    if precision_refused("openvino", precision, "cpu"):  # not "no fp16 on this CPU ... bf16"
        return f"OpenVINO runs no {precision} graph (it runs fp32, int8 and, on some CPUs, bf16)"
    if precision not in openvino.precisions_here():
        caps = ", ".join(openvino.cpu_capabilities())
        return (
            f"OpenVINO offers no {precision} on this CPU (it reports {caps}: bf16 needs AMX or "
            "AVX512-BF16)"
        )
    if openvino.graph_for_openvino(bundle, precision) is None:
        return f"the bundle has no {precision} graph for OpenVINO"
    return None


def graph_of(bundle: Bundle, backend: str, precision: str, device: str) -> GraphSpec | None:
    """The graph ``backend`` runs for ``precision`` on ``device`` (None: the PyTorch network)."""
    if backend == "torch":
        return None
    if backend == "openvino":
        from cyto.runtime.backends.openvino import graph_for_openvino

        return graph_for_openvino(bundle, precision)
    return graph_for(bundle.spec, precision, device)


def precision_candidates(
    bundle: Bundle, backend: str, device: str, golden, notes: list[str], verify: bool = True
) -> list[str]:
    """The precisions ``auto`` tries, fastest first: on a CPU an int8 graph and OpenVINO's bf16
    (where this CPU has it), on a GPU fp16 (an exported graph, or PyTorch's autocast) then
    int8, each only when it can be verified here on the bundle's real golden cells (and, for
    an exported graph, passed its gate at export); then fp32. PyTorch has no int8, and fp16
    only on a GPU (:func:`ort_cuda_left_out` for ONNX Runtime's CUDA provider); bf16 is
    OpenVINO's alone (:func:`openvino_left_out`)."""
    if backend == "torch" and device == "cpu":
        return ["fp32"]
    out = []
    for p in ("int8", "bf16") if device == "cpu" else ("fp16", "int8"):
        if p == "bf16":
            left_out = openvino_left_out(bundle, p) if backend in ("auto", "openvino") else ""
            if left_out:
                notes.append(left_out)
            if left_out is not None:
                continue
        g = graph_of(bundle, backend if backend != "auto" else "onnx", p, device)
        if backend == "auto" and device == "cpu":
            # each CPU backend runs its own int8 form (ONNX Runtime's, OpenVINO's INT8_ORDER):
            # one below its gate leaves the precision to the other (attempt_plan's _gated
            # drops the backend whose form it is); OpenVINO's verified int8 was never tried
            forms = [f for f in (g, graph_of(bundle, "openvino", p, device)) if f is not None]
            for f in forms:
                if not f.parity_passed and any(o.parity_passed for o in forms):
                    notes.append(
                        f"{p} ({f.file}) is below the parity gate (accepted at export): not used"
                    )
            g = next((f for f in forms if f.parity_passed), forms[0] if forms else None)
        autocast = p == "fp16" and device != "cpu" and backend in ("auto", "torch")
        usable = g is not None
        if g is not None:
            left_out = ort_cuda_left_out(bundle, p, g) if backend == "onnx" else None
            if left_out and device != "cpu":
                notes.append(left_out)
                usable = False
            elif not g.parity_passed:
                notes.append(
                    f"{p} ({g.file}) is below the parity gate (accepted at export): not used"
                )
                usable = False
        if not (usable or autocast):
            continue
        if not verify or golden is None or golden.kind != "cells":
            what = f"{p} ({g.file})" if g is not None else f"{p} (PyTorch autocast)"
            if not verify:
                notes.append(
                    f"{what}: not used ({passing('verify', False)} turns its check off, and "
                    "auto takes a reduced precision only where it is checked)"
                )
            else:
                notes.append(
                    f"{what} cannot be verified here (no real golden cells: re-export with "
                    "this cyto): not used"
                )
            continue
        out.append(p)
    return [*out, "fp32"]


#: the order ``auto`` tries (backend, precision) on a CPU, fastest first, measured with
#: benchmarks/speed/openvino_cpu.py (benchmarks/results/epyc-2core/openvino/README.md). On the
#: 2-core AMD EPYC (AVX512-VNNI and AVX512-BF16, no AMX), cells/s at 16 a call, ResNet18 at
#: 224 px: OpenVINO int8 200, ONNX Runtime int8 174, OpenVINO bf16 113, OpenVINO fp32 59,
#: ONNX Runtime fp32 52; the demo's Deep SVDD: 260, 154, 197, 102, 92. On an Intel Xeon with
#: AMX (issue 58, ResNet18, batch 64): OpenVINO int8 800, bf16 504, ONNX Runtime int8 253,
#: fp32 104 and 102: with AMX, bf16 comes before ONNX Runtime's int8 (:func:`cpu_order`)
CPU_ORDER = (
    ("openvino", "int8"),
    ("onnx", "int8"),
    ("openvino", "bf16"),
    ("openvino", "fp32"),
    ("onnx", "fp32"),
    ("torch", "fp32"),
)


def cpu_order() -> tuple[tuple[str, str], ...]:
    """:data:`CPU_ORDER` for this CPU: OpenVINO's bf16 ahead of ONNX Runtime's int8 where the
    CPU has AMX (its bf16 matrix units: 2x ONNX Runtime's int8 there; without AMX, bf16 on
    AVX512-BF16 ran at 0.65x of it for ResNet18)."""
    from cyto.runtime.machine import cpu_info

    if "amx_bf16" not in cpu_info().flags:
        return CPU_ORDER
    rest = [c for c in CPU_ORDER if c != ("openvino", "bf16")]
    at = rest.index(("onnx", "int8"))
    return (*rest[:at], ("openvino", "bf16"), *rest[at:])


#: said where fp16 runs on a CPU: ONNX Runtime's CPU kernels compute an fp16 graph through
#: conversions to fp32 (a 2-core AVX2-only AMD EPYC: 27 against 95 patches/s for fp32 by cyto
#: bench engine at batch 64, a slide 13.7 s against 10.4 s; hostile round 60, 3)
CPU_FP16 = (
    "fp16 graphs are made for GPUs: on a CPU ONNX Runtime runs them slower than fp32 (1.6-3.5x "
    "on a 2-core AVX2 EPYC; cyto doctor times each here): leave --precision out (auto) here"
)


def attempt_plan(
    bundle: Bundle,
    backend: str,
    device: str,
    precision: str,
    golden,
    notes: list[str],
    verify: bool = True,
) -> list[tuple[str, str, GraphSpec | None]]:
    """(backend, precision, graph) in the order :func:`load_scorer` tries them, fastest first:
    each precision's backends (:func:`precision_candidates`, :func:`backend_candidates`); on a
    GPU every TensorRT engine ahead of the rest, on a CPU in :func:`cpu_order`. The graph is
    None: this machine's default for the precision (a CPU int8 form that fails here is
    followed by the other one)."""
    precisions = (
        precision_candidates(bundle, backend, device, golden, notes, verify)
        if precision == "auto"
        else [precision]
    )
    plan = [
        (name, p, None)
        for p in precisions
        for name in (
            backend_candidates(bundle, device, p, notes) if backend == "auto" else [backend]
        )
    ]
    if precision == "auto":  # an exported graph below its gate runs only when named
        plan = [
            (name, p, g)
            for name, p, g in plan
            if name == "torch" or p == "fp32" or _gated(bundle, name, p, device)
        ]
    if device != "cpu" and backend == "auto":
        plan.sort(key=lambda attempt: attempt[0] != "trt")
    if device == "cpu":
        rank = {choice: i for i, choice in enumerate(cpu_order())}
        plan.sort(key=lambda attempt: rank.get(attempt[:2], len(rank)))
    notes[:] = list(dict.fromkeys(notes))  # one note once, whichever precision gave it
    return plan


def _gated(bundle: Bundle, backend: str, precision: str, device: str) -> bool:
    g = graph_of(bundle, backend, precision, device)
    return g is not None and g.parity_passed


#: the smallest patch side a scorer takes (a cell image's: cyto.data.images.MIN_CELL_SIDE)
MIN_PATCH_SIDE = MIN_CELL_SIDE


def load_scorer(
    model: Path | str | Bundle,
    backend: str = "auto",
    device: str = "auto",
    precision: str = "fp32",
    threads: int | None = None,
    verify: bool = True,
    graph: GraphSpec | None = None,
    recheck: bool = False,
) -> Scorer:
    """Load the whole model for ``backend`` on ``device`` (cpu, cuda, cuda:N or auto), verified
    on this machine (:mod:`cyto.runtime.verify`) before it is returned.

    ``precision`` picks the exported graph (fp32 ``encoder.onnx``, or an fp16 / int8 variant;
    bf16 is OpenVINO's, on ``encoder.onnx``).
    A backend or precision the user named that fails the verification is refused with the
    numbers (:class:`~cyto.errors.VerificationError`), except a graph whose loss was accepted at
    export. ``auto`` (backend or precision) takes the fastest choice that passed here, and
    ``notes`` say what was passed over and why. ``verify=False`` skips the check (recorded in
    ``scorer.verification``). ``graph`` runs that graph of the bundle's ``precision`` graphs and
    no other (``cyto doctor`` checks each CPU int8 form so). ``recheck``: a failure on this
    machine's record is run again rather than read (``cyto doctor``).
    """
    from cyto.errors import VerificationError
    from cyto.flags import check_choice
    from cyto.runtime.verify import Verification, read_golden, verify_scorer

    check_choice("backend", backend, CHOICES)
    check_choice("precision", precision, (*PRECISIONS, "auto"))
    loaded_here = not isinstance(model, Bundle)
    bundle = load_bundle(Path(model), weights=False, for_scoring=True) if loaded_here else model
    device = resolve_device(device)
    _refuse_set_aside(bundle, precision, device)
    golden = read_golden(bundle) if verify else None
    head = head_for(bundle)
    notes: list[str] = []
    failures: list[str] = []
    # ``graph``: that graph of the precision and no other
    # (backend, precision, graph form, why a kept compiled engine is not to be used)
    attempts = [
        (name, p, graph, "")
        for name, p, _ in attempt_plan(bundle, backend, device, precision, golden, notes, verify)
    ]
    planned = len(attempts)  # one: the only choice, not "the fastest" (hostile round 60, 3)
    while attempts:
        name, p, form, anew = attempts.pop(0)
        try:
            chosen = make_backend(name, bundle, device, p, threads, graph=form, anew=anew)
        except CytoError as exc:
            if backend != "auto":
                raise
            notes.append(f"{name} ({p}) on {device}: {exc}")
            continue
        notes.extend(getattr(chosen, "notes", ()))  # e.g. OpenVINO's first compile, said once
        scorer = Scorer(bundle, head, chosen, notes, golden=golden)
        if not verify:
            scorer.verification = Verification(
                "skipped", f"verification turned off by the user ({passing('verify', False)})"
            )
            scorer.warm()
            _say_set_aside(scorer, loaded_here)
            return scorer
        check = verify_scorer(scorer, golden, recheck=recheck)
        scorer.verification = check
        # PyTorch runs its network (fp16: autocast), no exported graph
        ran = getattr(chosen, "graph", None)
        accepted = ran is not None and not ran.parity_passed and precision != "auto"
        if check.status != "failed" or accepted:
            if accepted and check.status == "failed":
                notes.append(
                    f"{ran.file} is below the gate here too ({check.words()}), as accepted "
                    "at export"
                )
            # an unverified graph's reason: its UNVERIFIED warning and the verification line
            if form is not None:
                notes.append(
                    f"{form.file}, the bundle's other CPU int8 form, "
                    + ("passed verification here" if check.passed else "runs here")
                    + " and scores instead"
                )
            passed = "passed verification here" if check.passed else "runs here"
            if backend == "auto":
                why = f"the fastest choice that {passed}"
                if planned == 1:
                    why = f"the only {scorer.precision} choice, which {passed}"
                notes.append(f"chose {scorer.describe()}: {why}")
                if scorer.precision == "fp16" and device == "cpu":
                    notes.append(CPU_FP16)
            elif precision == "auto":  # the backend was asked for: only its precision chosen
                notes.append(
                    f"{scorer.describe()} as asked ({passing('backend', backend)}), at its "
                    f"fastest precision that {passed}"
                )
            if check.cached or check.status == "unverified":  # nothing ran on it yet
                scorer.warm()
            _say_set_aside(scorer, loaded_here)
            return scorer
        scorer.close()
        kept = getattr(chosen, "engine_file", None)
        if getattr(chosen, "loaded_from_cache", False) and kept is not None and not check.cached:
            # a kept compiled model (its bytes as recorded) that scores wrong here was taken
            # for the graph's own failure, and stayed in the cache (hostile round 53): it is
            # named, and the graph is compiled anew, once, and verified in turn (a failure
            # read from a record is said with the command that runs the check again)
            why = f"{kept.path.name} failed verification here ({check.words()})"
            attempts.insert(0, (name, p, form, why))
            continue
        words = f"{name} {p} ({scorer_artifact(chosen)}) on {device}: {check.words()}"
        failures.append(words)
        # a failure read from the record may be stale (a driver or library since updated):
        # the command that runs the check again is named (hostile round 53, 4)
        again = f"; cyto doctor {as_arg(bundle.path)} runs the check again" if check.cached else ""
        notes.append(f"failed verification, not used: {words}{again}")
        # ONNX Runtime's two forms: the other one once; OpenVINO's: each later one of its order
        # (on an AVX2-only CPU TensorRT's form and the 8-bit form both fail there, the 7-bit
        # form passes); never another than the ``graph`` asked for
        follow = form is None or (graph is None and name == "openvino")
        other = other_cpu_int8(bundle.spec, chosen, device, p) if follow else None
        if other is not None:
            attempts.insert(0, (name, p, other, ""))
    if failures:
        read = any(", not run now)" in f for f in failures)
        raise VerificationError(
            f"{bundle.path}: nothing here reproduces the bundle's golden cells; "
            + "; ".join(failures)
            + f" (gate: {check.record.get('gate')}). Use another {said('precision')} or "
            f"{said('backend')}, or {passing('verify', False)} to score anyway (recorded)"
            + (f"; cyto doctor {as_arg(bundle.path)} runs the check again" if read else "")
        )
    if precision != "fp32" and graph_for(bundle.spec, precision, device) is None:
        raise ConfigError(
            f"{bundle.path} has no {precision} graph: make one with "
            f"{export_hint(bundle, precision)}"
        )
    if precision != "fp32":  # bf16 has no graph: OpenVINO's compile of encoder.onnx
        what = f"{precision} for" if precision == "bf16" else f"the {precision} graph of"
        raise ConfigError(
            f"no backend here runs {what} {bundle.path} on {device}"
            + (f" ({'; '.join(notes)})" if notes else "")
        )
    raise ConfigError(f"no backend here can score {bundle.path} on {device}: {'; '.join(notes)}")


def choice_lines(scorer: Scorer, warned_beside: bool = True) -> list[str]:
    """What a run says of a loaded scorer's choice, a line each: the notes (a choice passed
    over and why, a compile, what was chosen) and the verification. One list for ``cyto
    score`` and :func:`cyto.load_model` (a Python caller was told none of it: a choice that
    failed verification stayed in ``scorer.notes``; hostile round 53, 9). ``warned_beside``:
    an unverified graph's UNVERIFIED warning is said on the same console, which the line
    then points to; where it is a Python warning that a caller may have silenced, the line
    says the reason itself (it said "see UNVERIFIED" of a warning never shown; round 64, 10)."""
    lines = [f"backend choice: {note}" for note in scorer.notes]
    if scorer.verification is not None:
        check = scorer.verification
        lines.append(f"verification: {check.line() if warned_beside else check.words()}")
    return lines


def _refuse_set_aside(bundle: Bundle, precision: str, device: str) -> None:
    """A graph of the bundle left out as damaged (:attr:`cyto.bundle.Bundle.set_aside`) whose
    precision was asked for, with no intact form of it left: refused in its own words."""
    from cyto.errors import BundleError

    if precision in ("auto", "fp32", "bf16") or not bundle.set_aside_for(precision):
        return
    if graph_for(bundle.spec, precision, device) is None:
        raise BundleError(bundle.set_aside_for(precision)[0][1].refusal())


def _say_set_aside(scorer: Scorer, warn: bool) -> None:
    """The warning of each graph of the bundle left out as damaged and passed over, once the
    scorer is chosen: where it runs another graph of the same precision (another CPU int8
    form), that graph is named, as the one that scores in its place (named before the choice,
    it was the form ONNX Runtime would take while OpenVINO ran another: hostile round 55, 3).
    ``warn``: the bundle was loaded for this scorer (a caller that loaded it, ``cyto doctor``,
    says it once itself)."""
    ran = scorer.graph_file
    for key, gone in scorer.bundle.set_aside.items() if warn else ():
        same = of_precision(key, scorer.precision) and ran is not None
        warn_caller(gone.warning(key, ran if same else None))


def other_cpu_int8(spec, chosen: Backend, device: str, precision: str):
    """The bundle's other ONNX Runtime CPU int8 form than the one ``chosen`` ran, or None.

    The form follows the CPU's flags (8-bit weights with VNNI or AMX, 7-bit elsewhere), but the
    flags are what the kernel reports, not what ONNX Runtime's kernels do: under an emulator
    (``qemu-x86_64 -cpu Haswell`` reports the host's VNNI while its kernels are AVX2's, and the
    8-bit form failed verification at Spearman 0.945) or on another architecture, the other
    form may be the one that holds here, and it is still int8."""
    from cyto.bundle import CPU_INT8_FORMS

    graph = getattr(chosen, "graph", None)
    if device != "cpu" or precision != "int8" or graph is None:
        return None
    keys = [k for k, g in spec.graphs.items() if g.file == graph.file]
    if chosen.name == "openvino" and keys:  # its own order of forms, TensorRT's included
        from cyto.runtime.backends.openvino import int8_order

        order = int8_order()
        later = order[order.index(keys[0]) + 1 :] if keys[0] in order else ()
        return next((spec.graphs[k] for k in later if k in spec.graphs), None)
    if not keys or keys[0] not in CPU_INT8_FORMS:
        return None
    other = next(k for k in CPU_INT8_FORMS if k != keys[0])
    return spec.graphs.get(other)


def scorer_artifact(backend: Backend) -> str:
    entry = getattr(backend, "entry", None)
    if entry is not None:
        return f"engines/{entry.file}"
    graph = getattr(backend, "graph", None)
    return graph.file if graph is not None else "PyTorch network"
