"""Rebuild a bundle's network graph in PyTorch (no training code needed).

The module returned is the one ``cyto export`` writes to ONNX and the PyTorch backend runs:
uint8 NHWC in, the graph output its scorer head expects out (see :mod:`cyto.models.graphs`).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from cyto.bundle import Bundle, ModelSpec
from cyto.errors import BundleError
from cyto.models.backbones import build_backbone
from cyto.models.graphs import ClassifierLogits, DSVDDEmbeddings, EmbeddingModel, InstanceLogit


def _net(spec: ModelSpec, state: dict, out_dim: int | None = None) -> nn.Module:
    net = build_backbone(spec.backbone, out_dim or spec.embedding_dim, bias=spec.bias)
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        raise BundleError(f"weights do not fit a {spec.backbone} backbone: {exc}") from exc
    return net.eval()


def _weights(b: Bundle, name: str) -> dict:
    if name not in b.weights:
        raise BundleError(
            f"{b.path}: weights-{name}.safetensors is missing from the loaded bundle "
            "(load it with weights=True, or the bundle is incomplete)"
        )
    return b.weights[name]


def _dsvdd(b: Bundle) -> nn.Module:
    s = b.spec
    encoders = [_net(s, _weights(b, f"encoder-seed{i}")) for i in range(s.n_seeds)]
    return DSVDDEmbeddings(encoders, s.input_size, s.tta_views, s.mean, s.std)


def _classifier(b: Bundle) -> nn.Module:
    s = b.spec
    return ClassifierLogits(_net(s, _weights(b, "net"), out_dim=2), s.input_size, s.mean, s.std)


def _ocsvm(b: Bundle) -> nn.Module:
    s = b.spec
    enc = _net(s, _weights(b, "encoder"))
    return EmbeddingModel(enc, s.input_size, s.embedding_normalized, s.mean, s.std)


def _mil(b: Bundle) -> nn.Module:
    s = b.spec
    head = nn.Linear(s.embedding_dim, 1)
    agg = _weights(b, "aggregator")
    head.load_state_dict({"weight": agg["instance.weight"], "bias": agg["instance.bias"]})
    return InstanceLogit(_net(s, _weights(b, "encoder")), head, s.input_size, s.mean, s.std)


GRAPHS: dict[str, Callable[[Bundle], nn.Module]] = {
    "dsvdd": _dsvdd,
    "classifier": _classifier,
    "ocsvm": _ocsvm,
    "mil": _mil,
    "knn": _ocsvm,  # the embeddings, as for the OC-SVM
}


def build_graph(bundle: Bundle) -> nn.Module:
    """The bundle's network, in eval mode on the CPU: uint8 NHWC in, graph output out (after the
    bundle's stain normalization, when it has one)."""
    kind = bundle.spec.head
    if kind not in GRAPHS:
        raise BundleError(
            f"{bundle.path}: unknown scorer kind {kind!r}; this cyto knows "
            f"{', '.join(GRAPHS)} (upgrade cyto?)"
        )
    graph = GRAPHS[kind](bundle)
    record = bundle.manifest.get("stain_normalization")
    if record:
        from cyto.data.stain import StainNormalized, module

        try:
            graph = StainNormalized(graph, module(record))
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(f"{bundle.path}: unusable stain_normalization record: {exc}") from exc
    return graph.eval()
