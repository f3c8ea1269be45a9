"""Reduced-precision graphs of a bundle, with their ranking parity measured, stored and enforced.

- ``fp16``: every float tensor of ``encoder.onnx`` in half precision; the uint8 input is cast
  straight to fp16 and the output is cast back to float32, so callers see the same interface.
- ``int8``: explicit quantization (QuantizeLinear/DequantizeLinear pairs), activation ranges
  calibrated on cells the user names (never on made-up ones), per-channel weights; the
  calibration method is a choice (entropy, percentile or minmax), recorded. Preprocessing stays in
  float inside the graph. It comes in two forms, because no one graph serves both runtimes:
  ``int8`` for TensorRT 10/11 (symmetric int8 activations, every zero point 0, float biases:
  TensorRT's rules) and ``int8-cpu`` for ONNX Runtime on x86 CPUs (uint8 activations and int8
  weights, whose VNNI/AMX kernels ONNX Runtime has; measured on this project's 2-core machine,
  ResNet18 at 224 px, 8 per call: 128 patches/s against 65 in fp32, where the symmetric int8
  form ran its convolutions at 9 patches/s when fused and not faster than fp32 when not).

Parity: on held-out cells (``parity_cells``, or the part of the calibration cells calibration did
not use; for fp16, which nothing calibrates, else the bundle's golden cells) the quantized graph and
``encoder.onnx`` are compared through the full score, head included: Spearman correlation, overlap
of the top 1% and 10%, the largest score difference, and AUROC and Recall@K with labels. A graph
below the gate (Spearman 0.99, top-10% overlap 0.90) is refused, unless the user accepts the loss,
which is recorded with it.

An int8 graph is judged by the numbers it scores with where it is meant to run, whatever CPU
exports it. The 7-bit x86 form: ONNX Runtime's kernels here, which are every x86 CPU's (no pair
of its products reaches 2^15). The 8-bit x86 form: ONNX Runtime's kernels here where they sum in
int32 (VNNI, AMX); elsewhere they pair products in int16, which saturates, so it is judged with
its Q/DQ pairs unfused, in float (the sums a VNNI CPU makes exactly; its own rounding differs by
about 1% of the score range) and its parity on this CPU's kernels is recorded beside it
(``parity_here``) and said. TensorRT's form: unfused, in float (a GPU's int8 kernels sum in
int32): measured through this CPU's fused kernels instead, an AVX2 CPU refused it at Spearman
0.53 where a VNNI CPU gives 0.9997. Where the bundle runs, verification on its golden cells
decides (:mod:`cyto.runtime.verify`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from cyto.bundle import Bundle, add_files, load_bundle
from cyto.errors import ConfigError, DatasetError, ParityError
from cyto.flags import passing, said
from cyto.runtime.machine import cpu_info, int8_kernels_exact
from cyto.runtime.verify import GATE, passes, ranking_parity, top_cells
from cyto.staging import staged_dir

CALIB_METHODS = ("entropy", "percentile", "minmax")
QUANTIZED = ("fp16", "int8", "int8-cpu", "int8-cpu7")
#: the int8 graphs ``--precision int8`` makes: TensorRT's and ONNX Runtime's two x86 forms
INT8_FORMS = ("int8", "int8-cpu", "int8-cpu7")
QUANTIZED_OPS = ("Conv", "Gemm", "MatMul")


def variant_file(key: str) -> str:
    return f"encoder-{key}.onnx"


@dataclass
class Cells:
    """Cell patches resized to the model's crop size, with labels when classes were named."""

    images: np.ndarray
    labels: np.ndarray | None
    source: str
    fingerprint: str
    #: the classes drawn from (``--calib-class``; empty: all): what an export that makes the
    #: graph again is told to give (a repair advised without them calibrated on every class)
    classes: tuple[str, ...] = ()

    def split(self, held_out: float, seed: int = 0) -> tuple[Cells, Cells]:
        """(calibration part, held-out part), both non-empty."""
        n = len(self.images)
        order = np.random.default_rng(seed).permutation(n)
        k = min(n - 1, max(1, int(round(n * held_out))))
        a, b = np.sort(order[k:]), np.sort(order[:k])
        lab = self.labels
        return (
            replace(self, images=self.images[a], labels=None if lab is None else lab[a]),
            replace(self, images=self.images[b], labels=None if lab is None else lab[b]),
        )


