"""The runtime's small decisions: device names, ONNX Runtime's provider plan (no silent CPU
fallback on a GPU, the GPU's ordinal honoured), the head registry, the model spec."""

from __future__ import annotations

import pytest

from cyto.bundle import ModelSpec
from cyto.errors import BundleError, ConfigError
from cyto.runtime.backends.onnxruntime import CPU, CUDA, TRT, session_plan
from cyto.runtime.devices import parse_device, resolve_device
from cyto.runtime.heads import HEADS, head_class


def test_device_names():
    assert parse_device("cuda:2") == ("cuda", 2)
    assert parse_device("CUDA") == ("cuda", None)
    assert parse_device("cpu") == ("cpu", None)
    assert resolve_device("cpu") == "cpu"
    for bad in ("gpu", "cpu:1", "cuda:x", "cuda:-1", ""):
        with pytest.raises(ConfigError, match="device must be"):
            parse_device(bad)


def test_onnx_runtime_on_a_gpu_keeps_shape_arithmetic_on_the_cpu(exported_dsvdd, tmp_path):
    """Every exported graph computes the resize's sizes with Shape/Concat nodes, which the CUDA
    provider places on the CPU on purpose: forbidding the CPU fallback would refuse every graph
    (the session never opened on a GPU). The GPU provider comes first, on cuda:N, without TF32
    for fp32; the TensorRT provider gets the int8 / fp16 mode of the graph it is given."""
    import onnx

    graph = onnx.load(str(exported_dsvdd / "encoder.onnx"))
    ops = [n.op_type for n in graph.graph.node]
    assert "Shape" in ops and "Resize" in ops
    providers, entries = session_plan("cuda:3", "cuda")
    assert providers == [(CUDA, {"device_id": "3", "use_tf32": "0"}), CPU]
    assert entries == {}  # no session.disable_cpu_ep_fallback
    providers, entries = session_plan("cuda:1", "tensorrt", tmp_path, "int8")
    assert [p if isinstance(p, str) else p[0] for p in providers] == [TRT, CUDA, CPU]
    assert providers[0][1]["device_id"] == "1" and providers[1][1]["device_id"] == "1"
    assert providers[0][1]["trt_engine_cache_path"] == str(tmp_path)
    assert providers[0][1]["trt_int8_enable"] == "True"
    assert providers[0][1]["trt_fp16_enable"] == "False"
    fp16 = session_plan("cuda:0", "tensorrt", None, "fp16")[0][0][1]
    assert fp16["trt_fp16_enable"] == "True" and fp16["trt_int8_enable"] == "False"
    assert session_plan("cpu", "cuda")[0] == [CPU]


def test_the_cpu_engine_leaves_the_cores_to_detection_between_batches(exported_dsvdd):
    """ONNX Runtime's threads spin after each call by default, taking the cores that nucleus
    detection and the decode workers need; a CPU session lets them sleep."""
    from cyto.runtime import load_scorer

    scorer = load_scorer(exported_dsvdd, "onnx", "cpu")
    opts = scorer.backend.session.get_session_options()
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_heads_are_registered_once_with_what_the_graph_emits():
    assert set(HEADS) == {"dsvdd", "ocsvm", "classifier", "mil", "knn"}
    assert head_class("dsvdd").batch_axis == 2 and head_class("dsvdd").output == "embeddings"
    assert head_class("classifier").output == "logits" and head_class("mil").output == "scores"
    assert head_class("knn").output == "embeddings"
    with pytest.raises(BundleError, match="unknown scorer head 'kmeans'.*classifier, dsvdd"):
        head_class("kmeans")


def test_the_model_spec_is_read_once_and_refuses_a_garbled_manifest():
    manifest = {
        "method": "dsvdd",
        "scorer_kind": "dsvdd",
        "backbone": "smallcnn",
        "embedding_dim": 8,
        "input_size": 64,
        "config": {"load_size": 80, "mpp": 0.12},
        "seeds": [0, 1],
        "tta_views": ["orig", "hflip"],
        "tta_lambda": 0.35,
        "files": {"encoder.onnx": "ab" * 32},
        "onnx": {
            "file": "encoder.onnx",
            "opset": 18,
            "input": {"name": "patches"},
            "output": {"name": "embeddings"},
        },
    }
    spec = ModelSpec.from_manifest(manifest)
    assert (spec.input_size, spec.crop_size, spec.mpp, spec.n_seeds) == (64, 80, 0.12, 2)
    assert spec.graph("fp32").sha256 == "ab" * 32 and spec.graph("int8") is None
    del manifest["backbone"]
    with pytest.raises(BundleError, match="backbone"):
        ModelSpec.from_manifest(manifest)


