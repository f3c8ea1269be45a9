"""The scorer: backend choice, clear errors for what this machine cannot run, the same scores
from every backend; detection sizes follow the slide's resolution."""

from __future__ import annotations

import numpy as np
import pytest

from cyto.detect import NucleusParams
from cyto.errors import ConfigError, CytoError
from cyto.infer import ScoreOptions
from cyto.runtime import load_scorer


def test_auto_picks_an_exported_graph_and_backends_agree(exported_dsvdd):
    # on a CPU, auto takes OpenVINO or ONNX Runtime, whichever is first verified here
    auto = load_scorer(exported_dsvdd, "auto", "cpu", precision="fp32")
    assert auto.backend.name in ("onnx", "openvino") and auto.device == "cpu"
    torch_engine = load_scorer(exported_dsvdd, "torch", "cpu")
    size = auto.spec.crop_size
    x = np.random.default_rng(0).integers(0, 256, (9, size, size, 3)).astype(np.uint8)
    np.testing.assert_allclose(auto.score(x, 4), torch_engine.score(x, 4), rtol=1e-4, atol=1e-6)
    assert auto.score(x[:0]).shape == (0,)
    with pytest.raises(ConfigError, match="uint8"):
        auto.score(x.astype(np.float32))


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the errors of a machine without CUDA"
)
def test_what_cannot_run_here_fails_clearly(exported_dsvdd):
    with pytest.raises(CytoError, match="no CUDA GPU"):
        load_scorer(exported_dsvdd, "onnx", "cuda")
    with pytest.raises(CytoError, match="no CUDA GPU"):
        load_scorer(exported_dsvdd, "torch", "cuda:1")
    # this test runs where there is no GPU (skipped above otherwise): the backend is what to
    # leave out, since --device cuda would be refused next
    with pytest.raises(CytoError, match="runs on an NVIDIA GPU, and there is none here"):
        load_scorer(exported_dsvdd, "trt", "cpu")
    with pytest.raises(CytoError, match="runs on an NVIDIA GPU, and there is none here"):
        load_scorer(exported_dsvdd, "onnx-trt", "cpu")
    with pytest.raises(ConfigError, match="^--backend must be one of"):
        load_scorer(exported_dsvdd, "tpu", "cpu")
    with pytest.raises(ConfigError, match="device must be"):
        load_scorer(exported_dsvdd, "onnx", "gpu0")
    with pytest.raises(ConfigError, match="precision"):
        load_scorer(exported_dsvdd, "onnx", "cpu", precision="int4")
    # the missing graph is named with the command that makes it, asked for by backend or not
    for backend in ("onnx", "auto"):
        with pytest.raises(CytoError, match=r"no int8 graph.*cyto export .*--precision int8"):
            load_scorer(exported_dsvdd, backend, "cpu", precision="int8")
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


def test_onnx_runtime_scoring_never_imports_torch(exported_dsvdd):
    """The runtime is importable and runs its exported graphs (ONNX Runtime, OpenVINO) without
    PyTorch (~0.4 GB per process)."""
    import json
    import subprocess
    import sys

    probe = f"""
import json, sys
import numpy as np
from cyto.runtime import load_scorer
out = []
for backend in ("onnx", "auto"):
    s = load_scorer({str(exported_dsvdd)!r}, backend, "cpu")
    n = s.spec.crop_size
    x = np.random.default_rng(0).integers(0, 256, (3, n, n, 3), dtype=np.uint8)
    out.append([s.backend.name, s.device, len(s.score(x))])
print("@@" + json.dumps([out, "torch" in sys.modules]))
"""
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    line = [x for x in proc.stdout.splitlines() if x.startswith("@@")][-1]
    (onnx, auto), imported_torch = json.loads(line[2:])
    assert onnx == ["onnx", "cpu", 3] and auto[1:] == ["cpu", 3] and not imported_torch
    assert auto[0] in ("onnx", "openvino")


def test_a_backend_asked_for_is_said_as_asked_not_as_the_fastest(exported_dsvdd):
    """Hostile round 45 (13): ``--backend torch`` was said "chose torch on cpu: the fastest
    choice that passed verification here", where nothing chose it and it is not the fastest."""
    from cyto.runtime import load_scorer

    asked = load_scorer(exported_dsvdd, "torch", "cpu", precision="auto")
    said = " ".join(asked.notes)
    assert "torch on cpu as asked (--backend torch), at its fastest precision" in said, said
    assert "fastest choice" not in said
    chosen = load_scorer(exported_dsvdd, "auto", "cpu")
    assert any(n.startswith("chose ") and "the fastest choice" in n for n in chosen.notes)