#: how a parity record's ``cells_source`` begins when the bundle's golden cells measured it
GOLDEN_SOURCE = "the bundle's golden cells"


def parity_cells_words(parity: dict) -> str:
    """``N golden cells`` or ``N cells held out from calibration``: the cells a graph's parity
    with fp32 was measured on, as its record (``cells_source``) says; every line that reports a
    parity says it so (an fp16 graph's are the golden cells). Held out from the calibration, not
    from training: cells the model trained on measure a parity as well as any, and "held-out"
    alone read as the latter (hostile round 46, 4)."""
    golden = str(parity.get("cells_source") or "").startswith(GOLDEN_SOURCE)
    if golden:
        return f"{parity['cells']} golden cells"
    if parity.get("uncalibrated"):  # an fp16 graph's: no calibration to hold cells out of
        return f"{parity['cells']} cells of {parity.get('cells_source')} (fp16 is not calibrated)"
    return f"{parity['cells']} cells held out from calibration"


def _golden_cells(bundle) -> Cells | None:
    """The bundle's golden cells as parity cells, when they are real cells (an fp16 graph is
    not calibrated, so cells the model trained on measure its parity as well as any)."""
    from cyto.runtime.verify import read_golden

    golden = read_golden(bundle)
    if golden is None or golden.kind != "cells":
        return None
    return Cells(
        golden.images,
        golden.labels,
        f"{GOLDEN_SOURCE} ({golden.source})",
        golden.sha256,
    )


