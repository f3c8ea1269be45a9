"""Method specifics: Deep SVDD centre, blend and ensemble; DROC loss and OC-SVM; configs;
bad input; bundles that were tampered with."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cyto.bundle import load_bundle, save_bundle, verify_bundle
from cyto.errors import BundleError, ConfigError, DatasetError, DeviceError, TrainingError
from cyto.models.backbones import build_backbone
from cyto.runtime import load_scorer
from cyto.runtime.heads.dsvdd import tta_blend
from cyto.runtime.heads.ocsvm import ocsvm_scores
from cyto.train.config import resolve_config, to_toml
from cyto.train.data import TrainData
from cyto.train.droc import DROCConfig, droc_loss, fold_whitening
from cyto.train.dsvdd import DeepSVDD, DSVDDConfig, clamp_centre
from cyto.train.fssil import FSSIL, SILConfig
from cyto.train.loop import resolve_device
from cyto.train.registry import get_method
from tests.train_helpers import make


def test_centre_clamp_including_exact_zeros():
    c = torch.tensor([0.0, 0.05, -0.05, 0.2, -0.3, -0.0, 0.1])
    out = clamp_centre(c, 0.1)
    assert torch.allclose(out, torch.tensor([0.1, 0.1, -0.1, 0.2, -0.3, 0.1, 0.1]))
    assert (out.abs() >= 0.1).all()


def test_tta_blend_matches_hand_computation():
    d = torch.tensor([[1.0, 4.0], [3.0, 2.0], [2.0, 5.0]])  # views x N, original first
    # cell 0: 1 + 0.35 * (3 - 1) = 1.7 ; cell 1: 4 + 0.35 * (5 - 4) = 4.35
    assert torch.allclose(tta_blend(d, 0.35), torch.tensor([1.7, 4.35]))


@pytest.fixture(scope="module")
def dsvdd(request):
    tiny = request.getfixturevalue("tiny")
    # what these tests read (the seed ensemble, the blend, the encoders' layers, the clamped
    # centres) needs no autoencoder start and one epoch: the start was 80% of the fit
    return make("dsvdd", epochs=1, ae_epochs=0, n_seeds=3).fit(tiny), tiny


def test_dsvdd_score_is_the_mean_over_seeds_of_the_blend(dsvdd):
    model, tiny = dsvdd
    d = model.distances(tiny.images[:10])  # seeds x views x N
    assert d.shape == (3, 4, 10)
    lam = model.config.tta_lambda
    per_seed = d[:, 0] + lam * (d.max(axis=1) - d[:, 0])
    np.testing.assert_allclose(model.score(tiny.images[:10]), per_seed.mean(0), rtol=1e-5)
    assert not np.allclose(d[0], d[1])  # seeds really are different networks


def test_dsvdd_has_no_bias_or_batchnorm_shift_in_the_embedding_path(dsvdd):
    model, _ = dsvdd
    for enc in model.encoders_:
        names = [n for n, _ in enc.named_parameters()]
        assert not any(n.endswith("bias") for n in names), names
        for m in enc.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                assert not m.affine
    for name in ("resnet18", "smallcnn"):
        net = build_backbone(name, 8, bias=False)
        assert not any(n.endswith("bias") for n, _ in net.named_parameters())


def test_dsvdd_centres_are_clamped(dsvdd):
    model, _ = dsvdd
    assert (model.centres_.abs() >= model.config.eps - 1e-7).all()


def test_dsvdd_collapse_is_caught():
    flat = np.full((24, 40, 40, 3), 128, dtype=np.uint8)
    data = TrainData(flat, np.zeros(24, dtype=np.int8))
    with pytest.raises(TrainingError, match="collapsed"):
        make("dsvdd", epochs=1, ae_epochs=1, n_seeds=1).fit(data)


def _droc_loss_by_hand(z1, z2, a, t, alpha):
    z = torch.nn.functional.normalize(torch.cat([z1, z2]), dim=1).double()
    a = torch.nn.functional.normalize(a, dim=1).double()
    n = z1.shape[0]
    clr = da = 0.0
    for i in range(2 * n):
        p = (i + n) % (2 * n)
        pos = torch.exp(z[i] @ z[p] / t)
        others = sum(torch.exp(z[i] @ z[k] / t) for k in range(2 * n) if k != i)
        extra = sum(torch.exp(z[i] @ a[j] / t) for j in range(n))
        clr += -torch.log(pos / others)
        da += -torch.log(pos / (pos + extra))
    return (clr + alpha * da) / (2 * n)


@pytest.mark.parametrize("t,alpha", [(2.0, 1.0), (0.5, 0.3), (0.1, 2.0)])
def test_droc_loss_matches_an_independent_implementation(t, alpha):
    g = torch.Generator().manual_seed(0)
    z1, z2, a = (torch.randn(5, 7, generator=g) for _ in range(3))
    got = droc_loss(z1, z2, a, t, alpha)
    assert torch.allclose(got.double(), _droc_loss_by_hand(z1, z2, a, t, alpha), rtol=1e-5)


def test_pseudo_abnormal_negatives_raise_the_loss_when_close():
    g = torch.Generator().manual_seed(1)
    z1 = torch.randn(4, 8, generator=g)
    z2 = z1 + 0.01 * torch.randn(4, 8, generator=g)
    far, near = -z1, z1.clone()
    assert droc_loss(z1, z2, near, 0.5, 1.0) > droc_loss(z1, z2, far, 0.5, 1.0)


def test_droc_ocsvm_scores_equal_sklearn(request):
    tiny = request.getfixturevalue("tiny")
    model = make("droc", epochs=1).fit(tiny)
    feats = model.embed(tiny.images).astype(np.float64)
    ref = -model.svm_.decision_function(feats)
    np.testing.assert_allclose(model.score(tiny.images), ref, rtol=1e-7, atol=1e-9)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 6))
    from sklearn.svm import OneClassSVM

    svm = OneClassSVM(kernel="rbf", nu=0.1, gamma="auto").fit(x)
    q = rng.normal(size=(30, 6))
    mine = ocsvm_scores(
        q, svm.support_vectors_, svm.dual_coef_.ravel(), svm._gamma, -svm.intercept_[0], chunk=7
    )
    np.testing.assert_allclose(mine, -svm.decision_function(q), rtol=1e-9, atol=1e-12)


class _LinearEncoder(torch.nn.Module):
    """An encoder that is only its last layer, ``fc``, as every backbone ends."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_whitening_folded_into_the_encoder_equals_ledoit_wolf_whitening():
    from sklearn.covariance import LedoitWolf

    rng = np.random.default_rng(3)
    enc = _LinearEncoder(5, 4)
    h = rng.normal(size=(200, 5)) * [5.0, 1.0, 0.2, 3.0, 0.5]
    with torch.no_grad():
        f = enc(torch.as_tensor(h, dtype=torch.float32)).double().numpy()
    info = fold_whitening(enc, f)
    with torch.no_grad():
        e = enc(torch.as_tensor(h, dtype=torch.float32)).double().numpy()
    lw = LedoitWolf().fit(f)
    evals, evecs = np.linalg.eigh(lw.covariance_)
    ref = (f - lw.location_) @ evecs @ np.diag(evals**-0.5) @ evecs.T
    np.testing.assert_allclose(e, ref, atol=1e-4)
    assert np.abs(e.mean(0)).max() < 1e-4
    # the sample covariance S, shrunk to C = (1 - a) S + a m I, comes out with the variances
    # s / ((1 - a) s + a m): 1 for a = 0, and never above 1 / (1 - a)
    s_eig = np.linalg.eigvalsh(np.cov(f.T, bias=True))
    a, m = info["shrinkage"], s_eig.mean()
    np.testing.assert_allclose(
        np.linalg.eigvalsh(np.cov(e.T, bias=True)),
        np.sort(s_eig / ((1 - a) * s_eig + a * m)),
        rtol=1e-3,
    )


