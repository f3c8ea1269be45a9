"""The public Python API of ``cyto/__init__.py``: few names, exported lazily, always the calls."""

from __future__ import annotations

import inspect
import json
import math
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

import cyto
from cyto import api
from cyto.errors import ConfigError
from cyto.infer.options import ScoreOptions
from tests.unit.test_cli_import import HEAVY

PROBE = """
import json, sys
import cyto
names = [cyto.load_model, cyto.score_slide, cyto.train, cyto.export, cyto.predict, cyto.info,
         cyto.calibrate, cyto.evaluate, cyto.synth_slide]
print("@@" + json.dumps([m for m in {heavy!r} if m in sys.modules]))
"""


def test_import_cyto_and_its_api_names_import_no_heavy_library():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    marker = [line for line in proc.stdout.splitlines() if line.startswith("@@")]
    assert marker and json.loads(marker[-1][2:]) == []


def test_the_public_names_are_listed_and_documented():
    assert set(cyto.__all__) == {
        "__version__",
        "cache_dir",
        "load_model",
        "score_slide",
        "train",
        "export",
        "predict",
        "info",
        "calibrate",
        "evaluate",
        "synth_slide",
    }
    assert set(cyto.__all__) <= set(dir(cyto))
    for name in cyto._API:
        func = getattr(api, name)
        doc = inspect.getdoc(func)
        assert doc and "Args:" in doc and "Example:" in doc, name
        assert inspect.signature(getattr(cyto, name)) == inspect.signature(func), name
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cyto.nope  # noqa: B018


@pytest.mark.parametrize(
    ("name", "attr"), [("train", "config"), ("export", "api"), ("predict", "load_records")]
)
def test_a_name_shared_with_a_subpackage_stays_the_call(name, attr, monkeypatch):
    """``cyto.train`` is the call even after the training package was imported (Python binds the
    subpackage to that name then), and the subpackage's modules stay reachable through it."""
    import importlib

    module = importlib.import_module(f"cyto.{name}")
    if hasattr(module, "__path__"):  # a package: its module ``attr`` is imported
        importlib.import_module(f"cyto.{name}.{attr}")
    assert cyto.__dict__[name] is module  # what the import system bound
    calls = []
    monkeypatch.setattr(api, name, lambda *a, **k: calls.append((a, k)) or "ran")
    assert cyto.__getattribute__(name)("x", flag=1) == "ran"
    assert calls == [(("x",), {"flag": 1})]
    monkeypatch.undo()
    # attributes, set and read, are the module's: tests' monkeypatching reaches it
    assert getattr(getattr(cyto, name), attr) is getattr(module, attr)
    monkeypatch.setattr(f"cyto.{name}.{attr}", "patched")
    assert getattr(module, attr) == "patched"


@pytest.mark.parametrize("name", cyto._API)
def test_help_of_every_public_call_shows_its_parameters(name):
    """``help(cyto.train)`` lists the call's parameters as ``help(cyto.load_model)`` does: the
    names shared with a subpackage showed the docstring under no signature (round 56, 8)."""
    import pydoc

    text = pydoc.render_doc(getattr(cyto, name), renderer=pydoc.plaintext)
    params = list(inspect.signature(getattr(api, name)).parameters)
    head = next(line for line in text.splitlines() if f"{name}(" in line)
    assert all(f"{p}:" in head or f"**{p}" in head for p in params), head
    # headed by the call's name, its types as written, without the checks' own metadata
    # ("_SharedName in cyto"; "Annotated[str | Path, Local('a folder of cells ...')]")
    title = text.splitlines()[0]
    assert title.endswith((f"{name} in cyto", f"{name} in module cyto.api")), title
    assert "Annotated" not in head and "Local(" not in head and "Range(" not in head, head
    assert inspect.getdoc(getattr(cyto, name)) == inspect.getdoc(getattr(api, name))


@pytest.mark.parametrize(
    ("text", "bare"),
    [
        ("Annotated[str | Path, Local('a, b [c]')]", "str | Path"),
        ("Annotated[int | None, Range(0, 1024, '0 or None')] | None", "int | None | None"),
        ("dict[str, Annotated[float, X(1, 2)]]", "dict[str, float]"),
        ("Annotated[Annotated[int, A], B]", "int"),
        ("str | Path", "str | Path"),
    ],
)
def test_a_signature_shows_each_annotated_type_bare(text, bare):
    assert api._bare(text) == bare
    assert api._bare(int) is int


def test_dotted_imports_of_shared_subpackages_reach_their_modules():
    import cyto.predict as predict_module
    import cyto.train.config as config

    assert config.__name__ == "cyto.train.config"
    assert predict_module.predict is sys.modules["cyto.predict"].predict


def test_score_slide_refuses_an_unknown_option_by_name(tmp_path):
    with pytest.raises(ConfigError, match="unknown option.*topk.*known: .*top_k"):
        cyto.score_slide(tmp_path / "s.tif", tmp_path / "m.cyto", tmp_path / "o", topk=5)


# --- the front door: every public call checks its arguments through cyto.flags ---------------

