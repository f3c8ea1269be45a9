"""`scorer.score(patches)` takes the model's crops: a hostile check scored 10 x 10 patches with a
40 px model and got scores with no word (the graph resizes whatever it gets)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from cyto.errors import ConfigError, ScaleWarning


@pytest.fixture(scope="module")
def scorer(exported_dsvdd):
    from cyto.runtime import load_scorer

    return load_scorer(exported_dsvdd, "onnx", "cpu", verify=False)


def test_patches_of_the_crop_size_score_without_a_word(scorer):
    size = scorer.spec.crop_size
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = scorer.score(np.zeros((2, size, size, 3), np.uint8))
    assert scores.shape == (2,) and np.isfinite(scores).all()


@pytest.mark.parametrize("side", [20, 97])
def test_patches_of_another_side_are_said_once_as_another_scale(scorer, side):
    scorer._said_side = set()
    x = np.zeros((2, side, side, 3), np.uint8)
    with pytest.warns(ScaleWarning, match=f"patches of {side} px are resized") as said:
        scorer.score(x)
        scorer.score(x)  # once per side and scorer
    assert len([w for w in said if w.category is ScaleWarning]) == 1
    assert str(scorer.spec.crop_size) in str(said[0].message)
    # another side later is said too (once per scorer left it unsaid: hostile round 25, 31)
    other = side + 13
    with pytest.warns(ScaleWarning, match=f"patches of {other} px are resized"):
        scorer.score(np.zeros((2, other, other, 3), np.uint8))


def test_a_rectangle_and_a_bad_batch_size_are_one_line_in_python_words(scorer):
    size = scorer.spec.crop_size
    with pytest.raises(ConfigError, match="must be square crops") as err:
        scorer.score(np.zeros((2, size, size + 8, 3), np.uint8))
    assert "\n" not in str(err.value)
    own = scorer.spec.patch_px or size  # the side the scale warning advises too
    assert f"the model's training crops are {own} x {own} px" in str(err.value)
    with pytest.raises(ConfigError, match=r"^batch_size= must be >= 1, got 0$"):
        scorer.score(np.zeros((1, size, size, 3), np.uint8), batch_size=0)


def test_a_loaded_scorer_given_with_other_settings_is_refused_and_its_own_recorded(
    scorer, tmp_path
):
    """A hostile check: score_slide(<a loaded onnx fp32 scorer>, backend="torch",
    precision="fp16") ran onnx fp32 with no word and recorded torch/fp16 in the summary's
    options; predict ignored them too."""
    import cyto
    from cyto.api import _scorer_runs

    runs = {"backend": "onnx", "device": "cpu", "precision": scorer.precision}
    asked = {"backend": "auto", "device": "auto", "precision": "auto"}
    assert _scorer_runs(scorer, asked) == runs  # what is recorded: what runs
    assert _scorer_runs(tmp_path, asked) == asked  # a bundle path: as asked
    for call in (
        lambda: cyto.score_slide(tmp_path / "s.tif", scorer, tmp_path / "o", backend="torch"),
        lambda: cyto.predict(scorer, tmp_path, tmp_path / "p.parquet", precision="fp16"),
    ):
        with pytest.raises(ConfigError, match="does not apply to a loaded scorer") as err:
            call()
        assert "\n" not in str(err.value) and "--" not in str(err.value)
    assert not (tmp_path / "o").exists() and not (tmp_path / "p.parquet").exists()


def test_exports_refusals_name_keywords_from_python_and_flags_from_the_command_line(
    exported_dsvdd,
):
    """A hostile check: cyto.export(precisions=...) said "pass --parity-cells CELLS (or
    --calib)", flags a Python caller cannot pass."""
    from cyto.export.quantize import export_variant
    from cyto.flags import python_words

    with pytest.raises(ConfigError, match=r"pass --calib with real cells") as cli:
        export_variant(exported_dsvdd, "int8", calib=None)
    with python_words("export"), pytest.raises(ConfigError) as py:
        export_variant(exported_dsvdd, "int8", calib=None)
    assert "calib=" in str(py.value) and "--" not in str(py.value), str(py.value)
    assert "--calib-class LYT" in str(cli.value)


def test_wrong_kinds_of_values_are_one_line_in_python_words(scorer, tmp_path):
    """A hostile check (round 2): batch_size="8" was a raw TypeError; detection=5 named an
    internal class; train(weights=<missing>) read every image, then a raw FileNotFoundError."""
    import cyto
    from cyto.errors import InputPathError

    size = scorer.spec.crop_size
    with pytest.raises(ConfigError, match=r"^batch_size= must be an integer, got '8'$"):
        scorer.score(np.zeros((1, size, size, 3), np.uint8), batch_size="8")
    with pytest.raises(ConfigError, match="detection= must be one of auto, smear, tissue, pap"):
        cyto.score_slide(tmp_path / "s.tif", tmp_path / "m", tmp_path / "o", detection=5)
    with pytest.raises(InputPathError, match=r"^weights='.*nosuch.safetensors': no such file"):
        cyto.train("dsvdd", tmp_path, tmp_path / "t.cyto", normal="n", weights="nosuch.safetensors")