def load_cells(
    path: Path,
    size: int,
    classes: str | None = None,
    normal: str | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> Cells:
    """Cells of a folder of class sub-folders or a manifest, resized to ``size``: only the
    ``classes`` named (comma-separated), or all. With ``normal`` every other class is labelled
    abnormal. ``limit`` draws that many at random (seeded)."""
    from cyto.data.dataset import load_records, parse_classes
    from cyto.data.images import read_image, resize_rgb

    path = Path(path)
    records = load_records(path)
    keep = parse_classes(classes)
    if keep:
        missing = set(keep) - {r.cls for r in records}
        if missing:
            raise DatasetError(f"{path} has no class {', '.join(sorted(missing))}")
        records = [r for r in records if r.cls in keep]
    if limit is not None and len(records) > limit:
        pick = np.sort(np.random.default_rng(seed).permutation(len(records))[:limit])
        records = [records[i] for i in pick]
    if len(records) < 8:
        raise DatasetError(f"{path}: {len(records)} cells; quantization needs at least 8")
    images = np.stack([resize_rgb(read_image(r.path), size) for r in records])
    labels = None
    normals = parse_classes(normal)
    if normals:
        labels = np.array([0 if r.cls in normals else 1 for r in records], dtype=np.int8)
    fingerprint = hashlib.sha256("\n".join(str(r.path) for r in records).encode()).hexdigest()
    source = f"{path}" + (f" ({', '.join(keep)})" if keep else "")
    return Cells(images, labels, source, fingerprint, tuple(keep or ()))


# ops kept in float32 in the fp16 graph: ONNX Runtime's CUDA provider has no fp16 GridSample (the
# test-time views' rotations), so an fp16 one ran on the CPU, with copies both ways: 13 % of the
# fp16 graph's time on an H200. TensorRT runs the float32 op at no cost to the convolutions
FP16_KEEP_FLOAT = ("GridSample",)


def fp16_graph(src: Path, dst: Path) -> dict:
    """``src`` with every float tensor in fp16, the uint8 input and float32 output kept, and the
    ops of :data:`FP16_KEEP_FLOAT` in float32 (:func:`keep_float32`)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = convert_float_to_float16(onnx.load(str(src)), keep_io_types=True)
    kept = keep_float32(model, FP16_KEEP_FLOAT)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return {
        "method": "onnxruntime.transformers.float16, float32 outputs kept",
        "float32_ops": list(FP16_KEEP_FLOAT),
        "float32_nodes": kept,
    }


def keep_float32(model, op_types: tuple[str, ...]) -> int:
    """Run the ``op_types`` nodes of an fp16 ``model`` in float32: a Cast to float32 before each
    fp16 input and a Cast back after each fp16 output, named after the node, in place; returns
    how many nodes. (The converter's own ``op_block_list`` gave a graph out of order with
    ONNX Runtime 1.32, and two nodes writing one tensor with 1.31: refused by the checker.)"""
    import onnx
    from onnx import TensorProto, helper

    g = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.input, *g.output)}
    types.update({t.name: t.data_type for t in g.initializer})
    nodes, kept = [], 0
    for i, original in enumerate(model.graph.node):
        node = onnx.NodeProto()  # a copy: the graph's own nodes are replaced below
        node.CopyFrom(original)
        if node.op_type not in op_types:
            nodes.append(node)
            continue
        kept += 1
        tag = f"{node.name or node.op_type}_{i}_fp32"
        after = []
        for k, name in enumerate(node.input):
            if name and types.get(name) == TensorProto.FLOAT16:
                cast = f"{tag}_in{k}"
                nodes.append(helper.make_node("Cast", [name], [cast], cast, to=TensorProto.FLOAT))
                node.input[k] = cast
        for k, name in enumerate(node.output):
            if types.get(name) == TensorProto.FLOAT16:
                raw = f"{tag}_out{k}"
                node.output[k] = raw
                after.append(
                    helper.make_node("Cast", [raw], [name], f"{raw}_cast", to=TensorProto.FLOAT16)
                )
        nodes += [node, *after]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return kept


def int8_graph(
    src: Path,
    dst: Path,
    calib: np.ndarray,
    method: str = "percentile",
    input_name: str = "patches",
    exclude: tuple[str, ...] = (),
    batch: int = 4,
    form: str = "int8",
    calib_cache: Path | None = None,
) -> dict:
    """A Q/DQ graph of ``src`` calibrated on ``calib`` (uint8 NHWC cells), in the TensorRT form
    (``int8``) or one of ONNX Runtime's x86 forms (``int8-cpu``: 8-bit weights, for CPUs with
    VNNI or AMX; ``int8-cpu7``: 7-bit weights, the same numbers on every x86 CPU); returns its
    record. ``exclude`` keeps nodes in float: node names, or op types (``Gemm``: every Gemm
    node). With ``calib_cache`` (a folder), activation ranges measured once for a graph and its
    cells are reused by the next form (:func:`_calibration_cache`)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    from cyto.progress import progress

    if method not in CALIB_METHODS:
        raise ConfigError(f"calibration method must be one of {', '.join(CALIB_METHODS)}")
    if form not in INT8_FORMS:
        raise ConfigError(f"int8 forms are {', '.join(INT8_FORMS)}, got {form!r}")
    trt = form == "int8"
    # without VNNI, x86 kernels add two uint8 x int8 products in int16 (vpmaddubsw), which
    # saturates: 255 * 127 * 2 > 2^15 - 1. Weights in [-64, 63] keep every pair below it (and
    # the first convolution's 7-bit input with 8-bit weights: _first_conv_overrides)
    seven = form == "int8-cpu7"
    # equal batches: ONNX Runtime's histogram calibrators stack them
    batch = min(batch, len(calib))
    batches = [calib[i : i + batch] for i in range(0, len(calib) - batch + 1, batch)]
    used = len(batches) * batch  # the last partial batch is left out: recorded as such

    class Reader(CalibrationDataReader):
        """Batches, in ranges: ONNX Runtime's histogram calibrators keep every activation of the
        batches they are given, so they get one batch at a time (``CalibStridedMinMax``)."""

        def __init__(self) -> None:
            self.set_range(0, len(batches))

        def __len__(self) -> int:
            return len(batches)

        def set_range(self, start_index: int, end_index: int) -> None:
            self._it = iter(batches[start_index:end_index])

        def get_next(self):
            x = next(self._it, None)
            if x is None:
                return None
            bar.advance(len(x))  # a graph's ranges are measured once (later forms: the cache)
            return {input_name: np.ascontiguousarray(x)}

    algo = {
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
        "minmax": CalibrationMethod.MinMax,
    }[method]
    t0 = time.perf_counter()
    with (
        progress("int8 calibration", total=used, unit="cells") as bar,
        tempfile.TemporaryDirectory() as tmp,
        contextlib.redirect_stdout(io.StringIO()),
    ):
        pre = Path(tmp) / "pre.onnx"  # (the calibrators print their settings: kept quiet)
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        kept = _nodes_named(pre, exclude)
        overrides = _first_conv_overrides(pre, batches, input_name) if seven else {}
        cache = _calibration_cache(calib_cache, pre, batches, method, trt)
        quantize_static(
            str(pre),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8 if trt else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            reduce_range=seven,
            op_types_to_quantize=list(QUANTIZED_OPS) if trt else None,
            nodes_to_exclude=kept,
            calibrate_method=algo,
            # TensorRT's explicit quantization is symmetric (every zero point 0), and its
            # DequantizeLinear takes int8, not the int32 biases ONNX Runtime would make
            extra_options={
                "ActivationSymmetric": trt,
                "WeightSymmetric": True,
                "QuantizeBias": not trt,
                # one batch per collection, for every method: without it the paper's Deep SVDD
                # (5 seeds x 4 views) ran out of 24 GB while calibrating on 192 cells
                "CalibStridedMinMax": 1,
                **({"TensorQuantOverrides": overrides} if overrides else {}),
            },
            **({"calibration_cache_path": str(cache)} if cache is not None else {}),
        )
    return {
        "form": "TensorRT" if trt else "ONNX Runtime on x86 CPUs",
        "format": (
            "QDQ, symmetric int8 activations, per-channel int8 weights, float biases"
            if trt
            else f"QDQ, uint8 activations, per-channel {7 if seven else 8}-bit weights, int32 "
            "biases"
        ),
        "cpus": (
            "NVIDIA GPUs"
            if trt
            else "every x86 CPU"
            if seven
            else "x86 CPUs with VNNI or AMX (saturates elsewhere)"
        ),
        "method": method,
        "quantized_ops": list(QUANTIZED_OPS) if trt else "every op ONNX Runtime quantizes",
        "kept_float": list(exclude),
        **(
            {"first_conv": "8-bit weights on a 7-bit input (every pair sum below 2^15)"}
            if seven
            else {}
        ),
        "excluded_nodes": kept,
        "cells": used,  # those the ranges were measured on
        **({"cells_left_out": len(calib) - used} if used < len(calib) else {}),
        "calibration_seconds": round(time.perf_counter() - t0, 1),
    }


