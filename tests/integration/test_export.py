"""Export: ONNX Runtime scores equal PyTorch scores for all five methods (uint8 in, final score
out), numba kernels equal their references, TensorRT logic around the build."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from cyto.bundle import load_bundle, save_bundle
from cyto.errors import ConfigError, MissingDependencyError
from cyto.export import kernels
from cyto.export.onnx import OnnxScorer, export_onnx
from cyto.export.trt import BatchProfile, calibration_batches, engine_name, require_tensorrt
from cyto.models.from_bundle import load_scorer
from cyto.train.registry import method_names
from tests.train_helpers import make

HAS_TRT = importlib.util.find_spec("tensorrt") is not None


@pytest.fixture(scope="module")
def bundles(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("bundles")
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


@pytest.fixture(scope="module")
def patches(request):
    """Real bone-marrow cells when the shared data are there, else synthetic ones."""
    from cyto.data.images import read_image
    from tests.conftest_paths import shared_bone_marrow

    bm = shared_bone_marrow()
    if bm is not None:
        files = sorted((bm / "LYT").glob("*.jpg"))[:12] + sorted((bm / "BLA").glob("*.jpg"))[:12]
        return np.stack([read_image(f) for f in files])  # 250 x 250, resized in the graph
    tiny = request.getfixturevalue("tiny")
    return tiny.images[:24]


@pytest.mark.parametrize("name", ["droc", "dsvdd", "fs-sil", "its2clr", "ws-sil"])
def test_onnx_runtime_equals_pytorch(bundles, patches, name):
    torch_scores = load_scorer(bundles[name]).score(patches)
    ort_scores = OnnxScorer.open(bundles[name]).score(patches, batch_size=7)
    np.testing.assert_allclose(ort_scores, torch_scores, rtol=1e-4, atol=1e-5)
    assert np.std(ort_scores) > 0


def test_manifest_records_the_export(bundles):
    b = load_bundle(bundles["dsvdd"])
    assert "encoder.onnx" in b.manifest["files"]
    assert b.manifest["onnx"]["input"] == {
        "name": "patches",
        "dtype": "uint8",
        "layout": "NHWC",
        "shape": ["N", "H", "W", 3],
    }
    assert b.manifest["onnx"]["opset"] == 18


def test_changed_onnx_byte_is_refused(bundles, tmp_path):
    import shutil

    from cyto.errors import BundleError

    copy = tmp_path / "c.cyto"
    shutil.copytree(bundles["fs-sil"], copy)
    raw = bytearray((copy / "encoder.onnx").read_bytes())
    raw[len(raw) // 2] ^= 1
    (copy / "encoder.onnx").write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="encoder.onnx does not match"):
        OnnxScorer.open(copy)


def test_dsvdd_kernel_equals_the_pytorch_scorer(bundles, patches):
    import torch

    scorer = load_scorer(bundles["dsvdd"])
    with torch.no_grad():
        emb = scorer.module.embeddings(torch.from_numpy(patches)).numpy()
        ref = scorer.module(torch.from_numpy(patches)).double().numpy()
    b = load_bundle(bundles["dsvdd"])
    got = kernels.dsvdd_scores(emb, b.scorer["centres"], b.manifest["tta_lambda"])
    np.testing.assert_allclose(got, ref, rtol=1e-5)
    np.testing.assert_allclose(
        got, kernels.dsvdd_scores_ref(emb, b.scorer["centres"], b.manifest["tta_lambda"]), rtol=1e-9
    )


def test_kernels_equal_their_references_and_sklearn():
    from sklearn.svm import OneClassSVM

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(3, 4, 50, 16)).astype(np.float32)
    centres = rng.normal(size=(3, 16)).astype(np.float32)
    np.testing.assert_allclose(
        kernels.dsvdd_scores(emb, centres, 0.35),
        kernels.dsvdd_scores_ref(emb, centres, 0.35),
        rtol=1e-10,
    )
    train = rng.normal(size=(300, 32))
    svm = OneClassSVM(kernel="rbf", nu=0.1, gamma="auto").fit(train)
    q = rng.normal(size=(257, 32))
    args = (svm.support_vectors_, svm.dual_coef_.ravel(), svm._gamma, -svm.intercept_[0])
    got = kernels.ocsvm_scores(q, *args, chunk=64)
    np.testing.assert_allclose(got, -svm.decision_function(q), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(got, kernels.ocsvm_scores_ref(q, *args), rtol=1e-9, atol=1e-10)
    logits = rng.normal(size=(40, 2)).astype(np.float32) * 30
    np.testing.assert_allclose(
        kernels.softmax_abnormal(logits), kernels.softmax_abnormal_ref(logits), rtol=1e-12
    )


def test_batch_profile_and_engine_names():
    p = BatchProfile.parse("1,64,256")
    assert (p.min, p.opt, p.max) == (1, 64, 256)
    for bad in ("64,1,256", "0,1,2", "1,2", "a,b,c"):
        with pytest.raises(ConfigError):
            BatchProfile.parse(bad)
    name = engine_name("NVIDIA H100 80GB HBM3", (9, 0), "10.7.0", "fp16", p, (192, 192))
    assert name == "engine-nvidia-h100-80gb-hbm3-sm90-trt10.7.0-fp16-b1-64-256-192x192.plan"
    assert engine_name("NVIDIA H100 80GB HBM3", (9, 0), "10.7.0", "int8", p, (192, 192)) != name
    with pytest.raises(ConfigError, match="precision"):
        engine_name("x", (8, 0), "10", "bf8", p, (1, 1))


def test_calibration_batches():
    imgs = np.zeros((70, 8, 8, 3), np.uint8)
    batches = calibration_batches(imgs, 32)
    assert [b.shape[0] for b in batches] == [32, 32]
    with pytest.raises(ConfigError, match="at least 32"):
        calibration_batches(imgs[:10], 32)


@pytest.mark.skipif(HAS_TRT, reason="tensorrt is installed here")
def test_missing_tensorrt_is_one_clear_error(bundles):
    with pytest.raises(MissingDependencyError, match=r"pip install 'cyto\[gpu\]'"):
        require_tensorrt()
    from tests.unit.test_cli import run_cyto

    proc = run_cyto("export", str(bundles["fs-sil"]), "--no-onnx", "--trt")
    assert proc.returncode != 0
    assert "tensorrt" in proc.stderr and "cyto[gpu]" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TRT, reason="needs the tensorrt package and an NVIDIA GPU")
def test_tensorrt_engine_matches_onnx_runtime(bundles, patches):  # pragma: no cover - GPU only
    from cyto.export.api import export_bundle

    rep = export_bundle(bundles["fs-sil"], onnx=False, trt=True, batch="1,8,32")
    assert rep["trt"]["spearman"] > 0.99


def test_export_cli_and_info(bundles, tmp_path):
    import shutil

    from tests.unit.test_cli import run_cyto

    copy = tmp_path / "w.cyto"
    shutil.copytree(bundles["ws-sil"], copy)
    proc = run_cyto("export", str(copy))
    assert proc.returncode == 0, proc.stderr
    assert "opset 18" in proc.stdout and "max relative difference" in proc.stdout
    rel = float(proc.stdout.split("max relative difference")[1].split()[0])
    assert rel < 1e-4
    info = run_cyto("info", str(copy))
    assert "onnxruntime: ready" in info.stdout and "encoder.onnx" in info.stdout


def test_predict_without_labels(bundles, tiny, tmp_path):
    import pyarrow.parquet as pq
    from PIL import Image

    from tests.unit.test_cli import run_cyto

    folder = tmp_path / "cells" / "unknown"
    folder.mkdir(parents=True)
    for i in range(5):
        Image.fromarray(tiny.images[i]).save(folder / f"c{i}.png")
    out = tmp_path / "s.parquet"
    proc = run_cyto(
        "predict", str(bundles["dsvdd"]), "--data", str(tmp_path / "cells"), "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    table = pq.read_table(out)
    assert table.num_rows == 5 and "label" not in table.column_names