def test_whitening_lets_the_ocsvm_see_a_low_variance_abnormality():
    """What whitening is for: abnormal cells that differ in a direction of little normal variance,
    hidden under large nuisance variance (background, neighbours), are found only after it."""
    from sklearn.metrics import roc_auc_score
    from sklearn.svm import OneClassSVM

    rng = np.random.default_rng(0)
    scale = np.array([10.0, 10.0, 10.0, 10.0, 1.0])
    normal = rng.normal(size=(300, 5)) * scale
    abnormal = rng.normal(size=(100, 5)) * scale
    abnormal[:, 4] += 4.0  # four normal standard deviations, in the quiet direction
    test = np.vstack([rng.normal(size=(100, 5)) * scale, abnormal])
    y = np.r_[np.zeros(100), np.ones(100)]
    enc = _LinearEncoder(5, 5)
    with torch.no_grad():
        enc.fc.weight.copy_(torch.eye(5))
        enc.fc.bias.zero_()

    def auroc():
        with torch.no_grad():
            tr, te = (
                enc(torch.as_tensor(a, dtype=torch.float32)).double().numpy()
                for a in (normal, test)
            )
        svm = OneClassSVM(kernel="rbf", nu=0.1, gamma="auto").fit(tr)
        return roc_auc_score(y, -svm.decision_function(te))

    raw = auroc()
    with torch.no_grad():
        f = enc(torch.as_tensor(normal, dtype=torch.float32)).double().numpy()
    fold_whitening(enc, f)
    assert raw < 0.7 < 0.85 < auroc()


