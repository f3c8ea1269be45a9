"""What runs is what was verified (issue 68, class 1).

A compiled engine kept in cyto's cache (an OpenVINO compiled model, a TensorRT plan) is a
derived file outside the bundle's seal. With bytes of OpenVINO's cached ``.blob`` flipped,
``cyto score`` printed "verification: passed (cached for this machine)" and scored near 1e57: the
verification record was keyed on the graph, not on what ran. Here a kept engine is damaged in
generated ways (bytes flipped, cut short, replaced by another model's, deleted) and the scores
must stay right, the console must say why the kept engine was not used, and no verification
made on other bytes may vouch for the engine that runs. TensorRT runs against the fake of its
API (tests/fakes/tensorrt_api.py); ``cyto doctor`` says which lines ran now and which it read
from a record.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cyto.errors import ConfigError
from cyto.runtime import load_scorer
from cyto.runtime.verify import FP32_TOLERANCE, read_golden


@pytest.fixture
def bundle(exported_dsvdd, synth_patches, tmp_path, monkeypatch):
    """A Deep SVDD bundle with 64 golden cells, cyto's user cache in a folder of its own."""
    from cyto.export.golden import write_golden

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "d.cyto"
    shutil.copytree(exported_dsvdd, path)
    write_golden(path, synth_patches, normal="normal", n=64)
    return path


@pytest.fixture
def ov_bundle(bundle):
    pytest.importorskip("openvino", reason="openvino is not installed (pip install 'cyto[cpu]')")
    return bundle


@pytest.fixture
def other_model(ov_bundle, tmp_path):
    """Another model's compiled model and its record, kept in the same cache: the bundle with
    its graph's weights changed (it computes otherwise)."""
    import onnx
    from onnx import numpy_helper

    from cyto.bundle import add_files

    other = tmp_path / "other.cyto"
    shutil.copytree(ov_bundle, other)
    model = onnx.load(other / "encoder.onnx")
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(model, tmp_path / "encoder.onnx")
    add_files(other, {"encoder.onnx": tmp_path / "encoder.onnx"})
    s = load_scorer(other, "openvino", "cpu", "fp32", verify=False)
    engine = s.backend.engine_file
    s.close()
    return engine.path.read_bytes(), engine.path.parent / "compiled.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _scores_right(scorer) -> None:
    golden = read_golden(scorer.bundle)
    got = scorer.score(golden.images)
    assert np.isfinite(got).all()
    assert np.abs(got - golden.scores).max() <= FP32_TOLERANCE * np.ptp(golden.scores)


def _vouches_for_what_runs(scorer) -> None:
    """The verification's record was made on the very engine bytes that run."""
    engine = scorer.backend.engine_file
    artifact = scorer.verification.record["key"]["artifact"]
    assert artifact["engine_sha256"] == engine.sha256 == _sha(engine.path.read_bytes())
    assert artifact["engine_size"] == engine.size


def test_an_intact_kept_model_is_reused_with_its_record(ov_bundle):
    first = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    assert not first.backend.loaded_from_cache and not first.verification.cached
    _vouches_for_what_runs(first)
    again = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    assert again.backend.loaded_from_cache and again.verification.cached
    assert "(cached for this machine)" in again.verification.words()
    assert again.backend.engine_file == first.backend.engine_file
    _vouches_for_what_runs(again)
    _scores_right(again)


DAMAGE = st.one_of(
    st.tuples(
        st.just("flip"),
        st.lists(
            st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
            min_size=1,
            max_size=3,
        ),
    ),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.just(("other model's blob",)),
    st.just(("other model's blob and record",)),
    st.just(("deleted",)),
)


def _damage(path, how, other_model) -> None:
    data = path.read_bytes()
    kind = how[0]
    if kind == "flip":
        out = bytearray(data)
        for where, mask in how[1]:
            out[int(where * len(out))] ^= mask
        path.write_bytes(bytes(out))
    elif kind == "truncate":
        path.write_bytes(data[: int(how[1] * len(data))])
    elif kind == "deleted":
        path.unlink()
    else:
        blob, record = other_model
        path.write_bytes(blob)
        if kind.endswith("record"):
            shutil.copy(record, path.parent / "compiled.json")
            (path.parent / json.loads(record.read_text())["file"]).write_bytes(blob)


