"""Every ``Path`` argument of every command is a local path (hostile round 6): a URL given for
one was turned into ``./s3:/b/x`` and written to (data cells, data mosaic, eval sweep, synth
slide), or reported missing as ``s3:/b/x`` (eval scores, data info, review report, refine,
score --nuclei). One rule over the whole CLI (``cli._app.guard_local_paths``)."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from tests.cli_runner import run_cyto


def commands(typer_app=None, words=()):
    """(command words, callback as the CLI runs it) of every command of the CLI."""
    from cyto.cli import app

    typer_app = typer_app or app
    for info in typer_app.registered_commands:
        name = info.name or info.callback.__name__.removesuffix("_cmd").replace("_", "-")
        yield (*words, name), info.callback
    for group in typer_app.registered_groups:
        yield from commands(group.typer_instance, (*words, group.name))


def _path_params():
    """(command words, parameter name, is positional) of every Path parameter of every command."""
    out = []
    for words, callback in commands():
        for param, hint in typing.get_type_hints(callback, include_extras=True).items():
            base = typing.get_args(hint)[0] if hasattr(hint, "__metadata__") else hint
            if Path in (base, *typing.get_args(base)) or base == list[Path]:
                meta = getattr(hint, "__metadata__", ())
                positional = any(type(m).__name__ == "ArgumentInfo" for m in meta)
                out.append((words, param, positional))
    return out


PARAMS = _path_params()


def _find(words):
    """The callback of the command ``words`` (as the CLI runs it: guarded)."""
    return dict(commands()).get(tuple(words))


def test_the_cli_has_path_parameters_to_guard():
    assert len(PARAMS) > 20 and any(p for _, p, pos in PARAMS if pos)


@pytest.mark.parametrize(("words", "param", "positional"), PARAMS, ids=lambda v: str(v))
def test_a_url_for_any_path_argument_is_refused_in_one_line_naming_it(
    words, param, positional, tmp_path, monkeypatch
):
    from cyto.cli._app import local_paths_only
    from cyto.errors import InputPathError

    callback = _find(words)
    assert getattr(callback, "_local_paths", False), words  # guarded
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputPathError) as err:
        callback(**{param: Path("s3://bucket/key")})
    said = str(err.value)
    assert said.startswith(param.upper() if positional else f"--{param.replace('_', '-')}")
    assert "takes a local path, not a URL: s3://bucket/key" in said
    assert not list(tmp_path.iterdir())  # nothing written here
    assert local_paths_only  # the rule's one implementation


def test_the_guard_runs_at_the_command_line(tmp_path):
    proc = run_cyto("data", "mosaic", str(tmp_path), "--out", "s3://b/m.png")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: --out takes a local path, not a URL: s3://b/m.png (copy it to this machine "
        "first, or write here and copy it there after)"
    )


def _outs():
    from cyto.cli._app import OUTPUTS

    return [p for p in PARAMS if p[1] in OUTPUTS]


OUTS = _outs()


@pytest.mark.parametrize(("words", "param", "positional"), OUTS, ids=lambda v: str(v))
def test_an_output_under_a_file_is_refused_in_one_line_before_any_work(
    words, param, positional, tmp_path, monkeypatch
):
    """Hostile round 43 (3): ``--out`` under a regular file ended cyto train, synth slide and
    data mosaic in a traceback (predict and score said it in one line); now every command's
    output, by the CLI's guard, and the Python calls' ``out=`` by their front door. Round 45
    (1-3): review serve's ``--session`` and bench's ``--results`` and ``--work`` too (bench ran
    for minutes first), and an output through a link to nothing (data field made the link's
    target, /nonexistent/zz/f)."""
    from cyto.errors import OutputWriteError

    callback = _find(words)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "dang").symlink_to(tmp_path / "nowhere" / "zz")
    flag = param.upper() if positional else f"--{param}"
    with pytest.raises(OutputWriteError) as err:
        callback(**{param: Path("afile/x")})
    assert str(err.value) == (
        f"cannot write {flag} afile/x: {tmp_path / 'afile'} is a file, not a folder"
    )
    for given in ("dang/x", "dang"):
        with pytest.raises(OutputWriteError) as err:
            callback(**{param: Path(given)})
        assert str(err.value) == (
            f"cannot write {flag} {given}: {tmp_path / 'dang'} is a link to "
            f"{tmp_path / 'nowhere' / 'zz'}, which does not exist"
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "dang"]  # nothing written


def test_the_python_calls_refuse_an_output_under_a_file_in_one_line(tmp_path):
    import cyto
    from cyto.errors import OutputWriteError

    (tmp_path / "afile").write_text("x")
    calls = {
        "train": lambda out: cyto.train("dsvdd", tmp_path, out, normal="n", echo=None),
        "synth_slide": lambda out: cyto.synth_slide(out, width=512, height=512, echo=None),
        "predict": lambda out: cyto.predict(tmp_path / "m.cyto", tmp_path, out, echo=None),
    }
    for name, call in calls.items():
        with pytest.raises(OutputWriteError) as err:
            call(str(tmp_path / "afile" / "x"))
        assert str(err.value).startswith(f"cannot write out='{tmp_path}/afile/x': "), name
        assert str(err.value).endswith("afile is a file, not a folder"), name


def test_a_positional_output_is_named_as_the_command_line_names_it(tmp_path):
    """Hostile round 45 (18): ``cyto synth patches FILE`` was told ``--out FILE is a file``, a
    flag the command does not have (its output is the positional OUT)."""
    (tmp_path / "afile").write_text("x")
    proc = run_cyto("synth", "patches", str(tmp_path / "afile"), "--n-normal", "5")
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: OUT {tmp_path / 'afile'} is"), (
        proc.stderr
    )


def test_a_file_in_the_way_of_a_folder_cyto_makes_is_one_line(tmp_path, monkeypatch):
    """Hostile round 45 (4): ``data field --out FILE``, a stray ``OUT.train-state`` or
    ``.OUT.run`` file ended in mkdir's FileExistsError traceback; any file in the way of a
    folder cyto makes is now said by the CLI's last word, as the machine's other errors are."""
    import errno

    from PIL import Image

    from cyto.errors import system_words

    for n in ("a", "b"):
        (tmp_path / "d" / "normal").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (32, 32), (9, 9, 9) if n == "a" else (99, 9, 9)).save(
            tmp_path / "d" / "normal" / f"{n}.png"
        )
    (tmp_path / "afile").write_text("x")
    proc = run_cyto("data", "field", str(tmp_path / "d"), "--out", str(tmp_path / "afile"))
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"error: {tmp_path / 'afile'}: a file is in the way of a folder cyto makes there: move "
        "it, or give another output"
    ), proc.stderr
    err = NotADirectoryError(errno.ENOTDIR, "Not a directory", "x/y")
    assert system_words(err) == "x/y: a file stands where the path needs a folder"
