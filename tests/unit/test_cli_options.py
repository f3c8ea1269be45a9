"""What every command's options say of themselves, held to the code: one text per option that
several commands take (the CLI's shared ``typer.Option`` in ``cyto.cli._app``)."""

from __future__ import annotations

import re
import typing

from tests.unit.test_local_path_args import commands


def _options_named(name: str):
    """(command words, help) of every command's option ``name``."""
    found = []
    for words, callback in commands():
        hint = typing.get_type_hints(callback, include_extras=True).get(name)
        if hint is not None:
            info = next(m for m in hint.__metadata__ if type(m).__name__ == "OptionInfo")
            found.append((words, info.help))
    return found


def test_every_backend_option_names_every_backend_it_takes():
    """Hostile round 44 (2): cyto score's and predict's --backend help named no OpenVINO,
    which auto chose on every CPU run; each command's help said auto's order its own way."""
    from cyto.runtime import CHOICES

    helps = _options_named("backend")
    assert {w for w, _ in helps} >= {("score",), ("predict",), ("bench", "slide")}
    for words, text in helps:
        for name in CHOICES:
            assert re.search(rf"(^|[ (]){re.escape(name)}[ ,.)]", text), (words, name, text)
