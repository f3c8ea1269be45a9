"""The inference engine: backend choice, clear errors for what this machine cannot run, the same
scores from every backend; detection sizes follow the slide's resolution."""

from __future__ import annotations

import numpy as np
import pytest

from cyto.errors import ConfigError, CytoError
from cyto.infer.engine import load_engine
from cyto.infer.nuclei import NucleusParams
from cyto.infer.pipeline import ScoreOptions


def test_auto_picks_onnx_for_an_exported_bundle_and_backends_agree(exported_dsvdd):
    auto = load_engine(exported_dsvdd, "auto", "cpu")
    assert auto.backend == "onnx" and auto.device == "cpu"
    torch_engine = load_engine(exported_dsvdd, "torch", "cpu")
    x = np.random.default_rng(0).integers(0, 256, (9, auto.input_size, auto.input_size, 3))
    x = x.astype(np.uint8)
    np.testing.assert_allclose(auto.score(x, 4), torch_engine.score(x, 4), rtol=1e-4, atol=1e-6)
    assert auto.score(x[:0]).shape == (0,)


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the errors of a machine without CUDA"
)
def test_what_cannot_run_here_fails_clearly(exported_dsvdd):
    with pytest.raises(CytoError, match="no CUDA GPU"):
        load_engine(exported_dsvdd, "onnx", "cuda")
    with pytest.raises(CytoError, match="CUDA only"):
        load_engine(exported_dsvdd, "trt", "cpu")
    with pytest.raises(ConfigError, match="unknown backend"):
        load_engine(exported_dsvdd, "tpu", "cpu")
    with pytest.raises(ConfigError, match="backend must be one of"):
        ScoreOptions(backend="tpu")
    with pytest.raises(ConfigError, match="workers"):
        ScoreOptions(workers=-1)


def test_nucleus_sizes_scale_with_the_slide_resolution():
    p = NucleusParams()  # given at 0.12 um/px
    coarse = p.at(0.48)  # 4x coarser pixels: 1/4 the lengths, 1/16 the areas
    assert coarse.min_distance == 6 and coarse.min_area == round(300 / 16)
    assert coarse.max_area == 2500 and coarse.sigma == pytest.approx(0.5)
    assert p.at(None) is p and p.at(0.1201) is p
    # detection runs on a 2x-reduced tile while nuclei stay >= 40 px there, else at full size
    assert p.reduction() == 2 and coarse.reduction() == 1
    assert NucleusParams(downsample=1).reduction() == 1
    with pytest.raises(ConfigError):
        NucleusParams(mpp=0)
