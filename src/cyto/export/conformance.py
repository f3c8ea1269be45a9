"""Does TensorRT's ONNX parser accept a graph? The rules that can be read from the graph itself.

TensorRT cannot be installed everywhere cyto is tested, so every graph cyto exports is checked
here against the import rules of onnx-tensorrt (the ONNX parser of TensorRT), for every release
cyto targets (TensorRT 10.0 through 11.x):

1. UINT8 only as a network input that feeds a Cast: the parser fails any node whose UINT8 output
   is not a graph output ("TensorRT does not support UINT8 types for intermediate tensors!",
   ``ModelImporter.cpp`` parseNode, 10.0-EA/10.1-GA), and every importer but Cast rejects a UINT8
   input (``notInvalidType(..., {"UINT8"})``). UINT8 weights are silently widened to INT32.
2. Every op is in onnx-tensorrt's supported-operator list of every targeted release
   (``docs/operators.md`` at 10.0-GA 73f629e, 10.1-GA 96e7811 and 10.15 fa5aa9f; the 11.x
   releases add operators and remove none), in the default ONNX domain, at an opset it reads.
3. No data type TensorRT lacks (DOUBLE is only cast down, UINT16/32/64, INT16, STRING, complex
   not at all), and each op's input of a type its importer accepts.
4. The attributes the parser restricts: Resize (nearest/linear, no antialiasing, stretch),
   GridSample on 4-D inputs, MaxPool without indices or dilation, constant ``axes`` for reductions,
   Slice, Squeeze and Unsqueeze, zero zero-points for Q/DQ.
5. Dynamic dimensions only on the inputs the optimization profile covers.

:func:`check_model` returns the violations as readable strings (an empty list means conformant).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

TARGETS = "TensorRT 10.0 to 11.x"
OPSET_RANGE = (9, 20)  # the default-domain opsets onnx-tensorrt 10.0 reads

# docs/operators.md rows marked Y at 10.0-GA (10.1 adds DeformConv, 10.15 eight more; 11.x adds)
SUPPORTED_OPS = frozenset(
    [
        "Abs",
        "Acos",
        "Acosh",
        "Add",
        "And",
        "ArgMax",
        "ArgMin",
        "Asin",
        "Asinh",
        "Atan",
        "Atanh",
        "AveragePool",
        "BatchNormalization",
        "Cast",
        "CastLike",
        "Ceil",
        "Celu",
        "Clip",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Conv",
        "ConvTranspose",
        "Cos",
        "Cosh",
        "CumSum",
        "DepthToSpace",
        "DequantizeLinear",
        "Div",
        "Dropout",
        "Einsum",
        "Elu",
        "Equal",
        "Erf",
        "Exp",
        "Expand",
        "EyeLike",
        "Flatten",
        "Floor",
        "GRU",
        "Gather",
        "GatherElements",
        "GatherND",
        "Gelu",
        "Gemm",
        "GlobalAveragePool",
        "GlobalLpPool",
        "GlobalMaxPool",
        "Greater",
        "GreaterOrEqual",
        "GridSample",
        "GroupNormalization",
        "HardSigmoid",
        "HardSwish",
        "Hardmax",
        "Identity",
        "If",
        "ImageScaler",
        "InstanceNormalization",
        "IsInf",
        "IsNaN",
        "LRN",
        "LSTM",
        "LayerNormalization",
        "LeakyRelu",
        "Less",
        "LessOrEqual",
        "Log",
        "LogSoftmax",
        "Loop",
        "LpNormalization",
        "LpPool",
        "MatMul",
        "Max",
        "MaxPool",
        "Mean",
        "MeanVarianceNormalization",
        "Min",
        "Mish",
        "Mod",
        "Mul",
        "Neg",
        "NonMaxSuppression",
        "NonZero",
        "Not",
        "OneHot",
        "Or",
        "PRelu",
        "Pad",
        "ParametricSoftplus",
        "Pow",
        "QuantizeLinear",
        "RNN",
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Range",
        "Reciprocal",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceMax",
        "ReduceMean",
        "ReduceMin",
        "ReduceProd",
        "ReduceSum",
        "ReduceSumSquare",
        "Relu",
        "Reshape",
        "Resize",
        "ReverseSequence",
        "RoiAlign",
        "Round",
        "ScaledTanh",
        "Scan",
        "Scatter",
        "ScatterElements",
        "ScatterND",
        "Selu",
        "Shape",
        "Shrink",
        "Sigmoid",
        "Sign",
        "Sin",
        "Sinh",
        "Size",
        "Slice",
        "Softmax",
        "Softplus",
        "Softsign",
        "SpaceToDepth",
        "Split",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Sum",
        "Tan",
        "Tanh",
        "ThresholdedRelu",
        "Tile",
        "TopK",
        "Transpose",
        "Trilu",
        "Unsqueeze",
        "Upsample",
        "Where",
        "Xor",
    ]
)

REDUCE_OPS = (
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceL2",
    "ReduceL1",
    "ReduceSumSquare",
    "ReduceProd",
)
# ONNX TensorProto data types by name (onnx.TensorProto.DataType)
_F = {"FLOAT", "FLOAT16", "BFLOAT16"}
_NUM = _F | {"INT32", "INT64"}
_MOVE = _NUM | {"BOOL"}
# the types the parser maps to TensorRT (importerUtils.cpp convertDtype), DOUBLE left out: it is
# only cast down to FLOAT, which a graph meant to match its PyTorch scores must not rely on
TRT_TYPES = _MOVE | {"INT8", "UINT8", "FLOAT8E4M3FN", "INT4"}
# the "Supported Types" of the first input, operators.md (10.0-GA, 10.1-GA, 10.15)
INPUT_TYPES: dict[str, set[str]] = {
    **dict.fromkeys(
        [
            "Conv",
            "ConvTranspose",
            "Resize",
            "Gemm",
            "MatMul",
            "Softmax",
            "LogSoftmax",
            "BatchNormalization",
            "MaxPool",
            "AveragePool",
            "GlobalAveragePool",
            "GlobalMaxPool",
            "Sqrt",
            "Exp",
            "Log",
            "Erf",
            "Sigmoid",
            "Tanh",
            "LpNormalization",
            "Clip",
            "LeakyRelu",
            "Elu",
            "Reciprocal",
            "InstanceNormalization",
            "LayerNormalization",
            "QuantizeLinear",
            "Pow",
            "Gelu",
            "HardSigmoid",
            "HardSwish",
            "Softplus",
        ],
        _F,
    ),
    "GridSample": {"FLOAT", "FLOAT16"},
    # documented with INT32 too, but the 10.0/10.1 importer (activationHelper) rejects INT32
    "Relu": _F | {"INT64"},
    **dict.fromkeys(
        [
            "Add",
            "Sub",
            "Mul",
            "Div",
            "Neg",
            "Max",
            "Min",
            "Abs",
            "Equal",
            "Greater",
            "Less",
            "GreaterOrEqual",
            "LessOrEqual",
            *REDUCE_OPS,
        ],
        _NUM,
    ),
    **dict.fromkeys(
        [
            "Transpose",
            "Reshape",
            "Flatten",
            "Gather",
            "Slice",
            "Concat",
            "Unsqueeze",
            "Squeeze",
            "Shape",
            "Identity",
            "Expand",
            "Tile",
            "Split",
            "Size",
        ],
        _MOVE,
    ),
    "DequantizeLinear": {"INT8", "FLOAT8E4M3FN", "INT4"},
}
RESIZE_COORDS = {
    "half_pixel",
    "pytorch_half_pixel",
    "tf_half_pixel_for_nn",
    "asymmetric",
    "align_corners",
}
# the input that must be a constant (initializer or Constant output) for these ops, from opset 13+
CONSTANT_INPUTS = {
    **dict.fromkeys(
        [
            *REDUCE_OPS,
            "ReduceLogSum",
            "ReduceLogSumExp",
        ],
        (1, "axes"),
    ),
    "Squeeze": (1, "axes"),
    "Unsqueeze": (1, "axes"),
    "Slice": (3, "axes"),
}


def _type_name(elem_type: int) -> str:
    import onnx

    return onnx.TensorProto.DataType.Name(elem_type)


def _walk(graph, path: str = ""):
    """Every node of ``graph`` and of its subgraphs (If/Loop/Scan bodies), with where it is."""
    import onnx

    for node in graph.node:
        yield node, path
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _walk(attr.g, f"{path}{node.name or node.op_type}/")
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _walk(g, f"{path}{node.name or node.op_type}/")


def _attr(node, name: str, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


#: the problems a manifest keeps word for word; the rest are counted (an x86 int8 graph, never
#: meant for TensorRT, breaks one rule at each of its ~1,000 uint8 zero points: 185 kB each)
KEPT_PROBLEMS = 20


def conformance_record(problems: list[str]) -> dict:
    """What a bundle's manifest records of a graph's conformance to TensorRT's import rules."""
    record = {"targets": TARGETS, "ok": not problems, "problems": problems[:KEPT_PROBLEMS]}
    if len(problems) > KEPT_PROBLEMS:
        record["more_problems"] = len(problems) - KEPT_PROBLEMS
    return record