#: the kind of each argument the generated calls get wrong, per public call (the annotations say
#: the same; written out here so that the test does not read them from the code it checks)
KINDS = {
    "load_model": {
        "path": "path",
        "backend": "str",
        "device": "str",
        "precision": "str",
        "threads": "int?",
        "verify": "bool",
    },
    "score_slide": {
        "slide": "path",
        "model": "path",
        "out": "path",
        "overwrite": "bool",
        "echo": "callable?",
        "top_k": "int",
        "batch_size": "int",
        "mosaic": "int",
        "workers": "int?",
        "fdr_alpha": "float?",  # None: the default level (ScoreOptions)
        "slide_mpp": "float?",
        "truth": "path?",
        "resume": "bool",
        "backend": "str",
        "rank_by": "str",
        "qupath": "str",
    },
    "export": {
        "bundle": "path",
        "trt": "bool",
        "calib_class": "str?",
        "opset": "int",
        "calib_limit": "int",
        "accept_parity_loss": "bool",
    },
    "predict": {
        "model": "path",
        "data": "path",
        "out": "path",
        "normal": "classes?",
        "batch_size": "int",
        "overwrite": "bool",
        "chunk": "int",
        "resume": "bool",
        "patch_mpp": "float?",
    },
    "train": {
        "method": "str",
        "data": "path",
        "out": "path",
        "resume": "bool",
        "overrides": "dict?",
        "weights": "path?",
    },
    "info": {"model": "path"},
    "calibrate": {
        "model": "path",
        "normalize": "str",
        "overwrite": "bool",
        "storage_options": "dict?",
        "echo": "callable?",
    },
    "evaluate": {
        "table": "path",
        "score_column": "str",
        "by_class": "bool",
        "normal": "classes?",
        "echo": "callable?",
    },
    "synth_slide": {
        "out": "path",
        "cells": "path?",
        "mpp": "float?",
        "abnormal_fraction": "float",
        "width": "int",
        "n_cells": "int?",
        "seed": "int",
        "overwrite": "bool",
        "tile": "int",
        "defocus": "float",
    },
}
#: values out of each option's range (the range is the option's, at the CLI and in Python alike)
OUT_OF_RANGE = {
    "load_model": {
        "threads": st.one_of(st.integers(max_value=-1), st.integers(min_value=1025)),
        # a named choice is refused as score_slide refuses it (round 70, 1: "unknown backend")
        "backend": st.sampled_from(["onnxx", "ONNX", ""]),
        "precision": st.sampled_from(["int4", "float32", ""]),
    },
    "score_slide": {
        "top_k": st.integers(max_value=0),
        "batch_size": st.integers(max_value=0),
        "mosaic": st.integers(max_value=-1),
        "workers": st.integers(max_value=-1),
        "patch_size": st.integers(min_value=-5, max_value=15),
        "fdr_alpha": st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0)),
        "triage_level": st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0)),
        "map_um": st.one_of(st.floats(max_value=0.99), st.floats(min_value=10000.5)),
        "slide_mpp": st.one_of(st.floats(max_value=0.0099), st.floats(min_value=100.5)),
        "model_mpp": st.one_of(st.floats(max_value=0.0099), st.floats(min_value=100.5)),
        "tile": st.integers(max_value=15),
        "queue": st.integers(max_value=0),
        "chunk_cells": st.integers(max_value=0),
        "max_cells": st.integers(max_value=0),
        "truth_radius": st.floats(max_value=-1e-6),
        "fdr_confidence": st.one_of(st.floats(max_value=0.0), st.floats(min_value=1.0)),
        "backend": st.sampled_from(["tensorflow", "ONNX", ""]),
        "precision": st.sampled_from(["fp8", "float32", ""]),
        "rank_by": st.sampled_from(["size", "score", ""]),
        "detection": st.sampled_from(["blood", "Pap!", ""]),
        "qupath": st.sampled_from(["cells,tiles", "geojson"]),
    },
    "predict": {
        "backend": st.sampled_from(["tensorflow", "ONNX", ""]),
        "precision": st.sampled_from(["fp8", "float32", ""]),
        "rank_by": st.sampled_from(["size", "score", ""]),
        "batch_size": st.integers(max_value=0),
        "chunk": st.integers(max_value=0),
        "patch_mpp": st.floats(max_value=0.0),
    },
    "evaluate": {
        "k": st.one_of(
            st.integers(max_value=0),
            st.lists(st.integers(max_value=0), min_size=1, max_size=2),
            st.just([]),  # no K at all (round 28, 6)
        )
    },
    "synth_slide": {
        "mpp": st.one_of(st.floats(max_value=0.0099), st.floats(min_value=10.5)),
        "abnormal_fraction": st.one_of(st.floats(max_value=-1e-6), st.floats(min_value=1.001)),
        "width": st.integers(max_value=511),
        "height": st.integers(max_value=511),
        "n_cells": st.integers(max_value=-1),
        "seed": st.one_of(st.integers(max_value=-1), st.integers(min_value=2**32)),
        "tile": st.one_of(st.integers(max_value=63), st.integers(min_value=513)),
        "quality": st.one_of(st.integers(max_value=0), st.integers(min_value=101)),
        "scale": st.floats(max_value=0.0),
        "defocus": st.one_of(st.floats(max_value=-20.01), st.floats(min_value=20.01)),
        "smear_extent": st.one_of(st.floats(max_value=0.0199), st.floats(min_value=0.501)),
        "workers": st.integers(max_value=-1),
    },
    "export": {
        "opset": st.integers(max_value=10),
        "calib_limit": st.integers(max_value=7),
        "precisions": st.sampled_from(["fp8", "q4"]),
    },
}
SCALARS = {
    "int": st.integers(-3, 3),
    "float": st.floats(-2, 2, allow_nan=False),
    "str": st.text(max_size=4),
    "bool": st.booleans(),
    "path": st.just("x"),
}


def _wrong(kind: str):
    """Values that are not of ``kind`` (``int?``: an int or None)."""
    optional = kind.endswith("?")
    kind = kind.rstrip("?")
    wrong = {
        "int": [SCALARS["str"], st.floats(allow_nan=True), st.booleans(), st.lists(st.integers())],
        "float": [SCALARS["str"], st.sampled_from([math.nan, math.inf, -math.inf]), st.booleans()],
        "str": [st.integers(), st.floats(allow_nan=False), st.lists(SCALARS["str"], max_size=2)],
        "bool": [st.integers(), SCALARS["str"], st.floats(allow_nan=False)],
        "path": [
            st.integers(),
            st.floats(allow_nan=False),
            st.booleans(),
            st.lists(st.just("a.tif"), min_size=2, max_size=2),
        ],
        "callable": [st.integers(), SCALARS["str"]],
        "dict": [st.integers(), st.lists(st.integers(), max_size=2), SCALARS["str"]],
        # a string or a list of strings: class names (round 26, 11)
        "classes": [
            st.integers(),
            st.floats(allow_nan=False),
            st.lists(st.integers(), min_size=1, max_size=2),
        ],
    }[kind]
    if not optional and kind != "callable":
        wrong.append(st.none())
    return st.one_of(*wrong, _OBJECTS)


class _Lines:
    def __repr__(self) -> str:
        return "a thing\nof three\nlines"


def _objects():
    """Objects a notebook holds, each with a repr of several lines: a table (what score_slide
    returns, given to evaluate: the refusal printed its whole schema, round 43, 7), an array."""
    import numpy as np
    import pyarrow as pa

    return st.sampled_from(
        [pa.table({"path": ["a.png"], "score": [0.5]}), np.zeros((3, 3)), _Lines()]
    )


_OBJECTS = st.deferred(_objects)


def _call(name: str, tmp: Path, **given):
    """Call ``cyto.NAME`` with paths that do not exist for the arguments it needs, and
    ``given`` on top (a positional one given by name)."""
    needs = {
        "load_model": {"path": tmp / "m.cyto"},
        "score_slide": {"slide": tmp / "s.tif", "model": tmp / "m.cyto", "out": tmp / "o"},
        "export": {"bundle": tmp / "m.cyto"},
        "predict": {"model": tmp / "m.cyto", "data": tmp / "d", "out": tmp / "p.parquet"},
        "train": {"method": "dsvdd", "data": tmp / "d", "out": tmp / "t.cyto"},
        "info": {"model": tmp / "m.cyto"},
        "calibrate": {"model": tmp / "m.cyto", "tables": [tmp / "t.parquet"]},
        "evaluate": {"table": tmp / "t.parquet"},
        "synth_slide": {"out": tmp / "s.tif"},
    }[name]
    quiet = (
        {"echo": None}
        if name in ("score_slide", "export", "predict", "calibrate", "evaluate", "synth_slide")
        else {}
    )
    return getattr(cyto, name)(**{**needs, **quiet, **given})


def _in_python_words(message: str, field: str) -> None:
    """A message to a Python caller names the keyword it wrote, never a command-line flag."""
    assert f"{field}=" in message, message
    assert not re.search(r"(^|\s|\()--[a-z]", message), message


