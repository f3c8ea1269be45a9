"""OpenVINO backend: the bundle's ONNX graphs in Intel's CPU inference engine.

OpenVINO reads cyto's graphs as they are (uint8 NHWC in, preprocessing inside) and compiles them
for the CPU it runs on. Precisions:

- ``fp32``: ``encoder.onnx`` with ``INFERENCE_PRECISION_HINT`` f32, set explicitly: on a CPU with
  AMX or AVX512-BF16 OpenVINO's default for an fp32 graph is bf16.
- ``bf16``: the same ``encoder.onnx`` compiled in bf16 (no file of its own), offered only where
  OpenVINO itself reports ``BF16`` among the CPU's ``OPTIMIZATION_CAPABILITIES`` (AMX or
  AVX512-BF16; the kernel's flags can say otherwise under a hypervisor or the CPUID mask). Judged
  like fp16, by the ranking gate on the golden cells.
- ``int8``: one of the bundle's int8 Q/DQ graphs. OpenVINO's low-precision transformations fold
  each Q/DQ pair into its own int8 kernels, so no form ties it to ONNX Runtime's x86 kernels.
  :data:`INT8_ORDER` takes TensorRT's symmetric ``int8`` form first, as measured: on this
  project's 2-core AMD EPYC (AVX512-VNNI/BF16, no AMX), the demo's Deep SVDD at 16 cells a call,
  260 cells/s against 196 (``int8-cpu``) and 195 (``int8-cpu7``), all three within the gate
  (benchmarks/results/epyc-2core/openvino/README.md). Its activations are signed with every zero
  point 0, which spares OpenVINO's convolutions the zero-point terms of the x86 forms' uint8
  activations (the likely reason; not measured apart); the price is resolution: after a ReLU a
  signed int8 uses half its range, and its ranking on the demo's golden cells is closer to the
  gate (Spearman 0.9916 against 0.9957 and 0.9963), which verification here judges. The x86
  forms follow; a form that fails verification here gives way to the next
  (:func:`cyto.runtime.scorer.other_cpu_int8`). On a CPU whose int8 products do not sum exactly
  (AVX2 without VNNI) the 7-bit form comes first (:func:`int8_order`): the 8-bit forms' ranking
  moves in OpenVINO too (Spearman 0.988 emulated, issue 58; 0.93-0.98 on a real AVX2-only EPYC).

Compiled models are kept in cyto's user cache under a folder named by the graph's sha256,
OpenVINO's version, the precision and the CPU's capabilities, so a changed graph, an upgrade or
another CPU compiles anew; the first compile's time goes to the scorer's notes. cyto keeps them
itself (``export_model``, then ``import_model`` of bytes it has checked), not through OpenVINO's
``CACHE_DIR``, which loads whatever ``.blob`` it finds: a compiled model with bytes flipped
loaded there and scored near 1e57 (issue 68). Each is a derived engine
(:mod:`cyto.runtime.derived`): kept with the sha256 and size of its bytes, loaded only when they
match, compiled anew (saying why) when they do not, and its sha256 is in the key of the
verification record that vouches for it.

One stream of ``threads`` inference threads (the cores cyto gives the engine: the decode
and detection workers keep theirs), threads not pinned to cores, since the cores are shared.
OpenVINO has no spinning switch like ONNX Runtime's: its TBB workers spin briefly, then sleep,
measured at 1 ms of CPU time in a 50 ms pause after a call (ONNX Runtime without spinning:
0.1 ms), about 2% of a core between batches.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import threading
import time
from pathlib import Path

import numpy as np

from cyto.bundle import Bundle, GraphSpec
from cyto.errors import (
    BundleError,
    ConfigError,
    DeviceError,
    MissingDependencyError,
    first_line,
    os_error_path,
)
from cyto.flags import passing
from cyto.runtime.backends import precision_refused
from cyto.runtime.heads import head_class
from cyto.runtime.machine import openvino_cpu

PRECISIONS = ("fp32", "bf16", "int8")
#: the bundle's int8 forms in the order OpenVINO takes them (see the module docstring)
INT8_ORDER = ("int8", "int8-cpu", "int8-cpu7")
#: OpenVINO's inference precision per cyto precision (int8 graphs: float parts in f32)
INFERENCE_PRECISION = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}
#: cells per call: as for ONNX Runtime on a CPU (flat cells/s from 16 up, memory grows)
CPU_MAX_BATCH = 16
#: the latency hint, with the streams set explicitly (:data:`STREAMS`): the throughput hint
#: chooses its own number of streams, which one synchronous caller could not fill; cyto fills
#: its streams itself by splitting each call's cells among them
PERFORMANCE_HINT = "LATENCY"
INSTALL = "pip install 'cyto[cpu]' (openvino beside onnxruntime)"


def has_openvino() -> bool:
    return importlib.util.find_spec("openvino") is not None


def require_openvino():
    """Import openvino, or raise the one error naming the extra to install."""
    missing = MissingDependencyError(
        "openvino", f"OpenVINO scoring ({passing('backend', 'openvino')})", INSTALL
    )
    if not has_openvino():
        raise missing
    try:
        import openvino as ov
    except ImportError as exc:
        raise missing from exc
    return ov


@functools.lru_cache(maxsize=1)
def _core():
    return require_openvino().Core()


#: one thread of a process inside OpenVINO at a time (compiling, setting a request's inputs,
#: inferring, letting go): two threads that each loaded the same bundle and ran their first
#: inferences at once hung for good, each in OpenVINO's Python input dispatch, the GIL held
#: (hostile round 46, 1: two `cyto.score_slide` calls on threads, 2 of 8 tries; 1 of 10 here
#: with a cold cache). Each request already runs on every core its streams have, so two
#: threads gain nothing from entering together.
ONE_AT_A_TIME = threading.RLock()


def version() -> str:
    """OpenVINO's version (the build string, e.g. ``2026.4.1-22982-...``)."""
    require_openvino()
    return openvino_cpu()["version"]


