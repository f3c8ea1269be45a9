"""Shared fixtures. Real data is reached at ../shared/data (or $CYTO_SHARED_DATA) and tests that
need it skip with the reason when it is absent; capability markers skip on what the installed
libraries can do, never on guesses."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import pickle
import shutil
import tempfile
from pathlib import Path

import pytest

# openslide-python must load its own libopenslide before pyvips loads the system one (libvips42
# links OpenSlide 3.4); the other order leaves openslide-python bound to the older library.
if importlib.util.find_spec("openslide") is not None:
    import openslide  # noqa: F401

os.environ.setdefault("CYTO_PROGRESS", "0")

# What the runs of a test session leave outside their own folders goes to one temporary folder,
# removed when the session ends: Ray's sessions and its record of the current cluster (a record
# naming a dead head made a user's next `cyto score --ray auto` fail), and cyto's cache
# (verification results, numba kernels). Subprocesses inherit it.
SESSION_TMP = tempfile.mkdtemp(prefix="cyto-test-")
os.environ["RAY_TMPDIR"] = SESSION_TMP
os.environ["CYTO_CACHE_DIR"] = os.path.join(SESSION_TMP, "cache")
os.environ["NUMBA_CACHE_DIR"] = os.path.join(SESSION_TMP, "cache", "numba")
# The GCS tests run an emulator (fake-gcs-server), which speaks the JSON API only; gcsfs reads
# whether to probe buckets over gRPC when it is imported, and a test before them may import it
# (reading a storage option's store), which made their first call wait for good. cyto sets it
# where it imports gcsfs while STORAGE_EMULATOR_HOST is set (cyto.slides.remote._before_gcsfs);
# here it is set before any test can import gcsfs.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from tests.conftest_paths import SHARED_DATA  # noqa: E402 - after the openslide import above


@pytest.fixture(autouse=True)
def _own_review_registry(tmp_path_factory, monkeypatch):
    """Each test its own registry of blinded reviews (cyto.review.session.registered_reviews):
    the tests' slides and models are made alike, and a review one test leaves unfinished would
    blind another test's view of the same slide, as it would on a user's machine."""
    monkeypatch.setenv(
        "CYTO_REVIEW_REGISTRY", str(tmp_path_factory.mktemp("review-registry", numbered=True))
    )


# Under pytest-xdist (``-n``) the workers share the cores: where there are as many cores as
# workers or more, each worker runs on cores of its own (its processes too: tile workers, `cyto`
# subprocesses, Ray), which every engine counts as its own threads (ONNX Runtime, OpenVINO,
# numba take every core they may run on, and spin waiting for them). Two workers of two threads
# each on 2 cores: the whole suite 470 s, pinned 432 s (epyc-2core, 2026-12-04). PyTorch in each
# worker takes its share of them, not all (two workers of two threads each on 2 shared cores:
# test_train_contract's trainings took 32 and 169 s, 7-10 s in one process).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    _cores = sorted(os.sched_getaffinity(0))
    if len(_cores) >= _workers > 1:
        _own = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")) % _workers
        os.sched_setaffinity(0, set(_cores[_own::_workers]))
        _threads = len(os.sched_getaffinity(0))
    else:
        _threads = max(1, len(_cores) // _workers)
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch.set_num_threads(_threads)

# Property-based tests (Hypothesis): bounded examples, no deadline (2 shared cores time out), and
# no example database in the working tree (a test run leaves no files behind).
if importlib.util.find_spec("hypothesis") is not None:
    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "cyto",
        max_examples=int(os.environ.get("CYTO_HYPOTHESIS_EXAMPLES", "40")),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        derandomize=os.environ.get("CI") == "true",
    )
    settings.load_profile("cyto")


def _has_openslide() -> bool:
    try:
        import openslide

        return bool(openslide.__library_version__)
    except (ImportError, OSError):
        return False


def _pyvips_loaders() -> set[str]:
    try:
        import pyvips
    except (ImportError, OSError):
        return set()
    return {name for name in ("tiffload", "openslideload") if pyvips.type_find("VipsForeign", name)}


def _chromium() -> str | None:
    """The system Chromium that Playwright drives (never a downloaded browser)."""
    if importlib.util.find_spec("playwright") is None:
        return None
    if os.environ.get("CYTO_CHROMIUM"):
        return os.environ["CYTO_CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


HAS_OPENSLIDE = _has_openslide()
PYVIPS_LOADERS = _pyvips_loaders()
CHROMIUM = _chromium()


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(SESSION_TMP, ignore_errors=True)


def _built_once(tmp_path_factory, name: str, build):
    """``build(folder)``'s result, with what it wrote in ``folder``, made once per test run.
    Alone, it is built in a fresh temporary folder. Under pytest-xdist (``-n``), the first worker
    that asks builds it in the run's common temporary folder while holding a lock (the others wait
    for it rather than train the same models again), and each worker copies the folder: a test
    that edits what it was given (a verification cached in a bundle) changes only its worker's
    copy, as it did when every worker built its own. ``build`` returns what the fixture returns,
    pickled; paths in it under ``folder`` are moved to the copy."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        return build(folder)
    shared = tmp_path_factory.getbasetemp().parent / f"built-{name}"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        if not (shared / ".result.pickle").is_file():
            shutil.rmtree(shared, ignore_errors=True)  # a worker died building it
            shared.mkdir()
            result = build(shared)
            (shared / ".result.tmp").write_bytes(pickle.dumps(result))
            (shared / ".result.tmp").rename(shared / ".result.pickle")
    own = tmp_path_factory.mktemp(name)
    shutil.copytree(shared, own, dirs_exist_ok=True)
    result = pickle.loads((own / ".result.pickle").read_bytes())
    (own / ".result.pickle").unlink()
    return _moved(result, shared, own)