@given(data=st.data())
def test_a_wrong_type_is_one_typed_line_in_the_callers_words(data, tmp_path):
    """load_model(42), score_slide(top_k="ten"), score_slide([a, b], ...), export(opset="18"):
    raw TypeErrors from deep inside before; now a ConfigError naming the keyword as written."""
    name = data.draw(st.sampled_from(sorted(KINDS)))
    field = data.draw(st.sampled_from(sorted(KINDS[name])))
    value = data.draw(_wrong(KINDS[name][field]))
    with pytest.raises(ConfigError) as err:
        _call(name, tmp_path, **{field: value})
    _in_python_words(str(err.value), field)
    assert "\n" not in str(err.value)  # one line, whatever the value's repr
    assert not any(tmp_path.iterdir())  # refused before anything was written


@given(data=st.data())
def test_an_unknown_keyword_is_refused_by_name(data, tmp_path):
    """export(bogus=1), predict(zooom=2), load_model(bakend=...): Python's TypeError before."""
    name = data.draw(st.sampled_from(sorted(KINDS)))
    word = data.draw(st.from_regex(r"[a-z][a-z_]{0,10}", fullmatch=True))
    assume(word not in inspect.signature(getattr(api, name)).parameters)
    assume(not (name == "score_slide" and word in {f.name for f in fields(ScoreOptions)}))
    assume(not (name in ("export", "predict") and word in _library_options(name)))
    with pytest.raises(ConfigError, match="unknown option") as err:
        _call(name, tmp_path, **{word: 1})
    _in_python_words(str(err.value), word)


@given(data=st.data())
def test_a_value_out_of_range_is_named_as_the_keyword(data, tmp_path):
    """ScoreOptions said "--top-k must be >= 1" to a caller who wrote top_k=0."""
    name = data.draw(st.sampled_from(sorted(OUT_OF_RANGE)))
    field = data.draw(st.sampled_from(sorted(OUT_OF_RANGE[name])))
    value = data.draw(OUT_OF_RANGE[name][field])
    with pytest.raises(ConfigError) as err:
        _call(name, tmp_path, **{field: value})
    _in_python_words(str(err.value), field)


def _numeric(hint) -> bool:
    """An int or float argument (optional, or with its range written in an Annotated)."""
    import typing

    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    arms = (
        typing.get_args(hint)
        if typing.get_origin(hint) in (typing.Union, type(int | None))
        else (hint,)
    )
    return any(a in (int, float) for a in arms) and str not in arms


def test_every_numeric_argument_of_the_public_calls_has_its_range_tried():
    """load_model(threads=-1) reached ONNX Runtime, OpenVINO and torch as they are (torch:
    RuntimeError "set_num_threads expects a positive integer"; threads=10**6 took gigabytes).
    Every int or float argument a public call takes (its own, or an option it passes on) is
    in OUT_OF_RANGE, so the test above tries values out of its range."""
    import cyto.export.api
    import cyto.predict
    from cyto.data.synth.make import make_slide
    from cyto.flags import hints_of
    from cyto.infer.options import _hints

    takes = {name: hints_of(getattr(api, name)) for name in KINDS}
    takes["score_slide"].update(_hints())
    takes["export"].update(hints_of(cyto.export.api.export_bundle))
    takes["predict"].update(hints_of(cyto.predict.predict))
    takes["synth_slide"].update(hints_of(make_slide))
    untried = {
        f"{name}({field}=)"
        for name, hints in takes.items()
        for field, hint in hints.items()
        if _numeric(hint) and field not in OUT_OF_RANGE.get(name, {})
    }
    assert not untried, sorted(untried)


def test_class_names_are_a_string_or_a_list(monkeypatch, tmp_path):
    """normal=["NILM"] was refused "(one per call)" where a list is the natural Python form;
    each call takes the names comma-separated, as the commands do, or as a list."""
    got: dict = {}
    monkeypatch.setattr("cyto.predict.predict", lambda *a, **k: got.update(k) or {})
    cyto.predict(tmp_path / "m.cyto", tmp_path / "d", tmp_path / "p.parquet", normal=["NILM"],
                 abnormal=("ASC-US", "LSIL"), echo=None)  # fmt: skip
    assert (got["normal"], got["abnormal"]) == ("NILM", "ASC-US,LSIL")
    cyto.predict(tmp_path / "m.cyto", tmp_path / "d", tmp_path / "p.parquet", normal="NILM",
                 abnormal="ASC-US,LSIL", echo=None)  # fmt: skip
    assert (got["normal"], got["abnormal"]) == ("NILM", "ASC-US,LSIL")
    with pytest.raises(ConfigError, match=r"^normal= names no class, got \[\]"):
        cyto.train("dsvdd", tmp_path / "d", tmp_path / "t.cyto", normal=[])
    with pytest.raises(ConfigError, match=r"^each item of abnormal= is one class name"):
        cyto.synth_slide(tmp_path / "s.tif", abnormal=["ASC-US,LSIL"], echo=None)
    with pytest.raises(ConfigError, match=r"^each item of normal= must be a string, got 3"):
        cyto.evaluate(tmp_path / "t.parquet", normal=["NILM", 3], echo=None)
    assert not any(tmp_path.iterdir())


def test_wrong_counts_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cache_dir takes no arguments"):
        cyto.cache_dir(1)  # a hostile check: Python's raw TypeError
    with pytest.raises(ConfigError, match="load_model needs path="):
        cyto.load_model()
    with pytest.raises(ConfigError, match="takes 4 argument.*by position"):
        cyto.load_model(tmp_path, "onnx", "cpu", "fp32", 2)
    with pytest.raises(ConfigError, match=r"zooom= \(did you mean zoom=\?\)"):
        cyto.predict(tmp_path / "m", tmp_path / "d", tmp_path / "p.parquet", zooom=2)
    # the command line's own names suggest the keyword they set (a hostile check: fdr=, mpp=)
    for flag_name, keyword in (("fdr", "fdr_alpha"), ("mpp", "slide_mpp")):
        with pytest.raises(ConfigError, match=rf"{flag_name}= \(did you mean {keyword}=\?\)"):
            cyto.score_slide(tmp_path / "s.tif", tmp_path / "m", tmp_path / "o", **{flag_name: 0.1})


def test_the_cli_keeps_its_flags_where_python_gets_keywords():
    """One message, two callers: the words come from cyto.flags."""
    from cyto.flags import passing, python_words, said

    with pytest.raises(ConfigError, match="^--top-k must be >= 1, got 0"):
        ScoreOptions(top_k=0)
    with pytest.raises(ConfigError, match="^--mpp must be"):
        ScoreOptions(slide_mpp=0.0)
    with python_words("score_slide"), pytest.raises(ConfigError, match="^slide_mpp= must be"):
        ScoreOptions(slide_mpp=0.0)
    assert (said("fdr_alpha"), passing("verify", False), passing("overwrite")) == (
        "--fdr",
        "--skip-verify",
        "--overwrite",
    )
    with python_words("x"):
        assert (said("fdr_alpha"), passing("verify", False)) == ("fdr_alpha=", "verify=False")
        assert passing("hard_normals", False) == "hard_normals=False"
    # a --x/--no-x switch turned off (refine told a Python caller "--no-hard-normals")
    assert passing("hard_normals", False) == "--no-hard-normals"