def cpu_capabilities() -> tuple[str, ...]:
    """What OpenVINO says its CPU device can compute in (``OPTIMIZATION_CAPABILITIES``: FP32,
    BF16, INT8, ...): read from the runtime that will run the graph, not from /proc/cpuinfo."""
    require_openvino()
    return tuple(openvino_cpu()["cpu"])


def precisions_here() -> tuple[str, ...]:
    """The precisions OpenVINO runs on this CPU: fp32 and int8 everywhere, bf16 where OpenVINO
    reports BF16 (AMX or AVX512-BF16)."""
    caps = cpu_capabilities()
    return tuple(p for p in PRECISIONS if p != "bf16" or "BF16" in caps)


def int8_order() -> tuple[str, ...]:
    """The bundle's int8 forms in the order OpenVINO takes them on this CPU: :data:`INT8_ORDER`
    where int8 products sum exactly (VNNI, AMX: measured, :func:`cyto.runtime.machine.
    int8_dot_here`); elsewhere the 7-bit form first, the one made for such a CPU. The 8-bit
    forms saturate in AVX2's int16 pair sums in OpenVINO too (a real AVX2-only AMD EPYC: Spearman
    0.93-0.98 on the golden cells, the 7-bit form 0.998), and were tried first, each said as a
    failed verification before every run (hostile round 60, 5)."""
    from cyto.runtime.machine import int8_dot_here

    if int8_dot_here():
        return INT8_ORDER
    return ("int8-cpu7", *(k for k in INT8_ORDER if k != "int8-cpu7"))


def graph_for_openvino(bundle: Bundle, precision: str) -> GraphSpec | None:
    """The graph OpenVINO compiles for ``precision``: ``encoder.onnx`` for fp32 and bf16, the
    first of :func:`int8_order` the bundle has for int8."""
    graphs = bundle.spec.graphs
    if precision in ("fp32", "bf16"):
        return graphs.get("fp32")
    if precision == "int8":
        return next((graphs[k] for k in int8_order() if k in graphs), None)
    return None


def cache_folder(graph: GraphSpec, precision: str) -> Path:
    """Where the compiled model of ``graph`` at ``precision`` is kept: one folder per graph
    sha256, OpenVINO version, precision and CPU capabilities (the key the record beside the
    compiled model holds, :func:`kept_model`)."""
    from cyto.cachedir import cache_dir

    key = "\n".join((graph.sha256, version(), precision, ",".join(cpu_capabilities())))
    name = f"{graph.sha256[:16]}-{precision}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    return Path(cache_dir()) / "openvino" / name


