"""The TensorRT path without TensorRT: engine keys and index, batch padding and splitting, the
version gate, the builder's calls and a rebuild that never breaks a bundle, all against a fake
of the TensorRT 10/11 Python API (tests/fakes/tensorrt_api.py) that keeps TensorRT's contract.
On a GPU with TensorRT, test_export.py builds and runs a real engine."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from cyto.bundle import load_bundle, verify_bundle
from cyto.errors import BundleError, ConfigError, DeviceError, MissingDependencyError
from cyto.runtime import devices
from cyto.runtime.engines import BatchProfile, EngineIndex, EngineKey, EngineWant, plan_batches
from tests.fakes.tensorrt_api import make_plan, make_tensorrt

H100 = devices.GpuIdentity(0, "NVIDIA H100 80GB HBM3", (9, 0))


@pytest.fixture
def fake_trt(monkeypatch):
    """TensorRT 11.1 installed, and an H100 as cuda:0 (its work runs on the CPU here)."""
    import contextlib

    trt = make_tensorrt("11.1.0.106")
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(devices, "gpu_identity", lambda device: H100)
    monkeypatch.setattr(devices, "resolve_device", lambda device: "cpu")
    monkeypatch.setattr(devices, "on_device", lambda device: contextlib.nullcontext())
    return trt


@pytest.fixture
def bundle(exported_bundles, tmp_path):
    copy = tmp_path / "d.cyto"
    shutil.copytree(exported_bundles["dsvdd"], copy)  # the head's batch axis is 2: (S, V, N, d)
    return copy


def test_plan_batches_pads_below_the_minimum_and_splits_above_the_maximum():
    assert plan_batches(3, 64, 4, 16) == [(0, 3, 4)]
    assert plan_batches(37, 64, 4, 16) == [(0, 16, 16), (16, 32, 16), (32, 37, 5)]
    assert plan_batches(34, 64, 4, 16) == [(0, 16, 16), (16, 32, 16), (32, 34, 4)]
    assert plan_batches(10, 4, 1, 16) == [(0, 4, 4), (4, 8, 4), (8, 10, 2)]
    assert plan_batches(0, 8, 1, 8) == []
    with pytest.raises(ConfigError):
        plan_batches(5, 0, 1, 8)


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("10.0.1.6", False),  # strongly typed networks are complete from 10.12 on
        ("10.11.0.33", False),
        ("10.12.0.36", True),
        ("10.16.0.72", True),
        ("11.1.0.106.post1", True),
        ("9.3.0", False),
        ("12.0.0", False),
    ],
)
def test_the_version_gate(monkeypatch, version, ok):
    from cyto.runtime.backends.tensorrt import require_tensorrt

    monkeypatch.setitem(sys.modules, "tensorrt", make_tensorrt(version))
    if ok:
        assert require_tensorrt().__version__ == version
    else:
        with pytest.raises(MissingDependencyError, match=r"TensorRT 10.12 or newer, below 12"):
            require_tensorrt()


def _key(**kw) -> EngineKey:
    base = dict(
        onnx_sha256="a" * 64,
        gpu=H100.name,
        capability=(9, 0),
        tensorrt="10.16.0.72",
        precision="fp32",
        profile=BatchProfile(1, 64, 256),
        input_hw=(80, 80),
    )
    return EngineKey(**{**base, **kw})


def test_engine_keys_and_the_lookup_never_take_a_mismatch(tmp_path):
    index = EngineIndex(tmp_path)
    good = _key()
    assert good.file_name() == (
        "engine-nvidia-h100-80gb-hbm3-sm90-trt10.16.0.72-fp32-b1-64-256-80x80-aaaaaaaaaaaa.plan"
    )
    with pytest.raises(ConfigError, match="precision"):
        _key(precision="fp8")
    others = {
        "another ONNX graph": _key(onnx_sha256="b" * 64),
        "NVIDIA H200": _key(gpu="NVIDIA H200"),
        "compute capability 8.9": _key(capability=(8, 9)),
        "TensorRT 10.15": _key(tensorrt="10.15.1.29"),
        "int8, not the fp32": _key(precision="int8"),
        "40x40 inputs": _key(input_hw=(40, 40)),
    }
    for k in others.values():
        index.add(k, b"plan " + k.file_name().encode())
    want = EngineWant("a" * 64, H100.name, (9, 0), "10.16.0.72", "fp32", (80, 80))
    entry, reasons = index.find(want)
    assert entry is None and len(reasons) == len(others)
    for why in others:
        assert any(why in r for r in reasons), (why, reasons)
    index.add(good, b"the right plan")
    entry, _ = index.find(want)
    assert entry.key == good and index.plan_path(entry).read_bytes() == b"the right plan"
    # a plan changed on disk is never loaded
    index.plan_path(entry).write_bytes(b"tampered")
    entry, reasons = index.find(want)
    assert entry is None and any("is cut short" in r for r in reasons)
    # the profile that holds the batch is preferred
    index.add(good, b"the right plan")
    index.add(_key(profile=BatchProfile(1, 8, 16)), b"small")
    assert index.find(want, batch=12)[0].key.profile.max == 16
    assert index.find(want, batch=100)[0].key.profile.max == 256
    plan = index.dir / good.file_name()
    assert index.remove(good) and not plan.exists()


def test_a_damaged_index_is_one_clear_error(tmp_path):
    index = EngineIndex(tmp_path)
    index.add(_key(), b"x")
    (index.dir / "index.json").write_text("{not json")
    with pytest.raises(BundleError, match="delete .*engines"):
        index.entries()


def _runner(bundle_path, trt, profile, out_dtype="FLOAT"):
    from cyto.runtime.backends.tensorrt import EngineRunner
    from cyto.runtime.heads import head_class

    b = load_bundle(bundle_path, weights=False)
    graph = b.spec.graph("fp32")
    size = b.spec.crop_size
    shapes = [(n, size, size, 3) for n in profile]
    plan = make_plan(
        (bundle_path / graph.file).read_bytes(), graph.input, graph.output, shapes, out_dtype
    )
    axis = head_class(b.spec.head).batch_axis
    return EngineRunner(trt, plan, "cpu", graph, axis), b


@pytest.mark.parametrize("n", [1, 3, 16, 37])
def test_the_runner_pads_splits_and_equals_onnx_runtime(bundle, fake_trt, n):
    from cyto.runtime import load_scorer

    runner, b = _runner(bundle, fake_trt, (4, 8, 16))
    size = b.spec.crop_size
    x = np.random.default_rng(n).integers(0, 256, (n, size, size, 3), dtype=np.uint8)
    ort = load_scorer(bundle, "onnx", "cpu")
    want = np.concatenate(ort.raw(x, batch_size=n), axis=2)
    inp, out = runner.inp.data_ptr(), runner.out.data_ptr()
    got = runner.run(x)
    assert got.shape == want.shape  # (seeds, views, n, d): padding rows dropped on axis 2
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    shapes = [c[1] for c in fake_trt.calls if c[0] == "set_input_shape"][1:]  # after the setup
    assert all(4 <= s[0] <= 16 for s in shapes), shapes
    assert (runner.inp.data_ptr(), runner.out.data_ptr()) == (inp, out)  # buffers reused
    # crops already on the device: the same output, copied device to device into the input
    import torch

    on_device = runner.run_tensor(torch.from_numpy(x)).numpy()
    np.testing.assert_array_equal(on_device, got)


def test_the_output_buffer_has_the_engines_dtype(bundle, fake_trt):
    import torch

    runner, b = _runner(bundle, fake_trt, (1, 8, 8), out_dtype="HALF")
    assert runner.out.dtype == torch.float16
    size = b.spec.crop_size
    x = np.random.default_rng(0).integers(0, 256, (5, size, size, 3), dtype=np.uint8)
    from cyto.runtime import load_scorer

    want = np.concatenate(load_scorer(bundle, "onnx", "cpu").raw(x, 5), axis=2)
    got = runner.run(x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)  # fp16 rounding, not garbage


def test_a_refused_shape_or_a_failed_run_is_an_error(bundle, fake_trt):
    runner, b = _runner(bundle, fake_trt, (1, 8, 8))
    size = b.spec.crop_size
    x = np.zeros((3, size, size, 3), np.uint8)
    fake_trt.behaviour["refuse_shapes"] = {(3, size, size, 3)}
    with pytest.raises(DeviceError, match="refused the input shape"):
        runner.run(x)
    fake_trt.behaviour = {"execute_fails": True}
    with pytest.raises(DeviceError, match="execution failed"):
        runner.run(x)
    fake_trt.behaviour = {}
    with pytest.raises(ConfigError, match="takes uint8 patches of shape"):
        runner.run(np.zeros((3, size + 1, size + 1, 3), np.uint8))


def test_build_rebuild_and_score_never_touch_the_sealed_bundle(bundle, fake_trt, tmp_path):
    from cyto.export.trt import build_engine
    from cyto.runtime.backends.tensorrt import TensorRTBackend
    from cyto.runtime.heads import head_for
    from cyto.runtime.scorer import Scorer

    manifest_before = (bundle / "manifest.json").read_bytes()
    entry = build_engine(bundle, "fp32", BatchProfile(1, 8, 32), echo=lambda m: None)
    # strongly typed, no precision flag (what TensorRT 11 requires), and TF32 (on by default)
    # turned off for an fp32 engine
    flag = 1 << int(fake_trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert ("create_network", flag) in fake_trt.calls
    assert ("build", []) in fake_trt.calls
    assert entry.info["tf32"] is False
    assert not hasattr(fake_trt.BuilderFlag, "FP16")
    assert entry.key.gpu == H100.name and entry.key.tensorrt == "11.1.0.106"
    assert entry.key.onnx_sha256 == load_bundle(bundle, weights=False).spec.graph().sha256
    timing = EngineIndex(bundle).timing_cache_path(H100.name, (9, 0), "11.1.0.106")
    assert timing.is_file()
    # rebuilding replaces the engine and its index entry; the bundle still verifies and loads
    again = build_engine(bundle, "fp32", BatchProfile(1, 8, 32), echo=lambda m: None)
    assert [e.key for e in EngineIndex(bundle).entries()] == [again.key]
    assert (bundle / "manifest.json").read_bytes() == manifest_before
    verify_bundle(bundle)
    b = load_bundle(bundle, weights=False)
    backend = TensorRTBackend(b, "cpu")
    scorer = Scorer(b, head_for(b), backend)
    size = b.spec.crop_size
    x = np.random.default_rng(3).integers(0, 256, (40, size, size, 3), dtype=np.uint8)
    from cyto.runtime import load_scorer

    np.testing.assert_allclose(
        scorer.score(x, 64), load_scorer(bundle, "onnx", "cpu").score(x, 64), rtol=1e-5
    )
    # an index entry edited to claim another graph is passed over, with the reason
    data = json.loads((bundle / "engines" / "index.json").read_text())
    data["engines"][0]["key"]["onnx_sha256"] = "0" * 64
    (bundle / "engines" / "index.json").write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="built from another ONNX graph"):
        TensorRTBackend(b, "cpu")
    # deleting every engine leaves a loadable bundle
    shutil.rmtree(bundle / "engines")
    verify_bundle(bundle)


def test_a_plan_rebuilt_after_it_was_chosen_is_refused(bundle, fake_trt, monkeypatch):
    """Another run rebuilds the engine (same key, same file name) between this run's choice of
    it and its deserialization: the plan on disk is no longer the one whose sha256 was chosen
    and verified."""
    from cyto.export.trt import build_engine
    from cyto.runtime.backends.tensorrt import TensorRTBackend

    build_engine(bundle, "fp32", BatchProfile(1, 8, 32), echo=lambda m: None)
    spec = load_bundle(bundle, weights=False).spec
    graph, size = spec.graph(), spec.crop_size
    plan = make_plan(
        (bundle / graph.file).read_bytes(),
        graph.input,
        graph.output,
        [(n, size, size, 3) for n in (1, 8, 32)],
        noise=0.5,  # computes wrong: what a silently swapped engine could do
    )
    real_find = EngineIndex.find

    def find_then_rebuilt(self, want, batch=None):
        entry, reasons = real_find(self, want, batch)
        self.plan_path(entry).write_bytes(plan)
        return entry, reasons

    monkeypatch.setattr(EngineIndex, "find", find_then_rebuilt)
    with pytest.raises(BundleError, match=r"\.plan changed after it was chosen"):
        TensorRTBackend(load_bundle(bundle, weights=False), "cpu")


def test_the_builder_refuses_what_tensorrt_would_refuse(bundle, fake_trt, tmp_path):
    import torch

    from cyto.bundle import add_files
    from cyto.export.trt import build_engine

    fake_trt.behaviour["parse_fails"] = True
    with pytest.raises(ConfigError, match="cannot parse .*unsupported node"):
        build_engine(bundle, "fp32", echo=lambda m: None)
    fake_trt.behaviour = {}
    with pytest.raises(ConfigError, match="no int8 ONNX graph"):
        build_engine(bundle, "int8", echo=lambda m: None)

    class Legacy(torch.nn.Module):  # the old preprocessing: uint8 transposed before the cast
        def forward(self, x):
            return x.permute(0, 3, 1, 2).float().mean(dim=(1, 2, 3))

    bad = tmp_path / "encoder.onnx"
    x = torch.zeros((2, 8, 8, 3), dtype=torch.uint8)
    torch.onnx.export(
        Legacy().eval(),
        (x,),
        dynamo=True,
        external_data=False,
        input_names=["patches"],
        output_names=["embeddings"],
        dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},),
    ).save(str(bad))
    add_files(bundle, {"encoder.onnx": bad})
    fake_trt.calls.clear()
    with pytest.raises(ConfigError, match="breaks TensorRT's ONNX import rules.*UINT8"):
        build_engine(bundle, "fp32", echo=lambda m: None)
    assert not any(c[0] == "parse" for c in fake_trt.calls)  # refused before TensorRT saw it


def test_a_timing_cache_from_another_gpu_is_not_used(bundle, fake_trt):
    from cyto.export.trt import build_engine

    index = EngineIndex(bundle)
    index.dir.mkdir(parents=True, exist_ok=True)
    index.timing_cache_path(H100.name, (9, 0), "11.1.0.106").write_bytes(b"other-gpu")
    notes = []
    build_engine(bundle, "fp32", BatchProfile(1, 8, 16), echo=notes.append)
    assert any("does not fit this GPU" in n for n in notes)


def test_concurrent_builds_keep_every_engine(bundle):
    """Two processes adding engines at once: the lock keeps both index entries."""
    import multiprocessing as mp

    keys = [_key(profile=BatchProfile(1, 8, m)) for m in (16, 32, 64, 128)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_add, args=(str(bundle), k)) for k in keys]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(e.key.profile.max for e in EngineIndex(bundle).entries()) == [16, 32, 64, 128]


def _add(path: str, key: EngineKey) -> None:
    EngineIndex(path).add(key, key.file_name().encode() * 1000)


@pytest.mark.parametrize("how", ["none", "raises", "serialize-raises"])
def test_a_timing_cache_that_fails_never_costs_the_engine(bundle, fake_trt, how):
    """create_timing_cache may return None or raise, and so may serialize: the built plan is
    kept either way, with a note."""
    from cyto.export.trt import build_engine

    fake_trt.behaviour["timing_cache"] = how
    notes = []
    entry = build_engine(bundle, "fp32", BatchProfile(1, 8, 16), echo=notes.append)
    index = EngineIndex(bundle)
    assert [e.key for e in index.entries()] == [entry.key]
    assert index.plan_path(entry).is_file()
    assert any("timing cache" in n for n in notes), notes
    assert entry.info["timing_cache"] is (how == "serialize-raises")


def test_a_tf32_engine_would_not_reproduce_fp32_scores(bundle, fake_trt):
    """Why TF32 is turned off: an "fp32" plan built with TF32 on keeps 10 mantissa bits, and
    its scores move away from the fp32 reference; the one cyto builds equals ONNX Runtime."""
    from cyto.runtime.backends.tensorrt import EngineRunner
    from cyto.runtime.heads import head_class

    b = load_bundle(bundle, weights=False)
    graph, size = b.spec.graph("fp32"), b.spec.crop_size
    shapes = [(n, size, size, 3) for n in (1, 8, 16)]
    onnx_bytes = (bundle / graph.file).read_bytes()
    x = np.random.default_rng(1).integers(0, 256, (16, size, size, 3), dtype=np.uint8)
    from cyto.runtime import load_scorer

    want = np.concatenate(load_scorer(bundle, "onnx", "cpu").raw(x, 16), axis=2)
    axis = head_class(b.spec.head).batch_axis
    for tf32 in (False, True):
        plan = make_plan(onnx_bytes, graph.input, graph.output, shapes, tf32=tf32)
        got = EngineRunner(fake_trt, plan, "cpu", graph, axis).run(x)
        err = float(np.abs(got - want).max() / np.abs(want).max())
        assert (err < 1e-6) if not tf32 else (err > 1e-4), (tf32, err)


def test_an_engine_that_does_not_reproduce_the_golden_cells_is_never_kept(
    golden_bundle, fake_trt, monkeypatch
):
    """cyto export --trt verifies every engine it builds on the golden cells and removes one
    that fails (here a plan that computes with 5% noise), with the numbers; a good engine is
    kept with its verification recorded in the index."""
    import cyto.runtime as runtime
    from cyto.errors import VerificationError
    from cyto.export.api import export_bundle
    from cyto.runtime.backends.tensorrt import TensorRTBackend
    from cyto.runtime.heads import head_for
    from cyto.runtime.scorer import Scorer
    from cyto.runtime.verify import read_golden, verify_scorer

    bundle = golden_bundle  # real cells: each export_bundle below keeps them (random patches
    # it would draw again, 256 of them, and score with PyTorch each time)
    real = runtime.load_scorer

    def load(model, backend="auto", device="auto", precision="fp32", threads=None, verify=True):
        if backend != "trt":
            return real(model, backend, "cpu", precision, threads, verify)
        b = load_bundle(model, weights=False)  # the fake GPU runs on the CPU: cpu device here
        scorer = Scorer(b, head_for(b), TensorRTBackend(b, "cpu", precision))
        scorer.verification = verify_scorer(scorer, read_golden(b))
        if not scorer.verification.passed:
            raise VerificationError(f"engine: {scorer.verification.words()}")
        return scorer

    monkeypatch.setattr(runtime, "load_scorer", load)
    fake_trt.behaviour["engine_noise"] = 0.05
    with pytest.raises(VerificationError, match="failed on .* golden cells"):
        export_bundle(bundle, onnx=False, trt=True, batch="1,8,16", echo=lambda m: None)
    assert EngineIndex(bundle).entries() == []
    assert not any(p.suffix == ".plan" for p in (bundle / "engines").iterdir())
    fake_trt.behaviour = {}
    report = export_bundle(bundle, onnx=False, trt=True, batch="1,8,16", echo=lambda m: None)
    (entry,) = EngineIndex(bundle).entries()
    assert entry.info["verification"]["status"] == "passed"
    assert report["trt"]["fp32"]["max_diff_of_range"] < 1e-3