#: each command and the library function it calls with its options (by the same names)
COMMANDS = {
    ("refine",): "cyto.review.refine:refine",
    ("predict",): "cyto.predict:predict",
    ("export",): "cyto.export.api:export_bundle",
    ("train",): "cyto.train.api:train",
}
#: a library function's positional arguments, as its command names them
POSITIONAL = {("export",): {"path": "model"}}


def _command_names(path: tuple[str, ...]) -> set[str]:
    """The flags (and argument names) of ``cyto PATH``, read from the app itself."""
    import click
    import typer

    from cyto.cli import app

    command = typer.main.get_command(app)
    for part in path:
        command = command.get_command(click.Context(command), part)
    names: set[str] = set()
    for param in command.params:
        names.update(param.opts, getattr(param, "secondary_opts", None) or ())
        if isinstance(param, click.Argument):
            names.add(param.name)
    return names


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_every_option_a_command_passes_on_is_named_by_a_flag_it_has(path):
    """refine's refusal named --review where its flag is --marks (issue 68): a message names an
    option through cyto.flags.said/passing, so each parameter of the library function a command
    calls must map (cyto.flags.FLAGS) to a flag that command has, or be marked as no flag."""
    import importlib

    from cyto.flags import FLAGS, flag

    module, name = COMMANDS[path].split(":")
    target = getattr(importlib.import_module(module), name)
    names = _command_names(path)
    wrong = [
        f"{field} -> {flag(field)}"
        for field in inspect.signature(target).parameters
        if FLAGS.get(field, "") is not None
        and flag(field) not in names
        and POSITIONAL.get(path, {}).get(field, field) not in names
    ]
    assert not wrong, f"cyto {' '.join(path)}: {wrong}"


def _finished(folder: Path, slide: str) -> dict[str, bytes]:
    folder.mkdir(parents=True)
    summary = {"slide": f"/scans/{slide}", "cells_scored": 3}  # as cyto writes it, unsealed
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "scores.parquet").write_bytes(b"PAR1 their table")
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_score_slide_refuses_a_folder_of_finished_results_as_cyto_score_does(tmp_path):
    """cyto.score_slide into a folder holding another slide's finished results replaced them
    silently (the API had no overwrite); it is refused now, naming whose results they are."""
    from cyto.cohort.run import refuse_rescoring
    from cyto.errors import InputPathError

    out = tmp_path / "other"
    before = _finished(out, "other.ndpi")
    with pytest.raises(InputPathError) as err:
        cyto.score_slide(tmp_path / "this.tif", tmp_path / "m.cyto", out, echo=None)
    words = str(err.value)
    assert "finished results of other.ndpi" in words
    assert "overwrite=True" in words and "resume=True" in words and "--" not in words
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # the CLI's refusal (of rescoring that slide into its folder) is the same rule, in its flags
    with pytest.raises(InputPathError, match=r"^--out .*pass --overwrite.*or --resume"):
        refuse_rescoring([Path("/scans/other.ndpi")], tmp_path)
    # asked to: the refusal stands aside (the run then fails on the missing model, not on it)
    from cyto.errors import BundleError

    with pytest.raises(BundleError):
        cyto.score_slide(tmp_path / "t.tif", tmp_path / "m.cyto", out, overwrite=True, echo=None)


def test_resume_and_overwrite_together_are_refused_in_the_callers_words(tmp_path):
    """cyto score --resume --overwrite kept the results and ignored --overwrite without a word."""
    from cyto.cohort.run import refuse_resume_and_overwrite
    from tests.cli_runner import run_cyto

    with pytest.raises(ConfigError) as err:
        cyto.score_slide(
            tmp_path / "s.tif", tmp_path / "m.cyto", tmp_path / "o", resume=True, overwrite=True
        )
    assert "resume=True" in str(err.value) and "overwrite=True" in str(err.value)
    assert "--" not in str(err.value) and not any(tmp_path.iterdir())
    with pytest.raises(ConfigError, match="^--resume keeps .* and --overwrite scores it again"):
        refuse_resume_and_overwrite(True, True)
    refuse_resume_and_overwrite(True, False)
    refuse_resume_and_overwrite(False, True)
    args = ["score", str(tmp_path / "s.tif"), "--model", str(tmp_path / "m.cyto")]
    proc = run_cyto(*args, "--out", str(tmp_path / "o"), "--resume", "--overwrite")
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1 and "--resume" in last[0] and "--overwrite" in last[0], proc.stderr


UNGUARDED = """
import cyto
cyto.score_slide({slide!r}, {model!r}, {out!r}, detection="smear", workers=2, echo=None)
"""


def test_a_script_without_a_main_guard_is_told_so_before_any_worker_starts(tmp_path):
    """Each spawned worker ran the script again from its top and failed there; the parent saw a
    broken worker and blamed --workers. Now the call is refused first, in one line."""
    script = tmp_path / "unguarded.py"
    args = {"slide": str(tmp_path / "s.tif"), "model": str(tmp_path / "m"), "out": "o"}
    script.write_text(UNGUARDED.format(**args))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("cyto.errors.ConfigError"), proc.stderr
    assert "if __name__ ==" in last and "line 3" in last and "workers=0" in last, last
    assert "bootstrapping" not in proc.stderr and "--workers" not in proc.stderr


def test_a_script_read_from_standard_input_is_told_so_before_any_worker_starts(tmp_path):
    """python - < script.py: each spawned worker looked for the file '<stdin>' and the run ended
    in a BrokenProcessPool traceback (hostile round 28, 3)."""
    script = "import cyto\ncyto.synth_slide('s.tif', width=2048, height=2048, echo=None)\n"
    proc = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith("cyto.errors.ConfigError"), proc.stderr
    assert "from <stdin>" in last and "workers=0" in last, last
    assert "BrokenProcessPool" not in proc.stderr and not any(tmp_path.iterdir())


