"""The one reading of cyto's environment variables (docs/reference/environment.md): a number
(:func:`env_number`: seconds, MiB), a folder (:func:`env_folder`), a switch (:func:`env_switch`) and
a text (:func:`env_text`: a token); and of a local path a user
gives cyto anywhere (:func:`user_path`: ``~`` is the home folder, as in a variable). A bottom
module: it imports only :mod:`cyto.errors`.

Every variable goes through one of them, so that every one is read alike: the blanks around a
value (a ``.env`` line ``X= 5``) are not its, an empty value is an unset one, and what cannot be
the variable's is refused in one line naming it. Before, each was read its own way (hostile
round 41): a negative or ``nan`` timeout was taken, and a request then "timed out" at once,
blamed on the server; ``inf`` read-ahead overflowed; ``~`` in the review registry made a folder
named ``~`` under the working folder; a relative cache folder moved with the working folder."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from cyto.errors import ConfigError, InputPathError


def env_number(
    name: str,
    default: float,
    unit: str,
    example: str,
    positive: bool = False,
    most: float = math.inf,
):
    """The number ``$name`` gives in ``unit`` (``default`` when unset or blank): finite, 0 or
    more (above 0 where ``positive``) and at most ``most``; anything else refused in one line.
    (A timeout of 1e10 s overflowed the clock in a traceback: seconds take a bound, a day.)"""
    raw = env_text(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0) or value > most:
        least = "above 0" if positive else "0 or more"
        bound = f" and at most {most:g}" if math.isfinite(most) else ""
        raise ConfigError(f"{name}={raw!r}: give {unit}, a number {least}{bound}, e.g. {example}")
    return value


def env_text(name: str) -> str | None:
    """``$name`` without the blanks around it; None when unset or blank."""
    return (os.environ.get(name) or "").strip() or None


#: cyto's switches and their value when unset: on or off (docs/reference/environment.md)
SWITCHES = {"CYTO_DEBUG": False, "CYTO_PROGRESS": True}
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def env_switch(name: str) -> bool:
    """Whether the switch ``$name`` (:data:`SWITCHES`) is on: 1, true, yes or on; 0, false, no
    or off; its default when unset, blank, or another word (refused before any work by
    :func:`check_switches`, so read here where an error is being said). ``CYTO_DEBUG=" 1 "``
    printed no traceback (hostile round 44, 4); ``CYTO_DEBUG=true`` and ``CYTO_PROGRESS=off``
    were passed over without a word (round 45, 11)."""
    word = (env_text(name) or "").lower()
    return True if word in _ON else False if word in _OFF else SWITCHES[name]


def check_switches() -> None:
    """Every switch of :data:`SWITCHES` set to a word it takes, or one line naming it: called
    where a command or a Python call starts."""
    for name in SWITCHES:
        raw = env_text(name)
        if raw is not None and raw.lower() not in (*_ON, *_OFF):
            raise ConfigError(
                f"{name}={raw!r}: give 1 (or true, yes, on) or 0 (or false, no, off), or unset it"
            )


def home_expanded(text: str) -> str | None:
    """``text`` with a leading ``~`` (``~``, ``~/x``, ``~user/x``) expanded as a shell expands
    it; None where that ``~`` cannot be expanded here; any other text as it is."""
    if not text.startswith("~"):
        return text
    path = os.path.expanduser(text)
    return None if path.startswith("~") else path


def _why_no_home(text: str) -> str:
    return "no home folder" if text == "~" or text.startswith("~/") else "no such user"


def user_path(value: str | os.PathLike) -> Path:
    """The one reading of a local path a user gives cyto (a command's argument or option, a
    Python call's argument): a leading ``~`` is the home folder, as a shell expands it where it
    can (``--out=~/x`` and ``out="~/x"`` reach cyto unexpanded: a folder named ``~`` was made
    under the working folder, and pyarrow, which expands it, then wrote elsewhere and failed
    in a traceback: hostile round 43, 1). A ``~`` that cannot be expanded is refused in one
    line."""
    text = os.fspath(value)
    path = home_expanded(text)
    if path is None:
        raise InputPathError(
            f"{text} starts with a ~ that cannot be expanded here ({_why_no_home(text)}): give "
            "the absolute path"
        )
    return Path(path)


def env_folder(name: str) -> Path | None:
    """The folder ``$name`` names (None when unset or blank), with ``~`` expanded as a shell
    would; a ``~`` that cannot be expanded, a URL or a relative path (the folder would follow
    the working folder of each run) refused in one line."""
    raw = env_text(name)
    if raw is None:
        return None
    path = home_expanded(raw)
    if path is None:
        raise ConfigError(
            f"{name}={raw} starts with a ~ that cannot be expanded here ({_why_no_home(raw)}): "
            "give the folder's absolute path"
        )
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", path):  # made ./s3:/b/cache here
        raise ConfigError(
            f"{name}={raw} is a URL: it names a folder on this machine; point it at one, or "
            "unset it"
        )
    if not os.path.isabs(path):
        raise ConfigError(
            f"{name}={raw} is a relative path, which each run would take from the folder it "
            f"starts in: give the folder's absolute path ({os.path.abspath(path)}?)"
        )
    return Path(path)
