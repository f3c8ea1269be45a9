"""OpenVINO's engine threads as streams (one infer request each, a call's cells split among them
and run at once): the same numbers as one stream, joined along the axis that indexes the cells
(Deep SVDD's graph puts its cells on axis 2), verified apart from one stream's, and each call
split only as far as it has cells."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import cyto.runtime.backends.openvino as ov
from cyto.bundle import load_bundle
from cyto.export.golden import write_golden
from cyto.runtime import load_scorer
from cyto.runtime.heads import head_class

pytestmark = pytest.mark.openvino


@pytest.mark.parametrize("method", ["dsvdd", "fs-sil"])
def test_streams_give_one_streams_numbers_along_the_cells_axis(exported_bundles, method):
    bundle = load_bundle(exported_bundles[method], weights=False)
    size = bundle.spec.crop_size
    cells = np.random.default_rng(0).integers(0, 256, (13, size, size, 3), dtype=np.uint8)
    out = {}
    for streams in (1, 2):
        ov.STREAMS, default = streams, ov.STREAMS
        try:
            backend = ov.OpenVinoBackend(bundle, "cpu", "fp32", threads=2, cache=False)
        finally:
            ov.STREAMS = default
        assert backend.streams == streams and len(backend.requests) == streams
        out[streams] = [backend.run(cells), backend.run(cells[:1])]  # 7 + 6 cells; 1 cell
        backend.close()
    axis = head_class(bundle.spec.head).batch_axis
    for one, two in zip(out[1], out[2], strict=True):
        assert one.shape == two.shape and one.dtype == two.dtype == np.float32
        np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-6)
    assert out[2][0].shape[axis] == 13 and out[2][1].shape[axis] == 1


def test_streams_are_verified_apart_and_never_more_than_the_threads(
    exported_dsvdd, synth_patches, tmp_path, monkeypatch
):
    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "d.cyto"
    shutil.copytree(exported_dsvdd, path)
    write_golden(path, synth_patches, normal="normal", n=32)
    monkeypatch.setattr(ov, "STREAMS", 1)
    one = load_scorer(path, "openvino", "cpu", "fp32", threads=2)
    monkeypatch.setattr(ov, "STREAMS", 2)
    two = load_scorer(path, "openvino", "cpu", "fp32", threads=2)
    # the first run of the split calls is verified on the golden cells, not read from the
    # record of one stream's
    assert one.verification.passed and two.verification.passed
    assert not two.verification.cached and two.backend.providers[-1] == "2 streams"
    assert load_scorer(path, "openvino", "cpu", "fp32", threads=2).verification.cached
    assert load_scorer(path, "openvino", "cpu", "fp32", threads=1).backend.streams == 1
