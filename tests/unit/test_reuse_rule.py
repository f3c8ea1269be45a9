"""cyto.reuse.check_reuse over generated keys and damaged artifacts."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from cyto.reuse import Artifact, check_reuse, key_sha256

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=6))
keys = st.dictionaries(
    st.text("abcdefgh_", min_size=1, max_size=6),
    st.one_of(
        scalars, st.dictionaries(st.text("xyz", min_size=1, max_size=3), scalars, max_size=3)
    ),
    max_size=6,
)


@given(keys)
def test_a_key_matches_itself_and_its_json_copy(key):
    import json

    assert check_reuse(key, key).ok
    assert check_reuse(json.loads(json.dumps(key)), key).ok
    assert key_sha256(key) == key_sha256(json.loads(json.dumps(key)))


@given(keys, keys)
def test_any_difference_is_named_by_its_flag(recorded, current):
    import json

    def text(d, name):
        return json.dumps(d.get(name), sort_keys=True)  # a field absent reads as its default

    reuse = check_reuse(recorded, current)
    moved = [n for n in {*recorded, *current} if text(recorded, n) != text(current, n)]
    assert reuse.ok == (not moved)
    for name in moved:
        assert f"--{name.replace('_', '-')}" in reuse.words()


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1))
def test_a_secret_is_never_shown(seed_then, seed_now):
    reuse = check_reuse({"seed": seed_then}, {"seed": seed_now}, secret={"seed"})
    assert reuse.ok == (seed_then == seed_now)
    assert str(seed_then) not in reuse.words() and str(seed_now) not in reuse.words()
    if not reuse.ok:
        assert "--seed differs" in reuse.words()


def test_no_record_is_no_reuse():
    assert check_reuse(None, {"a": 1}).missing and not check_reuse(None, {}).ok


@given(st.integers(0, 40), st.integers(0, 40), st.sampled_from(["cut", "empty", "gone", "whole"]))
def test_parquet_artifacts_read_back_with_their_rows(tmp_path_factory, n, claimed, damage):
    path = tmp_path_factory.mktemp("a") / "t.parquet"
    pq.write_table(pa.table({"score": [float(i) for i in range(n)]}), path)
    data = path.read_bytes()
    if damage == "cut":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "gone":
        path.unlink()
    problem = Artifact(path, "parquet", rows=claimed, columns=("score",)).problem()
    assert (problem is None) == (damage == "whole" and n == claimed)
    if problem:
        assert "t.parquet" in problem
    if damage == "whole":
        assert "lacks the column(s) rank" in Artifact(path, "parquet", columns=("rank",)).problem()


def _score_flags() -> set[str]:
    """Every flag ``cyto score`` takes, read from the command itself."""
    import typer

    from cyto.cli import app

    command = typer.main.get_command(app).commands["score"]
    return {o for p in command.params for o in p.opts if o.startswith("--")}


SCORE_SETTINGS = {
    "top_k": st.integers(1, 1000),
    "mosaic": st.integers(0, 200),
    "tile": st.sampled_from([512, 1024, 2048]),
    "patch_size": st.sampled_from([None, 64, 192]),
    "slide_mpp": st.sampled_from([None, 0.25, 0.5]),
    "model_mpp": st.sampled_from([None, 0.12]),
    "fdr_alpha": st.floats(0.01, 0.5),
    "triage_level": st.floats(0.01, 0.2),
    "fdr_confidence": st.sampled_from([None, 0.9]),
    "rank_by": st.sampled_from(["model", "morphometry", "auto"]),
    "burden_cells": st.sampled_from(["evaluable", "all"]),
    "qupath": st.sampled_from(["none", "cells", "cells,map"]),
    "map_um": st.sampled_from([50.0, 100.0]),
    "rescale": st.booleans(),
    "precision": st.sampled_from(["auto", "fp32", "fp16"]),
    "planes": st.sampled_from(["auto", "none"]),
    "truth_radius": st.sampled_from([20.0, 35.0]),
}


@st.composite
def _score_options(draw):
    from dataclasses import replace

    from cyto.detect import detection_preset
    from cyto.infer.options import ScoreOptions

    chosen = {k: draw(v) for k, v in SCORE_SETTINGS.items() if draw(st.booleans())}
    detection = replace(
        detection_preset(draw(st.sampled_from(["smear", "pap", "tissue"]))),
        sigma=draw(st.sampled_from([2.0, 8.0])),
        detector=draw(st.sampled_from(["scipy", "torch"])),
    )
    return ScoreOptions(detection=detection, **chosen)


@settings(max_examples=15)
@given(_score_options(), _score_options())
def test_a_change_list_names_only_flags_cyto_score_takes(a, b):
    """Issue 68: a rescored slide's change list said --slide-mpp (the flag is --mpp) and
    --detection sigma 2 -> 8 (no flag sets sigma). Every flag a change list names is one of
    cyto score's, through the one map of fields to flags (cyto.flags)."""
    import re

    from cyto.cohort.local import score_key_names
    from cyto.reuse import differences

    flags = _score_flags()
    for line in differences(a.output_key(), b.output_key(), score_key_names("s.tif")):
        named = set(re.findall(r"--[a-z][a-z0-9-]*", line))
        assert named <= flags, (line, named - flags)  # a setting no flag sets: by its name


def test_a_change_list_says_the_detection_by_its_flags():
    from dataclasses import replace

    from cyto.detect import detection_preset
    from cyto.infer.options import ScoreOptions
    from cyto.reuse import differences

    smear = ScoreOptions(detection=detection_preset("smear"))
    assert differences(smear.output_key(), replace(smear, slide_mpp=0.5).output_key()) == [
        "--mpp default -> 0.5"
    ]
    sigma = replace(smear, detection=replace(smear.detection, sigma=8.0))
    assert differences(smear.output_key(), sigma.output_key()) == [
        "--detection smear's sigma 2 -> 8"
    ]
    pap = replace(smear, detection=detection_preset("pap"))
    assert differences(smear.output_key(), pap.output_key()) == ["--detection smear -> pap"]


@given(
    paths=st.lists(
        st.sampled_from(["/a/s.tif", "/b/s.tif", "/c/p.tif"]), min_size=1, max_size=3, unique=True
    ),  # fmt: skip
    moved=st.sampled_from(["/d/s.tif", "/e/s.tif"]),
)
def test_a_slide_read_from_another_file_of_the_same_content_is_said_so(paths, moved):
    """Hostile round 45 (15): a watch took up a slide another run had scored from another
    folder and said "file content: /wf2/big.tif default -> b1b7...; /wf/big.tif b1b7... ->
    default": the same content, its path moved, and "default" for a file not there."""
    from cyto.reuse import differences

    ids = {p: f"{i:064x}" for i, p in enumerate(paths)}
    names = {"slide": "the slide's file content:"}
    was = {"slide": ids}
    now = {"slide": {**{p: v for p, v in ids.items() if p != paths[0]}, moved: ids[paths[0]]}}
    assert differences(was, now, names) == [
        f"the slide's file content: the same content, read from {moved} (was {paths[0]})"
    ]
    changed = {"slide": {**ids, paths[0]: "f" * 64}}
    assert differences(was, changed, names) == [
        f"the slide's file content: {paths[0]} {ids[paths[0]][:12]} -> ffffffffffff"
    ]
    grown = {"slide": {**ids, moved: "e" * 64}}
    assert differences(was, grown, names) == [
        f"the slide's file content: {moved} added (eeeeeeeeeeee)"
    ]
