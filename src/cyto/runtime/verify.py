"""Every graph proves itself on the machine it runs on.

``cyto export`` keeps golden cells in the bundle (``golden.npz``, inside the seal): a few hundred
real cells as uint8 patches at the model's crop size, with the scores the trained PyTorch network
gives them in fp32 on the exporting machine. Before a graph or engine scores anything,
:func:`cyto.runtime.load_scorer` runs it on those cells here and compares:

- an fp32 graph or engine (or the PyTorch network itself) must give the same scores up to float
  rounding: the largest difference at most :data:`FP32_TOLERANCE` of the reference scores' range;
- an fp16 or int8 graph, or OpenVINO's bf16 (``encoder.onnx`` compiled in bf16), must keep the
  ranking by the export gate (:data:`GATE`): Spearman correlation >= 0.99 and top-10% overlap
  >= 0.90 with the fp32 reference.

A graph that passed its gate where it was exported can fail here: ONNX Runtime's int8 kernels on
x86 CPUs without VNNI sum uint8 x int8 products in int16 and saturate, TensorRT picks kernels per
GPU and version. The result is cached outside the seal, keyed by everything that can change the
numbers (:func:`cyto.runtime.machine.fingerprint`, the graph's sha256 and that of the derived
engine that runs, a TensorRT plan or an OpenVINO compiled model, the golden cells', backend,
device and precision), in ``BUNDLE/verified/`` or, where the bundle is
read-only, in the user's cache folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cyto.errors import BundleError
from cyto.tables import json_text

GOLDEN_FILE = "golden.npz"
#: the ranking gate of reduced-precision graphs, at export and here
GATE = {"spearman": 0.99, "top10_overlap": 0.90}
#: fp32: the largest score difference, as a fraction of the reference scores' range
FP32_TOLERANCE = 1e-3
CACHE_DIR = "verified"
CACHE_VERSION = 1


@dataclass(frozen=True)
class Golden:
    """The bundle's golden cells: uint8 patches, their fp32 reference scores and, when the
    export knew them, labels (1 = abnormal); ``kind`` is ``cells`` or ``random``."""

    images: np.ndarray
    scores: np.ndarray
    labels: np.ndarray | None
    sha256: str
    source: str
    kind: str = "cells"


def read_golden(bundle) -> Golden | None:
    """The golden cells of a loaded (checksum-verified) bundle, or None when it has none."""
    entry = bundle.manifest.get("golden")
    if not entry or entry.get("file") not in bundle.manifest.get("files", {}):
        return None
    path = bundle.path / entry["file"]
    try:
        with np.load(path, allow_pickle=False) as z:
            images, scores = z["images"], z["scores"].astype(np.float64)
            labels = z["labels"] if "labels" in z.files else None
    except (OSError, ValueError, KeyError) as exc:
        raise BundleError(f"{path} is not a readable golden-cell file: {exc}") from exc
    if images.dtype != np.uint8 or images.ndim != 4 or len(images) != len(scores):
        raise BundleError(
            f"{path}: golden cells must be uint8 (N, H, W, 3) with one score each, got "
            f"{images.dtype} {images.shape} and {scores.shape} scores"
        )
    if labels is not None and (labels < 0).all():
        labels = None
    return Golden(
        images,
        scores,
        labels,
        bundle.manifest["files"][entry["file"]],
        str(entry.get("source", "")),
        str(entry.get("kind", "cells")),
    )


def export_hint(bundle, precision: str) -> str:
    """The ``cyto export`` command that adds ``precision``'s graph to ``bundle``: fp32 is the
    plain export (``encoder.onnx``); int8 needs calibration cells; fp16 measures its parity on
    the golden cells when they are real cells, else it needs cells too."""
    from cyto.flags import export_words

    if precision == "fp32":
        return export_words(bundle.path)
    if precision == "int8":
        return export_words(bundle.path, precision, "calib", onnx=False)
    golden = read_golden(bundle)
    if golden is None or golden.kind != "cells":
        return export_words(bundle.path, precision, "parity_cells", onnx=False)
    return export_words(bundle.path, precision, onnx=False)


def top_cells(n: int, frac: float) -> int:
    """How many cells the top ``frac`` of ``n`` is, as a top-k overlap counts them."""
    return max(1, int(round(n * frac)))


def _topk_overlap(a: np.ndarray, b: np.ndarray, frac: float) -> float:
    k = top_cells(len(a), frac)
    top_a = set(np.argsort(-a, kind="stable")[:k].tolist())
    top_b = set(np.argsort(-b, kind="stable")[:k].tolist())
    return len(top_a & top_b) / k


def ranking_parity(ref: np.ndarray, got: np.ndarray, labels: np.ndarray | None = None) -> dict:
    """How far ``got`` is from the reference scores ``ref``, as a ranking and as numbers."""
    from scipy.stats import spearmanr
    from sklearn.metrics import roc_auc_score

    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    finite = bool(np.isfinite(got).all())
    spread = float(np.ptp(ref)) if len(ref) else 0.0
    diff = np.abs(ref - got)
    out = {
        "cells": int(len(ref)),
        "finite": finite,
        "spearman": float(spearmanr(ref, got).statistic) if finite and len(ref) > 2 else 0.0,
        "top1_overlap": _topk_overlap(ref, got, 0.01) if finite else 0.0,
        "top10_overlap": _topk_overlap(ref, got, 0.10) if finite else 0.0,
        "max_abs_diff": float(diff.max()) if finite and len(ref) else float("inf"),
        "max_rel_diff": float((diff / (np.abs(ref) + 1e-6)).max()) if finite else float("inf"),
        "max_diff_of_range": float(diff.max() / max(spread, 1e-12)) if finite else float("inf"),
    }
    if np.isnan(out["spearman"]):  # a constant ranking: nothing kept
        out["spearman"] = 0.0
    if labels is not None and finite and 0 < int(labels.sum()) < len(labels):
        k = int(labels.sum())
        for name, s in (("fp32", ref), ("quantized", got)):
            out[f"auroc_{name}"] = float(roc_auc_score(labels, s))
            out[f"recall_at_k_{name}"] = float(labels[np.argsort(-s, kind="stable")[:k]].mean())
        out["auroc_delta"] = out["auroc_quantized"] - out["auroc_fp32"]
        out["recall_at_k_delta"] = out["recall_at_k_quantized"] - out["recall_at_k_fp32"]
        out["k"] = k
    return out


def passes(parity: dict) -> bool:
    """The ranking gate of reduced-precision graphs (:data:`GATE`)."""
    return (
        parity.get("finite", True)
        and parity["spearman"] >= GATE["spearman"]
        and parity["top10_overlap"] >= GATE["top10_overlap"]
    )


def judge(parity: dict, precision: str) -> tuple[bool, str]:
    """(passed, the gate in words) for a graph of ``precision`` against the fp32 reference."""
    if precision == "fp32":
        ok = parity["finite"] and parity["max_diff_of_range"] <= FP32_TOLERANCE
        return ok, f"fp32: largest difference <= {FP32_TOLERANCE:g} of the scores' range"
    gate = f"Spearman >= {GATE['spearman']}, top-10% overlap >= {GATE['top10_overlap']}"
    return passes(parity), gate


def parity_words(parity: dict) -> str:
    if not parity.get("finite", True):
        return "scores not finite (NaN or inf)"
    return (
        f"Spearman {parity['spearman']:.4f}, top-10% overlap {parity['top10_overlap']:.2f}, "
        f"largest difference {parity['max_abs_diff']:.3g} "
        f"({parity['max_diff_of_range']:.2g} of the range)"
    )


@dataclass
class Verification:
    """The outcome of checking one scorer on this machine.

    ``status``: ``passed``, ``failed``, ``unverified`` (nothing to check against: the bundle has
    no golden cells) or ``skipped`` (the user turned the check off).
    """

    status: str
    why: str = ""
    record: dict[str, Any] = field(default_factory=dict)
    cached: bool = False
    #: the scorer runs the model's own PyTorch network (no exported graph)
    pytorch: bool = False

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def words(self) -> str:
        if self.status in ("passed", "failed"):
            r = self.record
            where = " (cached for this machine)" if self.cached else ""
            if self.cached and self.status == "failed":
                # a failure read, not found: a stale or edited record must not pass for a run
                when = str(r.get("when", ""))[:16].replace("T", " ")
                where = f" (from this machine's record{' of ' + when if when else ''}, not run now)"
            return (
                f"{self.status} on {r['cells']} golden cells here{where}: "
                f"{parity_words(r['parity'])}"
            )
        return f"{self.status}: {self.why}"

    def line(self) -> str:
        """The verification as a run's console line says it: :meth:`words`, but an unverified
        graph's reason left to its warning (:meth:`warning`), which every run says beside it
        (the reason was said three times: the warning, a backend-choice note and this line;
        hostile round 27, 3)."""
        return line_of(self.words())

    def warning(self, model) -> str | None:
        """The warning every run that scores with an unverified graph says (``cyto score``,
        ``cyto predict``, and from Python a ``CytoWarning``), or None: a bundle without golden
        cells scored unsaid from Python (hostile round 26, 8)."""
        if self.status != "unverified":
            return None
        if self.pytorch:  # the trained network itself: "may differ from the trained model's"
            # read as false of it (hostile round 57, 5)
            return (
                f"UNVERIFIED: {model} scores with its PyTorch network, not checked on this "
                f"machine ({self.why}): whether it gives here the scores it gave where it was "
                "trained is not shown"
            )
        return (
            f"UNVERIFIED: {model} scores with a graph that has not been checked on this "
            f"machine ({self.why}); its scores may differ from the trained model's"
        )

    def as_json(self) -> dict:
        out = {"status": self.status, "cached": self.cached}
        if self.why:
            out["why"] = self.why
        if self.record:
            out.update(
                {
                    k: self.record[k]
                    for k in ("cells", "parity", "gate", "seconds", "key_sha256", "machine")
                    if k in self.record
                }
            )
        return out


def artifact(scorer) -> dict:
    """What computes the scores: an exported graph, with the derived engine it was compiled to
    when one is kept (a TensorRT plan, an OpenVINO compiled model: the sha256 and size of the
    bytes the runtime was handed, :mod:`cyto.runtime.derived`), or the PyTorch weights. A
    record made on other engine bytes is not this scorer's."""
    backend = scorer.backend
    graph = getattr(backend, "graph", None)
    if graph is None:
        return {"network": "pytorch", "weights": scorer.bundle.scoring_id}
    out = {"graph": graph.file, "graph_sha256": graph.sha256}
    engine = getattr(backend, "engine_file", None)
    if engine is not None:
        out.update(engine.as_key())
    return out