def engine_threads(threads: int | None) -> int:
    """``threads``, or every core this process may run on (ONNX Runtime's default too)."""
    if threads:
        return int(threads)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


#: streams the engine's threads are split into; each call's cells are split among them, one
#: infer request each, run at once (1: one request uses every thread). Two on 2 cores: a tile
#: worker that takes a core from one of the engine's threads stalls that thread's stream only,
#: where one stream of two threads waits for its slower thread at every layer: end to end
#: 1.04-1.24x (ResNet18-224 int8) and 1.02-1.11x (the demo's Deep SVDD int8) in 7 paired
#: rounds, the same numbers to the bit (benchmarks/results/epyc-2core/pipeline2/)
STREAMS = 2


def engine_streams(threads: int) -> int:
    """How many streams ``threads`` engine threads run as (:data:`STREAMS`, at most one per
    thread)."""
    return max(1, min(STREAMS, threads))


def compile_config(precision: str, threads: int, streams: int = 1) -> dict[str, str]:
    """OpenVINO's properties for compiling (and importing: a kept model takes the threads and
    streams of the run that imports it)."""
    return {
        "INFERENCE_PRECISION_HINT": INFERENCE_PRECISION[precision],
        "PERFORMANCE_HINT": PERFORMANCE_HINT,
        "NUM_STREAMS": str(streams),
        "INFERENCE_NUM_THREADS": str(threads),
        # the cores are shared with decode and detection: pinned threads would hold them
        "ENABLE_CPU_PINNING": "NO",
    }


def kept_model(graph: GraphSpec, precision: str):
    """The compiled model of ``graph`` at ``precision`` as kept in cyto's cache
    (:class:`cyto.runtime.derived.KeptEngine`): keyed by everything that changes what OpenVINO
    compiles."""
    from cyto.runtime.derived import KeptEngine

    key = {
        "graph_sha256": graph.sha256,
        "openvino": version(),
        "precision": precision,
        "cpu": list(cpu_capabilities()),
    }
    return KeptEngine(cache_folder(graph, precision), "compiled", ".blob", key)


