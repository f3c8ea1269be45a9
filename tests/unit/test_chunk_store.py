"""What a run says of a stopped run's finished chunks it finds (cyto.infer.store.ChunkStore):
kept with ``--resume``, and said when a run without it starts over (hostile round 25, 28: a
`cyto predict` rerun without --resume discarded the stopped run's finished chunk unsaid)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cyto.infer.store import ChunkStore


@pytest.mark.parametrize("chunks", [0, 1, 3])
def test_a_stopped_run_s_finished_chunks_are_said_when_a_run_starts_over(tmp_path, chunks):
    key = {"test": 1}
    first = ChunkStore(tmp_path, key, unit="images", rows=None)
    first.start(False, lambda m: None)
    for i in range(chunks):
        first.write(pa.table({"x": [float(i)]}), i, i + 1)
    said: list[str] = []
    assert ChunkStore(tmp_path, key, unit="images", rows=None).start(False, said.append) == (0, 0)
    if chunks:
        assert said == [
            f"note: the {chunks} finished chunk(s) ({chunks} images) of a stopped run here are "
            "discarded: starting over (pass --resume to go on from them)"
        ], said
    else:
        assert said == []
    # kept and said so with --resume
    again = ChunkStore(tmp_path, key, unit="images", rows=None)
    again.start(False, lambda m: None)
    for i in range(chunks):
        again.write(pa.table({"x": [float(i)]}), i, i + 1)
    said.clear()
    assert ChunkStore(tmp_path, key, unit="images", rows=None).start(True, said.append)[0] == (
        chunks
    )
    # none finished: not "resuming: 0 tiles and 0 cells already scored" (hostile round 59, 11)
    assert said == (
        [f"resuming: {chunks} images already scored"]
        if chunks
        else ["resume: the stopped run finished no chunk yet; starting from the beginning"]
    ), said


PRECISIONS = ["fp32", "fp16", "bf16", "int8"]


@pytest.mark.parametrize("python", [False, True])
@pytest.mark.parametrize("was, now", [(a, b) for a in PRECISIONS for b in PRECISIONS if a != b])
def test_a_resume_names_the_precision_auto_took_as_what_ran(tmp_path, python, was, now):
    """Hostile round 35 (3): a resume under another precision, which auto took (the backend it
    chose changed), said "--precision fp32 -> bf16" to a user who passed no --precision."""
    import contextlib

    from cyto.flags import python_words

    key = {"options": {"tile": 512, "precision": was}}
    ChunkStore(tmp_path, key).start(False, lambda m: None)
    said: list[str] = []
    words = python_words("score_slide") if python else contextlib.nullcontext()
    with words:
        store = ChunkStore(tmp_path, {"options": {"tile": 512, "precision": now}})
        assert store.start(True, said.append) == (0, 0)
    flag = "precision" if python else "--precision"
    assert said == [
        "resume: the earlier run had other settings or inputs: the precision run (auto's "
        f"choice, or {flag}) {was} -> {now}; starting over"
    ], said


def test_chunks_kept_for_a_prefix_in_object_storage_are_said_to_be_on_this_machine(
    tmp_path, monkeypatch
):
    """Hostile round 62, 4: a run into --out s3://... stopped with "1 finished chunk(s) are
    kept in s3://results/api/big2/.partial", where the bucket held nothing: the chunks are in
    the staging folder on the machine that scored them, and a rerun elsewhere starts over."""
    import json

    from cyto.infer.store import kept_words
    from cyto.location import MARK, urls_for_staging

    monkeypatch.setenv("CYTO_CACHE_DIR", str(tmp_path / "cache"))
    staged = tmp_path / "cache" / "outputs" / ("a" * 20)
    (staged / "big2" / ".partial").mkdir(parents=True)
    (staged / MARK).write_text(json.dumps({"url": "s3://results/api"}))
    (staged / "big2" / ".partial" / "chunk-0000000-0000009.parquet").write_bytes(b"x")
    said = urls_for_staging(kept_words(staged / "big2" / ".partial"))
    assert said == (
        "1 finished chunk(s) are kept on this machine, in the staging folder of "
        "s3://results/api/big2: rerun with --resume here to continue"
    ), said
    local = tmp_path / "out" / ".partial"
    local.mkdir(parents=True)
    (local / "chunk-0000000-0000009.parquet").write_bytes(b"x")
    assert (
        kept_words(local) == f"1 finished chunk(s) are kept in {local}: rerun with --resume"
        " to continue"
    )