def test_an_unguarded_synth_slide_is_refused_at_every_size(tmp_path):
    """A top-level synth_slide of a small slide ran (no pool: fewer than four rows) and the same
    script was refused once its slide grew (round 29, 12): one rule at every size."""
    script = tmp_path / "small.py"
    script.write_text("import cyto\ncyto.synth_slide('s.tif', width=512, height=512, echo=None)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "if __name__ ==" in last and "line 2" in last, proc.stderr
    assert not (tmp_path / "s.tif").exists()
    script.write_text(
        "import cyto\ncyto.synth_slide('s.tif', width=512, height=512, workers=0, echo=None)\n"
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0 and (tmp_path / "s.tif").is_file(), proc.stderr


def test_an_unguarded_synth_slide_hears_of_its_arguments_before_the_guard(tmp_path):
    """The guard of a script's top level answered a missing mpp, an unknown class or a .png
    first, and each came back only with workers=0 (hostile round 73, 4): the arguments are
    checked first, whatever the workers."""
    from PIL import Image

    (tmp_path / "cells" / "NILM").mkdir(parents=True)
    Image.new("RGB", (64, 64), (200, 180, 190)).save(tmp_path / "cells" / "NILM" / "a.png")
    calls = {
        "cells='cells', normal='NILM'": "mpp",
        "cells='cells', normal='NORMAL', mpp=0.25": "NORMAL",
        "fmt='png'": "png",
    }
    script = tmp_path / "bad.py"
    for args, word in calls.items():
        out = "s.png" if "png" in args else "s.tif"
        script.write_text(f"import cyto\ncyto.synth_slide({out!r}, {args}, echo=None)\n")
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=300, cwd=tmp_path)  # fmt: skip
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode != 0 and word in last, (args, proc.stderr)
        assert "__main__" not in last, (args, last)


def test_a_main_guard_is_recognised(tmp_path, monkeypatch):
    from cyto import interrupts

    script = tmp_path / "s.py"
    script.write_text("import x\nif __name__ == '__main__':\n    run()\n")
    main = type(sys)("__main__")
    main.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", main)
    code = compile("\n\nfound = unguarded()\n", str(script), "exec")
    scope = {"__name__": "__main__", "unguarded": interrupts.unguarded_script}
    exec(code, scope)  # line 3: inside the guard
    assert scope["found"] is None
    exec(compile("found = unguarded()\n", str(script), "exec"), scope)  # line 1: outside
    assert scope["found"] == (str(script), 1)


def _library_options(name: str) -> set[str]:
    import cyto.export.api
    import cyto.predict

    target = {"export": cyto.export.api.export_bundle, "predict": cyto.predict.predict}[name]
    return set(inspect.signature(target).parameters)


# --- a refusal names the option as the caller gave it (hostile round 3, MIS-4 to MIS-8) ----------

#: calls whose refusal names an option the caller gave as a keyword; each said the command line's
#: flag to a Python caller ("--out ... is a folder", "use --device cuda", "--adequacy ...")
REFUSALS = {
    "predict(out=FOLDER)": ("out", lambda b, t: cyto.predict(b, t, t, echo=None)),
    "predict(out=UNDER A FILE)": (
        "out",
        lambda b, t: cyto.predict(b, t, t / "s.tif" / "p.parquet", echo=None),
    ),
    # no GPU here: the backend is what to leave out (device=cuda would be refused next)
    "predict(backend=trt) on a CPU": (
        "backend",
        lambda b, t: cyto.predict(b, t, t / "p.parquet", backend="trt", echo=None),
    ),
    "load_model(backend=trt) on a CPU": ("backend", lambda b, t: cyto.load_model(b, backend="trt")),
    "load_model(device=cuda) with no GPU": (
        "device",
        lambda b, t: cyto.load_model(b, device="cuda"),
    ),
    "load_model(precision=bf16, backend=torch)": (
        "precision",
        lambda b, t: cyto.load_model(b, backend="torch", precision="bf16"),
    ),
    "score_slide(adequacy=MISSING)": ("adequacy", lambda b, t: _slide(b, t, adequacy="no.toml")),
    "score_slide(adequacy=NOT-TOML)": ("adequacy", lambda b, t: _slide(b, t, adequacy="bad.toml")),
    "score_slide(adequacy=NO-TABLE)": ("adequacy", lambda b, t: _slide(b, t, adequacy="x.toml")),
    "score_slide(truth=FOLDER)": ("truth", lambda b, t: _slide(b, t, truth=t)),
    "score_slide(out=s3 with a query)": ("out", lambda b, t: _slide(b, t, out="s3://b/o/?v=1")),
    # hostile round 5, MIS 3.8 and 3.9: train and predict said --resume and --skip-unreadable
    "train(resume=True) with no run": (
        "resume",
        lambda b, t: cyto.train("dsvdd", t, t / "t.cyto", normal="normal", resume=True),
    ),
    "train(resume=True, overwrite=True)": (
        "resume",
        lambda b, t: cyto.train("dsvdd", t, t / "t.cyto", resume=True, overwrite=True),
    ),
    "train(overrides= out of range)": (
        "overrides",
        lambda b, t: cyto.train("dsvdd", t, t / "t.cyto", normal="n", overrides={"eps": -1}),
    ),
    "train(normal=None)": ("normal", lambda b, t: cyto.train("dsvdd", _cells(t), t / "t.cyto")),
    "train(data=A MISSING IMAGE)": (
        "skip_unreadable",
        lambda b, t: cyto.train("dsvdd", _missing_image(t), t / "t.cyto", normal="normal"),
    ),
    "predict(data=A MISSING IMAGE)": (
        "skip_unreadable",
        lambda b, t: cyto.predict(b, _missing_image(t), t / "p.parquet", echo=None),
    ),
    "predict(patch_mpp=) of a model without mpp": (
        "patch_mpp",
        lambda b, t: cyto.predict(b, _cells(t), t / "p.parquet", patch_mpp=0.5, echo=None),
    ),
}
#: hostile round 5, MIS 3.2 and 3.3: a URL given where a local path is taken was turned into a
#: path (``https:/host/...``) and reported missing; each is refused by name, the URL printed
#: without its credentials and query string
URL = "https://user:secret@example.com/d/m.cyto?sig=abc"
LOCAL_ONLY = {
    "load_model(path=URL)": ("path", lambda b, t: cyto.load_model(URL)),
    "score_slide(model=URL)": ("model", lambda b, t: _slide(URL, t)),
    "score_slide(truth=URL)": ("truth", lambda b, t: _slide(b, t, truth=URL)),
    "train(data=URL)": ("data", lambda b, t: cyto.train("dsvdd", URL, t / "t.cyto", normal="n")),
    "train(out=URL)": ("out", lambda b, t: cyto.train("dsvdd", t, URL, normal="n")),
    "train(weights=URL)": ("weights", lambda b, t: cyto.train("dsvdd", t, t / "t", weights=URL)),
    "export(bundle=URL)": ("bundle", lambda b, t: cyto.export(URL, echo=None)),
    "export(cells=URL)": ("cells", lambda b, t: cyto.export(b, cells=URL, echo=None)),
    "export(calib=URL)": ("calib", lambda b, t: cyto.export(b, calib=URL, echo=None)),
    "predict(model=URL)": ("model", lambda b, t: cyto.predict(URL, t, t / "p.parquet")),
    "predict(data=URL)": ("data", lambda b, t: cyto.predict(b, URL, t / "p.parquet")),
    "predict(out=URL)": ("out", lambda b, t: cyto.predict(b, t, URL)),
}
REFUSALS.update(LOCAL_ONLY)


def _cells(tmp: Path) -> Path:
    """A class folder of two readable cell images."""
    import numpy as np
    from PIL import Image

    for i in range(2):
        (tmp / "cells" / "normal").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((32, 32, 3), 40 * i, np.uint8)).save(
            tmp / "cells" / "normal" / f"c{i}.png"
        )
    return tmp / "cells"