def test_a_wrong_keyword_of_the_scorer_is_one_line_through_the_schema(scorer):
    """A hostile check (round 3, TB-2): score(x, batchsize=8) was Python's TypeError; the
    scorer's methods bind their arguments through cyto.flags, as the public calls do."""
    size = scorer.spec.crop_size
    x = np.zeros((1, size, size, 3), np.uint8)
    with pytest.raises(ConfigError, match=r"^Scorer.score: unknown option\(s\) batchsize= "):
        scorer.score(x, batchsize=8)
    with pytest.raises(ConfigError, match="did you mean batch_size="):
        scorer.raw(x, batchsize=8)
    with pytest.raises(ConfigError, match=r"^progress= must be a string or None, got 3$"):
        scorer.score(x, progress=3)
    with pytest.raises(ConfigError, match=r"^Scorer.score needs images="):
        scorer.score()
    assert scorer.score(x, batch_size=np.int64(1)).shape == (1,)  # a numpy int is an int


def _backends_here() -> list[str]:
    import importlib.util

    return [
        b
        for b, module in (("onnx", "onnxruntime"), ("openvino", "openvino"), ("torch", "torch"))
        if importlib.util.find_spec(module) is not None
    ]


@pytest.mark.parametrize("backend", _backends_here())
def test_a_closed_scorer_refuses_in_one_line_whatever_its_backend(exported_dsvdd, backend):
    """A hostile check (round 3, TB-3): score() after close() was an IndexError from inside
    OpenVINO and an AttributeError from inside ONNX Runtime."""
    from cyto.runtime import load_scorer
    from cyto.runtime.scorer import CLOSED

    closed = load_scorer(exported_dsvdd, backend, "cpu", verify=False)
    size = closed.spec.crop_size
    closed.close()
    closed.close()  # twice is once
    x = np.zeros((1, size, size, 3), np.uint8)
    for call in (lambda: closed.score(x), lambda: closed.raw(x), closed.warm):
        with pytest.raises(ConfigError, match=f"^{CLOSED}$"):
            call()