def test_whitening_needs_raw_embeddings():
    with pytest.raises(ConfigError, match="whiten and normalize_embeddings"):
        DROCConfig(whiten=True, normalize_embeddings=True)


def test_config_precedence_preset_file_set(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('epochs = 7\nlr = 0.5\ntta_views = ["orig", "hflip"]\n')
    cfg = resolve_config(DSVDDConfig, "fast", f, ["lr=0.25", "n_seeds=3"])
    assert cfg.backbone == "smallcnn"  # from the preset
    assert cfg.epochs == 7  # the file beats the preset
    assert cfg.lr == 0.25 and cfg.n_seeds == 3  # --set beats the file
    assert cfg.tta_views == ("orig", "hflip")
    back = tmp_path / "back.toml"
    back.write_text(to_toml(cfg))
    assert resolve_config(DSVDDConfig, config_file=back) == cfg  # one-to-one round trip
    # every key --set takes is listed, an unset one as a comment (mpp was left out, though
    # cyto asks for it: hostile round 67, 7)
    assert cfg.mpp is None and "# mpp = (unset: --set mpp=...)" in back.read_text()


def test_yaml_config_maps_onto_the_dataclass_like_toml(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("epochs: 7\nlr: 0.5\ntta_views: [orig, hflip]\nweight_decay: 1.0e-5\n")
    t = tmp_path / "c.toml"
    t.write_text('epochs = 7\nlr = 0.5\ntta_views = ["orig", "hflip"]\nweight_decay = 1.0e-5\n')
    from_yaml = resolve_config(DSVDDConfig, "fast", y, ["n_seeds=3"])
    assert from_yaml == resolve_config(DSVDDConfig, "fast", t, ["n_seeds=3"])
    assert from_yaml.epochs == 7 and from_yaml.tta_views == ("orig", "hflip")
    bad = tmp_path / "bad.yml"
    bad.write_text("epochs: [3\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        resolve_config(DSVDDConfig, config_file=bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- epochs\n- 3\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        resolve_config(DSVDDConfig, config_file=listy)
    typo = tmp_path / "typo.yaml"
    typo.write_text("epoch: 3\n")
    with pytest.raises(ConfigError, match=r"unknown setting 'epoch' \(did you mean epochs\?\)"):
        resolve_config(DSVDDConfig, config_file=typo)


def test_config_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown setting 'epoch' \(did you mean epochs\?\)"):
        resolve_config(DSVDDConfig, overrides=["epoch=3"])
    # a name near none is listed with the known ones, not guessed at (round 26, 11)
    with pytest.raises(ConfigError, match=r"unknown setting 'zzz'; known: backbone"):
        resolve_config(DSVDDConfig, overrides={"zzz": 1})
    with pytest.raises(ConfigError, match="unknown preset"):
        resolve_config(DSVDDConfig, "turbo")
    with pytest.raises(ConfigError, match="--set epochs must be an integer, got .many."):
        resolve_config(DSVDDConfig, overrides=["epochs=many"])
    with pytest.raises(ConfigError, match="backbone"):
        resolve_config(SILConfig, overrides={"backbone": "vgg"})
    with pytest.raises(ConfigError, match="tta_views must start"):
        DSVDDConfig(tta_views=("hflip",))
    with pytest.raises(ConfigError, match="unknown method 'svdd'"):
        get_method("svdd")
    bad = tmp_path / "bad.toml"
    bad.write_text("epochs = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve_config(DROCConfig, config_file=bad)


def test_bad_training_data(tiny):
    only_abnormal = TrainData(tiny.images[tiny.labels == 1], tiny.labels[tiny.labels == 1])
    with pytest.raises(DatasetError, match="no normal images"):
        DeepSVDD(DSVDDConfig(epochs=1, ae_epochs=0, n_seeds=1)).fit(only_abnormal)
    with pytest.raises(DatasetError, match="no normal images"):
        make("droc", epochs=1).fit(only_abnormal)
    one_class = TrainData(tiny.images[tiny.labels == 0], tiny.labels[tiny.labels == 0])
    with pytest.raises(DatasetError, match="both classes"):
        FSSIL(resolve_config(SILConfig, "fast")).fit(one_class)
    with pytest.raises(DatasetError, match="needs bags"):
        make("ws-sil").fit(TrainData(tiny.images, tiny.labels))
    with pytest.raises(DatasetError, match="no training images"):
        TrainData(np.zeros((0, 8, 8, 3), np.uint8))


def test_nan_loss_is_stopped(tiny):
    with pytest.raises(TrainingError, match="loss became"):
        make("fs-sil", lr=1e12, epochs=3).fit(tiny)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_asked_on_a_cpu_machine_is_an_error():
    with pytest.raises(DeviceError, match="CUDA is not available"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"


def test_tampered_or_foreign_bundles_are_refused(tmp_path, request):
    tiny = request.getfixturevalue("tiny")
    model = make("fs-sil", epochs=1).fit(tiny)
    path = save_bundle(tmp_path / "m.cyto", *model.bundle_parts(tiny))
    assert load_bundle(path).method == "fs-sil"
    wfile = path / "weights-net.safetensors"
    raw = bytearray(wfile.read_bytes())
    raw[-1] ^= 0xFF
    wfile.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="does not match its checksum"):
        load_bundle(path)
    raw[-1] ^= 0xFF
    wfile.write_bytes(bytes(raw))
    verify_bundle(path)
    (path / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(BundleError, match="not a cyto bundle"):
        load_bundle(path)
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(tmp_path / "nothing.cyto")
    pickled = tmp_path / "p.cyto"
    pickled.mkdir()
    (pickled / "manifest.json").write_text("not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(pickled)


def test_an_edited_manifest_or_missing_scorer_arrays_are_refused(tmp_path, request):
    from cyto.bundle import add_files

    tiny = request.getfixturevalue("tiny")
    model = make("droc", epochs=1).fit(tiny)
    manifest, weights, scorer = model.bundle_parts(tiny)
    path = save_bundle(tmp_path / "d.cyto", manifest, weights, scorer)
    mf = path / "manifest.json"
    good = mf.read_text()
    edited = json.loads(good)
    edited["ocsvm"]["gamma"] = 10.0  # a hand edit that would silently change every score
    mf.write_text(json.dumps(edited, indent=2, sort_keys=True))
    with pytest.raises(BundleError, match="does not match its own checksum"):
        load_bundle(path)
    mf.write_text(good)
    assert load_bundle(path).method == "droc"
    # a scorer.npz without the support vectors, checksummed by the bundle's own writer
    partial = tmp_path / "scorer.npz"
    np.savez(partial, **{k: v for k, v in scorer.items() if k != "support_vectors"})
    add_files(path, {"scorer.npz": partial})
    with pytest.raises(BundleError, match="needs the scorer arrays support_vectors"):
        load_scorer(path, "torch", "cpu")


def test_float_or_nan_images_are_refused():
    bad = np.full((4, 16, 16, 3), np.nan, dtype=np.float32)
    with pytest.raises(DatasetError, match="uint8"):
        TrainData(bad, np.zeros(4, dtype=np.int8))


@pytest.mark.parametrize("name", ["smallcnn", "resnet18"])
@pytest.mark.parametrize("size", [33, 64, 100])
def test_backbones_take_any_input_size(name, size):
    net = build_backbone(name, 12).eval()
    with torch.no_grad():
        assert net(torch.zeros(2, 3, size, size)).shape == (2, 12)


def test_local_weights_file(tmp_path):
    from safetensors.torch import save_file

    from cyto.models.backbones import load_backbone_weights

    src = build_backbone("smallcnn", 8)
    torch.save(src.state_dict(), tmp_path / "w.pt")
    save_file(
        {k: v.contiguous() for k, v in src.state_dict().items()}, str(tmp_path / "w.safetensors")
    )
    for f in ("w.pt", "w.safetensors"):
        dst = build_backbone("smallcnn", 8, weights=tmp_path / f)
        for k, v in src.state_dict().items():
            assert torch.equal(dst.state_dict()[k], v), k
    # a classifier head of another size is skipped, the rest still loads
    other = build_backbone("smallcnn", 3)
    loaded = load_backbone_weights(other, tmp_path / "w.pt")
    assert "fc.weight" not in loaded and "features.0.weight" in loaded
    with pytest.raises(ConfigError, match="no tensor that fits"):
        load_backbone_weights(build_backbone("resnet18", 8), tmp_path / "w.pt")
    with pytest.raises(ConfigError, match="does not exist"):
        build_backbone("smallcnn", 8, weights=tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot read weights"):
        build_backbone("smallcnn", 8, weights=tmp_path / "junk.pt")


def test_its2clr_optional_simclr_start(tiny):
    model = make("its2clr", epochs=2, agg_epochs=5, pretrain_epochs=2).fit(tiny)
    assert len(model.history_["simclr"]) == 2
    assert np.isfinite(model.score(tiny.images)).all()


def test_deep_sad_pushes_known_abnormal_cells_away(tiny):
    """known_abnormal_eta > 0 (what cyto refine sets): the labelled abnormal cells end up farther
    from the centre, relative to the normal ones, than plain Deep SVDD puts them."""
    from sklearn.metrics import roc_auc_score

    def fit(eta):
        return make("dsvdd", epochs=4, ae_epochs=1, n_seeds=1, known_abnormal_eta=eta).fit(tiny)

    plain, sad = fit(0.0), fit(1.0)
    auc = {
        k: roc_auc_score(tiny.labels, m.score(tiny.images))
        for k, m in (("svdd", plain), ("sad", sad))
    }
    assert auc["sad"] > auc["svdd"] and auc["sad"] > 0.9
    n_abn = int(tiny.labels.sum())
    assert sad.n_used(tiny) == len(tiny) and plain.n_used(tiny) == len(tiny) - n_abn
    assert "Deep SAD" in sad.used_words(tiny) and plain.used_words(tiny) == "normal images only"
    with pytest.raises(ConfigError, match="known_abnormal_eta"):
        DSVDDConfig(known_abnormal_eta=-1.0)
