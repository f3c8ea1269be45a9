"""The model bundle: the contract between train, export and infer.

A directory (e.g. ``dsvdd.cyto/``) holding ``manifest.json``, one ``weights-*.safetensors`` per
seed/network, ``scorer.npz`` (centres, or support vectors...) and, after export, ``encoder.onnx``
and TensorRT engines. The manifest lists the sha256 of every other file and carries its own
(``manifest_sha256``, over its canonical JSON without that field); loading verifies each one and
refuses anything that does not match (but a damaged fp16 or int8 graph, passed over where the bundle
is loaded to score: :class:`SetAside`). Nothing is ever unpickled.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cyto import staging
from cyto.errors import BundleError, BundlePathError, as_arg, warn_caller
from cyto.locks import flock_or_not
from cyto.outputs_check import refuse_to_replace
from cyto.tables import finite, json_text
from cyto.version import __version__

FORMAT = "cyto-bundle"
# 2: the manifest must carry its seal; TensorRT engines live in engines/, outside the seal.
# 1 (older cyto): the seal was optional, so a version-1 manifest without one cannot be checked.
FORMAT_VERSION = 2
UNSEALED_VERSIONS = (1,)
MANIFEST = "manifest.json"
SEAL = "manifest_sha256"
ONNX_FILE = "encoder.onnx"
#: bf16 is a run-time precision of OpenVINO on the fp32 graph (no file of its own)
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
# the normal-score quantiles a bundle's ``calibration`` records (train and cyto calibrate)
CALIBRATION_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)
# the sorted normal-slide scores of ``cyto calibrate`` (the conformal calibration set)
CALIBRATION_FILE = "calibration.npz"
# the lock a bundle's writers take (one change of its manifest at a time) and its readers share
LOCK = ".lock"
#: the image files a model was trained on (and chose its ranking on): the first 64 bits of each
#: file's sha256, sorted (:func:`cell_keys`); cyto predict says which scored images are among
#: them (hostile round 39, 7: a model's own training cells were scored and measured unsaid)
TRAINING_CELLS = "training_cells.npy"
#: the files a loaded bundle keeps as they were when it loaded (:meth:`Bundle.file_bytes`): read
#: later, as each slide is scored or a folder predicted, from a folder that may have changed
HELD_AT_LOAD = (CALIBRATION_FILE, TRAINING_CELLS)


def cell_keys(digests: Iterable[str | None]) -> np.ndarray:
    """The sha256 hex digests of image files as 64-bit keys (uint64; None: a key of 0, which no
    digest of a 2^64 chance gives), in their order: :func:`save_bundle` keeps them sorted and
    unique as :data:`TRAINING_CELLS`."""
    return np.array([int(d[:16], 16) if d else 0 for d in digests], dtype=np.uint64)


def training_cells(bundle: Bundle) -> np.ndarray | None:
    """The keys of the images ``bundle`` was trained on, checked against its manifest; None for
    a bundle that records none (an older cyto's, or one not trained by cyto train)."""
    digest = bundle.manifest.get("files", {}).get(TRAINING_CELLS)
    if digest is None:
        return None
    import io

    return np.load(io.BytesIO(bundle.file_bytes(TRAINING_CELLS)), allow_pickle=False)


def read_checked(path: Path, sha256: str, changed: str) -> bytes:
    """A file's bytes when they still have the ``sha256`` read before; else a BundleError that
    says ``PATH CHANGED``. Whoever runs the file gets these bytes, not its path: what runs is
    what was checked."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if hashlib.sha256(data).hexdigest() != sha256:
        raise BundleError(f"{path} {changed}")
    return data


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"cyto": __version__, "python": platform.python_version()}
    for pkg in ("torch", "torchvision", "numpy", "scikit-learn", "onnx", "onnxruntime"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            continue
    return out


@dataclass(frozen=True)
class GraphSpec:
    """One exported ONNX graph of the bundle: uint8 NHWC ``input`` in, ``output`` out."""

    file: str
    sha256: str
    precision: str
    input: str
    output: str
    opset: int
    parity_passed: bool = True  # a quantized graph that kept the ranking (fp32: always)
    # ops an fp16 graph keeps in float32 (cyto.export.quantize.FP16_KEEP_FLOAT; () before them)
    float32_ops: tuple[str, ...] = ()


def normals_alone(training: dict | None) -> bool:
    """Whether a manifest's ``training_data`` says the model was trained on normal classes
    alone (its ``abnormal`` classes recorded, and none)."""
    training = training or {}
    return "abnormal" in training and not training["abnormal"]


@dataclass(frozen=True)
class ModelSpec:
    """What scoring needs to know about a model, read from the manifest once.

    ``input_size`` is the network's own input (the graph resizes to it); ``crop_size`` is the
    patch size the model was trained on (``load_size``, else ``input_size``), which is what the
    slide pipeline cuts. ``head`` names the scorer head (:mod:`cyto.runtime.heads`).
    """

    method: str
    head: str
    backbone: str
    embedding_dim: int
    bias: bool
    input_size: int
    crop_size: int
    mpp: float | None
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    n_seeds: int
    tta_views: tuple[str, ...]
    tta_lambda: float
    embedding_normalized: bool
    graphs: dict[str, GraphSpec]
    #: median share of a training normal's patch covered by nucleus (cyto.data.scale), at the
    #: load size: what ``cyto predict --zoom auto`` matches another folder's cells to
    nucleus_fraction: float | None = None
    #: the same for the nucleus at the patch's centre alone: what ``cyto score`` checks a
    #: slide's first cells against (a slide crop's whole share is the smear's nuclear density)
    centre_nucleus_fraction: float | None = None
    #: the training normals' log centre-nucleus share, mean and sd (``log_mean``, ``log_sd``):
    #: the nucleus-size score ranked beside the model (cyto.data.morphometry); None before
    nucleus_size: dict[str, float] | None = None
    #: the stain of the training cells (mgg, pap, he: cyto.data.morphometry.STAINS): which cell
    #: mask measures their morphometry and which nucleus detection a slide gets by default
    stain: str = "mgg"
    #: the morphometric score of the training normals (cyto.data.morphometry.Morphometric)
    morphometry: dict | None = None
    #: why training fitted no morphometric score (None: it did, or an earlier cyto)
    morphometry_why: str | None = None
    #: how the model, the morphometric score and their fusion ranked the held-back cells
    #: (``cyto train`` with abnormal classes): what ``--rank-by auto`` chooses from
    validation: dict | None = None
    #: the stain vectors estimated over the training cells (cyto.detect.stain): what another
    #: lab's cells are checked against
    stain_vectors: dict | None = None
    #: the training patches' own side (px, before any resize): the crop a slide's cells are cut
    #: at (at the model's mpp); None before cyto recorded it
    patch_px: int | None = None
    #: trained on normal classes alone (no abnormal class given: nothing held back could choose
    #: its ranking); False where the manifest does not say (an earlier cyto)
    normals_alone: bool = False

    @property
    def folder_scale_reference(self) -> float | None:
        """The training normals' median nucleus share a crop folder's cells are compared with
        (``cyto predict``'s scale check, ``--zoom auto``: :func:`cyto.detect.morphometry.
        scale_shares` at :attr:`crop_mpp`): every nucleus of a crop under the MGG rule, the
        centre nucleus of the other stains, measured at the crops' pixel size as the slide
        check's is. (Pap crops measured as of no pixel size read cells shrunk 0.6x as 1.1x
        larger: the mask's sizes in um are what it finds a nucleus by; hostile round 33.)"""
        if self.stain == "mgg":
            return self.nucleus_fraction
        return self.centre_nucleus_fraction

    @property
    def crop_mpp(self) -> float | None:
        """um per pixel of the crops the model takes: the training patches' (``mpp``) times
        their side over the crop's (``patch_px`` / ``crop_size``); None where either is not
        recorded. What the morphometry of its cells is measured at, in training and after."""
        if not self.mpp or not self.patch_px:
            return None
        return self.mpp * self.patch_px / self.crop_size

    @classmethod
    def from_manifest(
        cls, manifest: dict[str, Any], where: object = "bundle", leave_out: Iterable[str] = ()
    ) -> ModelSpec:
        """``leave_out``: graphs (by precision key) the spec does not offer."""
        try:
            cfg = manifest.get("config", {})
            norm = manifest.get("normalization") or {}
            training = manifest.get("training_data") or {}
            size = int(manifest["input_size"])
            graphs = {}
            for key, entry in _graph_entries(manifest).items():
                if key in leave_out:
                    continue
                graphs[key] = GraphSpec(
                    file=entry["file"],
                    sha256=manifest["files"][entry["file"]],
                    precision=str(entry.get("precision", key)),
                    input=entry["input"]["name"],
                    output=entry["output"]["name"],
                    opset=int(entry["opset"]),
                    parity_passed=bool((entry.get("gate") or {}).get("passed", True)),
                    float32_ops=tuple((entry.get("quantization") or {}).get("float32_ops", ())),
                )
            return cls(
                method=str(manifest["method"]),
                head=str(manifest["scorer_kind"]),
                backbone=str(manifest["backbone"]),
                embedding_dim=int(manifest["embedding_dim"]),
                bias=bool(manifest.get("bias", True)),
                input_size=size,
                crop_size=int(cfg.get("load_size") or size),
                mpp=float(cfg["mpp"]) if cfg.get("mpp") else None,
                mean=tuple(norm.get("mean", (0.485, 0.456, 0.406))),
                std=tuple(norm.get("std", (0.229, 0.224, 0.225))),
                n_seeds=len(manifest.get("seeds") or [0]),
                tta_views=tuple(manifest.get("tta_views") or ("orig",)),
                tta_lambda=float(manifest.get("tta_lambda", 0.0)),
                embedding_normalized=bool(manifest.get("embedding_normalized", False)),
                graphs=graphs,
                nucleus_fraction=training.get("nucleus_fraction"),
                centre_nucleus_fraction=training.get("centre_nucleus_fraction"),
                nucleus_size=training.get("nucleus_size"),
                stain=str(cfg.get("stain") or "mgg"),
                morphometry=training.get("morphometry"),
                morphometry_why=training.get("morphometry_why"),
                validation=manifest.get("validation"),
                stain_vectors=training.get("stain_vectors"),
                patch_px=int(training["patch_px"]) if training.get("patch_px") else None,
                normals_alone=normals_alone(training),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BundleError(
                f"{where}: the manifest lacks or garbles {exc}: not a model bundle this cyto "
                "can score with (retrain, or upgrade cyto)"
            ) from exc

    def graph(
        self, precision: str = "fp32", device: str | None = None, int8_dot: bool = True
    ) -> GraphSpec | None:
        """The graph of ``precision`` for ``device``. On a CPU, int8 is one of ONNX Runtime's
        x86 forms (uint8 activations): ``int8-cpu`` (8-bit weights) where the CPU sums int8
        products without saturation (``int8_dot``: VNNI or AMX), ``int8-cpu7`` (7-bit weights)
        elsewhere, each falling back to the other and then to the TensorRT form, which
        verification on the machine then judges; off the CPU, int8 is the TensorRT form."""
        if precision == "int8" and device == "cpu":
            order = CPU_INT8_FORMS if int8_dot else CPU_INT8_FORMS[::-1]
            for key in (*order, "int8"):
                if key in self.graphs:
                    return self.graphs[key]
            return None
        return self.graphs.get(precision)


#: ONNX Runtime's x86 int8 forms: 8-bit weights (fast and exact with VNNI/AMX; on other x86
#: CPUs vpmaddubsw sums pairs of uint8 x int8 products into int16 and saturates), and 7-bit
#: weights (reduce_range; the first convolution 8-bit weights on a 7-bit input): a pair's sum
#: stays below 2^15, so every x86 CPU computes the same)
CPU_INT8_FORMS = ("int8-cpu", "int8-cpu7")


def of_precision(key: str, asked: str) -> bool:
    """Whether the graph ``key`` (``fp16``, ``int8-cpu7``) is one ``asked`` names: a precision
    (``int8``: each of its forms) or one form (``int8-cpu``)."""
    return key == asked or key.startswith(f"{asked}-")


def _graph_entries(manifest: dict[str, Any]) -> dict[str, dict]:
    """The exported graphs by precision: ``onnx`` is the fp32 graph, ``onnx_variants`` the rest."""
    out = {}
    if manifest.get("onnx"):
        out["fp32"] = manifest["onnx"]
    for precision, entry in (manifest.get("onnx_variants") or {}).items():
        out[precision] = entry
    return out


@dataclass
class Bundle:
    """A loaded (verified) bundle: its manifest, tensors per weights file, and scorer arrays."""

    path: Path
    manifest: dict[str, Any]
    weights: dict[str, dict[str, Any]] = field(default_factory=dict)
    scorer: dict[str, np.ndarray] = field(default_factory=dict)
    _spec: ModelSpec | None = field(default=None, repr=False, compare=False)
    #: the fp16 / int8 graphs left out of :attr:`spec` as damaged or missing, by precision key
    #: (``load_bundle(..., for_scoring=True)``)
    set_aside: dict[str, SetAside] = field(default_factory=dict, repr=False, compare=False)
    #: the manifest's sha256 as it was loaded (under the bundle's lock, with what was read)
    _manifest_sha256: str | None = field(default=None, repr=False, compare=False)
    #: the bundle as a table or summary records it: absolute, taken when it is loaded (a record
    #: read from another folder, or moved, still names its model: the path as given, relative,
    #: stood beside the slide's absolute one, hostile round 26, 15; resolved when a table was
    #: written, it named the folder a script had since moved to, round 28, 1)
    recorded_path: str = field(default="", repr=False, compare=False)
    #: the files read whole when the bundle was loaded, checked (:data:`HELD_AT_LOAD`): what a
    #: loaded model scores with (:meth:`file_bytes`)
    held: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.recorded_path:
            self.recorded_path = str(Path(self.path).resolve())

    def __repr__(self) -> str:
        """One line: the folder and its method (not the manifest and every tensor)."""
        return f"<Bundle {self.recorded_path} ({self.manifest.get('method', '?')})>"

    @property
    def where(self) -> str:
        """The bundle as advice names it: the path as given while it leads there, else where it
        was loaded (a script that moved elsewhere was told to run 'cyto export' on a path that
        led nowhere: hostile round 29, 11)."""
        return str(self.path) if Path(self.path).exists() else self.recorded_path

    @property
    def method(self) -> str:
        return str(self.manifest["method"])

    @property
    def spec(self) -> ModelSpec:
        if self._spec is None:
            self._spec = ModelSpec.from_manifest(self.manifest, self.path, set(self.set_aside))
        return self._spec

    def set_aside_for(self, precision: str) -> list[tuple[str, SetAside]]:
        """The graphs of ``precision`` (int8: each of its forms) left out as damaged."""
        return [(key, gone) for key, gone in self.set_aside.items() if of_precision(key, precision)]

    def graph_bytes(self, graph: GraphSpec) -> bytes:
        """The graph file's bytes, checked against the sha256 the manifest gave when the bundle
        was loaded: a graph replaced since (another run exporting into the bundle) is refused
        here, never run under the verification of the graph it replaced. Callers hand these
        bytes to ONNX Runtime or TensorRT instead of the path, so what runs is what was checked."""
        return read_checked(
            Path(self.recorded_path) / graph.file,
            graph.sha256,
            "changed after the bundle was loaded (another run exported into it?): run again to "
            "load the bundle as it is now",
        )

    def file_bytes(self, name: str) -> bytes:
        """The bytes of a file the manifest lists, as the bundle was loaded: held since the load
        (:data:`HELD_AT_LOAD`), else read from the folder it was loaded from (absolute: a script
        that changed its working folder since) and checked against the manifest loaded. A
        loaded model read its calibration from disk at each slide, by the path as given: a
        bundle calibrated again since was scored with the new calibration and recorded as the
        old one, and a script that moved elsewhere failed after a whole slide, or took another
        bundle's calibration found at the same relative path (hostile round 64, 1 and 2)."""
        if name in self.held:
            return self.held[name]
        digest = self.manifest.get("files", {}).get(name)
        if digest is None:
            raise BundleError(f"{self.where} lists no {name}")
        return read_checked(
            Path(self.recorded_path) / name,
            digest,
            "changed since the model was loaded (calibrated or exported into again?): load the "
            "model again to use the bundle as it is now",
        )

    @property
    def manifest_hash(self) -> str:
        """The sha256 of the manifest this bundle was loaded with: a bundle calibrated or
        exported into while a run scores with it is not the bundle the run records (its
        calibration, read at load, is the old one; the run's summary must say the old one)."""
        if self._manifest_sha256 is None:
            self._manifest_sha256 = hashlib.sha256((self.path / MANIFEST).read_bytes()).hexdigest()
        return self._manifest_sha256

    @property
    def rows_id(self) -> str:
        """What a slide's scored rows depend on in the bundle: its manifest (read at load) less
        its calibration and the manifest's own seal. A bundle calibrated after slides were
        scored keeps their cells (its p-values, flags and burden are drawn from the table);
        anything else written into it (weights, graphs, training records) is another bundle."""
        body = {k: v for k, v in self.manifest.items() if k not in ("calibration", SEAL)}
        files = body.get("files")
        if isinstance(files, dict):
            body["files"] = {k: v for k, v in files.items() if k != CALIBRATION_FILE}
        text = json.dumps(body, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    @property
    def scoring_id(self) -> str:
        """What a cell's score depends on: the method and the trained arrays (weights,
        scorer.npz). Unlike :attr:`manifest_hash` it stays the same when the bundle is calibrated
        or exported, so score tables of one model can be recognised across those steps."""
        files = self.manifest.get("files", {})
        trained = {k: v for k, v in files.items() if k.startswith("weights-") or k == "scorer.npz"}
        text = json.dumps({"method": self.method, "files": trained}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


#: what cyto writes in a bundle besides the files its manifest lists: the manifest, its lock and
#: the hidden temporaries of its atomic writes (a killed write leaves one), the calibration,
#: exported graphs and golden cells, and the derived engines and verifications
DERIVED_NAMES = (
    MANIFEST,
    ".*",
    CALIBRATION_FILE,
    "*.onnx",
    "golden*.npz",
    "engines/*",
    "verified/*",
)


def bundle_names(path: Path) -> list[str]:
    """The names cyto wrote in the bundle folder ``path``: its manifest is its record (the
    sealed files it lists), with :data:`DERIVED_NAMES`. A folder that is no bundle has only the
    derived names, so whatever else it holds is not cyto's to replace."""
    try:
        files = json.loads((Path(path) / MANIFEST).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        files = {}
    return [*DERIVED_NAMES, *(f for f in files if isinstance(f, str))]


def save_bundle(
    out: Path,
    manifest: dict[str, Any],
    weights: dict[str, dict[str, Any]],
    scorer: dict[str, np.ndarray],
    overwrite: bool = False,
    cells: np.ndarray | None = None,
) -> Path:
    """Write a bundle atomically: built in a temporary folder, then renamed into place.

    Args:
        out: the bundle folder (``NAME.cyto``).
        manifest: method-specific fields; format, checksums and versions are added here.
        weights: ``{"encoder-seed0": state_dict, ...}``, each written as safetensors.
        scorer: arrays for ``scorer.npz``.
        cells: the keys of the training images (:func:`cell_keys`), for :data:`TRAINING_CELLS`.
    """
    from safetensors.torch import save_file

    out = Path(out)
    refuse_to_replace(out, overwrite, known=bundle_names(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = staging.dir_beside(out, "saving")
    try:
        files = {}
        for name, state in weights.items():
            fname = f"weights-{name}.safetensors"
            tensors = {k: v.detach().cpu().contiguous() for k, v in state.items()}
            save_file(tensors, str(tmp / fname), metadata={"cyto": __version__})
            files[fname] = sha256_file(tmp / fname)
        if scorer:
            np.savez(tmp / "scorer.npz", **{k: np.asarray(v) for k, v in scorer.items()})
            files["scorer.npz"] = sha256_file(tmp / "scorer.npz")
        if cells is not None:
            np.save(tmp / TRAINING_CELLS, np.unique(np.asarray(cells, dtype=np.uint64)))
            files[TRAINING_CELLS] = sha256_file(tmp / TRAINING_CELLS)
        full = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **manifest,
            "score_direction": "higher = more abnormal",
            "libraries": library_versions(),
            "files": files,
        }
        (tmp / MANIFEST).write_text(_manifest_text(full))
        _readable_by_all(tmp)
        if overwrite and out.exists():
            shutil.rmtree(out)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished bundle to ``out``. Another run that wrote ``out`` meanwhile (the same
    ``cyto train`` in two terminals) keeps its bundle, and this one is kept beside it, named."""
    try:
        os.replace(tmp, out)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        kept = out.with_name(f"{out.stem}-{os.getpid()}{out.suffix}")
        os.replace(tmp, kept)
        raise BundleError(
            f"{out} was written by another run while this one ran, and is left as that run "
            f"wrote it; this run's model is kept as {kept}"
        ) from exc


def _readable_by_all(folder: Path) -> None:
    """The modes a plain ``mkdir`` and ``open`` would give under the user's umask: mkdtemp makes
    the folder 0700 and safetensors writes 0600, which other users of a shared workstation
    cannot read."""
    umask = staging.umask()
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        if f.is_file():
            f.chmod(0o666 & ~umask)


def _canonical_sha256(manifest: dict[str, Any]) -> str:
    body = {k: v for k, v in manifest.items() if k != SEAL}
    text = json.dumps(
        json.loads(json.dumps(body, default=_json)), sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _manifest_text(manifest: dict[str, Any], seal: bool = True) -> str:
    """The manifest as written: sealed with the checksum of its canonical form, made of what is
    written (a number that is not finite as ``null``, so that what is read back holds the seal;
    an older manifest's ``NaN`` is read back as written, and its seal holds as before)."""
    body = finite({k: v for k, v in manifest.items() if k != SEAL})
    if seal:
        body[SEAL] = _canonical_sha256(body)
    return json_text(body, indent=2, sort_keys=True, default=_json)


def _json(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _manifest_file(path: Path) -> Path:
    """``PATH/manifest.json``, or the error that says what PATH is instead."""
    if not path.exists():
        raise BundlePathError(
            f"model bundle {path} does not exist (expected NAME.cyto/ with {MANIFEST}); train "
            f"one with {_train_words()}"
        )
    if not path.is_dir():
        if (path.parent / MANIFEST).is_file():  # a file of a bundle (its encoder.onnx)
            raise BundlePathError(
                f"{path} is a file of the model bundle {path.parent}: give the bundle folder "
                f"{path.parent}"
            )
        if _is_archive(path):  # a bundle sent zipped (hostile round 54, 8)
            raise BundlePathError(
                f"{path} is an archive, not a model bundle folder: unpack it and give the "
                "NAME.cyto folder it holds"
            )
        raise BundlePathError(
            f"{path} is not a model bundle folder (expected NAME.cyto/ with "
            f"{MANIFEST}); train one with {_train_words()}"
        )
    mf = path / MANIFEST
    if not mf.is_file():
        # the folder an archive was unpacked into, holding the bundle (one or two down), or a
        # folder of bundles (hostile round 55, 10)
        inside = sorted(path.glob(f"*/{MANIFEST}")) or sorted(path.glob(f"*/*/{MANIFEST}"))
        if len(inside) == 1:
            raise BundlePathError(
                f"{path} has no {MANIFEST}: the model bundle is the folder in it, give "
                f"{inside[0].parent}"
            )
        if inside:
            shown_bundles = ", ".join(str(m.parent) for m in inside[:4])
            raise BundlePathError(
                f"{path} has no {MANIFEST}: it holds {len(inside)} model bundles "
                f"({shown_bundles}{', ...' if len(inside) > 4 else ''}): give one of them"
            )
        raise BundleError(f"{path} has no {MANIFEST}: not a cyto model bundle")
    return mf


def _train_words() -> str:
    """How a caller trains a bundle: 'cyto train' at the command line, cyto.train from Python
    (a Python caller was told the command: hostile round 56, 3)."""
    from cyto.flags import python_call

    return "cyto.train" if python_call() else "'cyto train'"


def _is_archive(path: Path) -> bool:
    """Whether the file ``path`` is a zip or tar archive (by its bytes, not its name)."""
    import tarfile
    import zipfile

    try:
        return zipfile.is_zipfile(path) or tarfile.is_tarfile(path)
    except OSError:
        return False


#: what mends a manifest edited or damaged: nothing cyto runs (cyto export is checked against
#: the manifest, and would refuse it with this very line)
MANIFEST_REPAIR = (
    "restore the bundle from a copy, or train it again (no cyto command mends a manifest: "
    "every step is checked against it)"
)


def read_manifest(path: Path) -> dict[str, Any]:
    path = Path(path)
    mf = _manifest_file(path)
    try:
        manifest = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        # a copy cut short (an interrupted rsync) ends mid-way: said as what it likely is
        raise BundleError(
            f"{mf} is not valid JSON ({exc}): a copy cut short or an edit; copy the bundle again "
            "from where it was made"
        ) from exc
    if not isinstance(manifest, dict):
        raise BundleError(f"{mf} is not a JSON object: not a cyto bundle manifest")
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{path} is not a cyto bundle (format {manifest.get('format')!r})")
    version = manifest.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BundleError(
            f"{mf}: format_version must be a positive whole number, got {version!r} "
            "(the manifest is damaged)"
        )
    if version > FORMAT_VERSION:
        raise BundleError(
            f"{path} uses bundle format {version}, newer than this cyto "
            f"({__version__}) reads ({FORMAT_VERSION}); upgrade cyto"
        )
    if SEAL not in manifest and version not in UNSEALED_VERSIONS:
        raise BundleError(
            f"{mf} has no {SEAL}: a format-{version} manifest is always sealed, so this one was "
            f"edited by hand; {MANIFEST_REPAIR}"
        )
    if SEAL not in manifest:  # an older format that did not seal its manifest
        from cyto.errors import UnsealedBundleWarning

        warn_caller(
            f"{path} is an unsealed format-{version} bundle: an edit to its manifest cannot "
            f"be detected. If it is as you trained it, seal it: cyto info {as_arg(path)} --seal",
            UnsealedBundleWarning,
        )
    if SEAL in manifest and manifest[SEAL] != _canonical_sha256(manifest):
        raise BundleError(
            f"{mf} does not match its own checksum ({SEAL}): the manifest was edited or "
            f"corrupted after it was written; {MANIFEST_REPAIR}"
        )
    return manifest


@contextlib.contextmanager
def bundle_lock(path: Path, exclusive: bool) -> Iterator[None]:
    """``flock`` on ``PATH/.lock``: a writer's is exclusive, so two runs that add to one bundle
    at once (``cyto export --precision int8`` in one terminal, ``cyto calibrate`` in another)
    each add to what the other left, and a reader's is shared, so it never sees a manifest and
    its files half changed. A reader that may not write the lock file (another user's bundle)
    locks it read-only; where it cannot be made at all (a read-only copy: nothing can write
    there) a reader reads without it, and on a file system that cannot lock (NFS without its
    lock daemon) both go on unlocked, as before bundles had locks."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: the atomic renames still hold
        yield
        return
    fh = None
    for mode in ("a+",) if exclusive else ("a+", "r"):
        try:
            fh = open(Path(path) / LOCK, mode)  # noqa: SIM115 - held for the whole block
            break
        except OSError:
            if exclusive:
                raise
    if fh is None:
        yield
        return
    with fh:
        flock_or_not(fh, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)  # False: NFS without lockd
        yield


def verify_bundle(path: Path) -> dict[str, Any]:
    """Check every listed file's sha256; returns the manifest."""
    path = Path(path)
    _entered(path)  # a missing or foreign folder is its own error, before any lock file
    with bundle_lock(path, exclusive=False):
        return _verified(path)


#: the bundle files the step running now writes again (cyto export its graphs and golden
#: cells, cyto calibrate --overwrite the calibration): a damaged or missing copy of one of them
#: is no reason to refuse the very step that repairs it (:func:`rewriting`)
_REWRITING: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "cyto_bundle_rewriting", default=frozenset()
)


@contextlib.contextmanager
def rewriting(names: Iterable[str]) -> Iterator[None]:
    """Bundles are loaded, inside, without holding ``names`` to their checksums: the caller
    writes them again (and :func:`add_files` seals what it writes)."""
    token = _REWRITING.set(_REWRITING.get() | frozenset(names))
    try:
        yield
    finally:
        _REWRITING.reset(token)


def repair_words(path: Path, name: str, manifest: dict[str, Any]) -> str:
    """The step that writes the bundle file ``name`` again, which runs on a bundle whose copy
    of it is damaged or missing (:func:`rewriting`); what was trained cannot be remade."""
    if name == CALIBRATION_FILE:
        return f"calibrate it again: cyto calibrate {as_arg(path)} NEGATIVE_SCORES... --overwrite"
    from cyto.flags import export_words  # in the caller's words (Python's: round 56, 3)

    if name == ONNX_FILE:
        return f"export it again: {export_words(path)}"
    if name == "golden.npz":  # the cells it held are gone with it: real ones, given again
        return f"export it again with real cells: {export_words(path, cells='cells')}"
    entries = {e.get("file"): (k, e) for k, e in _graph_entries(manifest).items()}
    made = {f: str(e.get("precision", k)) for f, (k, e) in entries.items()}
    if name in made:
        precision = made[name].split("-")[0]
        if made[name].startswith("int8"):
            # the classes it was calibrated on, as given then (all, when none were named)
            classes = (entries[name][1].get("quantization") or {}).get("classes") or []
            given = {"calib_class": ",".join(classes)} if classes else {}
            return f"export it again: {export_words(path, precision, 'calib', **given)}"
        if (manifest.get("golden") or {}).get("kind") != "cells":
            # fp16 measures its parity on the golden cells only when they are real cells
            return f"export it again: {export_words(path, precision, 'parity_cells')}"
        return f"export it again: {export_words(path, precision)}"
    return "restore the bundle from a copy, or train it again"


def _verified(
    path: Path,
    rewritten: frozenset[str] | None = None,
    set_aside: dict[str, SetAside] | None = None,
) -> dict[str, Any]:
    """The manifest of the bundle at ``path``, every file it lists held to its checksum but
    ``rewritten`` (None: those of :func:`rewriting`). ``set_aside`` (a dict to fill): a damaged
    or missing fp16 or int8 graph is put there by its precision key, not refused."""
    manifest = read_manifest(path)
    files = manifest.get("files", {})
    skip = _REWRITING.get() if rewritten is None else rewritten
    optional = {e.get("file"): key for key, e in _graph_entries(manifest).items() if key != "fp32"}
    for name, digest in files.items():
        f = path / name
        if Path(name).name != name:
            raise BundleError(f"{path}: manifest lists a file outside the bundle: {name!r}")
        if name in skip:
            continue
        problem = _file_problem(f, digest)
        if problem is None:
            continue
        repair = repair_words(path, name, manifest)
        if f.is_dir() and not f.is_symlink():  # the export refuses a folder in the way
            repair = f"remove it (rm -r {as_arg(f)}), then {repair}"
        if set_aside is not None and name in optional:
            set_aside[optional[name]] = SetAside(path, problem, repair)
            continue
        raise BundleError(f"{path}: {problem}; {repair}")
    return manifest


def _file_problem(f: Path, digest: str) -> str | None:
    """What is wrong with the bundle file ``f`` against its checksum ``digest`` (None: it
    matches), said as what stands there (a folder was called missing, an empty copy only a
    checksum: hostile round 54, 7)."""
    name = f.name
    if f.is_dir():
        return f"{name} is a folder, not the file it should be (the bundle is incomplete)"
    if not f.is_file():
        return f"{name} is missing (the bundle is incomplete)"
    actual = sha256_file(f)
    if actual == digest:
        return None
    if f.stat().st_size == 0:
        return f"{name} is empty (0 bytes: a copy cut short?), not the file it should be"
    return (
        f"{name} does not match its checksum (expected {digest[:12]}..., got "
        f"{actual[:12]}...): the file was changed or corrupted"
    )


@dataclass(frozen=True)
class SetAside:
    """A bundle's fp16 or int8 graph that failed its checksum (or is missing) where the bundle
    was loaded to score (``load_bundle(..., for_scoring=True)``): every file a run uses is still
    held to its checksum, so the bundle scores with its intact graphs and this one is passed
    over with a warning, or refused in these words where it was asked for by name."""

    path: Path
    problem: str
    repair: str

    def refusal(self) -> str:
        return f"{self.path}: {self.problem}; {self.repair}"

    def warning(self, precision: str, instead: str | None = None) -> str:
        """The warning of a run that passes it over; ``instead``: the graph of the same
        precision (another CPU int8 form) that scores in its place."""
        scores = f"{instead} scores in its place" if instead else "the intact ones score"
        return (
            f"{self.path}: {self.problem}; its {precision} graph is passed over and {scores}; "
            f"{self.repair}, or leave it out for good: cyto info {as_arg(self.path)} "
            f"--drop-graph {precision}"
        )


def load_bundle(path: Path, weights: bool = True, for_scoring: bool = False) -> Bundle:
    """Verify and load a bundle: tensors as torch tensors (safetensors), arrays without pickle.

    ``weights=False`` verifies every checksum but leaves the tensors out (and torch unimported):
    the exported ONNX path needs only the manifest and the scorer arrays. ``for_scoring``: a
    damaged or missing fp16 or int8 graph does not refuse the bundle; it is left out of its
    graphs (:attr:`Bundle.set_aside`), and what scores is still held to its checksum. Steps
    that write into the bundle (export, calibrate) load it whole.
    """
    path = Path(path)
    _entered(path)
    with bundle_lock(path, exclusive=False):  # the files as the manifest lists them
        return _load_verified(path, weights, for_scoring)


def _load_verified(path: Path, weights: bool, for_scoring: bool = False) -> Bundle:
    set_aside: dict[str, SetAside] = {}
    manifest = _verified(path, set_aside=set_aside if for_scoring else None)
    bundle = Bundle(path=path, manifest=manifest, set_aside=set_aside)
    bundle.manifest_hash  # noqa: B018 (kept as loaded, under the lock: Bundle.manifest_hash)
    for name in HELD_AT_LOAD:  # what a loaded model scores with later, as it was loaded
        # (not a file a step is writing anew: unchecked at load, it is not read from there)
        if name in manifest["files"] and name not in _REWRITING.get():
            bundle.held[name] = read_checked(path / name, manifest["files"][name], "changed")
    for name in manifest["files"] if weights else ():
        if name.startswith("weights-") and name.endswith(".safetensors"):
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                bundle.weights[name[len("weights-") : -len(".safetensors")]] = load_file(
                    str(path / name)
                )
            except SafetensorError as exc:
                raise BundleError(f"{path / name} is not a valid safetensors file: {exc}") from exc
    if "scorer.npz" in manifest["files"]:
        try:
            with np.load(path / "scorer.npz", allow_pickle=False) as z:
                bundle.scorer = {k: z[k] for k in z.files}
        except ValueError as exc:
            raise BundleError(f"{path / 'scorer.npz'} cannot be read without pickle") from exc
    return bundle


def add_files(
    path: Path,
    new: dict[str, Path],
    manifest_update: dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Add (or replace) files in a bundle, update the manifest's checksums and fields.

    ``manifest_update`` is the fields to set, or a function of the manifest as it is now that
    returns them: a field that merges (the quantized graphs) must be built from the manifest
    read under the lock, not from one read when the export began, or another run's addition is
    lost. An unsealed (format 1) bundle stays format 1: sealing it now would vouch for edits
    made before."""
    path = Path(path)
    _entered(path)
    with bundle_lock(path, exclusive=True):
        # what is replaced may be damaged, and so may what the step running now writes next
        # (cyto export seals its fp32 graph before it writes the fp16 one again: rewriting)
        manifest = _verified(path, frozenset(new) | _REWRITING.get())
        sealed = SEAL in manifest
        update = manifest_update(manifest) if callable(manifest_update) else manifest_update
        manifest.update(update or {})
        refuse_folders_in_place(path, [*new, *manifest["files"]])  # before any is written
        kept = []
        for name, src in new.items():
            if Path(src).resolve() != (path / name).resolve():
                kept += _keep_previous(path, name, manifest["files"])
                atomic_write(path / name, Path(src).read_bytes())
            manifest["files"][name] = sha256_file(path / name)
        _write_manifest(path, manifest, sealed)
        for previous in kept:  # the manifest names the new files now
            previous.unlink(missing_ok=True)
    return manifest


def _previous(path: Path, name: str) -> Path:
    """Where :func:`add_files` keeps the file ``name`` it replaces until the manifest names the
    new one: hidden beside it (``.calibration.npz.prev``)."""
    target = Path(path) / name
    return target.with_name(f".{target.name}{PREVIOUS}")


#: the suffix of a replaced bundle file kept until its step's manifest is written
PREVIOUS = ".prev"


def _keep_previous(path: Path, name: str, listed: dict) -> list[Path]:
    """Keep the file ``name`` that is about to be replaced, when the manifest lists it, as a
    second link to its bytes (:func:`_previous`): a step killed after the new file was renamed
    into place and before the manifest was written left the manifest naming bytes no longer
    there (a ``cyto calibrate --overwrite`` killed so lost the calibration it replaced and left
    the bundle refused: hostile round 65, 1); :func:`_recover_interrupted` puts it back."""
    target = Path(path) / name
    if name not in listed or not target.is_file() or target.is_symlink():
        return []
    previous = _previous(path, name)
    previous.unlink(missing_ok=True)
    try:
        os.link(target, previous)
    except OSError:  # a file system without hard links: a copy
        shutil.copy2(target, previous)
    return [previous]


def _entered(path: Path) -> None:
    """Before a step takes a bundle's lock: the folder is a bundle (:func:`_manifest_file`), and
    what a step stopped inside :func:`add_files` left is undone (:func:`_recover_interrupted`)."""
    _manifest_file(path)
    _recover_interrupted(path)


def _recover_interrupted(path: Path) -> None:
    """Undo what a step stopped inside :func:`add_files` left: each replaced file kept
    (:func:`_previous`) goes back in place where the manifest still names its bytes (the step
    died before it wrote the manifest), said once; otherwise (it died after) it is removed.
    Under the bundle's exclusive lock; a bundle that cannot be locked for writing (a read-only
    copy) is left as it is, its checksums saying what is wrong."""
    path = Path(path)
    kept = sorted(path.rglob(f".*{PREVIOUS}"))
    if not kept:
        return
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(bundle_lock(path, exclusive=True))
        except OSError:
            return
        listed = read_manifest(path).get("files", {})
        restored = []
        for previous in kept:
            if not previous.is_file():  # another process undid it while this one waited
                continue
            target = previous.with_name(previous.name[1 : -len(PREVIOUS)])
            name = target.relative_to(path).as_posix()
            want = listed.get(name)
            now = sha256_file(target) if target.is_file() else None
            try:
                if want is not None and now != want and sha256_file(previous) == want:
                    os.replace(previous, target)
                    restored.append(name)
                else:
                    previous.unlink(missing_ok=True)
            except OSError:  # left as it is: the checksums say what is wrong
                continue
        if restored:
            warn_caller(
                f"{path}: a cyto step stopped as it replaced {', '.join(restored)} (before it "
                "recorded the new one in the manifest): the earlier file is back in place; run "
                "the step again"
            )


def refuse_folders_in_place(path: Path, names: Iterable[str] = ()) -> None:
    """Refuse, in one line, a folder where the bundle at ``path`` keeps, or is to be given, one
    of its files (``names``: those its manifest lists, those a step adds; and the graphs and
    cells an export writes): the write would end in a raw ``IsADirectoryError``, after the
    export's work (hostile round 54, 2 and 55, 5)."""
    path = Path(path)
    written = {p.name for p in path.glob("encoder*.onnx")} | {"golden.npz", CALIBRATION_FILE}
    for name in sorted({*names, *written}):
        if (path / name).is_dir() and not (path / name).is_symlink():
            raise BundleError(
                f"{path}: {name} is a folder, not the file it should be: remove it "
                f"(rm -r {as_arg(path / name)}) and run this again"
            )


class Staged:
    """Files (and manifest fields) prepared for a bundle and added to it in one
    :func:`add_files` when :func:`staged_files` ends without an error: a graph and the golden
    cells that verify it are sealed together or not at all (an export killed between the two
    used to leave a graph in the seal that nothing could check)."""

    def __init__(self, path: Path, folder: Path) -> None:
        self.path, self.folder = Path(path), Path(folder)
        self.files: dict[str, Path] = {}
        self.fields: dict[str, Any] = {}

    def file(self, name: str) -> Path:
        """Where to write the staged file ``name`` (kept once :meth:`add` names it)."""
        return self.folder / name

    def add(self, name: str, fields: dict[str, Any]) -> None:
        self.files[name] = self.file(name)
        self.fields.update(fields)


@contextlib.contextmanager
def staged_files(path: Path) -> Iterator[Staged]:
    """A :class:`Staged` set for the bundle at ``path``, added in one step at the end."""
    path = Path(path)
    with staging.staged_dir(path, "staged") as tmp:
        stage = Staged(path, tmp)
        yield stage
        if stage.files:
            add_files(path, stage.files, stage.fields)


def atomic_write(path: Path, data: bytes) -> None:
    """``path`` holds ``data`` at once, or is left as it was: written beside it, synced and
    renamed. Its mode is what a plain ``open`` gives under the umask (mkstemp's 0600 would hide
    it from the other users of a shared workstation)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~staging.umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def temp_dir_beside(path: Path) -> Path:
    """A new empty folder beside ``path`` (``.NAME.partial-PID@HOST-XXXX``: :mod:`cyto.staging`)
    to build it in, then rename into place, with the mode a plain ``mkdir`` gives."""
    return staging.dir_beside(path, "partial")


def clear_temp_dirs_beside(path: Path) -> None:
    """Remove the :func:`temp_dir_beside` folders of ``path`` that runs killed outright
    (SIGKILL, power loss) left. Call it only while holding the lock every writer of ``path``
    holds, so no live run's folder is among them."""
    path = Path(path)
    for stale in path.parent.glob(f".{path.name}.partial-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _write_manifest(path: Path, manifest: dict[str, Any], seal: bool) -> None:
    atomic_write(path / MANIFEST, _manifest_text(manifest, seal=seal).encode())


def drop_graphs(path: Path, precisions: Iterable[str]) -> Dropped:
    """Leave the fp16 / int8 graphs of ``precisions`` (``int8``: every int8 form; ``int8-cpu``:
    that form) out of the bundle for good: their manifest entries go, the manifest is sealed
    again, then their files are removed; every other file is still held to its checksum. For a
    copy made without them (a run warned of each on every run: hostile round 54, 9). Returns
    what was left out (:class:`Dropped`). The fp32 graph, which the others are made from, stays."""
    import warnings

    from cyto.errors import ConfigError, UnsealedBundleWarning

    path = Path(path)
    asked = [p.strip() for p in precisions if p.strip()]
    if "fp32" in asked:
        raise ConfigError(
            f"{ONNX_FILE} (fp32) is the graph every other one is made from: it cannot be "
            "dropped (cyto export writes it again)"
        )
    _entered(path)
    with warnings.catch_warnings(), bundle_lock(path, exclusive=True):
        # an unsealed bundle is said once, by the command's own look after (it was said thrice)
        warnings.simplefilter("ignore", UnsealedBundleWarning)
        manifest = read_manifest(path)
        variants = manifest.get("onnx_variants") or {}

        def of(precision: str) -> list[str]:
            return [k for k in variants if of_precision(k, precision)]

        unknown = [p for p in asked if not of(p)]
        if unknown:
            have = ", ".join(sorted(variants)) or "none but fp32"
            raise ConfigError(f"{path} has no {unknown[0]} graph to drop (its graphs: {have})")
        keys = sorted({k for p in asked for k in of(p)})
        files = [str(variants[k].get("file")) for k in keys]
        # the rest as sealed, but another damaged optional graph, which stays listed (each
        # drop refused for the other's damage: hostile round 55, 2)
        manifest = _verified(path, frozenset(files), set_aside={})
        for key in keys:
            del manifest["onnx_variants"][key]
        if not manifest["onnx_variants"]:
            del manifest["onnx_variants"]
        for name in files:
            manifest["files"].pop(name, None)
        _write_manifest(path, manifest, seal=SEAL in manifest)
        folders = []
        for name in files:  # after the manifest: a file left by a crash is listed nowhere
            if (path / name).is_file() or (path / name).is_symlink():
                (path / name).unlink()
            elif (path / name).is_dir():  # not cyto's to remove: said
                folders.append(path / name)
    return Dropped(files, SEAL in manifest, folders)


@dataclass(frozen=True)
class Dropped:
    """What :func:`drop_graphs` left out: the files, whether the manifest is sealed (an older
    unsealed bundle stays unsealed), and folders that stood in their place (left there)."""

    files: list[str]
    sealed: bool
    folders: list[Path]

    def words(self, path: Path) -> str:
        text = f"{path}: left out {', '.join(self.files)}; " + (
            "sealed again"
            if self.sealed
            else f"the bundle stays unsealed (cyto info {as_arg(path)} --seal seals it)"
        )
        for folder in self.folders:
            text += f"; the folder in its place is left: remove it (rm -r {as_arg(folder)})"
        return text


def seal_bundle(path: Path) -> bool:
    """Seal an older unsealed bundle as it is now: every listed file's checksum is verified, and
    the manifest gets the current format and its seal. Vouches for the manifest as it reads
    today, so the user checks it first (``cyto info``). A sealed bundle is left as it is.
    Returns whether it was sealed now."""
    import warnings

    from cyto.errors import UnsealedBundleWarning

    path = Path(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsealedBundleWarning)
        _entered(path)
        with bundle_lock(path, exclusive=True):
            manifest = _verified(path)
            if SEAL in manifest:
                return False
            manifest["format_version"] = FORMAT_VERSION
            _write_manifest(path, manifest, seal=True)
    return True
