"""What every command's options say of themselves, held to the code: one text per option that
several commands take (the CLI's shared ``typer.Option`` in ``cyto.cli._app``)."""

from __future__ import annotations

import re
import typing

from tests.unit.test_local_path_args import _find


def _options_named(name: str):
    """(command words, help) of every command's option ``name``."""
    found = []
    for words, param, _ in _all_params():
        if param == name:
            hint = typing.get_type_hints(_find(words), include_extras=True)[param]
            info = next(m for m in hint.__metadata__ if type(m).__name__ == "OptionInfo")
            found.append((words, info.help))
    return found


def _all_params():
    """(command words, parameter name, is positional) of every parameter of every command."""
    from cyto.cli import app

    out = []

    def walk(typer_app, words):
        for info in typer_app.registered_commands:
            name = info.name or info.callback.__name__.removesuffix("_cmd").replace("_", "-")
            hints = typing.get_type_hints(info.callback, include_extras=True)
            out.extend(((*words, name), p, False) for p in hints if p != "return")
        for group in typer_app.registered_groups:
            walk(group.typer_instance, (*words, group.name))

    walk(app, ())
    return out


def test_every_backend_option_names_every_backend_it_takes():
    """Hostile round 44 (2): cyto score's and predict's --backend help named no OpenVINO,
    which auto chose on every CPU run; each command's help said auto's order its own way."""
    from cyto.runtime import CHOICES

    helps = _options_named("backend")
    assert {w for w, _ in helps} >= {("score",), ("predict",), ("bench", "slide")}
    for words, text in helps:
        for name in CHOICES:
            assert re.search(rf"(^|[ (]){re.escape(name)}[ ,.)]", text), (words, name, text)