@pytest.mark.parametrize("backend", _backends_here())
def test_a_close_from_another_thread_waits_for_the_running_call(
    exported_dsvdd, backend, monkeypatch
):
    """Hostile round 64 (6): close() from another thread (a ``with`` block ending while a
    worker thread scored) let the backend go under the running call, which failed in each
    backend's own raw way (AttributeError, IndexError, TypeError). The call ends, then the
    close; a call after it is refused in one line."""
    import threading

    from cyto.runtime import load_scorer
    from cyto.runtime.scorer import CLOSED

    scorer = load_scorer(exported_dsvdd, backend, "cpu", verify=False)
    size = scorer.spec.crop_size
    x = np.random.default_rng(0).integers(0, 255, (6, size, size, 3), dtype=np.uint8)
    expected = scorer.score(x)
    started, release = threading.Event(), threading.Event()
    run = scorer.backend.run

    def held(batch):  # the first network call waits until the close has begun
        started.set()
        assert release.wait(30)
        return run(batch)

    monkeypatch.setattr(scorer.backend, "run", held)
    got: dict = {}

    def score():
        try:
            got["scores"] = scorer.score(x, batch_size=2)
        except BaseException as exc:  # what the user's thread would see
            got["scores"] = exc

    worker = threading.Thread(target=score)
    worker.start()
    assert started.wait(30)
    closer = threading.Thread(target=scorer.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # waiting for the call, not letting the backend go under it
    release.set()
    worker.join(30)
    closer.join(30)
    assert not closer.is_alive()
    assert np.allclose(got["scores"], expected, rtol=1e-5, atol=1e-6), got
    with pytest.raises(ConfigError, match=f"^{CLOSED}$"):
        scorer.score(x)


def test_a_scorer_is_a_context_manager_that_closes_however_the_block_ends(exported_dsvdd):
    """``with cyto.load_model(path) as scorer:`` (a known gap of issue 68: a Scorer was not a
    context manager, TypeError): closed after the block, also when it raised; a closed scorer
    is not entered again."""
    import cyto
    from cyto.runtime.scorer import CLOSED

    with cyto.load_model(exported_dsvdd, backend="onnx", device="cpu") as scorer:
        size = scorer.spec.crop_size
        assert scorer.score(np.zeros((2, size, size, 3), np.uint8)).shape == (2,)
    with pytest.raises(ConfigError, match=f"^{CLOSED}$"):
        scorer.score(np.zeros((1, size, size, 3), np.uint8))
    with pytest.raises(ConfigError, match=f"^{CLOSED}$"), scorer:
        pass
    other = cyto.load_model(exported_dsvdd, backend="onnx", device="cpu")
    with pytest.raises(KeyError), other:
        raise KeyError("the user's own error goes through")
    with pytest.raises(ConfigError, match=f"^{CLOSED}$"):
        other.warm()


def test_the_scorers_array_methods_refuse_what_is_not_patches_in_python_words(scorer):
    """A hostile check (round 7, H17): score_tensor(<numpy array>) and score_tensor(None) were
    AttributeErrors from inside, raw(None) a TypeError; score checked its patches, they did
    not. Each names its argument and says what to give."""
    import torch

    size = scorer.spec.crop_size
    x = np.zeros((1, size, size, 3), np.uint8)
    tensor = "crops= must be a uint8 (N, H, W, 3) torch tensor"
    array = "images= must be uint8 RGB (N, H, W, 3) patches (a numpy array)"
    for call, said in (
        (lambda: scorer.score_tensor(x), f"{tensor}, got numpy.ndarray: score a numpy array "
         "with Scorer.score"),
        (lambda: scorer.score_tensor(None), f"{tensor}, got None"),
        (lambda: scorer.score_tensor(torch.zeros((1, size, size, 3))),
         f"{tensor}, got torch.float32 (1, {size}, {size}, 3)"),
        (lambda: scorer.raw(None), f"{array}, got None"),
        # one patch: its batch is said (hostile round 64, 8), and an empty list as one
        (lambda: scorer.raw(x[0]), f"{array}, got uint8 ({size}, {size}, 3): one patch is "
         "images[None]"),
        (lambda: scorer.score([]), f"{array}, got an empty list"),
        (lambda: scorer.score(None), f"{array}, got None"),
        (lambda: scorer.score(torch.from_numpy(x)), f"{array}, got torch.Tensor: score a "
         "torch tensor with Scorer.score_tensor"),
        # a list of crops of several sizes: numpy's raw ValueError (hostile round 56, 5)
        (lambda: scorer.score([x[0], np.zeros((size + 4, size + 4, 3), np.uint8)]),
         f"{array}, got a list of crops of 2 sizes ({size} x {size}, {size + 4} x {size + 4} "
         "px): give crops of one size, cut alike"),
    ):  # fmt: skip
        with pytest.raises(ConfigError) as err:
            call()
        assert str(err.value) == said
    assert scorer.score_tensor(torch.from_numpy(x)).shape == (1,)
    assert len(scorer.raw(x)) == 1


def test_patches_too_small_to_hold_a_cell_are_refused(scorer):
    """Hostile round 12, N5: 1 x 1 px patches were scored (resized 96x) without a word."""
    for side in (1, 2, 15):
        with pytest.raises(ConfigError, match=rf"^patches of {side} x {side} px hold no cell"):
            scorer.score(np.zeros((2, side, side, 3), np.uint8))


@pytest.mark.filterwarnings("ignore::cyto.errors.ScaleWarning")
@pytest.mark.parametrize("load_size", [48, None])
def test_crops_of_another_side_score_as_cyto_predict_scores_their_files(tiny, tmp_path, load_size):
    """Hostile round 64 (4): a model trained on crops loaded at 80 px (cyto train's presets)
    given its own 192 px training crops (no scale warning) had them shrunk by the graph
    (bilinear, no antialiasing), where cyto predict loads files at 80 px with an area filter, as
    training did: the same image scored up to 0.08 apart, unsaid. Scorer.score now brings them
    to the load size the one way (cyto.data.images.resize_rgb); a model that kept its patches'
    own size (no load size) has them resized by its graph, as it was trained and as predict
    does."""
    from PIL import Image

    import cyto
    from cyto.bundle import save_bundle
    from cyto.data.images import resize_rgb
    from cyto.runtime import load_scorer
    from tests.train_helpers import make

    model = make(
        "dsvdd", epochs=1, ae_epochs=0, n_seeds=1, tta_views=("orig",), load_size=load_size
    )
    path = save_bundle(tmp_path / "m.cyto", *model.fit(tiny).bundle_parts(tiny))
    scorer = load_scorer(path, "torch", "cpu")
    assert scorer.load_size == load_size
    own = 2 * tiny.images.shape[1] + 3  # crops of another side than the training patches'
    rng = np.random.default_rng(3)
    # smooth and sharp detail alike (a shrink without antialiasing aliases the sharp)
    x = rng.integers(0, 255, (6, own, own, 3), dtype=np.uint8)
    block = np.repeat(np.repeat(x[:3, : own // 4 + 1, : own // 4 + 1], 4, 1), 4, 2)
    x[:3] = block[:, :own, :own]
    folder = tmp_path / "cells" / "normal"
    folder.mkdir(parents=True)
    for i, im in enumerate(x):
        Image.fromarray(im).save(folder / f"c{i}.png")
    table = cyto.predict(scorer, tmp_path / "cells", tmp_path / "t.parquet", echo=None)
    import pyarrow.parquet as pq

    t = pq.read_table(tmp_path / "t.parquet").to_pydict()
    by_file = dict(zip([p.rsplit("/", 1)[-1] for p in t["path"]], t["score"], strict=True))
    direct = scorer.score(x)
    assert table["n"] == 6
    if load_size:
        assert np.array_equal(
            direct, scorer.score(np.stack([resize_rgb(im, load_size) for im in x]))
        )
    assert np.allclose(direct, [by_file[f"c{i}.png"] for i in range(6)], rtol=1e-6, atol=1e-7)