def _calibration_cache(
    folder: Path | None, pre: Path, batches: list[np.ndarray], method: str, trt: bool
) -> Path | None:
    """Where ``quantize_static`` keeps (or finds) the activation ranges of this graph, these
    calibration batches and this method, when this ONNX Runtime can (1.32 and newer); None
    otherwise. Calibration is most of an int8 export (three forms: 6.8 of 11.7 s for a small
    Deep SVDD). The ranges of a tensor do not depend on which other tensors are measured, so
    the x86 forms' ranges (every op) serve TensorRT's form (Conv, Gemm and MatMul only) too;
    TensorRT's own ranges cover too few tensors for the x86 forms and are kept apart."""
    import inspect

    from onnxruntime.quantization import quantize_static

    if (
        folder is None
        or "calibration_cache_path" not in inspect.signature(quantize_static).parameters
    ):
        return None
    digest = hashlib.sha256(pre.read_bytes())
    digest.update(f"{method}:{len(batches)}".encode())
    for b in batches:
        digest.update(f"{b.shape}{b.dtype}".encode() + np.ascontiguousarray(b).tobytes())
    every = Path(folder) / f"{digest.hexdigest()[:32]}-every-op.json"
    if not trt or every.is_file():
        return every
    return every.with_name(every.name.replace("-every-op", "-tensorrt-ops"))