def test_numba_kernels_are_cached_in_the_user_cache_not_the_source_tree(tmp_path):
    import os
    import subprocess
    import sys

    import cyto

    code = (
        "import numpy as np, numba\n"
        "from cyto.runtime.heads import dsvdd\n"
        "f = dsvdd.dsvdd_scores.dispatcher\n"
        "print(f._cache._cache_path)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "XDG_CACHE_HOME")}
    env.update(HOME=str(tmp_path), CYTO_CACHE_DIR="")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out.startswith(str(tmp_path / ".cache" / "cyto" / "numba")), out
    assert not out.startswith(os.path.dirname(cyto.__file__))
    # a cache folder the user named wins
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out.startswith(str(tmp_path / "mine")), out


def test_a_tensorrt_beside_onnxruntime_gpu_of_another_major_is_named(tmp_path, monkeypatch):
    """onnxruntime-gpu's TensorRT provider links one TensorRT major; `tensorrt` 11 installed
    next to a provider built for 10 cannot load, and the message says what to use instead."""
    from cyto.runtime.backends import onnxruntime as ortb

    lib = tmp_path / "libonnxruntime_providers_tensorrt.so"
    lib.write_bytes(b"\x7fELF...GLIBC_2.17\x00libnvinfer.so.10\x00libnvonnxparser.so.10\x00")
    assert ortb.linked_tensorrt_major(lib) == 10
    assert ortb.linked_tensorrt_major(tmp_path / "none.so") is None
    monkeypatch.setattr(ortb, "provider_library", lambda name="tensorrt": lib)
    monkeypatch.setattr(ortb, "installed_tensorrt_major", lambda: 11)
    words = ortb.tensorrt_provider_mismatch()
    assert "built for TensorRT 10, but TensorRT 11 is installed" in words
    assert "--backend trt" in words
    monkeypatch.setattr(ortb, "installed_tensorrt_major", lambda: 10)
    assert ortb.tensorrt_provider_mismatch() is None


def test_a_precision_a_backend_does_not_run_is_refused_by_every_caller(exported_dsvdd):
    """--precision bf16 --backend onnx ran encoder.onnx in fp32 with a note (issue 68), exit 0,
    and nothing at all from cyto.load_model, while --backend torch was refused (hostile round
    60, 1). One rule (:func:`cyto.runtime.backends.precision_refused`) refuses it before
    anything loads, in the caller's words, for the scorer, the CLI and the Python call."""
    import cyto
    from cyto.errors import ConfigError
    from cyto.runtime import load_scorer
    from tests.cli_runner import run_cyto

    with pytest.raises(ConfigError) as err:
        load_scorer(exported_dsvdd, "onnx", "cpu", "bf16", verify=False)
    assert str(err.value) == (
        "--precision bf16 runs in OpenVINO, on the CPU, not in ONNX Runtime: use --backend "
        "openvino (or --backend auto)"
    )
    with pytest.raises(ConfigError, match=r"precision='bf16' runs in OpenVINO, on the CPU, not"):
        cyto.load_model(exported_dsvdd, backend="onnx", device="cpu", precision="bf16")
    proc = run_cyto("info", str(exported_dsvdd))  # a command that loads nothing: unaffected
    assert proc.returncode == 0
    proc = run_cyto(
        "predict", str(exported_dsvdd), "--data", str(exported_dsvdd), "--out",
        str(exported_dsvdd.parent / "p.parquet"), "--backend", "onnx", "--precision", "bf16",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: --precision bf16 runs in OpenVINO, on the CPU, not in ONNX Runtime: use "
        "--backend openvino (or --backend auto)"
    ], proc.stderr


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_which_backend_runs_which_precision_is_one_rule(device):
    """Every backend x precision: refused exactly where :data:`RUN_BY` says it does not run
    (PyTorch's fp16 on CUDA only), in one line naming a backend that does run it."""
    from cyto.runtime.backends import BACKENDS, RUN_BY, precision_refused

    for precision, runs in RUN_BY.items():
        for name in BACKENDS:
            refused = precision_refused(name, precision, device)
            cpu_fp16_torch = name == "torch" and precision == "fp16" and device == "cpu"
            assert (refused is None) == (name in runs and not cpu_fp16_torch), (name, precision)
            if refused:
                assert "\n" not in refused and f"--precision {precision}" in refused
                use = refused.split("use --backend ")[1].split(" ")[0]
                assert use in runs, refused


def test_bench_says_openvino_runs_no_fp16_not_that_a_graph_is_missing(exported_dsvdd):
    """``cyto bench engine`` said OpenVINO's fp16 was "unavailable (the bundle has no fp16 ONNX
    graph: make one with cyto export ...)" of a bundle that had it (hostile round 60, 2)."""
    from cyto.bench.engine import Unavailable, make_runner
    from cyto.bundle import load_bundle

    bundle = load_bundle(exported_dsvdd, weights=False, for_scoring=True)
    with pytest.raises(Unavailable) as err:
        make_runner(bundle, "openvino", "cpu", "fp16")
    assert str(err.value).startswith("--precision fp16 runs in ONNX Runtime and TensorRT"), err
    assert "cyto export" not in str(err.value)