def problem_words(record: dict, first: int = 3) -> str:
    """The first few problems of a :func:`conformance_record`, and how many there are."""
    total = len(record["problems"]) + record.get("more_problems", 0)
    words = "; ".join(record["problems"][:first])
    return words + (f" (and {total - first} more)" if total > first else "")


def check_model(model, profile_inputs: Iterable[str] = ()) -> list[str]:
    """The TensorRT import rules ``model`` (an ``onnx.ModelProto``) breaks, one string each.

    ``profile_inputs``: the graph inputs the optimization profile gives shapes for; any other
    input must have fixed dimensions.
    """
    import onnx

    problems: list[str] = []
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises several kinds; the rules still apply
        inferred = model
        problems.append(f"ONNX shape inference fails ({str(exc).splitlines()[0]}): types unknown")
    g = inferred.graph
    types: dict[str, str] = {}
    ranks: dict[str, int] = {}
    for vi in [*g.input, *g.output, *g.value_info]:
        t = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and t.elem_type:
            types[vi.name] = _type_name(t.elem_type)
            if t.HasField("shape"):
                ranks[vi.name] = len(t.shape.dim)
    initializers = {i.name: i for i in g.initializer}
    for init in g.initializer:
        types[init.name] = _type_name(init.data_type)
    constants = set(initializers)
    for node, _ in _walk(g):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            constants.update(node.output)
            value = _attr(node, "value")
            if value is not None:
                types[node.output[0]] = _type_name(value.data_type)
    graph_inputs = [i for i in g.input if i.name not in initializers]
    graph_outputs = {o.name for o in g.output}

    opsets = {o.domain: o.version for o in model.opset_import}
    default = opsets.get("", opsets.get("ai.onnx"))
    if default is None or not OPSET_RANGE[0] <= default <= OPSET_RANGE[1]:
        problems.append(
            f"default-domain opset {default} is outside the {OPSET_RANGE[0]}-{OPSET_RANGE[1]} "
            f"that every release of {TARGETS} reads"
        )

    # 5. dynamic dimensions only where the profile gives shapes
    covered = set(profile_inputs)
    for inp in graph_inputs:
        shape = inp.type.tensor_type.shape
        dynamic = [
            i for i, d in enumerate(shape.dim) if not d.HasField("dim_value") or d.dim_value < 1
        ]
        if inp.name in covered:
            if not inp.type.tensor_type.HasField("shape"):
                problems.append(f"input {inp.name!r} has no known rank: a profile cannot shape it")
        elif dynamic or not inp.type.tensor_type.HasField("shape"):
            problems.append(
                f"input {inp.name!r} has dynamic dimensions {dynamic} but no optimization "
                "profile covers it"
            )

    # 3. data types anywhere in the graph
    for name, t in sorted(types.items()):
        if t not in TRT_TYPES:
            problems.append(f"tensor {name!r} is {t}, which TensorRT does not support")
    for name, init in initializers.items():
        if _type_name(init.data_type) == "UINT8":
            problems.append(
                f"initializer {name!r} is UINT8: TensorRT widens UINT8 weights to INT32 silently"
            )

    for node, where in _walk(g):
        label = f"{where}{node.name or '?'} ({node.op_type})"
        # 2. supported operators
        if node.domain not in ("", "ai.onnx"):
            problems.append(f"{label}: custom domain {node.domain!r} has no TensorRT importer")
            continue
        if node.op_type not in SUPPORTED_OPS:
            problems.append(f"{label}: {node.op_type} is not supported by onnx-tensorrt")
            continue
        ins = [types.get(i) for i in node.input if i]
        # 1. UINT8: a network input feeding a Cast, nothing else
        for name in node.input:
            if name and types.get(name) == "UINT8" and node.op_type != "Cast":
                problems.append(
                    f"{label}: reads the UINT8 tensor {name!r}; TensorRT takes UINT8 only as a "
                    "network input that feeds a Cast (cast before any other op)"
                )
        for name in node.output:
            if name and types.get(name) == "UINT8" and name not in graph_outputs:
                problems.append(
                    f"{label}: makes the intermediate UINT8 tensor {name!r}, which TensorRT "
                    "does not support"
                )
        # 3. the first input's type, as the importer accepts it
        allowed = INPUT_TYPES.get(node.op_type)
        first = ins[0] if ins else None
        if node.op_type == "Where" and len(ins) > 1:
            allowed, first = _MOVE, ins[1]
        if allowed and first and first != "UINT8" and first not in allowed:
            problems.append(f"{label}: TensorRT's {node.op_type} does not take {first}")
        # 4. attributes and constant inputs the parser restricts
        problems.extend(_attribute_rules(node, label, ranks, constants))
    return problems