class OpenVinoBackend:
    """One of the bundle's ONNX graphs compiled by OpenVINO for this CPU."""

    name = "openvino"
    max_batch = CPU_MAX_BATCH

    def __init__(
        self,
        bundle: Bundle,
        device: str = "cpu",
        precision: str = "fp32",
        threads: int | None = None,
        graph: GraphSpec | None = None,
        cache: bool = True,
        not_kept: str = "",
    ) -> None:
        """``cache``: load the kept compiled model and keep a new one; ``not_kept``: why the
        kept one is not to be loaded (compiled anew and kept in its place)."""
        if device != "cpu":
            raise ConfigError(
                f"the openvino backend runs on the CPU only: use {passing('device', 'cpu')}"
            )
        refused = precision_refused("openvino", precision, device)
        if refused:
            raise ConfigError(refused)
        require_openvino()
        if precision == "bf16" and "bf16" not in precisions_here():
            raise DeviceError(
                f"{passing('precision', 'bf16')} needs a CPU with AMX or AVX512-BF16: OpenVINO "
                f"reports {', '.join(cpu_capabilities())} here; use "
                f"{passing('precision', 'fp32')} or {passing('precision', 'int8')}"
            )
        graph = graph or graph_for_openvino(bundle, precision)
        if graph is None:
            from cyto.runtime.verify import export_hint

            have = ", ".join(sorted(bundle.spec.graphs)) or "none"
            hint = export_hint(bundle, "fp32" if precision == "bf16" else precision)
            raise BundleError(
                f"{bundle.path} has no {precision} graph for OpenVINO (exported graphs: {have}): "
                f"make one with {hint}"
            )
        self.graph = graph
        self.device = device
        self.precision = precision
        self.threads = engine_threads(threads)
        self.notes: list[str] = []
        self.streams = engine_streams(self.threads)
        # in the verification's key: cells split among streams are verified as they run
        self.providers = [f"openvino {version()}"] + (
            [f"{self.streams} streams"] if self.streams > 1 else []
        )
        config = compile_config(precision, self.threads, self.streams)
        #: the kept compiled model this backend runs (None: compiled from the graph now)
        self.engine_file = None
        self.loaded_from_cache = False
        with ONE_AT_A_TIME:
            self._load(bundle, graph, precision, config, cache, not_kept)

    def _load(self, bundle, graph, precision, config, cache: bool, not_kept: str) -> None:
        """The compiled model (kept, or compiled now) and a request per stream."""
        kept = kept_model(graph, precision) if cache else None
        why = not_kept
        if kept is not None and not not_kept:
            blob, engine, why = kept.load()
            if blob is not None:
                try:
                    self.compiled = _core().import_model(blob, "CPU", config)
                    self.engine_file, self.loaded_from_cache = engine, True
                except Exception as exc:  # noqa: BLE001 - OpenVINO raises its own untyped errors
                    why = f"{engine.path.name} does not load in OpenVINO ({first_line(exc)})"
            want = INFERENCE_PRECISION[precision]
            if self.loaded_from_cache and self._computes_in() != want:
                why = f"{engine.path.name} computes in {self._computes_in()}, not {want}"
                self.engine_file, self.loaded_from_cache = None, False
        if not self.loaded_from_cache:
            self._compile(bundle, graph, precision, config, kept, why)
        got, want = self._computes_in(), INFERENCE_PRECISION[precision]
        if got != want:  # never a silent change of precision
            raise DeviceError(
                f"OpenVINO compiled {graph.file} in {got}, not {want} "
                f"({passing('precision', precision)})"
            )
        self.requests = [self.compiled.create_infer_request() for _ in range(self.streams)]
        # the output axis that indexes cells, along which the streams' parts are joined
        self.batch_axis = head_class(bundle.spec.head).batch_axis
        self.input = self.compiled.inputs[0]
        self.output = self.compiled.outputs[0]

    def _computes_in(self) -> str:
        return self.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()

    def _compile(self, bundle, graph, precision, config, kept, why: str) -> None:
        """Compile ``graph`` now and keep the compiled model (when ``kept``); the note says
        why a kept one was not used."""
        data = bundle.graph_bytes(graph)  # what the manifest (and the verification) named
        core = _core()
        t0 = time.perf_counter()
        try:
            model = core.read_model(data)
            self.compiled = core.compile_model(model, "CPU", config)
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises its own untyped errors
            raise DeviceError(f"OpenVINO cannot compile {graph.file} on the CPU: {exc}") from exc
        seconds = time.perf_counter() - t0
        where = ""
        if kept is not None:
            blob = self.compiled.export_model().getvalue()
            try:
                engine = kept.keep(blob)
            except OSError as exc:  # a cache that cannot be written: compiled again next time
                # the place named (it said "not kept: Not a directory", of no path: round 53, 6)
                place = os_error_path(exc) or kept.folder
                where = f" (not kept in {place}: {exc.strerror or exc})"
            else:
                # what runs is the kept bytes, as every later run will: the verification made
                # now vouches for exactly them
                self.compiled = core.import_model(blob, "CPU", config)
                self.engine_file = engine
                where = f", kept in {kept.folder} for the next run"
        if why:
            why = f"; the kept compiled model was not used: {why}"
        self.notes.append(
            f"OpenVINO compiled {graph.file} ({precision}) in {seconds:.1f} s{where}{why}"
        )

    def run(self, batch: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(batch, dtype=np.uint8)
        with ONE_AT_A_TIME:
            return self._run(x)

    def _run(self, x: np.ndarray) -> np.ndarray:
        parts = np.array_split(x, min(self.streams, len(x))) if len(x) else [x]
        if len(parts) == 1:
            self.requests[0].infer({self.input: x})
        else:  # one request a stream, at once; each waits for its own
            for request, part in zip(self.requests, parts, strict=False):
                request.start_async({self.input: part})
            for request in self.requests[: len(parts)]:
                request.wait()
        # a request's output buffer is reused by its next call: hand out a copy
        out = [self.requests[i].get_tensor(self.output).data for i in range(len(parts))]
        return (
            np.concatenate(out, axis=self.batch_axis).astype(np.float32, copy=False)
            if len(out) > 1
            else np.array(out[0], np.float32)
        )

    def close(self) -> None:
        with ONE_AT_A_TIME:
            self.requests = []
            self.compiled = None