def _moved(value, old: Path, new: Path):
    """``value`` with every path under ``old`` in it (in dicts, lists, tuples) under ``new``."""
    if isinstance(value, Path) and value.is_relative_to(old):
        return new / value.relative_to(old)
    if isinstance(value, dict):
        return {k: _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, old, new) for v in value)
    return value


def pytest_collection_modifyitems(config, items):
    skip_os = pytest.mark.skip(reason="openslide-python with a working libopenslide not installed")
    skip_vips = pytest.mark.skip(reason="pyvips cannot load libvips (install libvips42)")
    skip_browser = pytest.mark.skip(
        reason="no Chromium with playwright (apt install chromium; pip install playwright), "
        "or set CYTO_CHROMIUM to a Chromium executable"
    )
    skip_ov = pytest.mark.skip(reason="openvino is not installed (pip install 'cyto[cpu]')")
    has_openvino = importlib.util.find_spec("openvino") is not None
    for item in items:
        if "openvino" in item.keywords and not has_openvino:
            item.add_marker(skip_ov)
        if "openslide" in item.keywords and not HAS_OPENSLIDE:
            item.add_marker(skip_os)
        if "pyvips" in item.keywords and not PYVIPS_LOADERS:
            item.add_marker(skip_vips)
        if "browser" in item.keywords and not CHROMIUM:
            item.add_marker(skip_browser)