def _attribute_rules(node, label: str, ranks: dict[str, int], constants: set[str]) -> list[str]:
    out = []
    op = node.op_type
    if op == "Resize":
        mode = _attr(node, "mode", "nearest")
        if mode not in ("nearest", "linear"):
            out.append(f"{label}: Resize mode {mode!r} (TensorRT: nearest or linear)")
        coords = _attr(node, "coordinate_transformation_mode", "half_pixel")
        if coords not in RESIZE_COORDS:
            out.append(f"{label}: Resize coordinate mode {coords!r} is not supported")
        if _attr(node, "antialias", 0):
            out.append(f"{label}: Resize with antialiasing is not supported")
        if _attr(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
            out.append(f"{label}: Resize keeps the aspect ratio (TensorRT: stretch only)")
    elif op == "GridSample":
        rank = ranks.get(node.input[0])
        if rank is not None and rank != 4:
            out.append(f"{label}: GridSample on a {rank}-D input (TensorRT 10.x: 4-D only)")
    elif op == "MaxPool":
        if len([o for o in node.output if o]) > 1:
            out.append(f"{label}: MaxPool's Indices output is not supported")
        if any(d != 1 for d in _attr(node, "dilations", []) or []):
            out.append(f"{label}: MaxPool with dilation is not supported")
    elif op in ("QuantizeLinear", "DequantizeLinear"):
        if len(node.input) > 2 and node.input[2] and node.input[2] not in constants:
            out.append(f"{label}: its zero point must be a constant zero")
    elif op == "Constant":
        for bad in ("sparse_value", "value_string", "value_strings"):
            if _attr(node, bad) is not None:
                out.append(f"{label}: Constant {bad} is not supported")
    if op in CONSTANT_INPUTS:
        i, what = CONSTANT_INPUTS[op]
        if len(node.input) > i and node.input[i] and node.input[i] not in constants:
            out.append(f"{label}: {what} must be a constant (initializer) for TensorRT")
    return out


def zero_point_problems(model) -> list[str]:
    """Q/DQ zero points that are not all zeros (TensorRT's explicit quantization is symmetric)."""
    import numpy as np
    from onnx import numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") and len(node.input) > 2:
            zp = inits.get(node.input[2])
            if zp is not None and np.any(numpy_helper.to_array(zp) != 0):
                out.append(f"{node.name or node.op_type}: zero point is not zero")
    return out


def check_graph_file(path: Path, profile_inputs: Iterable[str] = ()) -> list[str]:
    """:func:`check_model` and :func:`zero_point_problems` for an ONNX file."""
    return check_graph_bytes(Path(path).read_bytes(), profile_inputs)


def check_graph_bytes(data: bytes, profile_inputs: Iterable[str] = ()) -> list[str]:
    """:func:`check_graph_file` for a serialized graph."""
    import onnx

    model = onnx.load_from_string(data)
    return check_model(model, profile_inputs) + zero_point_problems(model)