def _missing_image(tmp: Path) -> Path:
    """A manifest of readable cells and one image that is not there."""
    cells = _cells(tmp)
    rows = [f"{p},normal" for p in sorted((cells / "normal").iterdir())]
    manifest = tmp / "manifest.csv"
    manifest.write_text("\n".join(["path,label", *rows, f"{tmp / 'nope.png'},normal"]) + "\n")
    return manifest


def _slide(bundle: Path, tmp: Path, out: str | Path | None = None, **options):
    """score_slide of a slide that is never reached (what is refused is refused first)."""
    (tmp / "bad.toml").write_text("[adequacy\n")
    (tmp / "x.toml").write_text("[other]\nmin_cells = 1\n")
    if "adequacy" in options:
        options["adequacy"] = str(tmp / options["adequacy"])
    out = out or tmp / "o"
    return cyto.score_slide(tmp / "s.tif", bundle, out, workers=0, echo=None, **options)


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refusal_names_the_keyword_a_python_caller_gave(
    case, exported_dsvdd, tmp_path, monkeypatch
):
    """Hostile round 3: predict(out=FOLDER) said "--out ... is a folder", load_model(device=
    "cuda") "--device cuda asked for", score_slide(truth=FOLDER) called it a bad slide."""
    from cyto.errors import CytoError

    monkeypatch.setattr("cyto.runtime.devices.cuda_available", lambda: False)  # as on a CPU
    (tmp_path / "s.tif").write_bytes(b"x")
    field, call = REFUSALS[case]
    with pytest.raises(CytoError) as err:
        call(exported_dsvdd, tmp_path)
    message = str(err.value)
    assert "\n" not in message, message
    _in_python_words(message, field)
    if case in LOCAL_ONLY:
        assert f"{field}= takes a local path, not a URL: https://example.com/d/m.cyto (" in message
        assert "secret" not in message and "sig=" not in message, message


def test_the_same_refusals_name_flags_at_the_command_line(exported_dsvdd, tmp_path, monkeypatch):
    """One message, two callers: the CLI keeps --truth, --device, --adequacy and --out."""
    from cyto.errors import ConfigError, DeviceError
    from cyto.runtime.devices import resolve_device
    from cyto.runtime.scorer import make_backend
    from cyto.stats.adequacy import read_rule
    from tests.cli_runner import run_cyto

    monkeypatch.setattr("cyto.runtime.devices.cuda_available", lambda: False)
    with pytest.raises(DeviceError, match=r"^--device cuda asked for, but no CUDA GPU"):
        resolve_device("cuda")
    # no GPU here: advice to pass --device cuda would end in the next refusal (hostile round 6)
    with pytest.raises(ConfigError, match=r"there is none here: leave --backend out"):
        make_backend("trt", None, "cpu")
    monkeypatch.setattr("cyto.runtime.devices.cuda_available", lambda: True)
    with pytest.raises(ConfigError, match=r"runs on CUDA only: use --device cuda$"):
        make_backend("trt", None, "cpu")
    monkeypatch.setattr("cyto.runtime.devices.cuda_available", lambda: False)
    with pytest.raises(ConfigError, match=r"^--adequacy .*no.toml: cannot read it"):
        read_rule(tmp_path / "no.toml")
    slide = tmp_path / "s.tif"
    slide.write_bytes(b"x")
    got = run_cyto(
        "score", str(slide), "--model", str(exported_dsvdd), "--out", str(tmp_path / "o"),
        "--truth", str(tmp_path),
    )  # fmt: skip
    assert got.returncode != 0
    assert f"--truth {tmp_path} is a folder: a truth table is a .parquet or .csv file" in (
        got.stderr
    ), got.stderr
    assert "does not exist" not in got.stderr and "DICOM" not in got.stderr


def test_a_backends_advice_names_the_keyword_from_python():
    """The backends' own advice (ONNX Runtime's TensorRT provider) named --backend to Python."""
    from cyto.flags import python_words
    from cyto.runtime.backends.onnxruntime import _tensorrt_remedy

    assert "use --backend onnx (its CUDA provider)" in _tensorrt_remedy(10)
    with python_words("load_model"):
        _in_python_words(_tensorrt_remedy(10), "backend")


def test_a_busy_output_names_out_in_the_callers_words(tmp_path):
    """predict(out=<a table another run writes>) said "give another --out" (and "wait for it to
    finish" twice); the lock says the way out when it refuses, in the caller's words."""
    from cyto.errors import OutputBusyError
    from cyto.flags import python_words
    from cyto.locks import OutputLock

    held = OutputLock(tmp_path, "cyto predict").acquire()
    try:
        with pytest.raises(OutputBusyError) as cli:
            OutputLock(tmp_path, "cyto predict").acquire()
        with python_words("predict"), pytest.raises(OutputBusyError) as py:
            OutputLock(tmp_path, "cyto predict").acquire()
    finally:
        held.release()
    assert str(cli.value).endswith("; wait for it to finish, or give another --out")
    assert str(py.value).endswith("; wait for it to finish, or give another out=")
    _in_python_words(str(py.value), "out")


def test_a_refused_resume_names_what_changed_in_the_callers_words():
    """score_slide(resume=True) over chunks of another rank_by or nuclei file said --rank-by and
    "the --nuclei file's content" (the names were written once, as flags)."""
    from cyto.flags import python_words
    from cyto.infer.store import store_key_names
    from cyto.reuse import differences

    was = {"rank_by": "model", "nuclei_file": "a", "sharpness": True}
    now = {"rank_by": "fused", "nuclei_file": "b", "sharpness": False}
    cli = differences(was, now, store_key_names())
    with python_words("score_slide"):
        py = differences(was, now, store_key_names())
    assert cli[0].startswith("--rank-by ") and "the --nuclei file's content" in cli[1], cli
    assert "--adequacy none does not" in cli[2], cli
    assert py[0].startswith("rank_by ") and "the nuclei file's content" in py[1], py
    assert not any(re.search(r"(^|\s|\()--[a-z]", d) for d in py), py


# --- hostile round 5 (issue 68): MIS 3.2/3.3, 3.6, 3.8, 3.13 -----------------------------------


def test_the_cli_refuses_a_url_for_a_local_path_by_its_flag(tmp_path):
    """cyto train --data https://... said "https:/example.com/cells does not exist" (a URL made
    a path); cyto info, export and predict read a bundle URL as a missing folder."""
    from tests.cli_runner import run_cyto

    cases = {
        ("train", "dsvdd", "--data", URL, "--out", str(tmp_path / "t.cyto"), "--normal", "n"): (
            "--data"
        ),
        ("info", URL): "MODEL",
        ("export", str(tmp_path / "m.cyto"), "--cells", URL): "--cells",
        (
            "train",
            "dsvdd",
            "--data",
            str(tmp_path),
            "--out",
            "t",
            "--normal",
            "n",
            "--config",
            URL,
        ): ("--config"),
        ("export", URL): "MODEL",
        ("predict", URL, "--data", str(tmp_path)): "MODEL",
        ("predict", str(tmp_path / "m.cyto"), "--data", URL): "--data",
        ("score", str(tmp_path / "s.tif"), "--model", URL, "--out", str(tmp_path / "o")): (
            "--model"
        ),
    }
    for args, name in cases.items():
        proc = run_cyto(*args)
        last = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(last) == 1, (args, proc.stderr)
        assert last[0].startswith(
            f"error: {name} takes a local path, not a URL: https://example.com/d/m.cyto ("
        ), (args, proc.stderr)
    assert not any(tmp_path.iterdir())