def _first_conv_overrides(model_path: Path, batches: list[np.ndarray], input_name: str) -> dict:
    """The 7-bit form's first convolution: 8-bit weights on a 7-bit input (its range measured
    on the calibration cells), every pair sum still below 2^15 (127 x 127 x 2). On the
    normalized image with 3 input channels, 7-bit weights lose the most there (FS-SIL ResNet18,
    128 held-out bone-marrow cells: top-10% overlap 0.85 with 7-bit weights, 0.92 this way, as
    with that convolution in float; 2.2x fp32 speed on a VNNI CPU against 1.5x in float).
    Returns ONNX Runtime's TensorQuantOverrides (empty: no convolution)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(model_path), load_external_data=False)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    inits = {i.name for i in model.graph.initializer}
    if not convs or convs[0].input[1] not in inits:
        return {}
    x, w = convs[0].input[0], convs[0].input[1]
    if x not in {o.name for o in model.graph.output}:
        model.graph.output.append(onnx.helper.make_empty_tensor_value_info(x))
    opts = ort.SessionOptions()
    opts.enable_cpu_mem_arena = False
    session = ort.InferenceSession(
        model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
    )
    lo, hi = 0.0, 0.0  # the range holds 0, as ONNX Runtime's own activation ranges do
    for b in batches:
        (v,) = session.run([x], {input_name: np.ascontiguousarray(b)})
        lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    scale = (hi - lo) / 127.0 if hi > lo else 1.0
    zero = int(np.clip(round(-lo / scale), 0, 127))
    return {
        x: [{"scale": np.array(scale, np.float32), "zero_point": np.array(zero, np.uint8)}],
        w: [{"reduce_range": False}],
    }


def _nodes_named(model_path: Path, exclude: tuple[str, ...]) -> list[str]:
    """The graph's node names that ``exclude`` names, by name or by op type; a name that matches
    nothing is an error (a typo would silently quantize everything)."""
    import onnx

    if not exclude:
        return []
    nodes = onnx.load(str(model_path), load_external_data=False).graph.node
    out = [n.name for n in nodes if n.name in exclude or n.op_type in exclude]
    found = {n.name for n in nodes} | {n.op_type for n in nodes}
    missing = [e for e in exclude if e not in found]
    if missing:
        raise ConfigError(f"no node or op type {', '.join(missing)} in the graph to keep in float")
    return out


def _scores(
    bundle: Bundle, graph: Path, images: np.ndarray, batch: int = 16, int8_kernels: bool = True
) -> np.ndarray:
    """Scores of ``images`` through ``graph`` in ONNX Runtime (CPU) and the bundle's head.

    ``int8_kernels=False`` runs a Q/DQ graph unfused: every DequantizeLinear, float op and
    QuantizeLinear in float, which is what a GPU's int8 kernels compute (int32 sums, then the
    scales), on any CPU. Fused, ONNX Runtime runs this CPU's int8 kernels, which pair products in
    int16 and saturate on x86 without VNNI: TensorRT's form measured so on an AVX2 CPU gave
    Spearman 0.53 where the same graph unfused, or fused on a VNNI CPU, gives 0.9997."""
    from cyto.runtime.backends.onnxruntime import require_onnxruntime
    from cyto.runtime.heads import head_for

    ort = require_onnxruntime()
    opts = ort.SessionOptions()
    opts.enable_cpu_mem_arena = False
    if not int8_kernels:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    head = head_for(bundle)
    spec = bundle.spec.graph("fp32")
    return np.concatenate(
        [
            head.finish(session.run([spec.output], {spec.input: images[i : i + batch]})[0])
            for i in range(0, len(images), batch)
        ]
    )


def _reference_scores(
    bundle: Bundle, src: Path, images: np.ndarray, references: dict[str, np.ndarray] | None
) -> np.ndarray:
    """``encoder.onnx``'s scores of ``images``, taken from ``references`` when they were run
    there already (keyed by the cells' bytes) and kept there when not."""
    if references is None:
        return _scores(bundle, src, images)
    key = hashlib.sha256(np.ascontiguousarray(images).tobytes()).hexdigest()
    if key not in references:
        references[key] = _scores(bundle, src, images)
    return references[key]


def export_variant(
    path: Path,
    precision: str,
    calib: Cells | None,
    parity_cells: Cells | None = None,
    method: str = "percentile",
    accept_loss: bool = False,
    exclude: tuple[str, ...] = (),
    echo=print,
    calib_cache: Path | None = None,
    references: dict[str, np.ndarray] | None = None,
) -> dict:
    """Build the ``precision`` graph of the bundle at ``path``, measure its parity against
    ``encoder.onnx``, and add it to the bundle when it passes the gate (or the loss is
    accepted). Returns its manifest entry; a refused graph raises :class:`ConfigError` with the
    numbers and leaves the bundle as it was. ``references`` (a dict one export command keeps
    while it adds forms to one bundle) holds ``encoder.onnx``'s scores of the parity cells, so
    the three int8 forms measure against one run of it, not three."""
    import onnx

    from cyto.export.conformance import check_model, conformance_record

    if precision not in QUANTIZED:
        raise ConfigError(f"quantized graphs are {', '.join(QUANTIZED)}, got {precision!r}")
    key, precision = precision, precision.split("-")[0]
    bundle = load_bundle(Path(path), weights=False)
    fp32 = bundle.spec.graph("fp32")
    if fp32 is None:
        raise ConfigError(f"{bundle.path} has no encoder.onnx: export it first")
    if precision == "int8" and calib is None:
        raise ConfigError(
            f"int8 needs calibration cells: pass {said('calib')} with real cells of the kind the "
            f"model scores (its normal class, e.g. {passing('calib', 'cells/')} "
            f"{passing('calib_class', 'LYT')})"
        )
    held = parity_cells
    if calib is not None and held is None:
        calib, held = calib.split(0.25)
    if held is None and precision == "fp16":  # nothing calibrated: the golden cells serve
        held = _golden_cells(bundle)
    if held is None:
        raise ConfigError(
            f"{precision}: parity needs held-out cells: pass {said('parity_cells')} with cells "
            f"(or {said('calib')})"
            + (" (the bundle's golden cells are made-up patches)" if precision == "fp16" else "")
        )
    src = bundle.path / fp32.file
    with staged_dir(bundle.path, "exporting") as tmp:
        target = tmp / variant_file(key)
        if precision == "fp16":
            record = fp16_graph(src, target)
        else:
            record = int8_graph(
                src, target, calib.images, method, fp32.input, exclude, form=key,
                calib_cache=calib_cache,
            )  # fmt: skip
            # record["cells"]: those calibrated on (int8_graph), the fingerprint: those given
            record.update({"source": calib.source, "fingerprint": calib.fingerprint})
            if calib.classes:
                record["classes"] = list(calib.classes)
        model = onnx.load(str(target))
        onnx.checker.check_model(model)
        problems = check_model(model, profile_inputs={fp32.input})
        ref = _reference_scores(bundle, src, held.images, references)
        # the numbers it scores with where it is meant to run (the module docstring)
        fused = key != "int8" and (key != "int8-cpu" or int8_kernels_exact() is not False)
        got = _scores(bundle, target, held.images, int8_kernels=fused)
        parity = ranking_parity(ref, got, held.labels)
        parity["cells_source"] = held.source
        if precision == "fp16":
            # "held out from calibration" of a graph never calibrated, while int8's calibration
            # had used most of them (hostile round 60, 7)
            parity["uncalibrated"] = True
        ok = passes(parity)
        # the top's size beside its overlap: "top-1% 1.00" of 128 cells is one cell (round 60, 9)
        n = parity["cells"]
        line = (
            f"{key} vs fp32 on {parity_cells_words(parity)}: Spearman "
            f"{parity['spearman']:.4f}, top-10% overlap {parity['top10_overlap']:.2f} (of "
            f"{top_cells(n, 0.1)}), top-1% {parity['top1_overlap']:.2f} (of "
            f"{top_cells(n, 0.01)}), max score difference {parity['max_abs_diff']:.3g}"
        )
        if "auroc_delta" in parity:
            line += (
                f", AUROC {parity['auroc_fp32']:.3f} -> {parity['auroc_quantized']:.3f}, "
                f"Recall@{parity['k']} {parity['recall_at_k_fp32']:.3f} -> "
                f"{parity['recall_at_k_quantized']:.3f}"
            )
        echo(line)
        here = None  # an x86 form on this CPU's own int8 kernels
        if key.startswith("int8-cpu"):
            here = (
                parity
                if fused
                else ranking_parity(ref, _scores(bundle, target, held.images), held.labels)
            )
        if ok and here is not None and not passes(here):
            echo(
                f"{key} on this CPU's own int8 kernels: Spearman {here['spearman']:.4f}, top-10% "
                f"overlap {here['top10_overlap']:.2f}: below the gate here"
                + (
                    " (without VNNI or AMX they add pairs of its products in int16, which "
                    "saturates)"
                    if key == "int8-cpu"
                    else ""
                )
                + "; kept for the CPUs that reproduce it, and checked on its golden cells "
                "wherever it is to score"
            )
        if not ok and not accept_loss:
            raise ParityError(
                f"the {key} graph does not keep the ranking ({line}; the gate is Spearman "
                f">= {GATE['spearman']} and top-10% overlap >= {GATE['top10_overlap']}): not "
                f"added. Try another {said('calib_method')} or more calibration cells, or pass "
                f"{passing('accept_parity_loss')} to keep it anyway (recorded)"
            )
        entry = {
            "file": variant_file(key),
            "opset": int(
                next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
            ),
            "precision": precision,
            "input": bundle.manifest["onnx"]["input"],
            "output": bundle.manifest["onnx"]["output"],
            "nodes": len(model.graph.node),
            "ops": sorted({n.op_type for n in model.graph.node}),
            "quantization": record,
            "parity_vs_fp32": parity,
            "gate": {**GATE, "passed": ok, "accepted_loss": bool(accept_loss and not ok)},
            # int8 kernels differ by instruction set: where the parity was measured
            "measured_on": cpu_info().words(),
            "measured_with": (
                "ONNX Runtime's kernels on this CPU"
                if fused
                else "ONNX Runtime, Q/DQ unfused in float (int8 kernels' int32 sums)"
            ),
            "tensorrt_conformance": conformance_record(problems),
        }
        if here is not None:  # this CPU's own kernels (fused), beside the gate's numbers
            entry["parity_here"] = {
                k: here[k] for k in ("cells", "spearman", "top10_overlap", "max_abs_diff")
            }
        # merged into the variants as they are when it is added: another export of this bundle
        # may have added one since this began
        add_files(
            bundle.path,
            {entry["file"]: target},
            lambda now: {"onnx_variants": {**(now.get("onnx_variants") or {}), key: entry}},
        )
    return entry


def bf16_gate(path: Path, held: Cells | None = None, accept_loss: bool = False, echo=print) -> dict:
    """How OpenVINO's bf16 ranks against fp32 (``cyto export --precision bf16``): bf16 needs no
    file (OpenVINO compiles ``encoder.onnx`` in bf16), but it is judged by the same gate as fp16
    and int8. On the golden cells against their PyTorch fp32 scores (the verification here, kept
    in the cache) and, with ``held`` (--parity-cells), on those cells against ``encoder.onnx``
    in ONNX Runtime. Where this CPU cannot run bf16 (no OpenVINO, or no AMX / AVX512-BF16 as
    OpenVINO reports it), the report says so and nothing is refused. A ranking below the gate is
    a :class:`ParityError` unless the loss is accepted."""
    from cyto.runtime.backends import openvino
    from cyto.runtime.scorer import load_scorer, openvino_left_out
    from cyto.runtime.verify import judge, parity_words, read_golden

    bundle = load_bundle(Path(path), weights=False)
    why = openvino_left_out(bundle, "bf16")
    if why is not None:
        # nothing made, and exit 0 (bf16 needs no file): said, not left to be guessed (round 60)
        echo(
            f"bf16: not measured here ({why}); bf16 makes no file, and a CPU that runs it "
            "verifies it on the golden cells before it scores"
        )
        return {"measured": False, "why": why}
    golden = read_golden(bundle)
    if golden is None or golden.kind != "cells":
        why = f"the bundle has no real golden cells (pass {passing('cells', 'CELLS')})"
        if held is None:
            echo(f"bf16: not measured ({why})")
            return {"measured": False, "why": why}
    report: dict = {"measured": True, "openvino": openvino.version()}
    failed = []
    scorer = load_scorer(bundle, "openvino", "cpu", "bf16", verify=False)
    try:
        sets = []
        if golden is not None and golden.kind == "cells":
            sets.append(("golden", golden.images, golden.scores, golden.labels, "PyTorch fp32"))
        if held is not None:
            fp32 = _scores(bundle, bundle.path / bundle.spec.graph("fp32").file, held.images)
            sets.append(("held_out", held.images, fp32, held.labels, "encoder.onnx"))
        for name, images, ref, labels, against in sets:
            parity = ranking_parity(ref, scorer.score(images), labels)
            ok, gate = judge(parity, "bf16")
            report[name] = {"parity": parity, "passed": bool(ok), "gate": gate}
            words = f"bf16 (OpenVINO) vs {against} on {parity['cells']} {name} cells: " + (
                parity_words(parity)
            )
            echo(words + ("" if ok else f": below the gate ({gate})"))
            if not ok:
                failed.append(words)
    finally:
        scorer.close()
    if failed and not accept_loss:
        raise ParityError(
            "; ".join(failed) + f" (gate: {GATE}): auto will not run bf16 here; "
            f"{passing('accept_parity_loss')} records it anyway"
        )
    report["accepted_loss"] = bool(failed)
    return report
