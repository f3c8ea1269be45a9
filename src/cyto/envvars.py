"""The one reading of cyto's environment variables (docs/reference/environment.md): a number
(:func:`env_number`: seconds, MiB) and a folder (:func:`env_folder`). A bottom module: it imports
only :mod:`cyto.errors`.

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

from cyto.errors import ConfigError


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
    raw = (os.environ.get(name) or "").strip()
    if not raw:
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


def env_folder(name: str) -> Path | None:
    """The folder ``$name`` names (None when unset or blank), with ``~`` expanded as a shell
    would; a ``~`` that cannot be expanded, a URL or a relative path (the folder would follow
    the working folder of each run) refused in one line."""
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return None
    path = raw
    if raw.startswith("~"):
        path = os.path.expanduser(raw)
        if path.startswith("~"):
            who = "no home folder" if raw == "~" or raw.startswith("~/") else "no such user"
            raise ConfigError(
                f"{name}={raw} starts with a ~ that cannot be expanded here ({who}): give the "
                "folder's absolute path"
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