def test_an_unknown_keyword_is_offered_only_a_close_spelling():
    """score_slide(ray="local") was asked "did you mean rank_by=?"; a Ray cohort is the command
    line's, and score_slide says so; a typo still gets its keyword."""
    with pytest.raises(ConfigError) as err:
        cyto.score_slide("s.tif", "m.cyto", "o", ray="local", echo=None)
    message = str(err.value)
    assert "rank_by" not in message.split("known:")[0] and "did you mean" not in message
    assert "`cyto score SLIDE... --out OUT --ray ADDRESS`" in message, message
    with pytest.raises(ConfigError, match=r"unknown option\(s\) topk= \(did you mean top_k=\?\)"):
        cyto.score_slide("s.tif", "m.cyto", "o", topk=5, echo=None)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) bogus=; known"):
        cyto.score_slide("s.tif", "m.cyto", "o", bogus=5, echo=None)


def test_train_refuses_resume_with_overwrite_at_the_cli_too(tmp_path):
    """cyto.train(resume=True, overwrite=True) said "--resume: no interrupted run ..." and took
    the pair; both callers are refused, each in its words."""
    from tests.cli_runner import run_cyto

    args = ["train", "dsvdd", "--data", str(tmp_path), "--out", str(tmp_path / "t.cyto")]
    proc = run_cyto(*args, "--normal", "n", "--resume", "--overwrite")
    last = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(last) == 1, proc.stderr
    assert last[0] == (
        "error: --resume continues an interrupted run and --overwrite starts a new one over the "
        "bundle: give one of them, not both"
    )
    proc = run_cyto(*args, "--normal", "n", "--resume")
    assert "--resume: no interrupted run to continue at" in proc.stderr, proc.stderr


def test_a_resumed_training_replaces_the_bundle_its_run_was_asked_to(tmp_path):
    """resume and overwrite are not given together: a run started with overwrite over an
    existing bundle and stopped is resumed with resume alone, as it was asked to replace it."""
    from cyto.errors import InputPathError
    from cyto.train.api import REPLACES, checkpoint_dir

    out = tmp_path / "t.cyto"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    ckpt = checkpoint_dir(out)
    ckpt.mkdir()
    with pytest.raises(InputPathError, match="overwrite=True"):  # not asked: refused
        cyto.train("dsvdd", tmp_path / "none", out, normal="n", resume=True)
    (ckpt / REPLACES).write_bytes(b"")
    with pytest.raises(ConfigError, match=r"^resume=True: .* records no key"):  # got past it
        cyto.train("dsvdd", _cells(tmp_path), out, normal="normal", resume=True)


def test_resume_never_replaces_another_slides_finished_results(tmp_path):
    """score_slide(n3.tif, OUT, resume=True) into the folder of case.tif's finished results
    scored n3 over them ("scored with other settings or inputs"); without resume it was refused.
    Resume keeps this slide's results where they hold: another slide's are refused by name."""
    from cyto.errors import BundleError, InputPathError

    out = tmp_path / "slide"
    before = _finished(out, "case.tif")
    with pytest.raises(InputPathError) as err:
        cyto.score_slide(tmp_path / "n3.tif", tmp_path / "m.cyto", out, resume=True, echo=None)
    words = str(err.value)
    assert words == (
        f"out={str(out)!r} holds the results of another slide (/scans/case.tif): resume=True "
        "keeps the results of n3.tif, never another slide's (give another out=, or pass "
        "overwrite=True to replace them)"
    )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # a namesake elsewhere is another slide too (the rule that gives each its own folder)
    with pytest.raises(InputPathError, match="another slide"):
        cyto.score_slide(tmp_path / "case.tif", tmp_path / "m.cyto", out, resume=True, echo=None)
    # this slide's own results: resume goes on to compare them (here: the model is missing)
    slide = tmp_path / "case.tif"
    slide.write_bytes(b"the slide")
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**summary, "slide": str(slide)}))
    with pytest.raises(BundleError):
        cyto.score_slide(slide, tmp_path / "m.cyto", out, resume=True, echo=None)


def test_advice_writes_a_numbers_placeholder_bare(exported_dsvdd, tmp_path):
    """predict(patch_mpp=) of a model without a training resolution said "--set mpp=UM_PER_PX",
    "--zoom FACTOR": now the keywords, a number's placeholder unquoted."""
    with pytest.raises(ConfigError) as err:
        cyto.predict(exported_dsvdd, _cells(tmp_path), tmp_path / "p.parquet", patch_mpp=0.5)
    assert str(err.value) == (
        "patch_mpp=: the model records no training resolution (train it with "
        "overrides={'mpp': UM_PER_PX}); pass zoom=FACTOR or zoom='auto' instead"
    )


def test_queue_is_named_alone_when_it_is_the_one_given():
    """Hostile round 6 (N49): `score_slide(queue=0)` said "chunk_cells= and queue= must be >= 1,
    got 4096 and 0", naming an argument the caller did not pass."""
    from cyto.errors import ConfigError
    from cyto.flags import python_words
    from cyto.infer.options import ScoreOptions

    with python_words("score_slide"), pytest.raises(ConfigError) as err:
        ScoreOptions(queue=0)
    assert str(err.value) == "queue= must be >= 1, got 0"


def test_export_refuses_a_device_that_is_no_gpu_and_a_calib_class_without_calib(tmp_path):
    """Hostile round 7 (H18): export(device='tpu') and ``cyto export --device tpu`` ran with no
    word, and calib_class= without calib= was dropped. Each is one line, in the caller's
    words, before the bundle is touched."""
    from tests.cli_runner import run_cyto

    model = tmp_path / "m.cyto"
    model.mkdir()
    (model / "manifest.json").write_text("{}")
    device = "device='tpu' is not a GPU: TensorRT engines are built on cuda or cuda:N"
    with pytest.raises(ConfigError) as err:
        cyto.export(model, device="tpu")
    assert str(err.value) == device
    with pytest.raises(ConfigError) as err:
        cyto.export(model, calib_class="normal")
    assert str(err.value) == (
        "calib_class= picks the classes of calib=, which is not given: pass calib=CELLS "
        "(cells to calibrate int8 on) or leave calib_class= out"
    )
    got = run_cyto("export", str(model), "--device", "tpu")
    assert got.returncode == 2 and got.stderr.strip() == (
        "error: --device tpu is not a GPU: TensorRT engines are built on cuda or cuda:N"
    )
    got = run_cyto("export", str(model), "--calib-class", "LYT")
    assert got.returncode == 2 and got.stderr.strip() == (
        "error: --calib-class picks the classes of --calib, which is not given: pass --calib "
        "CELLS (cells to calibrate int8 on) or leave --calib-class out"
    )
    assert (model / "manifest.json").read_text() == "{}" and len(list(model.iterdir())) == 1