def scoring_settings(spec) -> dict:
    """The manifest's settings that turn a network's outputs into scores (views, their blend,
    normalization, sizes, seeds, head): an older unsealed manifest edited in any of them scores
    differently with the same graph or weights, so a record made before is not this scorer's."""
    return json.loads(
        json.dumps(
            {
                "head": spec.head,
                "input_size": spec.input_size,
                "crop_size": spec.crop_size,
                "mean": spec.mean,
                "std": spec.std,
                "n_seeds": spec.n_seeds,
                "tta_views": spec.tta_views,
                "tta_lambda": spec.tta_lambda,
                "embedding_normalized": spec.embedding_normalized,
            }
        )
    )


def verification_key(scorer, golden: Golden, machine: dict) -> dict:
    return {
        "version": CACHE_VERSION,
        "machine": machine,
        "artifact": artifact(scorer),
        "golden_sha256": golden.sha256,
        "backend": scorer.backend.name,
        "providers": list(getattr(scorer.backend, "providers", []) or []),
        "device": scorer.device.split(":")[0],
        "precision": scorer.precision,
        "head": scorer.spec.head,
        "scoring": scoring_settings(scorer.spec),
        "trained": scorer.bundle.scoring_id,
    }


def _key_sha(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def cache_dirs(bundle_path: Path) -> list[Path]:
    """Where results are kept: in the bundle, and in the user's cache (read-only bundles)."""
    from cyto.cachedir import cache_dir

    return [Path(bundle_path) / CACHE_DIR, Path(cache_dir()) / CACHE_DIR]


def _read_cached(bundle_path: Path, key: dict, golden: Golden) -> dict | None:
    """The kept record of ``key`` (:func:`cyto.reuse.check_reuse`: its whole key, field by
    field, not only the name it is filed under) whose numbers read back for this golden set;
    None when there is none, or it was made for anything else."""
    from cyto.reuse import check_reuse, read_record, record_intact, say_damaged_record

    sha = _key_sha(key)
    for folder in cache_dirs(bundle_path):
        path = folder / f"{sha[:32]}.json"
        record = read_record(path)
        if record is None and not path.is_file():
            continue
        # filed under this key's name: one that does not read back, or is another key's or
        # lacks its numbers, was damaged or edited (said, then checked again)
        if (
            record is None
            or not record_intact(record)
            or record.get("key_sha256") != sha
            or not check_reuse(record.get("key"), key).ok
            or not _numbers_read(record, golden)
        ):
            say_damaged_record(path, "the verification record", "checked again")
            continue
        return record
    return None


def _numbers_read(record: dict, golden: Golden) -> bool:
    """Whether a record holds the numbers its gate is judged from, for this many golden cells."""
    parity = record.get("parity")
    if not isinstance(parity, dict) or record.get("cells") != len(golden.images):
        return False
    needed = ("finite", "spearman", "top10_overlap", "max_abs_diff", "max_diff_of_range")
    if any(k not in parity for k in needed) or parity.get("cells") != len(golden.images):
        return False
    return all(isinstance(parity[k], (int, float)) for k in needed)


def _write_cached(bundle_path: Path, sha: str, record: dict) -> Path | None:
    """Keep ``record``; in the bundle when it is writable, else in the user's cache. A result
    that cannot be kept anywhere is only recomputed next time."""
    from cyto.bundle import atomic_write
    from cyto.reuse import sealed_record

    for folder in cache_dirs(bundle_path):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if not os.access(folder, os.W_OK):
                continue
            path = folder / f"{sha[:32]}.json"
            body = sealed_record(record)  # an edit to its numbers is seen (round 70, 4)
            atomic_write(path, json_text(body, indent=1, sort_keys=True).encode())
            return path
        except OSError:
            continue
    return None


def verify_scorer(
    scorer, golden: Golden | None, use_cache: bool = True, recheck: bool = False
) -> Verification:
    """Run ``scorer`` on the golden cells here and judge it by its precision's gate (see the
    module docstring); the result comes from, and goes to, the verification cache. ``recheck``:
    a failure on record is run again (``cyto doctor``), a pass on record is taken."""
    from cyto.flags import export_words
    from cyto.runtime.machine import fingerprint

    if golden is None:
        return Verification(
            "unverified",
            "the bundle has no golden cells (exported by an older cyto, or not exported): "
            f"run {export_words(scorer.bundle.recorded_path)} to add them",
            pytorch=scorer.backend.name == "torch",
        )
    if golden.kind == "random" and scorer.precision != "fp32":
        return Verification(
            "unverified",
            "the bundle's golden cells are random patches, which say nothing of a "
            f"{scorer.precision} ranking: re-export with --cells (real cells)",
        )
    machine = fingerprint(scorer.device)
    key = verification_key(scorer, golden, machine)
    sha = _key_sha(key)
    if use_cache:
        record = _read_cached(scorer.bundle.path, key, golden)
        if record is not None:
            # the decision is the gate's, on the recorded numbers, every time it is read: a
            # record's own "passed" is never trusted
            ok, gate = judge(record["parity"], scorer.precision)
            record = {**record, "passed": bool(ok), "gate": gate}
            if ok or not recheck:
                return Verification("passed" if ok else "failed", record=record, cached=True)
    t0 = time.perf_counter()
    # with a progress line: once per machine, and minutes for a paper-recipe network, before
    # the first cell of a slide is scored
    label = f"verify {scorer.backend.name} {scorer.precision} on {scorer.device}"
    got = scorer.score(golden.images, progress=label)
    seconds = time.perf_counter() - t0
    parity = ranking_parity(golden.scores, got, golden.labels)
    ok, gate = judge(parity, scorer.precision)
    record = {
        "key_sha256": sha,
        "key": key,
        "machine": machine,
        "cells": int(len(golden.images)),
        "parity": parity,
        "gate": gate,
        "passed": bool(ok),
        "seconds": round(seconds, 3),
        "cells_per_s": round(len(golden.images) / max(seconds, 1e-9), 1),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if use_cache:
        _write_cached(scorer.bundle.path, sha, record)
    return Verification("passed" if ok else "failed", record=record)


def line_of(words: str) -> str:
    """A verification's recorded words (:meth:`Verification.words`, a summary's
    ``verification``) as the console line says them: an unverified graph's reason is its
    UNVERIFIED warning's, not said again."""
    if words.startswith("unverified"):
        return "unverified (why: see UNVERIFIED)"
    return words