@settings(max_examples=10, deadline=None)
@given(how=DAMAGE)
def test_a_damaged_kept_model_is_compiled_anew_and_verified_on_what_runs(
    ov_bundle, other_model, how
):
    before = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    kept = before.backend.engine_file
    before.close()
    _damage(kept.path, how, other_model)
    damaged = _sha(kept.path.read_bytes()) if kept.path.exists() else None
    if damaged == kept.sha256:  # a flip that undid another: nothing was damaged
        return
    s = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    assert not s.backend.loaded_from_cache
    said = [n for n in s.notes if "the kept compiled model was not used" in n]
    assert len(said) == 1 and "\n" not in said[0], s.notes
    assert any(w in said[0] for w in ("sha256", "cut short", "missing", "built for")), said
    _vouches_for_what_runs(s)
    # a record of other bytes never vouches: the one read is of these very bytes
    assert s.backend.engine_file.sha256 != damaged
    assert not s.verification.cached or s.backend.engine_file.sha256 == kept.sha256
    assert s.verification.passed
    _scores_right(s)
    s.close()


def _forge(kept, data: bytes) -> None:
    """The kept model's bytes replaced by ``data`` and its record rewritten to match them."""
    kept.path.write_bytes(data)
    record_path = kept.path.parent / "compiled.json"
    record = json.loads(record_path.read_text())
    record.update(sha256=_sha(data), size=len(data))
    record_path.write_text(json.dumps(record))