@pytest.mark.parametrize(
    ("value", "bad"), [(["fp16", None], "None"), (("fp16", 3), "3"), ([b"fp16"], "b'fp16'")]
)
def test_a_list_argument_with_a_wrong_item_names_the_item(value, bad, tmp_path):
    # it said "precisions= must be a string or a list (one per call)": it was a list
    with pytest.raises(ConfigError) as err:
        cyto.export(tmp_path / "m.cyto", precisions=value)
    assert str(err.value) == f"each item of precisions= must be a string, got {bad}"


def test_several_values_for_an_argument_that_takes_one_still_say_one_per_call(tmp_path):
    with pytest.raises(ConfigError) as err:
        cyto.score_slide(["a.tif", "b.tif"], tmp_path / "m.cyto", tmp_path / "out")
    assert str(err.value).startswith("slide= must be a path (str or Path) (one per call)")


@given(
    name=st.text(alphabet="abcxyz_-.0123456789", min_size=256, max_size=400),
    call=st.sampled_from(["load_model", "score_slide", "predict", "export"]),
)
def test_a_name_too_long_for_the_file_system_is_one_typed_line(name, call, tmp_path_factory):
    """Hostile round 15 (10): a path with a name over 255 bytes was pathlib's raw OSError
    (Errno 36) from `cyto info`, `score --model`, `predict` and the Python calls alike. The
    machine's refusal is one line, the name cut to fit it: the CLI prints it, and the Python
    API raises it as cyto's PathError."""
    from cyto.errors import PathError

    tmp = tmp_path_factory.mktemp("long")
    model = str(tmp / name)
    args = {
        "load_model": (model,),
        "score_slide": (str(tmp / "s.tif"), model, str(tmp / "o")),
        "predict": (model, str(tmp), str(tmp / "t.parquet")),
        "export": (model,),
    }[call]
    with pytest.raises(PathError) as err:
        getattr(cyto, call)(*args)
    line = str(err.value)
    assert "\n" not in line and len(line) < 300, line
    assert "longer than the file system allows" in line, line


def test_the_cli_says_a_name_too_long_in_one_line(tmp_path):
    from tests.cli_runner import run_cyto

    model = str(tmp_path / ("x" * 300 + ".cyto"))
    out = str(tmp_path / "t.parquet")
    for args in (("info", model), ("predict", model, "--data", str(tmp_path), "--out", out)):
        proc = run_cyto(*args)
        assert proc.returncode == 1, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert lines[0].startswith(f"error: {str(tmp_path)[:20]}"), lines[0]
        assert "characters)" in lines[0], lines[0]  # the name cut to fit the line
        assert "longer than the file system allows" in lines[0] and len(lines[0]) < 300, lines[0]


def test_echo_none_silences_the_progress_bars_too(exported_dsvdd, synth_patches, tmp_path):
    """Hostile round 26 (5): `echo=None` ("where progress lines go; None: nowhere") left
    `train`'s, `predict`'s and `score_slide`'s progress bars on stderr. A call given
    `echo=None` writes none; the next call without it keeps them (a process of its own, its
    progress on as a user's is)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "quiet.py"
    script.write_text(
        "import sys, cyto\n"
        "for how, echo in (('none', None), ('print', print)):\n"
        f"    cyto.predict({str(exported_dsvdd)!r}, {str(synth_patches)!r}, "
        f"{str(tmp_path)!r} + f'/{{how}}.parquet', normal='normal', echo=echo)\n"
        "    print('--- after', how, file=sys.stderr, flush=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", str(script)], capture_output=True, text=True,
        env={**os.environ, "CYTO_PROGRESS": "1"}, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    quiet, loud = proc.stderr.split("--- after none")
    assert "images (" not in quiet and "images (" in loud, proc.stderr


def test_a_list_for_a_dict_is_told_the_dict_and_its_command_line_form(tmp_path):
    """Hostile round 43 (10): ``overrides=["epochs=1"]`` (the command line's --set, as a list)
    was told "must be a dict or None (one per call)": one per call said of a dict misled."""
    with pytest.raises(ConfigError) as err:
        cyto.train("dsvdd", tmp_path, tmp_path / "t.cyto", normal="n", overrides=["epochs=1"])
    assert str(err.value) == (
        "overrides= must be a dict ({'key': value}, where the command line takes key=value) or "
        "None, got ['epochs=1']"
    )


def test_every_command_that_keeps_or_replaces_refuses_both(tmp_path):
    """``cyto predict --resume --overwrite`` continued a stopped run and dropped --overwrite
    unsaid (as train and score once did; round 56 left it). Every command that takes both flags,
    found from the app itself, refuses the pair in one line before reading anything; the Python
    calls alike."""
    from tests.cli_runner import leaf_commands, run_cyto

    both = [
        (path, cmd)
        for path, cmd in leaf_commands()
        if {"--resume", "--overwrite"} <= {o for p in cmd.params for o in getattr(p, "opts", [])}
    ]
    assert {" ".join(path) for path, _ in both} >= {"train", "predict", "score"}
    missing = tmp_path / "absent"
    for path, cmd in both:
        args = []
        for p in cmd.params:  # every required argument: a path nothing is at (train's method)
            if not p.required:
                continue
            value = "dsvdd" if p.name == "method" else str(missing / p.name)
            args += [value] if p.param_type_name == "argument" else [p.opts[0], value]
        proc = run_cyto(*path, *args, "--resume", "--overwrite")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (path, proc.stderr)
        assert lines[0].startswith("error: --resume ") and lines[0].endswith(
            "give one of them, not both"
        ), (path, lines)
    with pytest.raises(ConfigError, match="resume=True continues a stopped run and overwrite="):
        cyto.predict(missing / "m.cyto", missing, missing / "o.parquet", resume=True,
                     overwrite=True, echo=None)  # fmt: skip
    with pytest.raises(ConfigError, match="not both"):
        cyto.score_slide(missing / "s.tif", missing / "m.cyto", missing / "o", resume=True,
                         overwrite=True, echo=None)  # fmt: skip


def test_help_shows_each_call_with_types_a_reader_can_look_up():
    """Hostile round 64 (9): help() and inspect.signature showed cyto's own aliases (``mpp:
    Mpp | None``, ``abnormal_fraction: Share``, ``width: SlideSide``, ``seed: Seed``, ``normal:
    Classes``), names no page defines, and ``cache_dir(*given, **named)``, which takes
    nothing."""
    import inspect
    import re

    import cyto

    public = {"Path", "Sequence", "Callable", "Any", "Scorer", "TrainResult", "Table"}
    public |= {"None", "True", "False"}
    for name in cyto.__all__:
        call = getattr(cyto, name)
        if not callable(call):
            continue
        text = str(inspect.signature(call))
        assert set(re.findall(r"\b[A-Z]\w*\b", text)) <= public, (name, text)
    assert str(inspect.signature(cyto.cache_dir)) == "() -> pathlib.Path"
    assert "mpp: 'float | None'" in str(inspect.signature(cyto.synth_slide))
