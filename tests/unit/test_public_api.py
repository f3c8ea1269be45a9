"""The public Python API of ``cyto/__init__.py``: few names, exported lazily, always the calls."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import pytest

import cyto
from cyto import api
from cyto.errors import ConfigError
from tests.unit.test_cli_import import HEAVY

PROBE = """
import json, sys
import cyto
names = [cyto.load_model, cyto.score_slide, cyto.train, cyto.export, cyto.predict]
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


def test_dotted_imports_of_shared_subpackages_reach_their_modules():
    import cyto.predict as predict_module
    import cyto.train.config as config

    assert config.__name__ == "cyto.train.config"
    assert predict_module.predict is sys.modules["cyto.predict"].predict


def test_score_slide_refuses_an_unknown_option_by_name(tmp_path):
    with pytest.raises(ConfigError, match="unknown option.*topk.*known: .*top_k"):
        cyto.score_slide(tmp_path / "s.tif", tmp_path / "m.cyto", tmp_path / "o", topk=5)
