"""Every error and warning class cyto raises is importable from one place, :mod:`cyto.errors`.

A user who meets ``RemoteAccessError`` or ``MetricError`` in a traceback catches it as
``cyto.errors.X``; four were defined in the modules that raise them (``cyto.slides.remote``,
``cyto.eval.metrics``, ``cyto.train.base``), where a caller had to import internal modules to
catch them (hostile round 56, 7). The rule is checked on the source, so a class added anywhere
later is held to it.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

import cyto.errors

SRC = Path(cyto.errors.__file__).parent


def _error_names() -> set[str]:
    """Names that make a class an error or warning: Python's own exception classes and the
    classes of :mod:`cyto.errors`."""
    own = {
        n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
    }
    ours = {
        n
        for n, v in vars(cyto.errors).items()
        if isinstance(v, type) and issubclass(v, BaseException)
    }
    return own | ours


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def public_errors_outside(root: Path) -> list[str]:
    """``module:Class`` of each public exception or warning class defined outside
    ``errors.py`` under ``root`` (a leading underscore: internal flow, never seen by a user)."""
    names, found = _error_names(), []
    for path in sorted(root.rglob("*.py")):
        if path.name == "errors.py" and path.parent == root:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            if any(_base_name(b) in names for b in node.bases):
                found.append(f"{path.relative_to(root)}:{node.name}")
    return found


#: signals caught where they are raised, never seen by a caller: a benchmark row that cannot
#: run here (said in its row), a slide another run finished while this one waited (skipped)
SIGNALS = ["bench/engine.py:Unavailable", "outputs_check.py:FinishedMeanwhile"]


def test_every_public_error_class_is_in_cyto_errors():
    assert public_errors_outside(SRC) == SIGNALS


@pytest.mark.parametrize(
    "source, found",
    [
        (
            "from cyto.errors import CytoError\nclass LostError(CytoError): pass\n",
            ["m.py:LostError"],
        ),
        ("class Odd(ValueError): pass\n", ["m.py:Odd"]),
        ("import cyto.errors\nclass W(cyto.errors.ScaleWarning): pass\n", ["m.py:W"]),
        ("class _Stop(Exception): pass\nclass Plain: pass\n", []),
    ],
)
def test_the_rule_sees_an_error_class_defined_elsewhere(tmp_path, source, found):
    (tmp_path / "m.py").write_text(source)
    assert public_errors_outside(tmp_path) == found


@pytest.mark.parametrize(
    "old, name",
    [
        ("cyto.slides.remote", "RemoteAccessError"),
        ("cyto.slides.remote", "SlideChangedError"),
        ("cyto.slides.remote", "NoRangesError"),
        ("cyto.eval.metrics", "MetricError"),
        ("cyto.train.base", "NotFittedError"),
    ],
)
def test_moved_classes_are_still_found_where_they_were(old, name):
    import importlib

    assert getattr(importlib.import_module(old), name) is getattr(cyto.errors, name)
    assert issubclass(getattr(cyto.errors, name), cyto.errors.CytoError)