def test_a_forged_record_for_damaged_bytes_gets_no_cached_pass(ov_bundle):
    """The kept model's bytes are changed and its record rewritten to match them: it loads,
    but the verification record of the bytes it replaced does not vouch for it; it is run on
    the golden cells here, and where it scores wrong the graph is compiled anew."""
    s = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    kept = s.backend.engine_file
    s.close()
    data = bytearray(kept.path.read_bytes())
    rng = np.random.default_rng(0)
    tail = len(data) // 2  # the weights: the header and the graph's text come first
    for i in rng.choice(np.arange(tail, len(data)), size=len(data) // 50, replace=False):
        data[i] ^= 0x40
    _forge(kept, bytes(data))
    forged = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    # it passed a verification run now (flips that changed nothing that counts), or did not
    # load, or failed and was compiled anew: either way nothing cached vouches for it
    assert not forged.verification.cached
    _vouches_for_what_runs(forged)
    _scores_right(forged)


def test_a_kept_model_that_scores_wrong_is_named_and_compiled_anew(ov_bundle, other_model):
    """Another model's compiled bytes kept with a record forged to match (as a damaged cache
    or a changed OpenVINO could leave them): they load, score wrong on the golden cells, and
    are named as the cause (to a Python caller too, as cyto score says it); the graph is
    compiled anew, verified, and kept in their place, so OpenVINO, asked for by name, still
    scores (it was refused with the numbers, and the failing compiled model stayed in the
    cache to fail every later run)."""
    s = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    kept = s.backend.engine_file
    s.close()
    blob, _ = other_model
    _forge(kept, blob)
    import cyto

    lines: list[str] = []  # a Python caller is told what cyto score says (it was told nothing)
    again = cyto.load_model(ov_bundle, "openvino", "cpu", "fp32", echo=lines.append)
    said = [n for n in again.notes if "the kept compiled model was not used" in n]
    assert len(said) == 1 and "\n" not in said[0], again.notes
    assert f"backend choice: {said[0]}" in lines, lines
    assert lines[-1] == f"verification: {again.verification.line()}", lines
    assert f"{kept.path.name} failed verification here (failed on 64 golden cells" in said[0]
    assert not any("failed verification, not used" in n for n in again.notes), again.notes
    assert not again.backend.loaded_from_cache and again.verification.passed
    _vouches_for_what_runs(again)
    _scores_right(again)
    again.close()
    # the failing bytes are gone from the cache: the next run loads the new ones, cached
    assert not any(_sha(f.read_bytes()) == _sha(blob) for f in kept.path.parent.glob("*.blob"))
    third = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    assert third.backend.loaded_from_cache and third.verification.cached
    assert third.backend.engine_file == again.backend.engine_file
    third.close()


def test_cyto_predict_says_why_and_scores_right_after_the_kept_model_is_damaged(
    ov_bundle, tiny, tmp_path
):
    from PIL import Image

    from tests.cli_runner import run_cyto

    folder = tmp_path / "cells" / "unknown"
    folder.mkdir(parents=True)
    for i in range(8):
        Image.fromarray(tiny.images[i]).save(folder / f"c{i}.png")

    def predict(out: str):
        proc = run_cyto(
            "predict",
            str(ov_bundle),
            "--data",
            str(tmp_path / "cells"),
            "--out",
            str(tmp_path / out),
            "--backend",
            "openvino",
            "--precision",
            "fp32",
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        import pyarrow.parquet as pq

        said = [ln for ln in proc.stdout.splitlines() if ln.startswith("verification:")]
        return proc.stdout, said, pq.read_table(tmp_path / out).column("score").to_numpy()

    _, said, first = predict("a.parquet")
    assert "cached" not in said[0]
    _, said, again = predict("b.parquet")
    assert "passed" in said[0] and "(cached for this machine)" in said[0]
    (blob,) = (tmp_path / "cache" / "openvino").glob("*/compiled-*.blob")
    data = bytearray(blob.read_bytes())
    for i in range(len(data) // 2, len(data), 97):
        data[i] ^= 0xFF
    blob.write_bytes(bytes(data))
    out, said, damaged = predict("c.parquet")
    assert "the kept compiled model was not used" in out and "does not match its sha256" in out
    assert said[0].startswith("verification: passed") and "cached" not in said[0], said
    np.testing.assert_allclose(damaged, first, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(again, first, rtol=1e-5, atol=1e-6)


# --- TensorRT, against the fake of its API ------------------------------------------------------


@pytest.fixture
def fake_trt(monkeypatch):
    import contextlib

    from cyto.runtime import devices
    from tests.fakes.tensorrt_api import make_tensorrt

    trt = make_tensorrt("10.16.0.72")
    gpu = devices.GpuIdentity(0, "NVIDIA H100 80GB HBM3", (9, 0))
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(devices, "gpu_identity", lambda device: gpu)
    monkeypatch.setattr(devices, "resolve_device", lambda device: "cpu")
    monkeypatch.setattr(devices, "on_device", lambda device: contextlib.nullcontext())
    return trt


def _trt_scorer(bundle):
    from cyto.bundle import load_bundle
    from cyto.runtime.backends.tensorrt import TensorRTBackend
    from cyto.runtime.heads import head_for
    from cyto.runtime.scorer import Scorer
    from cyto.runtime.verify import verify_scorer

    b = load_bundle(bundle, weights=False)
    scorer = Scorer(b, head_for(b), TensorRTBackend(b, "cpu"))
    scorer.verification = verify_scorer(scorer, read_golden(b))
    return scorer


def test_a_tensorrt_plan_is_verified_on_its_own_bytes(bundle, fake_trt):
    """The plan's sha256 and size (of the bytes deserialized) are in the verification key: a
    plan replaced together with its index entry (a consistent forgery, or a rebuild that
    computes otherwise) is verified again and refused; a plan damaged alone is not loaded, and
    the refusal says why and how to rebuild it."""
    from cyto.bundle import load_bundle
    from cyto.export.trt import build_engine
    from cyto.runtime.engines import BatchProfile, EngineIndex
    from tests.fakes.tensorrt_api import make_plan

    build_engine(bundle, "fp32", BatchProfile(1, 8, 32), echo=lambda m: None)
    first = _trt_scorer(bundle)
    assert first.verification.passed and not first.verification.cached
    _vouches_for_what_runs(first)
    again = _trt_scorer(bundle)
    assert again.verification.cached and again.backend.engine_file == first.backend.engine_file
    # a plan that computes wrong, put in with an index entry that matches it
    index = EngineIndex(bundle)
    (entry,) = index.entries()
    spec = load_bundle(bundle, weights=False).spec
    graph, size = spec.graph(), spec.crop_size
    wrong = make_plan(
        (bundle / graph.file).read_bytes(),
        graph.input,
        graph.output,
        [(n, size, size, 3) for n in (1, 8, 32)],
        noise=0.5,
    )
    index.plan_path(entry).write_bytes(wrong)
    data = json.loads((index.dir / "index.json").read_text())
    data["engines"][0].update(plan_sha256=_sha(wrong), plan_size=len(wrong))
    (index.dir / "index.json").write_text(json.dumps(data))
    forged = _trt_scorer(bundle)
    assert not forged.verification.cached and not forged.verification.passed
    assert forged.verification.record["key"]["artifact"]["engine_sha256"] == _sha(wrong)
    # a plan damaged alone: never deserialized
    index.plan_path(entry).write_bytes(wrong[: len(wrong) // 2])
    with pytest.raises(ConfigError, match=r"\.plan is cut short .*: run cyto export .* --trt"):
        _trt_scorer(bundle)


# --- cyto doctor ----------------------------------------------------------------------------------


def test_doctor_says_which_verifications_ran_now_and_which_it_read(bundle):
    from cyto.doctor import Report, model_rows, render

    def doctor():
        rows, auto, problems = model_rows(bundle, ["cpu"], "fp32")
        return rows, render(Report(rows=rows, auto=auto, problems=problems))

    rows, text = doctor()
    checked = [r for r in rows if r.status == "passed"]
    assert checked and all(r.source == "ran now" for r in checked)
    assert "passed (ran now)" in text and "read from records" not in text.splitlines()[-1]
    rows, text = doctor()
    assert all(r.source.startswith("from the record of ") for r in rows if r.status == "passed")
    assert "passed (from the record of " in text
    last = text.splitlines()[-1]
    assert last.startswith("everything asked for runs here (") and "not run now" in last, last


def test_doctor_says_a_failed_row_of_that_row_alone(ov_bundle, monkeypatch):
    """A graph that fails here, beside rows that pass: its line said "nothing here reproduces
    the bundle's golden cells" (issue 68, hostile round 3); it speaks of its row. (A record
    edited to fail no longer makes a failed row: doctor runs failures again.) OpenVINO's fp32
    row, which runs on any x86 CPU (bf16 "cannot run" on one without AMX or AVX512-BF16)."""
    from cyto.doctor import Report, model_rows, render
    from cyto.runtime import verify

    real = verify.verify_scorer

    def openvino_reversed(scorer, golden, use_cache=True, recheck=False):
        if scorer.backend.name == "openvino" and scorer.precision == "fp32":
            score = scorer.score  # scores in the reverse order: a graph that fails
            scorer.score = lambda images, **kw: score(images, **kw)[::-1].copy()
        return real(scorer, golden, use_cache=use_cache, recheck=recheck)

    monkeypatch.setattr(verify, "verify_scorer", openvino_reversed)
    rows, auto, problems = model_rows(ov_bundle, ["cpu"], None)
    text = render(Report(rows=rows, auto=auto, problems=problems))
    [failed] = [r for r in rows if r.backend == "openvino" and r.precision == "fp32"]
    assert failed.status == "FAILED" and any(r.status == "passed" for r in rows), text
    assert failed.source == "ran now", text
    assert "nothing here" not in text, text
    assert "this row does not reproduce the bundle's golden cells: openvino fp32" in failed.detail
    assert "Spearman -" in failed.detail and "score with a row that passed" in failed.detail


def test_a_kept_models_record_edited_to_other_settings_is_said_as_damaged(ov_bundle):
    """Hostile round 13, #5: compiled.json edited ("precision" bf16 -> fp32) was said as "it was
    built for other settings or inputs: --precision fp32 -> bf16", a flag nobody passed. The
    folder is its key's own: a record naming another was changed or damaged."""
    s = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    kept = s.backend.engine_file
    s.close()
    record_path = kept.path.parent / "compiled.json"
    record = json.loads(record_path.read_text())
    record["key"]["precision"] = "bf16"
    record_path.write_text(json.dumps(record))
    again = load_scorer(ov_bundle, "openvino", "cpu", "fp32")
    notes = " ".join(again.notes)
    again.close()
    assert "compiled.json does not match the folder it is kept in (changed or damaged:" in notes
    assert "--precision" not in notes, notes