@pytest.fixture(scope="session")
def bone_marrow() -> Path:
    path = SHARED_DATA / "bone_marrow"
    if not (path / "LYT").is_dir():
        pytest.skip(f"real bone-marrow data not found at {path} (set CYTO_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def cric() -> Path:
    """Pap-stained cervical cells with Bethesda labels (CRIC Cervix: NILM, ASC-US, LSIL, ASC-H)."""
    path = SHARED_DATA / "cric"
    if not (path / "NILM").is_dir():
        pytest.skip(f"real Pap cells (CRIC) not found at {path} (set CYTO_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def wsi_dir() -> Path:
    path = SHARED_DATA / "wsi"
    if not path.is_dir():
        pytest.skip(f"real slide files not found at {path} (set CYTO_SHARED_DATA)")
    return path


@pytest.fixture(scope="session")
def synth_patches(tmp_path_factory) -> Path:
    """A small synthetic class-folder dataset, drawn once per test session."""
    from cyto.data.synth.patches import PatchSynthConfig, write_patches

    out = tmp_path_factory.mktemp("synth") / "patches"
    write_patches(out, PatchSynthConfig(n_normal=120, n_abnormal=12, seed=3))
    return out


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """48 normal + 24 abnormal cells at 40 px, in 6 bags (3 negative, 3 positive)."""
    import numpy as np

    from cyto.data.dataset import PatchDataset
    from cyto.data.synth.patches import PatchSynthConfig, write_patches
    from cyto.train.data import TrainData

    root = tmp_path_factory.mktemp("tiny") / "p"
    write_patches(
        root,
        PatchSynthConfig(
            n_normal=48,
            n_abnormal=12,
            size=96,
            seed=3,
            abnormal_classes=("enlarged", "multinucleated"),
        ),
    )
    ds = PatchDataset.from_path(root, normal="normal", size=40)
    y = ds.labels
    bags = np.array([f"b{i % 6}" for i in range(len(y))], dtype=object)
    abn = np.flatnonzero(y == 1)
    bags[abn] = [f"b{3 + i % 3}" for i in range(len(abn))]
    bag_labels = np.array([1 if int(b[1]) >= 3 else 0 for b in bags], dtype=np.int8)
    return TrainData(np.asarray(ds.images), y, bags, bag_labels, ds.fingerprint)


@pytest.fixture(scope="session")
def exported_dsvdd(tiny, tmp_path_factory) -> Path:
    """A small Deep SVDD bundle (1 seed, 1 view: a quarter of the four-view network's work per
    cell; ``exported_bundles`` keeps the views) trained on ``tiny`` and exported to ONNX. Like
    one from `cyto train`, it records the training normals' morphometry, so `cyto score` scores
    each cell's morphometric score beside the model's; with no held-back cells recorded, it
    ranks by the model (``--rank-by auto``)."""
    from cyto.bundle import save_bundle
    from cyto.export.onnx import export_onnx
    from cyto.train.api import training_nuclei
    from tests.train_helpers import make

    def build(folder: Path) -> Path:
        m = make("dsvdd", epochs=2, ae_epochs=1, n_seeds=1, tta_views=("orig",)).fit(tiny)
        manifest, tensors, scorer = m.bundle_parts(tiny)
        manifest["training_data"].update(training_nuclei(tiny))
        path = save_bundle(folder / "d.cyto", manifest, tensors, scorer)
        export_onnx(path)
        return path

    return _built_once(tmp_path_factory, "m", build)


@pytest.fixture(scope="session")
def exported_bundles(tiny, tmp_path_factory) -> dict[str, Path]:
    """One small bundle per registered method, trained on ``tiny`` and exported to ONNX."""
    from cyto.bundle import save_bundle
    from cyto.export.onnx import export_onnx
    from cyto.train.registry import method_names
    from tests.train_helpers import make

    def build(root: Path) -> dict[str, Path]:
        out = {}
        for name in method_names():
            extra = {"epochs": 2}
            if name == "dsvdd":
                extra.update(ae_epochs=1, n_seeds=2)
            if name == "its2clr":
                extra.update(agg_epochs=10)
            model = make(name, **extra).fit(tiny)
            out[name] = save_bundle(root / f"{name}.cyto", *model.bundle_parts(tiny))
            export_onnx(out[name])
        return out

    return _built_once(tmp_path_factory, "bundles", build)


@pytest.fixture(scope="session")
def real_slides_scored(wsi_dir, exported_dsvdd, tmp_path_factory) -> dict[str, dict]:
    """Each real slide (SVS, JPEG 2000 SVS, NDPI) scored once with the default (smear) detection
    by the small Deep SVDD bundle, in the main process: name -> {summary, said, folder}."""
    from cyto.infer import ScoreOptions, score_slide
    from cyto.runtime import load_scorer

    def build(root: Path) -> dict[str, dict]:
        scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
        opts = ScoreOptions(mosaic=16, top_k=16, workers=0, tile=512)
        runs = {}
        for path in sorted(p for p in wsi_dir.iterdir() if p.suffix in (".svs", ".ndpi")):
            said: list[str] = []
            summary = score_slide(path, scorer, root / path.stem, opts, said.append)
            runs[path.name] = {"summary": summary, "said": said, "folder": root / path.stem}
        return runs

    return _built_once(tmp_path_factory, "real", build)


@pytest.fixture(scope="session")
def golden_dsvdd(exported_bundles, synth_patches, tmp_path_factory) -> Path:
    """``exported_bundles["dsvdd"]`` with 64 golden cells of the synthetic patches, written (and
    scored by PyTorch) once a session. Never handed to a test: ``golden_bundle`` copies it."""
    from cyto.export.golden import write_golden

    def build(folder: Path) -> Path:
        path = folder / "d.cyto"
        shutil.copytree(exported_bundles["dsvdd"], path)
        write_golden(path, synth_patches, normal="normal", n=64)
        return path

    return _built_once(tmp_path_factory, "golden", build)


@pytest.fixture
def golden_bundle(golden_dsvdd, tmp_path) -> Path:
    """A Deep SVDD bundle (four views) with 64 golden cells of the synthetic patches (normal +
    abnormal), copied for the test: verification can run on it and its cache be edited."""
    path = tmp_path / "d.cyto"
    shutil.copytree(golden_dsvdd, path)
    return path
